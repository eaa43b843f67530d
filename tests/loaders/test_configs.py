"""Lazy configs and every preset instantiated on real tiny data."""

from __future__ import annotations

import io
import json
import sys
import subprocess
import zipfile

import numpy as np
import pytest
import torch

import fgdata.configs as C
from fgdata.configs import LazyCall, instantiate, legacy_keys
from fgdata.loaders import LoaderConfigError, WDSLoader
from fgdata.loaders.decoders import VIDEO_MEMBERS

WDS_PRESETS = [n for n in C.PRESETS if not n.endswith("_Loader_Config")]
CLASS_COND = [n for n in C.PRESETS if n.endswith("_Loader_Config")]


def test_fourteen_presets_and_exports():
    assert len(C.PRESETS) == 14 and len(WDS_PRESETS) == 10
    import fgdata.loaders as L

    for name in ["ImageLoader", "BaseWDSLoader", "WDSLoader", "ImageWDSLoader", "VideoWDSLoader", "AudioVideoWDSLoader",
                 "CameraVideoWDSLoader", "PRESET_CONSTANTS", "PRESET_FILTERS"]:
        assert getattr(L, name) is not None


def test_import_is_light():
    code = "import sys, fgdata.configs, fgdata.loaders; print(sorted(m for m in ('torch','typer','rich','av','webdataset') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_copy_is_deep_and_assignment_works():
    cfg = C.VideoLatentLoaderConfig.copy()
    cfg.key_map["depth_latent"] = "depth_latent.pth"
    cfg.batch_size = 7
    assert "depth_latent" not in C.VideoLatentLoaderConfig.key_map
    assert C.VideoLatentLoaderConfig.batch_size == 2 and cfg.batch_size == 7
    assert cfg["batch_size"] == 7 and "key_map" in cfg
    assert cfg._target_ is WDSLoader


def test_unknown_key_names_key_and_class(grid):
    """Img_size on a plain WDSLoader."""
    cfg = C.ImageLatentLoaderConfig.copy()
    cfg.datatags = ["WDS:" + grid]
    cfg.img_size = (832, 480)
    with pytest.raises(TypeError, match=r"WDSLoader.*'img_size'"):
        instantiate(cfg)


def test_placeholder_datatag_names_the_field():
    with pytest.raises(LoaderConfigError, match="cfg.datatags"):
        instantiate(C.ImageLoaderConfig)


def test_lazycall_nesting_and_overrides():
    def pair(a, b=0):
        return (a, b)

    cfg = LazyCall(pair)(a=LazyCall(pair)(a=1, b=2))
    assert instantiate(cfg) == ((1, 2), 0)
    assert instantiate(cfg, b=5) == ((1, 2), 5)
    assert instantiate({"_target_": "builtins.dict", "x": 1}) == {"x": 1}


def test_legacy_keys_switch():
    legacy = legacy_keys(C.VideoLoaderConfig)
    assert legacy.key_map == {"real": VIDEO_MEMBERS, "condition": "txt"}
    assert legacy.presets_map == {"neg_condition": "neg_prompt_wan"}
    assert legacy.video_keys == ("real",)
    assert C.VideoLoaderConfig.key_map == {"real_raw": VIDEO_MEMBERS, "condition_raw": "txt"}


def _tag_for(name, image_shards, video_shards, latent_shards, prompt_shards):
    if name in ("ImageLoaderConfig", "ImageEditLoaderConfig"):
        return image_shards
    if name.startswith(("Video", "Camera")) and "Latent" not in name:
        return video_shards
    if name == "PromptLoaderConfig":
        return prompt_shards
    return latent_shards


