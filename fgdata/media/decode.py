"""The one place that turns a WebDataset member's bytes into a value, by extension.

Loaders, ``fgdata inspect`` and ``fgdata verify`` all call these, so a member that verifies is
a member that loads. Unsafe payloads are refused, never executed: ``.pth`` is weights-only, ``.npy``/``.npz`` have pickle disabled.
"""

from __future__ import annotations

import io
import json
import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from fgdata.media.errors import MediaError, MemberDecodeError

__all__ = [
    "DECODE_LIMIT",
    "IMAGE_EXTS",
    "TEXT_LIMIT",
    "TENSOR_EXTS",
    "VIDEO_EXTS",
    "check_member",
    "decode_member",
    "describe_member",
    "inflate_gz",
    "inflate_limit",
    "member_kind",
    "mixed_image_formats",
    "unwrap_gz",
]

IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "bmp", "tif", "tiff", "webp", "gif"})
VIDEO_EXTS = frozenset({"mp4", "ogv", "mjpeg", "avi", "mov", "h264", "mpg", "webm", "wmv"})
TENSOR_EXTS = frozenset({"pth", "npy", "npz"})
# webdataset's integer members (class labels, indices).
INT_EXTS = frozenset({"cls", "cls2", "index"})

_VIDEO_FRAMES_CHECKED = 3
#: The most bytes a member is loaded as, whole: ``verify --decode`` does not load a larger stored member,
#: and no reader inflates a ``.gz`` member past it (docs/FORMATS.md, Limits).
DECODE_LIMIT = 1 << 30
#: The most bytes a ``.gz`` text, json or integer member inflates to in every reader: a caption or a
#: metadata record is kilobytes, and one that inflates to gigabytes is a decompression bomb that would
#: cost several times its size as bytes, ``str`` and parsed values (docs/FORMATS.md, Limits).
TEXT_LIMIT = 64 << 20
_INFLATE_STEP = 1 << 20


class InflateLimitError(MemberDecodeError):
    """A ``.gz`` member inflates past the reader's limit (a decompression bomb, or simply too large)."""


def _keep(parts: list[bytes], part: bytes, total: int, limit: int, name: str) -> int:
    """Append an inflated ``part``; the new total, or InflateLimitError past ``limit``."""
    total += len(part)
    if total > limit:
        raise InflateLimitError(f".{name} inflates past the {limit:,}-byte limit; not loaded")
    parts.append(part)
    return total


def inflate_gz(data: bytes, limit: int = DECODE_LIMIT, *, name: str = "gz") -> bytes:
    """The gzip data inflated (every concatenated gzip member), fed and drained in 1 MiB steps: more than
    ``limit`` bytes raise :class:`InflateLimitError` before they are held, bad data :class:`MemberDecodeError`."""
    parts: list[bytes] = []
    total = 0
    view = memoryview(data)
    pos = 0
    pending: bytes = b""
    inflater = zlib.decompressobj(wbits=31)  # a gzip header and trailer (CRC and length checked)
    fed = False  # the current inflater has had input and has not reached its end
    try:
        while True:
            if not pending:
                if pos >= len(view):
                    break
                pending, pos = bytes(view[pos:pos + _INFLATE_STEP]), pos + _INFLATE_STEP
            part = inflater.decompress(pending, _INFLATE_STEP)
            fed = True
            total = _keep(parts, part, total, limit, name)
            if inflater.eof:  # the next gzip member, if any, starts in what this one left
                pending, inflater, fed = inflater.unused_data, zlib.decompressobj(wbits=31), False
                if not pending.strip(b"\0") and not bytes(view[pos:]).strip(b"\0"):
                    break  # nothing but zero padding after the last member, as gzip allows
            else:
                pending = inflater.unconsumed_tail
        if fed:  # the input is used up: what zlib still holds (a few bytes) and the trailer's check
            _keep(parts, inflater.flush(), total, limit, name)
            if not inflater.eof:
                raise MemberDecodeError(f".{name}: bad gzip data: the data ends inside the compressed stream")
    except zlib.error as e:
        raise MemberDecodeError(f".{name}: bad gzip data: {e}") from e
    return b"".join(parts)


