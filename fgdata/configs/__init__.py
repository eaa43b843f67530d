"""Lazy loader configs: the FastGen presets, ``LazyCall`` and ``instantiate``.

Importing this package never imports torch, typer or rich; the loaders pull in
torch only when a batch is first requested.
"""

from fgdata.configs.alias import install_fastgen_alias
from fgdata.configs.data import (
    PRESETS,
    CameraVideoLoaderConfig,
    CIFAR10_Loader_Config,
    ImageEditLoaderConfig,
    ImageLatentLoaderConfig,
    ImageLoaderConfig,
    ImageNet64_EDMV2_Loader_Config,
    ImageNet64_Loader_Config,
    ImageNet256_Loader_Config,
    PairLoaderConfig,
    PathLoaderConfig,
    PromptLoaderConfig,
    VideoAudioLoaderConfig,
    VideoLatentLoaderConfig,
    VideoLoaderConfig,
    legacy_keys,
)
from fgdata.configs.lazy import LazyCall, LazyConfig, instantiate

__all__ = [
    "PRESETS",
    "CIFAR10_Loader_Config",
    "CameraVideoLoaderConfig",
    "ImageEditLoaderConfig",
    "ImageLatentLoaderConfig",
    "ImageLoaderConfig",
    "ImageNet64_EDMV2_Loader_Config",
    "ImageNet64_Loader_Config",
    "ImageNet256_Loader_Config",
    "LazyCall",
    "LazyConfig",
    "PairLoaderConfig",
    "PathLoaderConfig",
    "PromptLoaderConfig",
    "VideoAudioLoaderConfig",
    "VideoLatentLoaderConfig",
    "VideoLoaderConfig",
    "install_fastgen_alias",
    "instantiate",
    "legacy_keys",
]
