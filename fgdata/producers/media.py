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

Image checks: a JPEG kept as it is has its header read (size, EXIF orientation, ICC profile: what
decides whether it needs a display change) and its end marker (EOI) checked; a JPEG without the
marker is fully decoded, so trailing garbage is accepted but truncation is not. Any other image
is fully decoded (to learn whether a viewer shows it differently), and so is everything re-encoded.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import io
import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from fgdata import storage
from fgdata.errors import FgdataError, OptionError
from fgdata.media.display import Display, parse_background
from fgdata.producers.scenes import CLIP_FIELDS, SceneOptions
from fgdata.shards.metadata import FGDATA_FIELD, parse_json, with_fgdata_fields
from fgdata.workitem import WorkItem, sample_key
from fgdata.storage.http import DownloadFailed, DownloadOptions, configure

Kind = Literal["images", "videos", "prompts"]
IMAGE_FORMATS = ("jpg", "png", "webp")
#: ``--resize-mode`` choices, as img2dataset names them (``no``: sizes kept).
RESIZE_MODES = ("no", "keep_ratio", "keep_ratio_largest", "center_crop", "border")
#: ``--format`` choices: one output format, or ``keep`` (each input's own format).
FORMAT_CHOICES = (*IMAGE_FORMATS, "keep")
_PIL_EXT = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tiff"}
_ADDRESS = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")


@dataclass(frozen=True)
class ShardOptions:
    """What the transform does; part of the job record, so a resumed job must use the same options.

    Images: every output is one ``image_format`` (``jpg`` by default; ``keep`` keeps each input's
    format). An input already in that format which needs no display change (EXIF orientation,
    16-bit, CMYK, transparency, wide-gamut ICC: :mod:`fgdata.media.display`) and no ``max_side``
    is kept byte for byte; anything else is decoded as a viewer shows it and encoded (JPEG and
    WebP at ``quality``; ``keep`` encodes jpg/png/webp inputs in their own format, others as PNG).
    """

    kind: Kind
    max_side: int | None = None
    image_format: str = "jpg"
    quality: int = 95
    background: str = "white"  # transparency is composited on it: white, black, gray or #rrggbb
    keep_icc: bool = False  # keep wide-gamut ICC profiles instead of converting to sRGB
    clip_seconds: float | None = None
    exact_clips: bool = False
    fps: float | None = None
    caption_field: tuple[str, ...] = ("caption", "text", "prompt")  # metadata fields tried for a missing caption
    max_pixels: int | None = None  # the decompression-bomb limit (None: Pillow's, or FGDATA_MAX_PIXELS)
    download: DownloadOptions | None = None  # set for jobs whose inputs are http(s) URLs
    dedupe: str | None = None  # "sha256": keep the first of inputs with equal bytes (images)
    # img2dataset's resize and filters (images); None is "not set", so older job records still match
    resize_mode: str | None = None  # one of RESIZE_MODES, with image_size
    image_size: int | None = None
    min_image_size: int | None = None  # the smaller side below it: filtered
    max_image_area: int | None = None  # width x height above it: filtered
    max_aspect_ratio: float | None = None  # longer side / shorter side above it: filtered
    require_caption: bool | None = None  # True: an input without a caption fails ("caption"); None: not set
    scenes: SceneOptions | None = None  # --split scenes (videos): single-shot clips, fgdata.producers.scenes

    def __post_init__(self) -> None:
        if self.image_format not in FORMAT_CHOICES:
            raise OptionError(f"--format must be one of {', '.join(FORMAT_CHOICES)}, not {self.image_format!r}")
        try:
            parse_background(self.background)
        except ValueError as e:
            raise OptionError(f"--background: {e}") from None
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
        if self.dedupe not in (None, "sha256"):
            raise OptionError(f"--dedupe must be sha256, not {self.dedupe!r}")
        if self.scenes is not None and (self.clip_seconds is not None or self.reencode_video):
            raise OptionError("--split scenes cuts clips itself: give --clip-mode exact instead of --clip-seconds, "
                              "--exact, --fps or --max-side")
        self._check_resize()

    def _check_resize(self) -> None:
        if self.resize_mode not in (None, *RESIZE_MODES):
            raise OptionError(f"--resize-mode must be one of {', '.join(RESIZE_MODES)}, not {self.resize_mode!r}")
        resizing = self.resize_mode not in (None, "no")
        if resizing and self.image_size is None:
            raise OptionError(f"--resize-mode {self.resize_mode} needs --image-size N")
        if self.image_size is not None and not resizing:
            raise OptionError("--image-size needs a --resize-mode that resizes (keep_ratio, keep_ratio_largest, center_crop or border)")
        if self.image_size is not None and self.image_size < 2:
            raise OptionError("--image-size must be at least 2")
        if resizing and self.max_side is not None:
            raise OptionError("--max-side N is --resize-mode keep_ratio_largest --image-size N without upscaling: "
                              "give one of them")
        for name, value in (("--min-image-size", self.min_image_size), ("--max-image-area", self.max_image_area)):
            if value is not None and value < 1:
                raise OptionError(f"{name} must be at least 1")
        if self.max_aspect_ratio is not None and self.max_aspect_ratio < 1:
            raise OptionError("--max-aspect-ratio must be at least 1 (longer side / shorter side)")

    @property
    def resize(self) -> tuple[str, int, bool] | None:
        """How images are resized: (img2dataset's mode, size, whether smaller images are enlarged), or None.
        ``--max-side N`` is keep_ratio_largest to N that never enlarges."""
        if self.resize_mode not in (None, "no") and self.image_size is not None:
            return self.resize_mode, self.image_size, True
        if self.max_side is not None and self.kind == "images":
            return "keep_ratio_largest", self.max_side, False
        return None

    @property
    def display(self) -> Display:
        """How images are normalised (:mod:`fgdata.media.display`)."""
        return Display(background=parse_background(self.background), keep_icc=self.keep_icc)

    @property
    def reencode_video(self) -> bool:
        return self.fps is not None or self.max_side is not None or self.exact_clips

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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
    normalised: tuple[str, ...] = ()  # the display changes made to an image (fgdata.media.display.CHANGES)
    image_format: str | None = None  # the image member written (images)
    captioned: bool = True  # False: written without a caption (no txt member, or an empty one)