@pytest.mark.parametrize("name", WDS_PRESETS)
def test_every_wds_preset_on_real_shards(name, image_shards, video_shards, latent_shards, grid):
    cfg = C.PRESETS[name].copy()
    cfg.datatags = ["WDS:" + _tag_for(name, image_shards, video_shards, latent_shards, grid)]
    cfg.num_workers = 0
    cfg.deterministic = True
    if "input_res" in cfg:
        cfg.input_res = 32
    if "sequence_length" in cfg:
        cfg.sequence_length, cfg.img_size, cfg.batch_size = 6, (32, 24), 1
    batch = next(iter(instantiate(cfg)))
    b = cfg.batch_size
    assert {"fname", "shard", "__key__"} <= set(batch)
    assert len(batch["fname"]) == b
    if name in ("ImageLoaderConfig", "ImageEditLoaderConfig"):
        assert batch["real_raw"].shape == (b, 3, 32, 32) and batch["condition_raw"][0]
        assert batch["neg_condition_raw"] == [""] * b
        if name == "ImageEditLoaderConfig":
            assert batch["condition_image_raw"].shape == (b, 3, 32, 32)
    elif name == "PromptLoaderConfig":
        assert set(batch) - {"fname", "shard", "__key__", "__index__"} == {"condition_raw", "neg_condition_raw"}
    elif name == "VideoAudioLoaderConfig":
        assert batch["real_raw"]["video"].shape == (1, 3, 6, 24, 32) and batch["real_raw"]["audio"].shape[:2] == (1, 2)
    elif name.startswith(("Video", "Camera")) and "Latent" not in name:
        assert batch["real_raw"].shape == (1, 3, 6, 24, 32)
        if name == "CameraVideoLoaderConfig":
            assert batch["camera_poses"].shape == (1, 6, 4, 4) and batch["camera_intrinsics"].shape == (1, 6, 4)
    else:
        assert batch["real"].shape == (b, 4, 8, 8) and batch["condition"].shape == (b, 7, 16)
        if name in ("PairLoaderConfig", "PathLoaderConfig"):
            assert "neg_condition" not in batch
            extra = "noise" if name == "PairLoaderConfig" else "path"
            assert batch[extra].shape == ((b, 4, 8, 8) if extra == "noise" else (b, 4, 4, 8, 8))
        else:
            assert batch["neg_condition"].shape == (b, 7, 16)


def _edm_zip(path, n=16, res=8, classes=10):
    from PIL import Image

    labels = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for i in range(n):
            name = f"00000/img{i:08d}.png"
            b = io.BytesIO()
            Image.fromarray(np.full((res, res, 3), i * 10, np.uint8)).save(b, "PNG")
            z.writestr(name, b.getvalue())
            labels.append([name, i % classes])
        z.writestr("dataset.json", json.dumps({"labels": labels}))


@pytest.mark.parametrize("name", CLASS_COND)
def test_class_conditional_presets(name, tmp_path, monkeypatch):
    cfg = C.PRESETS[name]
    assert cfg.use_labels and cfg.cache and cfg.shuffle and cfg.sampler_start_idx is None
    assert cfg.batch_size == (128 if name.startswith("CIFAR") else 32)
    assert cfg.s3_path.startswith("s3://") and cfg.s3_path.endswith(cfg.dataset_path.split("/DATA/")[-1])
    local = cfg.copy()
    local.dataset_path = str(tmp_path / "d.zip")
    _edm_zip(local.dataset_path)
    local.batch_size, local.cache, local.num_workers = 8, False, 0
    batch = next(iter(instantiate(local)))
    assert batch["real"].shape == (8, 3, 8, 8) and batch["condition"].shape == (8, 10)
    assert batch["real"].dtype == torch.float32 and not batch["neg_condition"].any()


def test_fastgen_alias_is_opt_in(grid):
    code = (
        "import sys\n"
        "try:\n    import fastgen\nexcept ImportError:\n    pass\nelse:\n    sys.exit(3)\n"
        "from fgdata.configs import install_fastgen_alias\n"
        "install_fastgen_alias()\n"
        "from fastgen.configs.data import ImageLatentLoaderConfig\n"
        "from fastgen.configs.instantiate import LazyCall, instantiate\n"
        "from fastgen.utils.instantiate import instantiate as i2\n"
        "from fastgen.datasets.wds_dataloaders import WDSLoader\n"
        "from fastgen.datasets.class_cond_dataloader import ImageLoader\n"
        f"cfg = ImageLatentLoaderConfig.copy(); cfg.datatags = ['WDS:{grid}']; cfg.files_map = None\n"
        "cfg.key_map = {'condition': 'txt'}; cfg.num_workers = 0\n"
        "print(type(instantiate(cfg)).__name__, i2 is instantiate, ImageLoader.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["WDSLoader", "True", "ImageLoader"]