def inflate_limit(ext: str, txt_extensions: Sequence[str] = ("txt",)) -> int:
    """The most bytes a ``.gz`` member of this extension inflates to: :data:`TEXT_LIMIT` for what decodes as text
    (text, json, integers), :data:`DECODE_LIMIT` for images, videos, tensors and raw bytes."""
    return TEXT_LIMIT if member_kind(ext, txt_extensions) in ("text", "json", "int") else DECODE_LIMIT


def unwrap_gz(ext: str, data: bytes, limit: int | None = None, txt_extensions: Sequence[str] = ("txt",)) -> tuple[str, bytes]:
    """Lower-case the extension and un-gzip a ``.gz`` member first, inflating at most the extension's
    :func:`inflate_limit` (or the caller's smaller ``limit``); bad gzip data or more raise MemberDecodeError."""
    ext = ext.lower()
    if ext.endswith(".gz") or ext == "gz":
        cap = inflate_limit(ext, txt_extensions)
        data = inflate_gz(data, cap if limit is None else min(limit, cap), name=ext)
        ext = ext[:-3].rstrip(".")
    return ext, data


def member_kind(ext: str, txt_extensions: Sequence[str] = ("txt",)) -> str:
    """'image', 'video', 'text', 'json', 'npy', 'npz', 'pth', 'int' or 'bytes' for an extension.

    The type comes from the last dotted part, so ``txt_emb.pth`` is 'pth' and ``poses.npy`` 'npy'.
    """
    ext = ext.lower().removesuffix(".gz")
    last = ext.rsplit(".", 1)[-1]
    if ext in txt_extensions or last in txt_extensions:
        return "text"
    if last in IMAGE_EXTS:
        return "image"
    if last in VIDEO_EXTS:
        return "video"
    if last in TENSOR_EXTS or last == "json":
        return last
    if last in INT_EXTS:
        return "int"
    return "bytes"


def mixed_image_formats(exts: Counter[str]) -> tuple[str, int] | None:
    """``(line, samples a single-key config misses)`` for a dataset whose samples carry several image
    extensions (``{ext: samples}``); None for one. What ``shard images --format keep``, ``report`` and
    ``verify`` say."""
    if len(exts) < 2:
        return None
    (top, n), *_ = exts.most_common()
    missed = sum(exts.values()) - n
    counts = ", ".join(f"{e} {k:,}" for e, k in exts.most_common())
    return (f"{len(exts)} image extensions ({counts}): HF datasets refuses such shards and a single-key "
            f"loader config such as {{'real': '{top}'}} misses {missed:,} samples; "
            f"shard with --format jpg (the default), png or webp for one format"), missed


def _load_pth(data: bytes) -> Any:
    import pickle

    import torch

    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:  # weights-only refused a global: never retried unsafely
        raise MemberDecodeError(f"pth refused (not weights-only): {str(e).splitlines()[0]}") from e
    except (RuntimeError, EOFError, ValueError) as e:
        raise MemberDecodeError(f"bad pth: {str(e).splitlines()[0]}") from e


def _load_npy(data: bytes, kind: str) -> Any:
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
        if kind == "npz":
            with loaded:
                return {k: loaded[k] for k in loaded.files}
        return loaded
    except ValueError as e:  # includes "Object arrays cannot be loaded when allow_pickle=False"
        raise MemberDecodeError(f"{kind} refused: {e}") from e
    except (OSError, EOFError) as e:
        raise MemberDecodeError(f"bad {kind}: {e}") from e


def decode_member(ext: str, data: bytes, *, txt_extensions: Sequence[str] = ("txt",)) -> Any:
    """Decode one member: image -> loaded PIL image, text -> stripped str, json -> value,
    npy -> array, npz -> dict of arrays, pth -> tensors, cls -> int, video/other -> raw bytes
    (videos are decoded by :func:`fgdata.media.video.decode_clip`, which needs the sampling
    parameters). Raises MemberDecodeError / ImageDecodeError (both FgdataError)."""
    ext, data = unwrap_gz(ext, data, txt_extensions=txt_extensions)
    kind = member_kind(ext, txt_extensions)
    if kind == "image":
        from fgdata.media.image import open_image

        im = open_image(data)
        try:
            im.load()
        except (OSError, ValueError, SyntaxError) as e:
            raise MemberDecodeError(f"bad image: {e}") from e
        return im
    if kind in ("text", "json", "int"):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MemberDecodeError(f".{ext} is not UTF-8: {e}") from e
        if kind == "text":
            return text.strip()
        try:
            return json.loads(text) if kind == "json" else int(text.strip())
        except ValueError as e:
            raise MemberDecodeError(f"bad .{ext}: {e}") from e
    if kind in ("npy", "npz"):
        return _load_npy(data, kind)
    if kind == "pth":
        return _load_pth(data)
    return data


