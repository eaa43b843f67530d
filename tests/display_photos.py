"""Photos that take every path of fgdata's display rule (fgdata.media.display), made here with Pillow.

A 16-bit greyscale PNG, an EXIF-6 JPEG, a CMYK JPEG, an RGBA PNG, a palette PNG with transparency, a Display P3
JPEG (its profile built by tests/iccprofile.py: no P3 file ships here) and a plain JPEG that needs nothing;
:func:`rgb16_png` writes the 16-bit RGB PNG that Pillow cannot.
"""

from __future__ import annotations

import io

import numpy as np
from iccprofile import DISPLAY_P3, rgb_profile
from PIL import Image

RED, BLUE, GREEN = (255, 0, 0), (0, 0, 255), (0, 255, 0)
P3_COLOUR = (40, 180, 90)  # inside both gamuts, so the sRGB values differ without clipping


def jpeg(im: Image.Image, **save) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=95, **save)
    return buf.getvalue()


def png(im: Image.Image, **save) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG", **save)
    return buf.getvalue()


def sideways() -> bytes:
    """Stored 64 wide x 32 high, red on the left; EXIF Orientation 6 turns it upright (red on top)."""
    im = Image.new("RGB", (64, 32), BLUE)
    im.paste(RED, (0, 0, 32, 32))
    exif = Image.Exif()
    exif[0x0112] = 6
    return jpeg(im, exif=exif.tobytes())


def half_transparent(mode: str) -> bytes:
    """Left half opaque green, right half fully transparent red (RGBA), or the palette equivalent."""
    if mode == "RGBA":
        im = Image.new("RGBA", (32, 32), (*RED, 0))
        im.paste((*GREEN, 255), (0, 0, 16, 32))
        return png(im)
    im = Image.new("P", (32, 32), 0)
    im.putpalette([*RED, *GREEN] + [0] * 762)
    im.paste(1, (0, 0, 16, 32))
    return png(im, transparency=0)


PHOTOS = {
    "grey16.png": lambda: png(Image.fromarray(np.linspace(0, 65535, 48 * 64).reshape(48, 64).astype(np.uint16))),
    "sideways.jpg": sideways,
    "cmyk.jpg": lambda: jpeg(Image.new("RGB", (40, 30), (200, 30, 30)).convert("CMYK")),
    "rgba.png": lambda: half_transparent("RGBA"),
    "palette.png": lambda: half_transparent("P"),
    "p3.jpg": lambda: jpeg(Image.new("RGB", (24, 24), P3_COLOUR), icc_profile=rgb_profile(DISPLAY_P3, "Display P3 (test)")),
    "plain.jpg": lambda: jpeg(Image.new("RGB", (24, 16), (10, 200, 10))),
}
CHANGES = {"grey16.png": {"8-bit": "I;16"}, "sideways.jpg": {"orientation": 6}, "cmyk.jpg": {"cmyk": "CMYK"},
           "rgba.png": {"alpha": "#ffffff"}, "palette.png": {"alpha": "#ffffff"}, "p3.jpg": {"icc": "Display P3 (test)"}}


def rgb16_png(rgb: np.ndarray) -> bytes:
    """A 16-bit RGB PNG written by hand (Pillow writes none): IHDR bit depth 16, colour type 2."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    h, w, _ = rgb.shape
    rows = b"".join(b"\0" + rgb[y].astype(">u2").tobytes() for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
