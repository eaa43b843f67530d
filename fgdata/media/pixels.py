"""uint8 pixels -> float32 training values, with the reference's arithmetic, straight into place.

Both paths (fast and reference-exact) end here, so their float values differ only where their
uint8 pixels differ. Each step is the reference's own float32 operation in the same order
(a division is a division, never a multiplication by a reciprocal, which rounds differently
for 111 of the 256 values), and the result lands in ``out``: a batch slot when the batch loop
preallocates one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["RESIZE_MODES", "check_resize", "image_to_float", "video_frame_to_float"]

# "fast": DCT-scaled JPEG decode and resampling inside libswscale, within a measured PSNR of
# the reference. "reference": full decode and the reference's own resampler: identical tensors.
RESIZE_MODES = ("fast", "reference")

_F255 = np.float32(255)
_F127_5 = np.float32(127.5)
_ONE = np.float32(1)


def check_resize(resize: str) -> str:
    """Validate a ``resize`` option value; the ValueError names the choices."""
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize={resize!r}: choose one of {', '.join(map(repr, RESIZE_MODES))}")
    return resize


def image_to_float(
    rgb: np.ndarray,
    mean: Sequence[float],
    std: Sequence[float],
    out: np.ndarray | None = None,
) -> np.ndarray:
    """HWC uint8 -> CHW float32 ``(x/255 - mean_c)/std_c``: a tensor conversion (``x/255``)
    followed by per-channel normalisation, each step rounded to float32 as there."""
    h, w, c = rgb.shape
    if out is None:
        out = np.empty((c, h, w), np.float32)
    # The transpose is cheap in uint8 and lets every float pass run over contiguous memory.
    np.divide(np.ascontiguousarray(rgb.transpose(2, 0, 1)), _F255, out=out, dtype=np.float32)
    np.subtract(out, np.asarray(mean, np.float32)[:, None, None], out=out)
    np.divide(out, np.asarray(std, np.float32)[:, None, None], out=out)
    return out


def video_frame_to_float(planes: Sequence[np.ndarray], out: np.ndarray) -> np.ndarray:
    """R, G, B uint8 planes -> ``out[c] = x/127.5 - 1`` in float32 (``out`` is ``[3, H, W]``)."""
    for i, plane in enumerate(planes):
        o = out[i]
        np.divide(plane, _F127_5, out=o, dtype=np.float32)
        np.subtract(o, _ONE, out=o)
    return out
