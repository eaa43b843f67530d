"""The reference's loader presets and class-conditional dataset paths, as lazy configs.

Use them as FastGen users do: ``cfg = VideoLoaderConfig.copy()``, assign fields,
then ``instantiate(cfg)``. The WDS presets carry placeholder datatags
(``WDS:/path/to/...``); instantiating one unchanged raises an error that names the
``datatags`` field.

Key maps follow the raw-key convention: decoded media and text go to
``real_raw`` / ``condition_raw`` / ``condition_image_raw`` and a text negative to
``neg_condition_raw``; precomputed tensors keep the plain keys. For the
snapshot-era maps call :func:`legacy_keys` on a preset.

The class-conditional paths are taken from ``DATA_ROOT_DIR`` and
``S3_DATA_ROOT_DIR`` when this module is first imported, as in the reference.
"""

from __future__ import annotations

from typing import Any

from fgdata.catalog import (
    CIFAR10_ZIP,
    IMAGENET64_EDMV2_ZIP,
    IMAGENET64_ZIP,
    IMAGENET256_SD_ZIP,
    data_root_dir,
    s3_data_root_dir,
)
from fgdata.configs.lazy import LazyCall, LazyConfig
from fgdata.loaders import (
    AudioVideoWDSLoader,
    CameraVideoWDSLoader,
    ImageWDSLoader,
    VideoWDSLoader,
    WDSLoader,
)
from fgdata.loaders.decoders import IMAGE_MEMBERS, VIDEO_MEMBERS, prefixed

# Media keys accept every extension fgdata's shard commands write ("jpg;jpeg;png;..."): the first one a
# sample has. A sample without its caption is dropped (missing_text="drop"); set missing_text="empty"
# for datasets without captions.
_RAW = {"real_raw": IMAGE_MEMBERS, "condition_raw": "txt"}
# Every media config has resize="fast"; set "reference" for tensors bit-identical to the reference
# loaders' (full-size decode and their resampler; slower).
# What the three raw-video presets share (81 frames at 832x480, two workers, trainer-filled resume).
_VIDEO: dict[str, Any] = {
    "sequence_length": 81,
    "img_size": (832, 480),
    "video_keys": ("real_raw",),
    "decoder_type": "segment",
    "target_fps": None,
    "resize": "fast",
    "num_workers": 2,
    "sampler_start_idx": None,
}
_LATENT = {"real": "latent.pth", "condition": "txt_emb.pth"}
# The relative neg-embedding path resolves against the datatag's parent.
_NEG_EMB = {"neg_condition": "neg_prompt_emb.npy"}

ImageLoaderConfig: LazyConfig = LazyCall(ImageWDSLoader)(
    datatags=["WDS:/path/to/image_shards"],
    batch_size=32,
    key_map=dict(_RAW),
    presets_map={"neg_condition_raw": "empty_string"},
    input_res=512,
    resize="fast",
    sampler_start_idx=None,
)

#: fgdata defines the image-edit extensions: ``jpg`` (or any image extension) is the edited target,
#: ``src.jpg`` (``src.png``, ...) the source [INF].
ImageEditLoaderConfig: LazyConfig = LazyCall(ImageWDSLoader)(
    datatags=["WDS:/path/to/image_edit_shards"],
    batch_size=32,
    key_map={"real_raw": IMAGE_MEMBERS, "condition_image_raw": prefixed("src.", IMAGE_MEMBERS), "condition_raw": "txt"},
    presets_map={"neg_condition_raw": "empty_string"},
    input_res=512,
    resize="fast",
    sampler_start_idx=None,
)

PromptLoaderConfig: LazyConfig = LazyCall(WDSLoader)(
    datatags=["WDS:/path/to/prompt_shards"],
    batch_size=32,
    key_map={"condition_raw": "txt"},
    presets_map={"neg_condition_raw": "empty_string"},
    sampler_start_idx=None,
)

VideoLoaderConfig: LazyConfig = LazyCall(VideoWDSLoader)(
    datatags=["WDS:/path/to/video_shards"],
    batch_size=2,
    key_map={"real_raw": VIDEO_MEMBERS, "condition_raw": "txt"},
    presets_map={"neg_condition_raw": "neg_prompt_wan"},
    **_VIDEO,
)

VideoAudioLoaderConfig: LazyConfig = LazyCall(AudioVideoWDSLoader)(
    datatags=["WDS:/path/to/video_shards_with_audio"],
    batch_size=1,
    key_map={"real_raw": VIDEO_MEMBERS, "condition_raw": "txt"},
    presets_map={"neg_condition_raw": "neg_prompt_ltx2"},
    target_sample_rate=None,
    **_VIDEO,
)

