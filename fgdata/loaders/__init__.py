"""Runtime loaders: a drop-in for FastGen's loader API.

Importing this package does not import torch (nor typer or rich): the WDS
loaders import it when first iterated, and ``ImageLoader`` (a torch DataLoader
subclass) is imported on first access.
"""

from __future__ import annotations

from typing import Any

from fgdata.loaders.presets import PRESET_CONSTANTS, PRESET_FILTERS
from fgdata.loaders.quickstart import quickstart_batch
from fgdata.loaders.selection import LoaderConfigError
from fgdata.loaders.wds import (
    AudioVideoWDSLoader,
    BaseWDSLoader,
    CameraVideoWDSLoader,
    ImageWDSLoader,
    VideoWDSLoader,
    WDSLoader,
)

__all__ = [
    "PRESET_CONSTANTS",
    "PRESET_FILTERS",
    "AudioVideoWDSLoader",
    "BaseWDSLoader",
    "CameraVideoWDSLoader",
    "ImageLoader",
    "ImageWDSLoader",
    "LoaderConfigError",
    "VideoWDSLoader",
    "WDSLoader",
    "quickstart_batch",
]


def __getattr__(name: str) -> Any:
    if name == "ImageLoader":
        from fgdata.loaders.image_loader import ImageLoader

        return ImageLoader
    raise AttributeError(f"module 'fgdata.loaders' has no attribute {name!r}")