class _Failed(Exception):
    def __init__(self, category: str, message: str):
        super().__init__(f"{category}: {message}")


def _first_line(e: BaseException) -> str:
    """The first line of an error, without object addresses (reports must be byte-identical on reruns)."""
    text = _ADDRESS.sub("", str(e)).strip()
    return text.splitlines()[0] if text else type(e).__name__


def input_suffix(path: str) -> str:
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


class _SourceShard:
    """The local source shard a process last read a member of, kept open while :func:`source_shards_open` holds
    (a unit written by one process): one open per source shard, not one per sample. Outside it each read opens
    the shard, so a process that outlives a job never reads a replaced file through an old descriptor."""

    scoped = 0
    path: str | None = None
    fd: int | None = None

    @classmethod
    def read(cls, path: str, size: int, offset: int) -> bytes:
        import os

        from fgdata.shards.scan import pread_exact

        if not cls.scoped:
            fd = os.open(path, os.O_RDONLY)
            try:
                return pread_exact(fd, size, offset)
            finally:
                os.close(fd)
        if cls.path != path:
            cls.close()
            cls.fd, cls.path = os.open(path, os.O_RDONLY), path
        assert cls.fd is not None
        return pread_exact(cls.fd, size, offset)

    @classmethod
    def close(cls) -> None:
        import os

        if cls.fd is not None:
            os.close(cls.fd)
        cls.fd = cls.path = None


@contextlib.contextmanager
def source_shards_open() -> Iterator[None]:
    """Within it, the media of a local source shard's samples (``WorkItem.data_at``) are read through one open
    descriptor per shard (see :class:`_SourceShard`); closed on leaving."""
    _SourceShard.scoped += 1
    try:
        yield
    finally:
        _SourceShard.scoped -= 1
        if not _SourceShard.scoped:
            _SourceShard.close()


