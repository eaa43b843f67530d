"""Image decode and the reference training transform, in two modes.

``resize="reference"`` is the reference's pipeline: full Pillow decode, RGB, a full BICUBIC
resize, the centre crop, then ``x/255`` and per-channel normalisation in float32. Tensors are
bit-identical to the reference loader's for RGB and greyscale sources (palette and alpha
images are converted to RGB before resizing, where the reference resizes first).

``resize="fast"`` (the default) gets its speed from never producing pixels it will throw away:
JPEG DCT scaling (Pillow ``draft`` or simplejpeg) decodes a smaller image when the target is
much smaller than the source, and ``Image.resize(box=...)`` resamples only the centre crop.
Geometry (sizes and crop offsets) is identical; pixels differ slightly (docs/DIFFERENCES.md
gives the measured PSNR). Both modes share the geometry and the float conversion.
"""

from __future__ import annotations

import functools
import io
import math
import os
import warnings
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from PIL import Image

from fgdata.media.errors import ImageDecodeError
from fgdata.media.geometry import ImageGeometry, image_transform_geometry
from fgdata.media.pixels import check_resize, image_to_float

__all__ = [
    "ImageGeometry",
    "check_pixels",
    "describe_image",
    "image_size",
    "image_transform_geometry",
    "load_image_for_training",
    "open_image",
    "pixel_limit",
    "to_rgb",
]

# JPEG DCT scaling decodes to at least this many times the resize target before the bicubic
# step; the box pre-reduction inside the resize (Pillow's "reducing gap") keeps a wider gap.
# These keep PSNR above 35 dB against the full-resolution reference on the bundled photos
# (tests check it) while letting DCT scaling apply to ImageNet-sized JPEGs at 256 px.
DCT_REDUCING_GAP = 1.0
RESIZE_REDUCING_GAP = 2.0

# libjpeg-turbo DCT scaling factors are n/8; used to recover the exact factor from the sizes.
_DCT_FACTORS = tuple(n / 8 for n in range(1, 17))


#: The one environment variable that raises (or lowers) the pixel limit in every process that decodes images.
MAX_PIXELS_ENV = "FGDATA_MAX_PIXELS"
_RAISE_LIMIT = f"allow it with --max-pixels N (shard, prepare) or {MAX_PIXELS_ENV}=N"
_env_applied = False


