"""Camera tracks: slice to the chosen frames, map intrinsics into the output crop, validate.

Pixel convention: intrinsics are in pixels with the principal point measured from the image's
top-left *corner* (OpenCV). Under that convention a resize by ``s`` maps ``c -> c*s`` and a crop
at ``x0`` maps ``c -> c - x0`` exactly, which is the reference formula. (With a pixel-centre origin
the resize would be ``(c + 0.5)*s - 0.5``; the difference is below half an output pixel.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fgdata.errors import FgdataError

__all__ = ["slice_camera", "transform_intrinsics", "validate_camera"]


def slice_camera(
    poses: np.ndarray, intrinsics: np.ndarray, frame_indices: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Per-output-frame poses ``[T,4,4]`` and intrinsics ``[T,4]``: source rows at the chosen indices."""
    idx = np.asarray(frame_indices, dtype=np.int64)
    return np.asarray(poses)[idx], np.asarray(intrinsics)[idx]


def transform_intrinsics(
    intrinsics: np.ndarray, src_w: int, src_h: int, cropping_params: Mapping[str, int]
) -> np.ndarray:
    """``fx*sx, fy*sy, cx*sx - crop_x0, cy*sy - crop_y0`` with ``sx = resize_w/src_w``."""
    src = np.asarray(intrinsics)
    k = src.astype(np.float64)  # compute in float64, hand back the caller's float dtype
    sx = cropping_params["resize_w"] / src_w
    sy = cropping_params["resize_h"] / src_h
    k[..., 0] *= sx
    k[..., 1] *= sy
    k[..., 2] = k[..., 2] * sx - cropping_params["crop_x0"]
    k[..., 3] = k[..., 3] * sy - cropping_params["crop_y0"]
    return k.astype(src.dtype) if src.dtype.kind == "f" else k


def validate_camera(
    poses: np.ndarray, intrinsics: np.ndarray, frame_count: int, *, tol: float = 1e-3
) -> None:
    """The SHOULD checks for camera shards; raises FgdataError naming the first problem."""
    poses = np.asarray(poses)
    intrinsics = np.asarray(intrinsics)
    if poses.ndim != 3 or poses.shape[1:] != (4, 4):
        raise FgdataError(f"poses must be [T,4,4], got {list(poses.shape)}")
    if intrinsics.ndim != 2 or intrinsics.shape[1] != 4:
        raise FgdataError(f"intrinsics must be [T,4] (fx, fy, cx, cy), got {list(intrinsics.shape)}")
    if poses.shape[0] != frame_count or intrinsics.shape[0] != frame_count:
        raise FgdataError(
            f"camera track length (poses {poses.shape[0]}, intrinsics {intrinsics.shape[0]}) "
            f"!= video frame count {frame_count}"
        )
    if not (np.isfinite(poses).all() and np.isfinite(intrinsics).all()):
        raise FgdataError("camera track has NaN or infinite values")
    bad = np.flatnonzero(np.abs(poses[:, 3, :] - [0, 0, 0, 1]).max(axis=1) > tol)
    if bad.size:
        raise FgdataError(f"pose {bad[0]}: last row is {poses[bad[0], 3].tolist()}, not [0, 0, 0, 1]")
    r = poses[:, :3, :3].astype(np.float64)
    err = np.abs(r @ r.transpose(0, 2, 1) - np.eye(3)).max(axis=(1, 2))
    det = np.linalg.det(r)
    bad = np.flatnonzero((err > tol) | (np.abs(det - 1) > tol))
    if bad.size:
        raise FgdataError(
            f"pose {bad[0]}: rotation is not orthonormal (|RRᵀ-I| = {err[bad[0]]:.2g}, det = {det[bad[0]]:.3g})"
        )
    bad = np.flatnonzero((intrinsics[:, 0] <= 0) | (intrinsics[:, 1] <= 0))
    if bad.size:
        raise FgdataError(f"frame {bad[0]}: focal lengths must be > 0, got fx, fy = {intrinsics[bad[0], :2].tolist()}")
