"""Pixel transforms of the EDM and EDM2 dataset tools, and the PNG encoding their zips require.

One function per crop so ImageNet-64 (both flavours) and ImageNet-256 share code. Sources are made RGB
once per file; for RGB and grayscale inputs that is exactly what both tools compute, for every other mode
it is the documented fix, and the caller reports the file.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

#: Modes both reference tools handle without ambiguity; anything else is converted and reported.
NATIVE_MODES = frozenset({"RGB", "L"})


def open_rgb(path: str, strict: bool = False) -> tuple[Image.Image, str | None]:
    """Decode ``path`` as RGB; return the image and the source mode when a conversion was needed."""
    from fgdata.media.image import open_image

    with open_image(path) as img:
        img.load()
        mode = img.mode
        if mode not in NATIVE_MODES and strict:
            from fgdata.errors import FgdataError

            raise FgdataError(f"{path}: mode {mode} is neither RGB nor L (strict mode)")
        rgb = img if mode == "RGB" else img.convert("RGB")
        rgb.load()
    return rgb, (None if mode in NATIVE_MODES else mode)


def edm_center_crop(img: Image.Image, size: int) -> Image.Image:
    """EDM ``center-crop``: central min(h, w) square, then LANCZOS to ``size``."""
    w, h = img.size
    s = min(w, h)
    box = ((w - s) // 2, (h - s) // 2, (w + s) // 2, (h + s) // 2)
    return img.crop(box).resize((size, size), Image.Resampling.LANCZOS)


def adm_center_crop(img: Image.Image, size: int) -> Image.Image:
    """ADM/Dhariwal crop: BOX halvings, one BICUBIC resize with Python rounding, central crop."""
    while min(img.size) >= 2 * size:
        img = img.resize((img.size[0] // 2, img.size[1] // 2), resample=Image.Resampling.BOX)
    scale = size / min(img.size)
    img = img.resize((round(img.size[0] * scale), round(img.size[1] * scale)), resample=Image.Resampling.BICUBIC)
    w, h = img.size
    top, left = (h - size) // 2, (w - size) // 2
    return img.crop((left, top, left + size, top + size))


CROPS = {"edm": edm_center_crop, "adm": adm_center_crop}


def png_bytes(img: Image.Image | np.ndarray) -> bytes:
    """Uncompressed PNG: Pillow, level 0, no optimisation, no ancillary chunks such as ICC or text."""
    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    else:
        img.info = {}
    buf = io.BytesIO()
    img.save(buf, format="png", compress_level=0, optimize=False)
    return buf.getvalue()
