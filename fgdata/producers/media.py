"""The per-item transform: one work item -> the samples to write, or a failure reason. Pure and picklable.

It runs in pool workers and Ray tasks, so it reads its own inputs (media and sidecars) and
returns plain data. A failure reason is ``"<category>: <message>"``; the report groups by
category (``read``, ``image-decode``, ``video-decode``, ``video-truncated``, ``camera``,
``metadata``, ``caption``, ``missing-path``, ``error``, and the source's refusals: ``name``,
``symlink``, ``path``, ``manifest``).

The ``json`` member keeps the user's metadata (manifest columns, ``NAME.json``) as given, and
puts fgdata's own fields under ``fgdata`` (see :mod:`fgdata.shards.metadata`).

Image checks: pass-through keeps the original bytes and checks the header plus the format's
end marker (JPEG EOI, PNG IEND); a file without its marker is fully decoded, so trailing
garbage is accepted but truncation is not. Re-encoding decodes everything anyway.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.shards.metadata import FGDATA_FIELD, with_fgdata_fields
from fgdata.sources.folder import WorkItem, sample_key
from fgdata.storage.http import DownloadFailed, DownloadOptions, configure, stop_fetching

Kind = Literal["images", "videos", "prompts"]
IMAGE_FORMATS = ("jpg", "png", "webp")
_PIL_EXT = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tiff"}
_PIL_SAVE = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
_PNG_END = b"IEND\xaeB`\x82"
_ADDRESS = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")


@dataclass(frozen=True)
class ShardOptions:
    """What the transform does; part of the job record, so a resumed job must use the same options."""

    kind: Kind
    max_side: int | None = None
    image_format: str | None = None  # jpg | png | webp; None keeps the format (re-encode: jpg/png/webp, else png)
    quality: int = 95
    clip_seconds: float | None = None
    exact_clips: bool = False
    fps: float | None = None
    download: DownloadOptions | None = None  # set for jobs whose inputs are http(s) URLs
    dedupe: str | None = None  # "sha256": keep the first of inputs with equal bytes (images)

    def __post_init__(self) -> None:
        if self.image_format is not None and self.image_format not in IMAGE_FORMATS:
            raise FgdataError(f"--format must be one of {', '.join(IMAGE_FORMATS)}, not {self.image_format!r}")
        if self.max_side is not None and self.max_side < 2:
            raise FgdataError("--max-side must be at least 2")
        if not 1 <= self.quality <= 100:
            raise FgdataError("--quality must be between 1 and 100")
        if self.clip_seconds is not None and self.clip_seconds <= 0:
            raise FgdataError("--clip-seconds must be > 0")
        if self.fps is not None and self.fps <= 0:
            raise FgdataError("--fps must be > 0")
        if self.dedupe not in (None, "sha256"):
            raise FgdataError(f"--dedupe must be sha256, not {self.dedupe!r}")

    @property
    def reencode_images(self) -> bool:
        return self.max_side is not None or self.image_format is not None

    @property
    def reencode_video(self) -> bool:
        return self.fps is not None or self.max_side is not None or self.exact_clips

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Outcome:
    """The result of one item: ``samples`` as (key, members), or a failure ``reason``; input bytes read."""

    position: int
    index: int
    name: str
    samples: list[tuple[str, dict[str, bytes]]] = field(default_factory=list)
    reason: str | None = None
    nbytes: int = 0


class _Failed(Exception):
    def __init__(self, category: str, message: str):
        super().__init__(f"{category}: {message}")


def _first_line(e: BaseException) -> str:
    """The first line of an error, without object addresses (reports must be byte-identical on reruns)."""
    text = _ADDRESS.sub("", str(e)).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _suffix(path: str) -> str:
    """The file extension of a path or URL (a URL's query and fragment are not part of it)."""
    if storage.is_url(path):
        path = path.split("?", 1)[0].split("#", 1)[0]
    return storage.basename(path).rpartition(".")[2].lower()


def _read(path: str) -> bytes:
    try:
        return storage.read_bytes(path)
    except DownloadFailed as e:
        raise _Failed(e.category, e.detail) from None
    except (FgdataError, OSError) as e:
        raise _Failed("read", _first_line(e)) from None


def json_bytes(doc: dict[str, Any]) -> bytes:
    """Canonical JSON (sorted keys, no spaces) so reruns give the same bytes."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _caption_and_metadata(item: WorkItem) -> tuple[str | None, dict[str, Any], int]:
    """The caption and the user's metadata (sidecars over manifest columns); fgdata adds its own fields later."""
    nbytes = 0
    caption = item.caption
    if item.caption_path:
        raw = _read(item.caption_path)
        nbytes += len(raw)
        try:
            caption = raw.decode("utf-8-sig").strip()
        except UnicodeDecodeError:
            raise _Failed("caption", f"{storage.basename(item.caption_path)} is not UTF-8") from None
    metadata = dict(item.metadata)
    if item.metadata_path:
        raw = _read(item.metadata_path)
        nbytes += len(raw)
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise _Failed("metadata", f"{storage.basename(item.metadata_path)}: {_first_line(e)}") from None
        if not isinstance(doc, dict):
            raise _Failed("metadata", f"{storage.basename(item.metadata_path)} must hold a JSON object")
        metadata.update(doc)
    if FGDATA_FIELD in metadata:
        raise _Failed("metadata", f"{item.name}: the field {FGDATA_FIELD!r} is reserved for fgdata's own metadata")
    return caption, metadata, nbytes


def _text_members(caption: str | None, metadata: dict[str, Any], fields: dict[str, Any]) -> dict[str, bytes]:
    """``txt`` and ``json``: the user's metadata with fgdata's ``fields`` under its own key."""
    members = {"json": json_bytes(with_fgdata_fields(metadata, fields))}
    if caption is not None:
        members["txt"] = caption.encode()
    return members


# -- images ------------------------------------------------------------------


def _check_complete(data: bytes, fmt: str | None) -> None:
    """Cheap truncation check by end marker; a full decode decides when the marker is absent."""
    tail = data.rstrip(b"\0")
    if fmt == "JPEG" and tail.endswith(b"\xff\xd9"):
        return
    if fmt == "PNG" and tail.endswith(_PNG_END):
        return
    from fgdata.media.image import _load, open_image

    _load(open_image(data))


def _reencode(data: bytes, options: ShardOptions, source_ext: str) -> tuple[bytes, str]:
    from PIL import Image, ImageOps

    from fgdata.media.image import _load, open_image

    im = open_image(data)
    if options.max_side and im.format == "JPEG" and max(im.size) > 2 * options.max_side:
        # DCT scaling: decode at >= 2x the target (Pillow's reducing gap) instead of full size.
        s = 2 * options.max_side / max(im.size)
        im.draft(im.mode, (math.ceil(im.width * s), math.ceil(im.height * s)))
    im = ImageOps.exif_transpose(_load(im))
    if options.max_side and max(im.size) > options.max_side:
        s = options.max_side / max(im.size)
        size = (max(1, round(im.width * s)), max(1, round(im.height * s)))
        if im.mode not in ("RGB", "RGBA", "L", "LA"):
            im = im.convert("RGBA" if "A" in im.getbands() or im.mode == "P" else "RGB")
        im = im.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
    ext = options.image_format or (source_ext if source_ext in IMAGE_FORMATS else "png")
    if ext == "jpg" and im.mode not in ("RGB", "L"):
        im = im.convert("RGB")
    elif ext == "webp" and im.mode not in ("RGB", "RGBA"):
        im = im.convert("RGBA" if "A" in im.getbands() else "RGB")
    buf = io.BytesIO()
    if ext == "jpg":
        im.save(buf, "JPEG", quality=options.quality)
    elif ext == "webp":
        im.save(buf, "WEBP", quality=options.quality, method=4)
    else:
        im.save(buf, "PNG", compress_level=6)
    return buf.getvalue(), ext


def _image_samples(item: WorkItem, options: ShardOptions) -> tuple[dict[str, bytes], int]:
    from fgdata.media import describe_image
    from fgdata.media.errors import MediaError

    data = _read(item.path)
    digest = hashlib.sha256(data).hexdigest() if options.download is not None or options.dedupe else None
    try:
        facts = describe_image(data)
        source_ext = _PIL_EXT.get(facts["format"]) or _suffix(item.path)
        if options.reencode_images:
            data, ext = _reencode(data, options, source_ext)
            facts = describe_image(data)
        else:
            _check_complete(data, facts["format"])
            ext = source_ext
    except MediaError as e:
        raise _Failed("image-decode", _first_line(e)) from None
    caption, metadata, nbytes = _caption_and_metadata(item)
    fields = {"source": item.name, "width": facts["width"], "height": facts["height"], "mode": facts["mode"]}
    if digest is not None:  # the input bytes' hash (URL inputs, --dedupe), whatever re-encoding did after
        fields["sha256"] = digest
    return {ext: data, **_text_members(caption, metadata, fields)}, len(data) + nbytes


# -- videos ------------------------------------------------------------------


def _npy(array: Any) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _camera(item: WorkItem, frame_count: int) -> tuple[Any, Any, int] | None:
    import numpy as np

    from fgdata.media import validate_camera

    if not item.poses_path and not item.intrinsics_path:
        return None
    if not (item.poses_path and item.intrinsics_path):
        have = item.poses_path or item.intrinsics_path or ""
        raise _Failed("camera", f"{storage.basename(have)} needs its partner (.poses.npy and .intrinsics.npy)")
    arrays = []
    nbytes = 0
    for path in (item.poses_path, item.intrinsics_path):
        raw = _read(path)
        nbytes += len(raw)
        try:
            arrays.append(np.load(io.BytesIO(raw), allow_pickle=False))
        except ValueError as e:
            raise _Failed("camera", f"{storage.basename(path)}: {_first_line(e)}") from None
    try:
        validate_camera(arrays[0], arrays[1], frame_count)
    except FgdataError as e:
        raise _Failed("camera", f"{item.name}: {_first_line(e)}") from None
    return arrays[0], arrays[1], nbytes


def _video_samples(item: WorkItem, options: ShardOptions) -> tuple[list[tuple[str, dict[str, bytes]]], int]:
    from fgdata.media import check_member, probe_video
    from fgdata.media.camera import slice_camera, transform_intrinsics
    from fgdata.media.errors import MediaError

    from fgdata.producers import transcode

    data = _read(item.path)
    ext = _suffix(item.path)
    problem = check_member("mp4", data)  # any video extension selects the same container check
    if problem:
        raise _Failed(problem, f"{item.name} does not decode")
    try:
        info = probe_video(data)
    except MediaError as e:
        raise _Failed("video-decode", _first_line(e)) from None
    camera = _camera(item, info.frame_count)
    caption, metadata, nbytes = _caption_and_metadata(item)
    nbytes += len(data) + (camera[2] if camera else 0)
    key = sample_key(item.index)
    if options.clip_seconds is None and not options.reencode_video:
        members = {ext: data, **_text_members(caption, metadata, {"source": item.name, **info.to_dict()})}
        if camera:
            members["poses.npy"], members["intrinsics.npy"] = _npy(camera[0]), _npy(camera[1])
        return [(key, members)], nbytes
    try:
        if options.clip_seconds is None:
            bounds = [(0.0, info.duration)]
        else:
            bounds = transcode.clip_bounds(info, options.clip_seconds, options.exact_clips or options.reencode_video)
        if options.reencode_video:
            clips = transcode.encode_clips(data, info, bounds, fps=options.fps, max_side=options.max_side)
            out_ext = "mp4"
        else:
            clips = transcode.copy_clips(data, info, bounds, ext)
            out_ext = "webm" if ext == "webm" else "mp4"
        samples = []
        for j, clip in enumerate(clips):
            clip_info = probe_video(clip.data)
            fields = {"source": item.name, **clip_info.to_dict(),
                      "clip": {"index": j, "start": clip.start, "end": clip.end}}
            members = {out_ext: clip.data, **_text_members(caption, metadata, fields)}
            if camera:
                poses, intrinsics = slice_camera(camera[0], camera[1], clip.frame_indices)
                crop = {"resize_w": clip_info.width, "resize_h": clip_info.height, "crop_x0": 0, "crop_y0": 0}
                members["poses.npy"] = _npy(poses)
                members["intrinsics.npy"] = _npy(transform_intrinsics(intrinsics, info.width, info.height, crop))
            samples.append((key if options.clip_seconds is None else f"{key}_{j:04d}", members))
    except MediaError as e:
        raise _Failed("video-decode", _first_line(e)) from None
    return samples, nbytes


# -- entry point ---------------------------------------------------------------


def transform(position: int, item: WorkItem, options: ShardOptions) -> Outcome:
    """Turn one work item into samples; every error becomes a failure reason, never an exception."""
    out = Outcome(position=position, index=item.index, name=item.name)
    if options.download is not None:
        configure(options.download)
    try:
        if item.refused:
            out.reason = item.refused
        elif options.kind == "prompts":
            if not item.caption:
                raise _Failed("caption", "empty prompt")
            out.samples = [(sample_key(item.index), {"txt": item.caption.encode()})]
            out.nbytes = len(item.caption.encode())
        elif not item.path:
            raise _Failed("missing-path", "no media path")
        elif options.kind == "images":
            members, out.nbytes = _image_samples(item, options)
            out.samples = [(sample_key(item.index), members)]
        else:
            out.samples, out.nbytes = _video_samples(item, options)
    except _Failed as e:
        out.reason = str(e)
    except Exception as e:  # noqa: BLE001 - a strange input must not end a long job; it is reported
        out.reason = f"error: {type(e).__name__}: {_first_line(e)}"
    return out


def transform_batch(tasks: list[tuple[int, WorkItem]], options: ShardOptions) -> list[Outcome]:
    """Transform a batch of ``(position, item)`` in input order; URL inputs are fetched (and decoded)
    by ``options.download.threads`` threads of this process, so many requests are in flight per worker."""
    threads = options.download.threads if options.download is not None else 1
    if threads <= 1 or len(tasks) <= 1:
        return [transform(p, item, options) for p, item in tasks]
    from concurrent.futures import ThreadPoolExecutor

    stop_fetching(False)
    pool = ThreadPoolExecutor(min(threads, len(tasks)), thread_name_prefix="fgdata-fetch")
    try:
        return list(pool.map(lambda task: transform(task[0], task[1], options), tasks))
    except BaseException:  # a stop signal (in-process runs): the threads end without new tries
        stop_fetching()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