def _media(item: WorkItem) -> tuple[bytes, str]:
    """The input's media bytes (inline from a table, or read from its path) and the name its extension comes
    from."""
    if item.data is not None:
        return item.data, item.name
    if item.data_at is not None:  # a member of a local source shard: read here, one sample at a time
        offset, size = item.data_at
        try:
            data = _SourceShard.read(item.path, size, offset)
        except OSError as e:
            raise _Failed("read", f"{item.path}: {_first_line(e)}") from None
        if len(data) != size:
            raise _Failed("read", f"{item.path} ends inside {item.name}")
        return data, item.name
    return _read(item.path), item.path


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
    if FGDATA_FIELD in text.metadata and item.members is None:  # a source shard's json: extended, not refused
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


def _has_caption(caption: str | None) -> bool:
    """Whether a sample carries a caption a loader can use (not absent, not blank)."""
    return bool(caption and caption.strip())


def _text_of(item: WorkItem, options: ShardOptions) -> _Text:
    """:func:`_caption_and_metadata`; an input without a caption fails here under ``--require-caption``."""
    text = _caption_and_metadata(item, options)
    if options.require_caption and not _has_caption(text.caption):
        said = [w.removeprefix("caption: ") for w in text.warnings if w.startswith("caption: ")]
        why = said[-1] if said else "a blank one" if text.caption is not None else "none found"
        raise _Failed("caption", f"no caption ({why}); --require-caption skips it")
    return text


def _text_members(text: _Text, fields: dict[str, Any]) -> dict[str, bytes]:
    """``txt`` and ``json``: the user's metadata with fgdata's ``fields`` (and the caption's) under its own key."""
    members = {"json": json_bytes(with_fgdata_fields(text.metadata, {**fields, **text.fields}))}
    if text.caption is not None:
        members["txt"] = text.caption.encode()
    return members


# -- images ------------------------------------------------------------------


def mixed_format_warning(written: Counter[str], options: ShardOptions) -> str | None:
    """The one warning of ``--format keep`` when the dataset holds several image formats (``written``: the
    image members written, by extension, over the whole dataset): what each reader will miss."""
    from fgdata.media.decode import mixed_image_formats

    if options.kind != "images" or options.image_format != "keep":
        return None
    mixed = mixed_image_formats(written)
    return f"--format keep: the samples will carry {mixed[0]}" if mixed else None


def _png_16bit(data: bytes) -> bool:
    """A PNG with 16 bits per sample (IHDR bit depth): Pillow keeps only the high byte of RGB(A)
    ones, other readers keep all 16 bits, so it is stored as 8-bit."""
    return data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) > 24 and data[24] == 16


def _encode(im: Any, ext: str, options: ShardOptions, icc: bytes | None) -> bytes:
    """Encode a displayed image (RGB or L) as ``ext``; ``icc``: a kept profile to embed (else none: sRGB is implied,
    in every format; Pillow would otherwise copy the input's own profile into a PNG)."""
    if ext == "webp" and im.mode != "RGB":
        im = im.convert("RGB")
    extra = {"icc_profile": icc}
    buf = io.BytesIO()
    if ext == "jpg":
        im.save(buf, "JPEG", quality=options.quality, **extra)
    elif ext == "webp":
        im.save(buf, "WEBP", quality=options.quality, method=4, **extra)
    else:
        im.save(buf, "PNG", compress_level=6, **extra)
    return buf.getvalue()


def _resize_scale(width: int, height: int, resize: tuple[str, int, bool]) -> float:
    """The scale of a ``resize`` (:attr:`ShardOptions.resize`) for an image of this size (either
    orientation: it depends on the shorter and longer side only)."""
    mode, size, enlarge = resize
    side = min(width, height) if mode in ("keep_ratio", "center_crop") else max(width, height)
    scale = size / side
    return scale if enlarge else min(1.0, scale)


