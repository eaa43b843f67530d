"""Images as a person sees them: the one decode rule of ``shard images``, the loaders, previews and ``encode``.

Several kinds of image decode differently in a plain ``Image.open(...).convert("RGB")`` (what most
readers do) than in an image viewer. :func:`display_image` turns a loaded Pillow image into what a
viewer shows, 8-bit RGB or greyscale, and names each change it made (the keys of
:data:`CHANGES`):

- ``orientation``: the EXIF Orientation tag is applied (the pixels are turned; the tag is gone);
- ``animation``: an animated image (GIF, APNG, WebP, AVIF) is its first frame, as every loader reads
  it; the detail is its frame count (a camera's multi-picture JPEG is not an animation);
- ``8-bit``: 16-bit and 32-bit integer images are scaled to 8 bits (``round(x * 255 / 65535)``;
  32-bit values outside 0..65535 by their own range), floating-point images from 0..1 (or their
  own range when wider), never clipped as Pillow's ``convert`` does;
- ``cmyk``: CMYK and YCCK become RGB, through the image's CMYK ICC profile when it has one;
- ``alpha``: transparency (an alpha channel, or a palette's or colour key's transparency) is
  composited on the background (white unless chosen); a fully opaque alpha channel is dropped
  without counting as a change;
- ``icc``: an RGB ICC profile whose primaries are not sRGB's (Display P3, Adobe RGB, ...) is
  converted to sRGB (perceptual intent), unless ``keep_icc``; the result carries no profile (sRGB is
  implied), so its bytes never depend on when the conversion ran.

Docs: docs/FORMATS.md (what ``shard images`` writes) and docs/DIFFERENCES.md (``resize="reference"``
keeps the reference loaders' plain decode instead).
"""

from __future__ import annotations

import functools
import io
import re
from dataclasses import dataclass
from typing import Any

from PIL import Image

from fgdata.media.errors import ImageDecodeError

__all__ = ["BACKGROUNDS", "CHANGES", "Display", "display_image", "parse_background", "wide_gamut_profile"]

#: The changes :func:`display_image` can make, in the order it makes them.
CHANGES = ("animation", "8-bit", "cmyk", "alpha", "icc", "orientation")
#: Named backgrounds for compositing transparency; ``#rrggbb`` is accepted too.
BACKGROUNDS = {"white": (255, 255, 255), "black": (0, 0, 0), "gray": (128, 128, 128)}

_HIGH_DEPTH = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I", "F"})
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_ORIENTATION_TAG = 0x0112
_CHROMATICITY_TOLERANCE = 0.005


def parse_background(text: str) -> tuple[int, int, int]:
    """``white`` / ``black`` / ``gray`` / ``#rrggbb`` -> an RGB triple; ValueError names the choices."""
    value = text.strip().lower()
    if value in BACKGROUNDS:
        return BACKGROUNDS[value]
    if re.fullmatch(r"#[0-9a-f]{6}", value):
        return int(value[1:3], 16), int(value[3:5], 16), int(value[5:7], 16)
    raise ValueError(f"background {text!r}: use {', '.join(BACKGROUNDS)} or #rrggbb")


@dataclass(frozen=True)
class Display:
    """How :func:`display_image` composites transparency and whether it keeps wide-gamut profiles."""

    background: tuple[int, int, int] = BACKGROUNDS["white"]
    keep_icc: bool = False

    @property
    def background_hex(self) -> str:
        return "#%02x%02x%02x" % self.background


def exif_orientation(im: Image.Image) -> int:
    """The EXIF Orientation (1..8) of an opened image; 1 when absent or invalid."""
    try:
        value = im.getexif().get(_ORIENTATION_TAG, 1)
    except Exception:  # noqa: BLE001 - a damaged EXIF block must not stop a decode; it is ignored
        return 1
    return value if isinstance(value, int) and value in _TRANSPOSE else 1


@functools.lru_cache(maxsize=1)
def _srgb_profile() -> Any:
    """lcms's built-in sRGB profile, the target of every conversion; built once per process."""
    from PIL import ImageCms

    return ImageCms.createProfile("sRGB")


@functools.lru_cache(maxsize=1)
def _srgb_chromaticities() -> tuple[tuple[float, float], ...]:
    p = _srgb_profile()
    colorants = (p.red_colorant, p.green_colorant, p.blue_colorant)
    return tuple((c[1][0], c[1][1]) for c in colorants if c is not None)


