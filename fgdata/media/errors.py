"""Media errors: one family so loaders can drop a bad sample with a single ``except``."""

from fgdata.errors import FgdataError


class MediaError(FgdataError):
    """A media payload could not be decoded or transformed; the message says why in one line."""


class ImageDecodeError(MediaError):
    """Pillow (or simplejpeg) could not decode the bytes as an image."""


class VideoDecodeError(MediaError):
    """PyAV/FFmpeg could not open or decode the container."""


class ClipTooShort(MediaError):
    """The video has fewer frames (after fps resampling) than ``sequence_length`` (drop it)."""


class MemberDecodeError(MediaError):
    """A WebDataset member could not be decoded for its extension (bad JSON, pickled npy, unsafe pth, ...)."""
