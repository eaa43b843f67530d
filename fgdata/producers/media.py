"""The per-item transform: one work item -> the samples to write, or a failure reason. Pure and picklable.

It runs in pool workers and Ray tasks, so it reads its own inputs (media and sidecars) and
returns plain data. A failure reason is ``"<category>: <message>"``; the report groups by
category (``read``, ``image-decode``, ``video-decode``, ``video-truncated``, ``camera``,
``metadata``, ``caption``, ``missing-path``, ``error``, and the source's refusals: ``name``,
``symlink``, ``path``, ``manifest``).

A caption that cannot be read (``NAME.txt`` that is not text, a caption field or column that is not
text) is a *warning* of that input (``Outcome.warnings``, the report's ``warnings``): the sample is
written without its ``txt``, so an image is never lost with its caption.

The ``json`` member keeps the user's metadata (manifest columns, ``NAME.json``) as given, and
puts fgdata's own fields under ``fgdata`` (see :mod:`fgdata.shards.metadata`).

Image checks: pass-through keeps the original bytes and checks the header plus the format's
end marker (JPEG EOI, PNG IEND); a file without its marker is fully decoded, so trailing
garbage is accepted but truncation is not. Re-encoding decodes everything anyway.
"""

from __future__ import annotations

import codecs
import io
import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from fgdata import storage
from fgdata.errors import FgdataError, OptionError
from fgdata.shards.metadata import FGDATA_FIELD, parse_json, with_fgdata_fields
from fgdata.sources.folder import WorkItem, sample_key

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
    caption_field: tuple[str, ...] = ("caption", "text", "prompt")  # metadata fields tried for a missing caption
    max_pixels: int | None = None  # the decompression-bomb limit (None: Pillow's, or FGDATA_MAX_PIXELS)

    def __post_init__(self) -> None:
        if self.image_format is not None and self.image_format not in IMAGE_FORMATS:
            raise OptionError(f"--format must be one of {', '.join(IMAGE_FORMATS)}, not {self.image_format!r}")
        if self.max_side is not None and self.max_side < 2:
            raise OptionError("--max-side must be at least 2")
        if not 1 <= self.quality <= 100:
            raise OptionError("--quality must be between 1 and 100")
        if self.clip_seconds is not None and self.clip_seconds <= 0:
            raise OptionError("--clip-seconds must be > 0")
        if self.fps is not None and self.fps <= 0:
            raise OptionError("--fps must be > 0")
        if not self.caption_field or not all(name.strip() for name in self.caption_field):
            raise OptionError("--caption-field needs one or more field names, e.g. caption,text,prompt")
        if self.max_pixels is not None and self.max_pixels < 1:
            raise OptionError("--max-pixels must be at least 1")

    @property
    def reencode_images(self) -> bool:
        return self.max_side is not None or self.image_format is not None

    @property
    def reencode_video(self) -> bool:
        return self.fps is not None or self.max_side is not None or self.exact_clips

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ClipTally:
    """The clips a ``--clip-seconds`` job wrote in one run, and how many came out longer than asked (cut at
    keyframes, a clip runs to the first keyframe at least ``clip_seconds`` on: sparse keyframes make long clips)."""

    asked: float
    written: int = 0
    longer: int = 0  # longer than asked by more than one frame
    longest: float = 0.0

    def add(self, length: float, longer: bool) -> None:
        self.written += 1
        self.longer += longer
        self.longest = max(self.longest, length)

    def merge(self, other: dict[str, Any]) -> None:
        """Add a tally in its :meth:`to_json` form (a work unit's)."""
        self.written += other["written"]
        self.longer += other["longer_than_asked"]
        self.longest = max(self.longest, other["longest_seconds"])

    def to_json(self) -> dict[str, Any]:
        return {"asked_seconds": self.asked, "written": self.written, "longer_than_asked": self.longer,
                "longest_seconds": round(self.longest, 3)}


@dataclass
class Outcome:
    """The result of one item: ``samples`` as (key, members), or a failure ``reason``; input bytes read; for
    ``--clip-seconds``, each sample's (length in seconds, longer than asked)."""

    position: int
    index: int
    name: str
    samples: list[tuple[str, dict[str, bytes]]] = field(default_factory=list)
    reason: str | None = None
    nbytes: int = 0
    warnings: list[str] = field(default_factory=list)  # "<category>: <message>" for inputs written without a part
    clips: list[tuple[float, bool]] = field(default_factory=list)


class _Failed(Exception):
    def __init__(self, category: str, message: str):
        super().__init__(f"{category}: {message}")


def _first_line(e: BaseException) -> str:
    """The first line of an error, without object addresses (reports must be byte-identical on reruns)."""
    text = _ADDRESS.sub("", str(e)).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _read(path: str) -> bytes:
    try:
        return storage.read_bytes(path)
    except (FgdataError, OSError) as e:
        raise _Failed("read", _first_line(e)) from None


