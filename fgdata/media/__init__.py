"""Pure media functions: decode and transform images, video, audio and camera tracks.

Heavy libraries (av, torch, simplejpeg) are imported inside the functions that need them.
"""

from fgdata.media.camera import slice_camera, transform_intrinsics, validate_camera
from fgdata.media.decode import (
    IMAGE_EXTS,
    TENSOR_EXTS,
    VIDEO_EXTS,
    check_member,
    decode_member,
    describe_member,
    member_kind,
)
from fgdata.media.errors import (
    ClipTooShort,
    ImageDecodeError,
    MediaError,
    MemberDecodeError,
    VideoDecodeError,
)
from fgdata.media.geometry import (
    ImageGeometry,
    image_transform_geometry,
    video_transform_geometry,
)
from fgdata.media.image import describe_image, load_image_for_training
from fgdata.media.pixels import RESIZE_MODES, check_resize
from fgdata.media.video import Clip, ClipSpec, VideoInfo, decode_clip, probe_video

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