@functools.lru_cache(maxsize=64)
def wide_gamut_profile(icc: bytes) -> str | None:
    """The description of an RGB ICC profile whose primaries are not sRGB's; None for sRGB, non-RGB or
    unreadable profiles. Cached: a dataset shares a few profiles, so each is parsed once per process."""
    from PIL import ImageCms

    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc)).profile
    except (OSError, ValueError, TypeError, ImageCms.PyCMSError):
        return None
    if profile.xcolor_space.strip() != "RGB":
        return None
    description = (profile.profile_description or "").strip() or "an RGB ICC profile"
    colorants = (profile.red_colorant, profile.green_colorant, profile.blue_colorant)
    if any(c is None for c in colorants):  # a table-based profile: its name decides
        return None if "srgb" in description.lower() else description
    for (x, y), c in zip(_srgb_chromaticities(), colorants):
        assert c is not None  # checked above
        if abs(c[1][0] - x) > _CHROMATICITY_TOLERANCE or abs(c[1][1] - y) > _CHROMATICITY_TOLERANCE:
            return description
    return None


def _to_8bit(im: Image.Image) -> Image.Image:
    """A 16/32-bit integer or float greyscale image scaled (not clipped) to 8-bit ``L``."""
    import numpy as np  # here: a job that meets no such image never loads numpy

    a = np.asarray(im)
    if im.mode == "F":
        a = np.nan_to_num(a.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        lo, hi = min(float(a.min(initial=0.0)), 0.0), max(float(a.max(initial=1.0)), 1.0)
    else:
        a = a.astype(np.float64)
        lo, hi = min(float(a.min(initial=0)), 0.0), max(float(a.max(initial=0)), 65535.0)
    return Image.fromarray(np.round((a - lo) * (255.0 / (hi - lo))).astype(np.uint8))


def _srgb(im: Image.Image, icc: bytes, mode: str) -> Image.Image:
    from PIL import ImageCms

    try:
        source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        out = ImageCms.profileToProfile(im, source, _srgb_profile(), renderingIntent=ImageCms.Intent.PERCEPTUAL,
                                        outputMode=mode)
    except (OSError, ValueError, ImageCms.PyCMSError) as e:
        raise ImageDecodeError(f"cannot convert the image's ICC profile to sRGB: {e}") from e
    assert out is not None  # not in place, so a new image
    # No profile goes with the result: sRGB is implied (docs/FORMATS.md), as for every JPEG and WebP fgdata
    # encodes. Pillow would embed lcms's profile in a PNG, and lcms stamps the time it made it into its header.
    out.info.pop("icc_profile", None)
    return out


def _cmyk_profile(icc: bytes | None) -> bool:
    from PIL import ImageCms

    if not icc:
        return False
    try:
        return ImageCms.ImageCmsProfile(io.BytesIO(icc)).profile.xcolor_space.strip() == "CMYK"
    except (OSError, ValueError, TypeError, ImageCms.PyCMSError):
        return False


def _composite(im: Image.Image, background: tuple[int, int, int]) -> tuple[Image.Image, bool]:
    """RGB(A)/LA/palette with transparency -> RGB or L on ``background``; True when a pixel was not opaque."""
    rgba = im.convert("RGBA")
    alpha = rgba.getchannel("A")
    if alpha.getextrema()[0] == 255:
        return (im.convert("L") if im.mode in ("LA", "La") else rgba.convert("RGB")), False
    out = Image.new("RGB", im.size, background)
    out.paste(rgba.convert("RGB"), mask=alpha)
    return out, True


def display_image(im: Image.Image, display: Display = Display()) -> tuple[Image.Image, dict[str, Any]]:
    """A loaded image -> (8-bit ``RGB`` or ``L`` as a viewer shows it, ``{change: detail}``).

    The details say what was there: the source mode, the background used, the profile's name,
    the orientation value. An image that needs none of it comes back unchanged (RGB/L) or converted
    to RGB (other modes, e.g. 1-bit, YCbCr) with an empty dict.
    """
    changes: dict[str, Any] = {}
    frames = getattr(im, "n_frames", 1) if im.format != "MPO" else 1
    if frames > 1:
        changes["animation"] = frames
    orientation = exif_orientation(im)
    icc = im.info.get("icc_profile") or None
    if im.mode in _HIGH_DEPTH:
        changes["8-bit"] = im.mode
        im = _to_8bit(im)
    if im.mode == "CMYK":
        changes["cmyk"] = "CMYK"
        im = _srgb(im, icc, "RGB") if icc and _cmyk_profile(icc) else im.convert("RGB")
        icc = None
    if im.mode in _ALPHA_MODES or "transparency" in im.info:
        im, seen = _composite(im, display.background)
        if seen:
            changes["alpha"] = display.background_hex
    elif im.mode not in ("RGB", "L"):
        im = im.convert("RGB")
    wide = wide_gamut_profile(icc) if icc and not display.keep_icc else None
    if icc and wide:
        im = _srgb(im.convert("RGB"), icc, "RGB")
        changes["icc"] = wide
    if orientation != 1:
        im = im.transpose(_TRANSPOSE[orientation])
        changes["orientation"] = orientation
    return im, changes
