"""Perceptual and exact hashes of one image.

The DCT hash is imagehash's ``phash`` computed without scipy: greyscale (Pillow's ``L``), Lanczos resize to
``4 * size`` square, a 2-D DCT-II, the top-left ``size x size`` coefficients compared with their median. ``size``
8 gives the usual 64-bit hash, 16 a 256-bit one. Bits are packed row-major, first coefficient in the most
significant bit, into ``size * size / 64`` uint64 words, so Hamming distance is a popcount of the XOR.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
from PIL import Image

HASH_SIZES = {64: 8, 256: 16}  # bits -> side of the kept DCT block


@functools.lru_cache(maxsize=4)
def _dct_matrix(n: int) -> np.ndarray:
    """The unnormalised DCT-II basis scipy.fftpack.dct uses (``2 cos(pi k (2i+1) / 2n)``): ``D @ x`` transforms
    the columns of ``x``."""
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    return 2.0 * np.cos(np.pi * k * (2 * i + 1) / (2 * n))


def phash(im: Image.Image, bits: int = 64) -> np.ndarray:
    """The DCT hash of ``im`` as ``bits // 64`` uint64 words (see the module docstring)."""
    size = HASH_SIZES[bits]
    n = 4 * size
    grey = np.asarray(im.convert("L").resize((n, n), Image.Resampling.LANCZOS), dtype=np.float64)
    d = _dct_matrix(n)
    low = (d @ grey @ d.T)[:size, :size]
    return pack_bits(low > np.median(low))


def pack_bits(flags: np.ndarray) -> np.ndarray:
    """Row-major booleans (a multiple of 64) -> big-endian-ordered uint64 words."""
    return np.packbits(flags.ravel()).view(">u8").astype(np.uint64)


def sha256_bytes(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def sha256_pixels(im: Image.Image) -> bytes:
    """sha256 of the decoded pixels with their mode and size, so a PNG and a lossless WebP of the same image
    match and two images with the same bytes in different shapes do not."""
    rgb = im if im.mode in ("RGB", "RGBA", "L") else im.convert("RGBA" if "A" in im.getbands() else "RGB")
    head = f"{rgb.mode} {rgb.width}x{rgb.height}\n".encode()
    return hashlib.sha256(head + rgb.tobytes()).digest()


def digest_words(digest: bytes) -> np.ndarray:
    """A 32-byte digest as 4 uint64 words, so exact and perceptual hashes share one store."""
    return np.frombuffer(digest, dtype=">u8").astype(np.uint64)