def _apply_env_limit() -> None:
    """Set Pillow's limit from ``FGDATA_MAX_PIXELS`` once per process, so pool workers, Ray tasks and loaders
    started with it all decode the same images (Pillow's own check in ``Image.open`` reads the same setting)."""
    global _env_applied
    if _env_applied:
        return
    _env_applied = True
    text = os.environ.get(MAX_PIXELS_ENV, "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ImageDecodeError(f"{MAX_PIXELS_ENV} must be a whole number of pixels, not {text!r}")
        Image.MAX_IMAGE_PIXELS = int(text)


@contextmanager
def pixel_limit(limit: int | None) -> Iterator[None]:
    """Decode under ``limit`` pixels (``--max-pixels``); None keeps the process's limit. Restored on exit."""
    _apply_env_limit()
    if limit is None:
        yield
        return
    before = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = limit
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = before


def check_pixels(width: int, height: int) -> None:
    """Refuse an image larger than Pillow's ``MAX_IMAGE_PIXELS`` (a decompression bomb), whoever decodes it.

    Pillow itself only warns between one and two times the limit, and the header fast paths
    (JPEG frame header, PNG IHDR, simplejpeg, pyspng) never ask it, so every path calls this
    instead. Setting ``PIL.Image.MAX_IMAGE_PIXELS = None`` turns the check off, as in Pillow;
    ``FGDATA_MAX_PIXELS`` and :func:`pixel_limit` set it.
    """
    _apply_env_limit()
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:
        raise ImageDecodeError(
            f"cannot decode image: {width}x{height} is {width * height:,} pixels, over Pillow's "
            f"MAX_IMAGE_PIXELS ({limit:,}); refused as a possible decompression bomb; {_RAISE_LIMIT}"
        )


#: HEIC/HEIF (phone photos): Pillow reads them through the ``pillow-heif`` plugin (``pip install 'fgdata[heif]'``).
HEIF_EXTS = frozenset({"heic", "heif", "hif", "heics", "heifs"})
_plugins: bool | None = None


def register_plugins() -> bool:
    """Teach Pillow HEIC/HEIF when ``pillow-heif`` is installed (once per process); True when it is."""
    global _plugins
    if _plugins is None:
        try:
            from pillow_heif import register_heif_opener
        except ImportError:
            _plugins = False
        else:
            register_heif_opener()
            _plugins = True
    return _plugins


@functools.cache
def source_image_extensions() -> frozenset[str]:
    """Every extension (lower case, no dot) of a still-image format Pillow can decode here: derived from Pillow's
    registry, less its stub formats (no decoder) and the formats of video extensions (MPEG is header-only)."""
    from PIL import ImageFile

    from fgdata.media.decode import VIDEO_EXTS

    register_plugins()
    Image.init()
    formats = {ext[1:]: fmt for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN}
    video = {fmt for ext, fmt in formats.items() if ext in VIDEO_EXTS}

    def stub(fmt: str) -> bool:
        factory = Image.OPEN[fmt][0]
        return isinstance(factory, type) and issubclass(factory, ImageFile.StubImageFile)

    return frozenset(ext for ext, fmt in formats.items() if fmt not in video and not stub(fmt))


#: Answered without Pillow's registry, which imports every plugin (about 0.2 s, once per job): the formats
#: of almost every folder, and the sidecar extensions, which are no Pillow format.
_COMMON_IMAGE_EXTS = frozenset({"jpg", "jpeg", "jfif", "jpe", "png", "webp", "gif", "bmp", "tif", "tiff"})
_SIDECAR_EXTS = frozenset({"txt", "json", "npy"})


class SourceImageExtensions(Collection[str]):
    """:func:`source_image_extensions` as a container that asks Pillow's registry only for an uncommon extension."""

    def __contains__(self, ext: object) -> bool:
        if ext in _COMMON_IMAGE_EXTS:
            return True
        return ext not in _SIDECAR_EXTS and ext in source_image_extensions()

    def __iter__(self) -> Iterator[str]:
        return iter(source_image_extensions())

    def __len__(self) -> int:
        return len(source_image_extensions())


def missing_decoder(ext: str) -> str | None:
    """Why a known image extension cannot be read here (its decoder is not installed), or None."""
    if ext in HEIF_EXTS and not register_plugins():
        return f".{ext} (HEIC/HEIF) needs pillow-heif: pip install 'fgdata[heif]'"
    if ext in ("avif", "avifs") and ext not in source_image_extensions():
        return f".{ext} needs a Pillow built with AVIF support (Pillow 11.2 or later wheels)"
    return None


def open_image(data: bytes | str | os.PathLike[str]) -> Image.Image:
    """Open (lazily, header only) image bytes or a file; a one-line ImageDecodeError instead of Pillow's zoo."""
    _apply_env_limit()
    register_plugins()
    try:
        with warnings.catch_warnings():  # between 1x and 2x the limit: check_pixels refuses it instead
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data) if isinstance(data, bytes) else data)
    except Image.DecompressionBombError as e:
        raise ImageDecodeError(f"cannot decode image: {e}; {_RAISE_LIMIT}") from e
    except (OSError, ValueError) as e:
        raise ImageDecodeError(f"cannot decode image: {e}") from e
    check_pixels(im.width, im.height)
    return im


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the header, checked against the pixel limit: the guard for decoders that bypass Pillow."""
    head = _jpeg_header(data) or _png_header(data)
    if head is None:
        return open_image(data).size
    check_pixels(head["width"], head["height"])
    return head["width"], head["height"]


def to_rgb(im: Image.Image) -> Image.Image:
    """RGB before any resampling: palette indices expanded, alpha dropped, grey replicated."""
    return im if im.mode == "RGB" else im.convert("RGB")


def _load(im: Image.Image) -> Image.Image:
    """Force the pixel decode so truncated or corrupt files fail here, as ImageDecodeError."""
    try:
        im.load()
    except (OSError, ValueError, SyntaxError) as e:
        raise ImageDecodeError(f"cannot decode image: {e}") from e
    return im


def _reference_rgb_crop(data: bytes, input_res: int | tuple[int, int]) -> np.ndarray:
    """HWC uint8 the reference's way: full decode, RGB, full BICUBIC resize, centre crop."""
    im = to_rgb(_load(open_image(data)))
    g = image_transform_geometry(im.width, im.height, input_res)
    im = im.resize((g.resize_w, g.resize_h), Image.Resampling.BICUBIC)
    im = im.crop((g.crop_x0, g.crop_y0, g.crop_x0 + g.crop_w, g.crop_y0 + g.crop_h))
    return np.asarray(im)


def _dct_factor(w: int, h: int, dw: int, dh: int) -> float:
    """The n/8 factor that turned (w, h) into (dw, dh) (libjpeg rounds sizes up)."""
    for f in _DCT_FACTORS:
        if math.ceil(w * f) == dw and math.ceil(h * f) == dh:
            return f
    return dw / w


def _simplejpeg_scaled(data: bytes, need_w: int, need_h: int) -> Image.Image | None:
    """simplejpeg's DCT-scaled decode to at least (need_w, need_h); None when unavailable or refused."""
    try:
        import simplejpeg
    except ImportError:
        return None
    try:
        return Image.fromarray(simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=need_w, min_height=need_h, fastdct=True))
    except ValueError:  # e.g. a JPEG flavour libjpeg-turbo's fast API refuses; Pillow decides instead
        return None


