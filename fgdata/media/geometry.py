"""Resize-and-crop geometry shared by images and video.

One function computes the crop offsets; the transforms apply exactly these offsets and
``cropping_params`` reports exactly these offsets, so the two can never disagree.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ImageGeometry:
    """Resize to (resize_w, resize_h), then keep the box (crop_x0, crop_y0, crop_w, crop_h)."""

    resize_w: int
    resize_h: int
    crop_x0: int
    crop_y0: int
    crop_w: int
    crop_h: int

    def as_dict(self) -> dict[str, int]:
        """The ``cropping_params`` dict of the batch contract."""
        return asdict(self)


def center_offset(dim: int, target: int) -> int:
    """Centre-crop offset: round-half-even((dim - target) / 2), as the reference's crop cuts."""
    return round((dim - target) / 2)


def image_transform_geometry(w: int, h: int, input_res: int | tuple[int, int]) -> ImageGeometry:
    """The reference geometry for a ``w`` x ``h`` source.

    An int resizes the shorter side to ``input_res`` (long side ``floor(input_res*long/short)``,
    as torchvision's Resize) and centre-crops a square; a tuple is ``(h, w)`` and means an
    exact resize with no crop.
    """
    if isinstance(input_res, tuple):
        th, tw = input_res
        return ImageGeometry(tw, th, 0, 0, tw, th)
    r = int(input_res)
    if w <= h:
        rw, rh = r, int(r * h / w)
    else:
        rw, rh = int(r * w / h), r
    return ImageGeometry(rw, rh, center_offset(rw, r), center_offset(rh, r), r, r)


def video_transform_geometry(w: int, h: int, target_w: int, target_h: int) -> ImageGeometry:
    """The reference geometry: cover the target with ``scale = max(W_t/w, H_t/h)``, then centre-crop."""
    scale = max(target_w / w, target_h / h)
    rh = math.floor(scale * h + 0.5)
    rw = math.floor(scale * w + 0.5)
    return ImageGeometry(
        rw, rh, center_offset(rw, target_w), center_offset(rh, target_h), target_w, target_h
    )