#: Output names ``camera_poses`` / ``camera_intrinsics`` are fgdata-defined [INF].
CameraVideoLoaderConfig: LazyConfig = LazyCall(CameraVideoWDSLoader)(
    datatags=["WDS:/path/to/videos_with_vipe"],
    batch_size=1,
    key_map={
        "real_raw": VIDEO_MEMBERS,
        "condition_raw": "txt",
        "camera_poses": "poses.npy",
        "camera_intrinsics": "intrinsics.npy",
    },
    presets_map={"neg_condition_raw": "neg_prompt_lingbot_world"},
    **_VIDEO,
)

ImageLatentLoaderConfig: LazyConfig = LazyCall(WDSLoader)(
    datatags=["WDS:/path/to/image_latent_shards"],
    batch_size=32,
    key_map=dict(_LATENT),
    files_map=dict(_NEG_EMB),
    sampler_start_idx=None,
)

VideoLatentLoaderConfig: LazyConfig = LazyCall(WDSLoader)(
    datatags=["WDS:/path/to/video_latent_shards"],
    batch_size=2,
    key_map=dict(_LATENT),
    files_map=dict(_NEG_EMB),
    num_workers=2,
    sampler_start_idx=None,
)

#: Single-step KD: no negative condition at all.
PairLoaderConfig: LazyConfig = LazyCall(WDSLoader)(
    datatags=["WDS:/path/to/pair_shards"],
    batch_size=2,
    key_map={"real": "latent.pth", "noise": "noise.pth", "condition": "txt_emb.pth"},
    shuffle_size=100,
    sampler_start_idx=None,
)

#: Multi-step KD: the teacher trajectory under ``path``; no negative condition.
PathLoaderConfig: LazyConfig = LazyCall(WDSLoader)(
    datatags=["WDS:/path/to/path_shards"],
    batch_size=2,
    key_map={"real": "latent.pth", "path": "path.pth", "condition": "txt_emb.pth"},
    shuffle_size=100,
    sampler_start_idx=None,
)


# A dotted target: ImageLoader is a torch DataLoader, so naming it lazily keeps torch out of this import.
IMAGE_LOADER_TARGET = "fgdata.loaders.image_loader.ImageLoader"


def _class_cond(rel: str, batch_size: int) -> LazyConfig:
    """The zip under the data root, and the same relative path under the S3 root."""
    return LazyCall(IMAGE_LOADER_TARGET)(
        dataset_path=str(data_root_dir() / rel),
        s3_path=f"{s3_data_root_dir()}/{rel}",
        batch_size=batch_size,
        use_labels=True,
        cache=True,
        shuffle=True,
        sampler_start_idx=None,
    )


CIFAR10_Loader_Config: LazyConfig = _class_cond(CIFAR10_ZIP, 128)
ImageNet64_Loader_Config: LazyConfig = _class_cond(IMAGENET64_ZIP, 32)
ImageNet64_EDMV2_Loader_Config: LazyConfig = _class_cond(IMAGENET64_EDMV2_ZIP, 32)
ImageNet256_Loader_Config: LazyConfig = _class_cond(IMAGENET256_SD_ZIP, 32)

#: Every preset by name, for tests and tooling.
PRESETS: dict[str, LazyConfig] = {
    "ImageLoaderConfig": ImageLoaderConfig,
    "ImageEditLoaderConfig": ImageEditLoaderConfig,
    "PromptLoaderConfig": PromptLoaderConfig,
    "VideoLoaderConfig": VideoLoaderConfig,
    "VideoAudioLoaderConfig": VideoAudioLoaderConfig,
    "CameraVideoLoaderConfig": CameraVideoLoaderConfig,
    "ImageLatentLoaderConfig": ImageLatentLoaderConfig,
    "VideoLatentLoaderConfig": VideoLatentLoaderConfig,
    "PairLoaderConfig": PairLoaderConfig,
    "PathLoaderConfig": PathLoaderConfig,
    "CIFAR10_Loader_Config": CIFAR10_Loader_Config,
    "ImageNet64_Loader_Config": ImageNet64_Loader_Config,
    "ImageNet64_EDMV2_Loader_Config": ImageNet64_EDMV2_Loader_Config,
    "ImageNet256_Loader_Config": ImageNet256_Loader_Config,
}


def _legacy_name(key: str) -> str:
    return key.removesuffix("_raw")


def legacy_keys(cfg: LazyConfig) -> LazyConfig:
    """A copy of a WDS preset with the snapshot-era output keys.

    Every ``x_raw`` output key (in ``key_map``, ``presets_map`` and ``video_keys``)
    becomes ``x``: decoded pixels and strings land in ``real`` / ``condition`` /
    ``neg_condition``, and the trainer copies them into ``*_raw`` itself.
    """
    out = cfg.copy()
    for field in ("key_map", "presets_map"):
        mapping = out.get(field)
        if mapping:
            out[field] = {_legacy_name(k): v for k, v in mapping.items()}
    if out.get("video_keys"):
        out.video_keys = tuple(_legacy_name(k) for k in out.video_keys)
    return out