def json_bytes(doc: dict[str, Any]) -> bytes:
    """Canonical JSON (sorted keys, no spaces) so reruns give the same bytes."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


#: Captions that are not UTF-8: a byte-order mark decides (UTF-32 before UTF-16: its BOM starts with UTF-16's).
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig", "utf-8"), (codecs.BOM_UTF32_LE, "utf-32", "utf-32"),
         (codecs.BOM_UTF32_BE, "utf-32", "utf-32"), (codecs.BOM_UTF16_LE, "utf-16", "utf-16"),
         (codecs.BOM_UTF16_BE, "utf-16", "utf-16"))
#: Without a BOM, a caption that is not UTF-8 is read as Windows-1252, then Latin-1 (what old tools wrote).
_FALLBACKS = (("cp1252", "cp1252"), ("latin-1", "latin-1"))
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def decode_caption(raw: bytes) -> tuple[str | None, str]:
    """A caption file's text and the encoding it was read in (``utf-8`` mostly); None when it is not text in
    that encoding (it does not decode, or holds control characters other than tab and line breaks)."""
    text, encoding = None, "utf-8"
    for bom, codec, name in _BOMS:
        if raw.startswith(bom):
            encoding = name
            try:
                text = raw.decode(codec)
            except UnicodeDecodeError:
                return None, name
            break
    else:
        for codec, name in (("utf-8", "utf-8"), *_FALLBACKS):
            try:
                text, encoding = raw.decode(codec), name
                break
            except UnicodeDecodeError:
                continue
    return (None if text is None or _CONTROL.search(text) else text.strip()), encoding


@dataclass
class _Text:
    """An item's caption and the user's metadata, with what fgdata records about them and the warnings."""

    caption: str | None
    metadata: dict[str, Any]
    nbytes: int
    fields: dict[str, Any] = field(default_factory=dict)  # for the json's "fgdata" object
    warnings: list[str] = field(default_factory=list)


def _caption_and_metadata(item: WorkItem, options: ShardOptions) -> _Text:
    """The caption (NAME.txt, a manifest's caption column, else the first ``--caption-field`` of the metadata)
    and the user's metadata (sidecars over manifest columns); a caption that cannot be read is a warning, and
    the sample is written without it."""
    text = _Text(item.caption, dict(item.metadata), 0, warnings=[item.warning] if item.warning else [])
    if item.caption_path:
        raw = _read(item.caption_path)
        text.nbytes += len(raw)
        name = storage.basename(item.caption_path)
        text.caption, encoding = decode_caption(raw)
        if text.caption is None:
            why = ("is not text in UTF-8, Windows-1252 or Latin-1" if encoding not in ("utf-16", "utf-32")
                   else f"has a {encoding.upper()} byte-order mark but is not {encoding.upper()} text")
            text.warnings.append(f"caption: {name} {why}; written without a caption")
        elif encoding != "utf-8":
            text.fields["caption_encoding"] = encoding
            if encoding in dict(_FALLBACKS).values():
                text.warnings.append(f"caption: {name} is not UTF-8; read as {encoding}")
    if item.metadata_path:
        raw = _read(item.metadata_path)
        text.nbytes += len(raw)
        try:
            doc = parse_json(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise _Failed("metadata", f"{storage.basename(item.metadata_path)}: {_first_line(e)}") from None
        if not isinstance(doc, dict):
            raise _Failed("metadata", f"{storage.basename(item.metadata_path)} must hold a JSON object")
        text.metadata.update(doc)
    if FGDATA_FIELD in text.metadata:
        raise _Failed("metadata", f"{item.name}: the field {FGDATA_FIELD!r} is reserved for fgdata's own metadata")
    if text.caption is None and not item.caption_path and not item.warning:
        _caption_from_fields(item, options.caption_field, text)
    return text


def _caption_from_fields(item: WorkItem, names: tuple[str, ...], text: _Text) -> None:
    """The first of ``names`` in the metadata that holds non-blank text becomes the caption (the field stays in
    the json)."""
    for name in names:
        value = text.metadata.get(name)
        if isinstance(value, str) and value.strip():
            text.caption = value.strip()
            text.fields["caption_field"] = name
            return
    present = [name for name in names if text.metadata.get(name) is not None and not isinstance(text.metadata[name], str)]
    if present:
        where = storage.basename(item.metadata_path) if item.metadata_path else item.name
        text.warnings.append(f"caption: the field {present[0]!r} of {where} is not text; written without a caption")


def _text_members(text: _Text, fields: dict[str, Any]) -> dict[str, bytes]:
    """``txt`` and ``json``: the user's metadata with fgdata's ``fields`` (and the caption's) under its own key."""
    members = {"json": json_bytes(with_fgdata_fields(text.metadata, {**fields, **text.fields}))}
    if text.caption is not None:
        members["txt"] = text.caption.encode()
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


def _image_samples(item: WorkItem, options: ShardOptions) -> tuple[dict[str, bytes], int, list[str]]:
    from fgdata.media import IMAGE_EXTS, describe_image
    from fgdata.media.errors import MediaError

    data = _read(item.path)
    read = len(data)  # the input's bytes, whatever re-encoding makes of them
    try:
        facts = describe_image(data)
        source_ext = _PIL_EXT.get(facts["format"]) or item.path.rpartition(".")[2].lower()
        if options.reencode_images or source_ext not in IMAGE_EXTS:  # AVIF, HEIC, ...: loaders read none of them
            data, ext = _reencode(data, options, source_ext)
            facts = describe_image(data)
        else:
            _check_complete(data, facts["format"])
            ext = source_ext
    except MediaError as e:
        raise _Failed("image-decode", _first_line(e)) from None
    text = _caption_and_metadata(item, options)
    fields = {"source": item.name, "width": facts["width"], "height": facts["height"], "mode": facts["mode"]}
    return {ext: data, **_text_members(text, fields)}, read + text.nbytes, text.warnings


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


def _video_samples(item: WorkItem, options: ShardOptions) -> tuple[list[tuple[str, dict[str, bytes]]], int, list[str],
                                                                   list[tuple[float, bool]]]:
    """The item's samples, input bytes read, warnings, and for ``--clip-seconds`` each clip's (length, longer
    than asked)."""
    from fgdata.media import check_member, probe_video
    from fgdata.media.camera import slice_camera, transform_intrinsics
    from fgdata.media.errors import MediaError

    from fgdata.producers import transcode

    data = _read(item.path)
    ext = item.path.rpartition(".")[2].lower()
    problem = check_member("mp4", data)  # any video extension selects the same container check
    if problem:
        raise _Failed(problem, f"{item.name} does not decode")
    try:
        info = probe_video(data)
    except MediaError as e:
        raise _Failed("video-decode", _first_line(e)) from None
    camera = _camera(item, info.frame_count)
    text = _caption_and_metadata(item, options)
    nbytes = text.nbytes + len(data) + (camera[2] if camera else 0)
    key = sample_key(item.index)
    if options.clip_seconds is None and not options.reencode_video:
        members = {ext: data, **_text_members(text, {"source": item.name, **info.to_dict()})}
        if camera:
            members["poses.npy"], members["intrinsics.npy"] = _npy(camera[0]), _npy(camera[1])
        return [(key, members)], nbytes, text.warnings, []
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
            members = {out_ext: clip.data, **_text_members(text, fields)}
            if camera:
                poses, intrinsics = slice_camera(camera[0], camera[1], clip.frame_indices)
                crop = {"resize_w": clip_info.width, "resize_h": clip_info.height, "crop_x0": 0, "crop_y0": 0}
                members["poses.npy"] = _npy(poses)
                members["intrinsics.npy"] = _npy(transform_intrinsics(intrinsics, info.width, info.height, crop))
            samples.append((key if options.clip_seconds is None else f"{key}_{j:04d}", members))
    except MediaError as e:
        raise _Failed("video-decode", _first_line(e)) from None
    if options.clip_seconds is None:
        return samples, nbytes, text.warnings, []
    frame = 1 / info.fps if info.fps else 0.0
    lengths = [clip.end - clip.start for clip in clips]
    return samples, nbytes, text.warnings, [(n, n > options.clip_seconds + frame + 1e-6) for n in lengths]


# -- entry point ---------------------------------------------------------------


def transform(position: int, item: WorkItem, options: ShardOptions) -> Outcome:
    """Turn one work item into samples; every error becomes a failure reason, never an exception."""
    from fgdata.media.image import pixel_limit

    out = Outcome(position=position, index=item.index, name=item.name)
    try:
        with pixel_limit(options.max_pixels):
            _transform_into(out, item, options)
    except _Failed as e:
        out.reason = str(e)
    except Exception as e:  # noqa: BLE001 - a strange input must not end a long job; it is reported
        out.reason = f"error: {type(e).__name__}: {_first_line(e)}"
    return out


def _transform_into(out: Outcome, item: WorkItem, options: ShardOptions) -> None:
    """The body of :func:`transform`: fill ``out`` with the item's samples; a failure raises :class:`_Failed`."""
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
        members, out.nbytes, out.warnings = _image_samples(item, options)
        out.samples = [(sample_key(item.index), members)]
    else:
        out.samples, out.nbytes, out.warnings, out.clips = _video_samples(item, options)