def _tensor_summary(x: Any) -> Any:
    """dtype/shape/min/max/mean of an array or tensor; recurses into lists, tuples and dicts."""
    if isinstance(x, dict):
        return {str(k): _tensor_summary(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_tensor_summary(v) for v in x]
    if hasattr(x, "detach"):  # a torch tensor; float64 copy for the stats (bf16 has no numpy)
        arr = x.detach().cpu().double().numpy()
    else:
        arr = np.asarray(x)
    out: dict[str, object] = {"dtype": str(getattr(x, "dtype", arr.dtype)).removeprefix("torch."), "shape": list(arr.shape)}
    if arr.size and arr.dtype.kind in "biuf":
        a = arr.astype(np.float64)
        out.update(min=float(a.min()), max=float(a.max()), mean=float(a.mean()))
    return out


def describe_member(ext: str, data: bytes, limit: int | None = None) -> dict:
    """A decoded one-screen summary for ``fgdata inspect``; failures become ``{'error': reason}``.
    A ``.gz`` member is inflated up to ``limit`` bytes (the caller's limit for loading a member) or its
    extension's :func:`inflate_limit`, whichever is smaller."""
    try:
        ext, data = unwrap_gz(ext, data, limit)
        kind = member_kind(ext)
        if kind == "image":
            from fgdata.media.image import describe_image

            return describe_image(data)
        if kind == "video":
            from fgdata.media.video import probe_video

            return probe_video(data).to_dict()
        value = decode_member(ext, data)
        if kind == "text":
            return {"chars": len(value), "text": value[:80]}
        if kind == "json":
            return {"keys": sorted(value)} if isinstance(value, dict) else {"type": type(value).__name__}
        if kind == "int":
            return {"value": value}
        if kind in ("npy", "npz", "pth"):
            return {"tensor": _tensor_summary(value)}
        return {"bytes": len(data)}
    except (MediaError, OSError, ValueError) as e:
        return {"error": str(e).splitlines()[0] if str(e) else type(e).__name__}


_CHECK_CATEGORY = {
    "image": "image-decode",
    "text": "utf8",
    "json": "json",
    "int": "int",
    "npy": "npy",
    "npz": "npz",
    "pth": "pth",
}


def _check_video(data: bytes) -> str | None:
    """Open, demux every packet and decode the first frames; a short read means truncation."""
    import av

    from fgdata.media.video import probe_video

    try:
        info = probe_video(data)
        with av.open(io.BytesIO(data), "r") as container:
            vs = container.streams.video[0]
            declared = vs.frames
            decoded = 0
            for _ in container.decode(vs):
                decoded += 1
                if decoded >= _VIDEO_FRAMES_CHECKED:
                    break
        if decoded < min(_VIDEO_FRAMES_CHECKED, info.frame_count):
            return "video-decode"
    except (MediaError, av.error.FFmpegError):
        return "video-decode"
    if info.frame_count == 0 or (declared and info.frame_count < declared):
        return "video-truncated"
    return None


def check_member(ext: str, data: bytes) -> str | None:
    """Full decode for ``fgdata verify --decode``: None when fine, else a short reason category
    ('gzip', 'gzip-too-large', 'image-decode', 'video-decode', 'video-truncated', 'utf8', 'json', 'npy', 'npz',
    'pth', 'int')."""
    try:
        ext, data = unwrap_gz(ext, data)
    except InflateLimitError:
        return "gzip-too-large"
    except MemberDecodeError:
        return "gzip"
    kind = member_kind(ext)
    if kind == "video":
        return _check_video(data)
    try:
        if kind == "image":  # the loaders' decode (as a viewer shows it), so what verifies is what loads
            from fgdata.media.image import decode_display

            decode_display(data)
        else:
            decode_member(ext, data)
    except MediaError as e:
        if kind in ("json", "int") and "not UTF-8" in str(e):
            return "utf8"
        return _CHECK_CATEGORY.get(kind, "decode")
    return None