def _resized(im: Any, resize: tuple[str, int, bool], background: tuple[int, int, int]) -> Any:
    """``im`` resized as img2dataset's mode says: keep_ratio (shorter side to N), keep_ratio_largest
    (longer side to N), center_crop (shorter side to N, then the centre N x N), border (inside N x N,
    padded to N x N with ``background``)."""
    from PIL import Image

    mode, size, _ = resize
    scale = _resize_scale(im.width, im.height, resize)
    if scale != 1.0:  # the side the mode fixes comes out N exactly: round(side * N / side)
        size_after = (max(1, round(im.width * scale)), max(1, round(im.height * scale)))
        im = im.resize(size_after, Image.Resampling.BICUBIC, reducing_gap=3.0)
    if mode == "center_crop":
        left, top = (im.width - size) // 2, (im.height - size) // 2
        im = im.crop((left, top, left + size, top + size))
    elif mode == "border" and im.size != (size, size):
        fill = background if im.mode == "RGB" else round(sum(background) / 3)
        canvas = Image.new(im.mode, (size, size), fill)
        canvas.paste(im, ((size - im.width) // 2, (size - im.height) // 2))
        im = canvas
    return im


def _filtered(width: int, height: int, options: ShardOptions) -> str | None:
    """Why an image of this size is filtered out (``--min-image-size``, ``--max-image-area``,
    ``--max-aspect-ratio``, as img2dataset applies them to the original), or None."""
    short, long = min(width, height), max(width, height)
    if options.min_image_size is not None and short < options.min_image_size:
        return f"{width}x{height}: smaller side below --min-image-size {options.min_image_size}"
    if options.max_image_area is not None and width * height > options.max_image_area:
        return f"{width}x{height}: area above --max-image-area {options.max_image_area}"
    if options.max_aspect_ratio is not None and long > options.max_aspect_ratio * short:
        return f"{width}x{height}: aspect ratio above --max-aspect-ratio {options.max_aspect_ratio:g}"
    return None


def _reencode(data: bytes, options: ShardOptions, ext: str, changes: dict[str, Any]) -> bytes:
    """Decode as a viewer shows it (recording the changes), resize (``--resize-mode`` or ``--max-side``),
    encode as ``ext``."""
    from fgdata.media.image import decode_display, open_image

    draft = None
    resize = options.resize
    if resize is not None:
        # DCT scaling: decode a JPEG at >= 2x the target (Pillow's reducing gap) instead of full size.
        w, h = open_image(data).size
        s = min(1.0, 2 * _resize_scale(w, h, resize))
        draft = (math.ceil(w * s), math.ceil(h * s))
    im, made = decode_display(data, options.display, draft)
    changes.update(made)
    if resize is not None:
        im = _resized(im, resize, options.display.background)
    icc = open_image(data).info.get("icc_profile") if options.keep_icc and "cmyk" not in changes else None
    return _encode(im, ext, options, icc)


def _image_samples(item: WorkItem, options: ShardOptions) -> tuple[dict[str, bytes], int, list[str], tuple[str, ...]]:
    """The image (kept, or normalised and encoded as ``--format`` says), its json and caption; the bytes
    read, the caption's warnings and the display changes made."""
    from fgdata.media import IMAGE_EXTS, describe_image
    from fgdata.media.errors import MediaError
    from fgdata.media.image import _load, decode_display, jpeg_display_changes, jpeg_header, open_image

    text = _text_of(item, options) if options.require_caption else None  # skip the decode of a refused input
    data, media_name = _media(item)
    read = len(data)  # the input's bytes, whatever re-encoding makes of them
    digest = hashlib.sha256(data).hexdigest() if options.download is not None or options.dedupe else None
    try:
        head = jpeg_header(data)  # one walk of a JPEG's markers: its size and what decides its display
        facts = head or describe_image(data)
        source_ext = _PIL_EXT.get(facts["format"]) or input_suffix(media_name)
        why = _filtered(facts["width"], facts["height"], options)
        if why is not None:
            raise _Failed("filtered", why)
        ext = source_ext if options.image_format == "keep" else options.image_format
        deep = _png_16bit(data)
        # AVIF, HEIC, ... are always encoded: the loaders read none of them.
        reencode = options.resize is not None or ext != source_ext or deep or source_ext not in IMAGE_EXTS
        changes: dict[str, Any] = {"8-bit": "16-bit PNG"} if deep else {}
        if not reencode:  # kept unless a viewer would show it differently: a JPEG's header tells, else a decode
            if head is None:
                changes = decode_display(data, options.display)[1]
            else:
                changes = jpeg_display_changes(head, options.display)
                if not data.rstrip(b"\0").endswith(b"\xff\xd9"):
                    _load(open_image(data))  # no end marker: a full decode decides (trailing garbage is accepted)
            reencode = bool(changes)
        if reencode:
            ext = ext if ext in IMAGE_FORMATS else "png"  # keep: a GIF, BMP, TIFF, AVIF, ... to encode becomes PNG
            data = _reencode(data, options, ext, changes)
            facts = describe_image(data)
    except MediaError as e:
        raise _Failed("image-decode", _first_line(e)) from None
    text = text or _text_of(item, options)
    fields: dict[str, Any] = {"source": item.name, "width": facts["width"], "height": facts["height"],
                              "mode": facts["mode"]}
    if changes:
        fields["normalised"] = dict(sorted(changes.items()))
    if digest is not None:  # the input bytes' hash (URL inputs, --dedupe), whatever re-encoding did after
        fields["sha256"] = digest
    return {ext: data, **_text_members(text, fields)}, read + text.nbytes, text.warnings, tuple(sorted(changes))


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
    from fgdata.media import VIDEO_EXTS, check_member, probe_video
    from fgdata.media.camera import slice_camera, transform_intrinsics
    from fgdata.media.errors import MediaError

    from fgdata.producers import transcode

    data, media_name = _media(item)
    ext = input_suffix(media_name)
    if item.data is not None and ext not in VIDEO_EXTS:  # a table cell without a file name: mp4
        ext = "mp4"
    if options.scenes is not None:  # its one analysis decode is also the check
        return (*_scene_samples(item, options, data, ext), [])
    problem = check_member("mp4", data)  # any video extension selects the same container check
    if problem:
        raise _Failed(problem, f"{item.name} does not decode")
    try:
        info = probe_video(data)
    except MediaError as e:
        raise _Failed("video-decode", _first_line(e)) from None
    camera = _camera(item, info.frame_count)
    text = _text_of(item, options)
    nbytes = text.nbytes + len(data) + (camera[2] if camera else 0)
    key = item.key or sample_key(item.index)
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


def _scene_samples(item: WorkItem, options: ShardOptions, data: bytes,
                   ext: str) -> tuple[list[tuple[str, dict[str, bytes]]], int, list[str]]:
    """``--split scenes``: one analysis decode, then the kept clips with their flat fields
    (:mod:`fgdata.producers.scenes`); dropped clips become ``filtered`` warnings, and a video that keeps
    none fails as ``filtered``. Returns the samples, the input bytes read and the warnings."""
    from fgdata.media.camera import slice_camera
    from fgdata.media.errors import MediaError
    from fgdata.media.scenes import analyse_video

    from fgdata.producers import scenes as sc

    scenes = options.scenes
    assert scenes is not None  # the caller's branch
    text = _caption_and_metadata(item, options)
    clash = sorted(set(text.metadata) & set(CLIP_FIELDS))
    if clash:
        raise _Failed("metadata", f"{item.name}: the field {clash[0]!r} is a clip field of --split scenes")
    try:
        analysis = analyse_video(data, network_frames=scenes.cut_detector == "transnetv2")
    except MediaError as e:
        raise _Failed("video-decode", _first_line(e)) from None
    if analysis.declared_frames and len(analysis.times) < analysis.declared_frames:
        raise _Failed("video-truncated", f"{item.name}: {len(analysis.times)} of {analysis.declared_frames} frames decode")
    camera = _camera(item, len(analysis.times))
    try:
        planned, dropped, method = sc.plan_clips(analysis, scenes)
        if scenes.clip_mode == "exact":
            written = sc.exact_clips(data, analysis, planned)
        else:
            written = sc.copy_clips(data, analysis, planned, "webm" if ext == "webm" else "mp4")
    except MediaError as e:
        raise _Failed("video-decode", _first_line(e)) from None
    samples: list[tuple[str, dict[str, bytes]]] = []
    for clip, out in zip(planned, written):
        if out is None:
            dropped.append(f"too-short: no keyframe between {analysis.times[clip.first]:.2f} s and "
                           f"{analysis.times[clip.last]:.2f} s to start a stream copy (--clip-mode exact cuts anywhere)")
            continue
        j = len(samples)
        doc = {**text.metadata, **sc.clip_fields(item.name, j, analysis, clip, out, scenes, method)}
        members = {("mp4" if scenes.clip_mode == "exact" or ext != "webm" else "webm"): out.data,
                   "json": json_bytes(with_fgdata_fields(doc, {"source": item.name, **text.fields}))}
        if text.caption is not None:
            members["txt"] = text.caption.encode()
        if camera:
            poses, intrinsics = slice_camera(camera[0], camera[1], list(range(out.first, out.last + 1)))
            members["poses.npy"], members["intrinsics.npy"] = _npy(poses), _npy(intrinsics)
        samples.append((f"{sample_key(item.index)}_{j:04d}", members))
    text.warnings += [f"filtered: {item.name}: {why}" for why in dropped]
    if not samples:
        kinds = Counter(why.split(":")[0] for why in dropped)
        raise _Failed("filtered", f"no clip kept: {', '.join(f'{n} {k}' for k, n in kinds.items()) or 'no scene'}"
                                  + (f"; first: {dropped[0]}" if dropped else ""))
    return samples, len(data) + text.nbytes + (camera[2] if camera else 0), text.warnings


# -- entry point ---------------------------------------------------------------


def transform(position: int, item: WorkItem, options: ShardOptions) -> Outcome:
    """Turn one work item into samples; every error becomes a failure reason, never an exception."""
    from fgdata.media.image import pixel_limit

    out = Outcome(position=position, index=item.index, name=item.name)
    if options.download is not None:
        configure(options.download)
    try:
        with pixel_limit(options.max_pixels):
            _transform_into(out, item, options)
    except _Failed as e:
        out.reason = str(e)
    except Exception as e:  # noqa: BLE001 - a strange input must not end a long job; it is reported
        out.reason = f"error: {type(e).__name__}: {_first_line(e)}"
    # a reason may quote a URL (a redirect's target, a storage error): stored with its credentials redacted
    if out.reason is not None:
        out.reason = storage.redact_text(out.reason)
    out.warnings = [storage.redact_text(w) for w in out.warnings]
    return out


def _transform_into(out: Outcome, item: WorkItem, options: ShardOptions) -> None:
    """The body of :func:`transform`: fill ``out`` with the item's samples; a failure raises :class:`_Failed`."""
    if item.refused:
        out.reason = item.refused
    elif options.kind == "prompts":
        if not item.caption:
            raise _Failed("caption", "empty prompt")
        out.samples = [(item.key or sample_key(item.index), {"txt": item.caption.encode()})]
        out.nbytes = len(item.caption.encode())
    elif not item.path and item.data is None:
        raise _Failed("missing-path", "no media path")
    elif options.kind == "images":
        members, out.nbytes, out.warnings, out.normalised = _image_samples(item, options)
        out.samples = [(item.key or sample_key(item.index), members)]
        out.image_format = next(ext for ext in members if ext not in ("json", "txt"))
    else:
        out.samples, out.nbytes, out.warnings, out.clips = _video_samples(item, options)
    if item.members:  # a source sample's other members, carried as they are
        for _, members in out.samples:
            for ext, data in item.members.items():
                members.setdefault(ext, data)
    out.captioned = all(_has_caption(m["txt"].decode()) if "txt" in m else False for _, m in out.samples)
