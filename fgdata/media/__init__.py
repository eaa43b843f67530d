"""Pure media functions: decode and transform images, video, audio and camera tracks.

Heavy libraries (av, torch, simplejpeg) are imported inside the functions that need them, and the package
loads each submodule only when one of its names is first used (numpy comes with the camera and pixel
functions), so a job that only copies files never pays for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fgdata.media.camera import slice_camera, transform_intrinsics, validate_camera
    from fgdata.media.decode import IMAGE_EXTS, TENSOR_EXTS, VIDEO_EXTS, check_member, decode_member, describe_member, member_kind
    from fgdata.media.errors import ClipTooShort, ImageDecodeError, MediaError, MemberDecodeError, VideoDecodeError
    from fgdata.media.geometry import ImageGeometry, image_transform_geometry, video_transform_geometry
    from fgdata.media.image import describe_image, load_image_for_training
    from fgdata.media.pixels import RESIZE_MODES, check_resize
    from fgdata.media.video import Clip, ClipSpec, VideoInfo, decode_clip, probe_video

#: Where each public name lives.
_HOMES = {
    "slice_camera": "fgdata.media.camera",
    "transform_intrinsics": "fgdata.media.camera",
    "validate_camera": "fgdata.media.camera",
    "IMAGE_EXTS": "fgdata.media.decode",
    "TENSOR_EXTS": "fgdata.media.decode",
    "VIDEO_EXTS": "fgdata.media.decode",
    "check_member": "fgdata.media.decode",
    "decode_member": "fgdata.media.decode",
    "describe_member": "fgdata.media.decode",
    "member_kind": "fgdata.media.decode",
    "ClipTooShort": "fgdata.media.errors",
    "ImageDecodeError": "fgdata.media.errors",
    "MediaError": "fgdata.media.errors",
    "MemberDecodeError": "fgdata.media.errors",
    "VideoDecodeError": "fgdata.media.errors",
    "ImageGeometry": "fgdata.media.geometry",
    "image_transform_geometry": "fgdata.media.geometry",
    "video_transform_geometry": "fgdata.media.geometry",
    "describe_image": "fgdata.media.image",
    "load_image_for_training": "fgdata.media.image",
    "RESIZE_MODES": "fgdata.media.pixels",
    "check_resize": "fgdata.media.pixels",
    "Clip": "fgdata.media.video",
    "ClipSpec": "fgdata.media.video",
    "VideoInfo": "fgdata.media.video",
    "decode_clip": "fgdata.media.video",
    "probe_video": "fgdata.media.video",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value

__all__ = [
    "IMAGE_EXTS",
    "RESIZE_MODES",
    "TENSOR_EXTS",
    "VIDEO_EXTS",
    "Clip",
    "ClipSpec",
    "ClipTooShort",
    "ImageDecodeError",
    "ImageGeometry",
    "MediaError",
    "MemberDecodeError",
    "VideoDecodeError",
    "VideoInfo",
    "check_member",
    "check_resize",
    "decode_clip",
    "decode_member",
    "describe_image",
    "describe_member",
    "image_transform_geometry",
    "load_image_for_training",
    "member_kind",
    "probe_video",
    "slice_camera",
    "transform_intrinsics",
    "validate_camera",
    "video_transform_geometry",
]