def _fast_rgb_crop(
    data: bytes, input_res: int | tuple[int, int], use_simplejpeg: bool
) -> np.ndarray:
    """HWC uint8 centre crop with the reference geometry, decoding and resampling as little as possible.

    A plain RGB or grey JPEG with simplejpeg allowed never goes through Pillow's parser: its
    frame header gives the size, simplejpeg decodes DCT-scaled, Pillow only resamples.
    """
    head = _checked_jpeg_header(data)
    src = None
    if head is not None:
        w, h = head["width"], head["height"]
    else:
        src = open_image(data)
        w, h = src.size
    g = image_transform_geometry(w, h, input_res)
    need_w = math.ceil(g.resize_w * DCT_REDUCING_GAP)
    need_h = math.ceil(g.resize_h * DCT_REDUCING_GAP)
    im = None
    if use_simplejpeg and head is not None and head["mode"] in ("RGB", "L"):
        im = _simplejpeg_scaled(data, need_w, need_h)
    if im is None:
        src = src or open_image(data)
        if src.format == "JPEG" and w >= 2 * need_w and h >= 2 * need_h:
            src.draft("RGB", (need_w, need_h))
        im = _load(src)
    f = _dct_factor(w, h, im.width, im.height) if im.size != (w, h) else 1.0
    if im.mode != "L":  # grey resamples 3x cheaper and converts exactly the same afterwards
        im = to_rgb(im)
    # The crop box of the resized image, mapped back into (possibly DCT-scaled) source pixels:
    # Pillow then resamples only the kept region, with the same scale and pixel centres as a
    # full resize followed by a crop (its filter still reads pixels just outside the box).
    sx = w / g.resize_w * f
    sy = h / g.resize_h * f
    box = (
        g.crop_x0 * sx,
        g.crop_y0 * sy,
        (g.crop_x0 + g.crop_w) * sx,
        (g.crop_y0 + g.crop_h) * sy,
    )
    out = im.resize((g.crop_w, g.crop_h), Image.Resampling.BICUBIC, box=box, reducing_gap=RESIZE_REDUCING_GAP)
    return np.asarray(to_rgb(out))


def load_image_for_training(
    data: bytes,
    input_res: int | tuple[int, int],
    norm_mean: Sequence[float] = (0.5, 0.5, 0.5),
    norm_std: Sequence[float] = (0.5, 0.5, 0.5),
    *,
    resize: str = "fast",
    simplejpeg: bool = True,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Image bytes -> float32 ``[3, H, W]`` normalised, the reference geometry, RGB conversion first.

    ``resize="reference"`` gives the reference loader's tensor bit for bit (see the module
    docstring); ``"fast"`` is several times faster. ``simplejpeg=False`` keeps the fast path
    off simplejpeg so its result depends on Pillow alone (the same on machines with and
    without the ``fastjpeg`` extra). ``out`` is where to write (e.g. a batch slot); else a new array.
    """
    if check_resize(resize) == "reference":
        rgb = _reference_rgb_crop(data, input_res)
    else:
        rgb = _fast_rgb_crop(data, input_res, simplejpeg)
    return image_to_float(rgb, norm_mean, norm_std, out)


_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_JPEG_MODES = {1: "L", 3: "RGB", 4: "CMYK"}


def _jpeg_header(data: bytes) -> dict | None:
    """Width, height and mode from a baseline/progressive JPEG's frame header, as Pillow reports them.

    Walking the marker segments costs microseconds, against a few hundred for Pillow's Python
    parser; sharding millions of JPEGs pays that per file. None when the file is anything
    unusual (12-bit, odd component counts, no frame header before the scan): Pillow decides then.
    """
    if data[:2] != b"\xff\xd8":
        return None
    pos, n = 2, len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            pos += 2
            continue
        if marker in _JPEG_SOF:
            if pos + 10 > n:
                return None
            height = int.from_bytes(data[pos + 5 : pos + 7], "big")
            width = int.from_bytes(data[pos + 7 : pos + 9], "big")
            mode = _JPEG_MODES.get(data[pos + 9])
            if data[pos + 4] != 8 or mode is None or not width or not height:
                return None
            return {"width": width, "height": height, "mode": mode, "format": "JPEG"}
        if marker == 0xDA:  # start of scan before any frame header
            return None
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    return None


def _checked_jpeg_header(data: bytes) -> dict | None:
    """:func:`_jpeg_header`, refusing sizes over the pixel limit: what every JPEG fast path reads."""
    head = _jpeg_header(data)
    if head is not None:
        check_pixels(head["width"], head["height"])
    return head


def _png_header(data: bytes) -> dict | None:
    """Width and height from a PNG's IHDR chunk (the first chunk, at a fixed offset); None if not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR" or len(data) < 24:
        return None
    return {"width": int.from_bytes(data[16:20], "big"), "height": int.from_bytes(data[20:24], "big")}


def describe_image(data: bytes) -> dict:
    """Header facts for inspect/provenance: width, height, mode, format (no pixel decode)."""
    facts = _checked_jpeg_header(data)
    if facts is not None:
        return facts
    im = open_image(data)
    return {"width": im.width, "height": im.height, "mode": im.mode, "format": im.format}
