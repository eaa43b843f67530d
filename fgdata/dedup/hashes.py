"""Perceptual and exact hashes of one image.

The DCT hash is imagehash's ``phash`` computed without scipy: greyscale (Pillow's ``L``), Lanczos resize to
``4 * size`` square, a 2-D DCT-II, the top-left ``size x size`` coefficients compared with their median. ``size``
8 gives the usual 64-bit hash, 16 a 256-bit one. Bits are packed row-major, first coefficient in the most
significant bit, into ``size * size / 64`` uint64 words, so Hamming distance is a popcount of the XOR.

PDQ is Facebook's 256-bit perceptual hash (ThreatExchange's ``hashing.pdf``), here in numpy: float luminance,
two passes of a Jarosz box filter (a tent, then nearly a Gaussian) sized so that 64 samples span the image, the
64x64 samples taken at the window centres, the 16x16 DCT coefficients after the constant one, each compared with
their median. Its words are the hash's usual hex form (bit 255 first), and its quality (0-100, the image's
gradient) says how much a hash of a nearly flat image can be trusted.
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


PDQ_SIDE = 64  # the downsampled image the DCT reads
PDQ_MIN_SIDE = 5  # smaller images hash to zero with quality 0, as the reference does


@functools.lru_cache(maxsize=1)
def _pdq_dct() -> np.ndarray:
    """PDQ's 16x64 DCT-II rows 1..16 (the constant row 0 is left out), scaled by ``sqrt(2 / 64)``."""
    k = np.arange(1, 17)[:, None]
    j = np.arange(PDQ_SIDE)[None, :]
    return np.sqrt(2.0 / PDQ_SIDE) * np.cos(np.pi / 2.0 / PDQ_SIDE * k * (2 * j + 1))


def _box(x: np.ndarray, window: int, axis: int, at: np.ndarray | None = None) -> np.ndarray:
    """A box filter of ``window`` samples along ``axis``, centred on ``(window + 2) // 2 - 1`` samples before
    each output; at the edges the mean of the part of the window inside the image (the reference's ``box1D``).
    ``at``: only these output positions (the filter is separable, so later steps need no others)."""
    length = x.shape[axis]
    half = (window + 2) // 2
    out_at = np.arange(length) if at is None else at
    start = np.clip(out_at + half - window, 0, length)
    end = np.clip(out_at + half, 0, length)
    shape = list(x.shape)
    shape[axis] = length + 1
    sums = np.zeros(shape, dtype=np.float64)
    np.cumsum(x, axis=axis, out=sums[(slice(None),) * axis + (slice(1, None),)])
    count = [1, 1]
    count[axis] = len(out_at)
    return (np.take(sums, end, axis=axis) - np.take(sums, start, axis=axis)) / (end - start).reshape(count)


def pdq_float(luma: np.ndarray) -> tuple[np.ndarray, int]:
    """PDQ's 16x16 DCT coefficients and quality of a ``(rows, cols)`` float luminance image."""
    rows, cols = luma.shape
    x = np.asarray(luma, dtype=np.float64)
    if (rows, cols) != (PDQ_SIDE, PDQ_SIDE):
        along_rows = (cols + 2 * PDQ_SIDE - 1) // (2 * PDQ_SIDE)
        along_cols = (rows + 2 * PDQ_SIDE - 1) // (2 * PDQ_SIDE)
        centres = (np.arange(PDQ_SIDE) + 0.5) / PDQ_SIDE
        x = _box(_box(x, along_rows, axis=1), along_cols, axis=0)
        # the second pass only where the 64x64 samples are taken (the window centres)
        x = _box(x, along_rows, axis=1, at=(centres * cols).astype(np.int64))
        x = _box(x, along_cols, axis=0, at=(centres * rows).astype(np.int64))
    x = x.astype(np.float32)
    steps = np.concatenate([np.diff(x, axis=0).ravel(), np.diff(x, axis=1).ravel()])
    gradient = int(np.abs(np.trunc(steps * 100 / 255)).sum())
    d = _pdq_dct()
    return d @ x.astype(np.float64) @ d.T, min(100, gradient // 90)


def pdq(im: Image.Image) -> tuple[np.ndarray, int]:
    """The PDQ hash of ``im`` as 4 uint64 words (bit 255 first, the hash's hex form) and its quality."""
    rgb = np.asarray(im.convert("RGB"), dtype=np.float64)
    if rgb.shape[0] < PDQ_MIN_SIDE or rgb.shape[1] < PDQ_MIN_SIDE:
        return np.zeros(4, dtype=np.uint64), 0
    luma = (rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114).astype(np.float32)
    coeffs, quality = pdq_float(luma)
    flat = coeffs.ravel()
    median = np.partition(flat, 127)[127]  # the reference's (Torben's) median: the lower of the middle two
    return pack_bits((flat > median)[::-1]), quality


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
