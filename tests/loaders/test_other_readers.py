"""The default output of ``fgdata shard images`` on a folder mixing JPEG, PNG and WebP, read by other tools.

One image format per dataset (``--format jpg`` by default) is what lets HF ``datasets`` and a plain
webdataset pipeline read every sample and every caption, and a single-key loader config
(``{"real_raw": "jpg"}``, as the reference configs have) see every sample.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PIL import Image

from fgdata.configs import ImageLoaderConfig, instantiate
from fgdata.sharding.job import ShardJob, run_shard
from fgdata.producers.media import ShardOptions

PHOTOS = ("chelsea.png", "coffee.png", "horse.png", "camera.png", "rocket.jpg", "grace_hopper.jpg", "hubble_deep_field.jpg")


@pytest.fixture(scope="module")
def default_shards(tmp_path_factory, sample_data) -> tuple[list[str], dict[str, str]]:
    """The bundled photos as found (JPEG, PNG) plus a WebP copy of each, with captions, sharded by default.
    Returns the shard paths and the caption of every input (by caption text, all distinct)."""
    root = tmp_path_factory.mktemp("readers")
    src = root / "photos"
    src.mkdir()
    for name in PHOTOS:
        shutil.copy(sample_data / name, src / name)
        im = Image.open(sample_data / name)
        im.thumbnail((80, 80))
        im.save(src / f"small_{Path(name).stem}.webp", "WEBP", quality=90)
    captions = {}
    for f in sorted(src.iterdir()):
        captions[f.name] = f"a photo called {f.name}"
        f.with_suffix(".txt").write_text(captions[f.name])
    assert {f.suffix for f in src.iterdir()} == {".jpg", ".png", ".webp", ".txt"}
    report = run_shard(ShardJob(src=str(src), dest=str(root / "shards"), options=ShardOptions(kind="images"),
                                    maxcount=5))
    assert report.failed == 0 and report.written == len(captions)
    return [str(root / "shards" / name) for name in sorted(report.counts)], captions


def test_hf_datasets_loads_every_sample_and_caption(default_shards, tmp_path):
    import datasets
    shards, captions = default_shards
    ds = datasets.load_dataset("webdataset", data_files={"train": shards}, split="train", cache_dir=str(tmp_path))
    assert len(ds) == len(captions)
    assert sorted(ds["txt"]) == sorted(captions.values())
    for row in ds:
        assert isinstance(row["jpg"], Image.Image) and row["jpg"].mode in ("RGB", "L") and row["json"]["fgdata"]


def test_plain_webdataset_pipeline_reads_every_sample_and_caption(default_shards):
    import webdataset as wds

    shards, captions = default_shards
    pipeline = wds.WebDataset(shards, shardshuffle=False, empty_check=False).decode("pil").to_tuple("__key__", "jpg", "txt")
    rows = list(pipeline)
    assert len(rows) == len({k for k, _, _ in rows}) == len(captions)
    assert sorted(t for _, _, t in rows) == sorted(captions.values())
    assert all(isinstance(im, Image.Image) for _, im, _ in rows)


def test_single_key_config_sees_every_sample(default_shards):
    shards, captions = default_shards
    cfg = ImageLoaderConfig.copy()
    cfg.datatags = ["WDS:" + str(Path(shards[0]).parent)]
    cfg.input_res, cfg.batch_size, cfg.num_workers = 32, 4, 0
    cfg.key_map = {"real_raw": "jpg", "condition_raw": "txt"}
    cfg.deterministic, cfg.train, cfg.partial = True, False, True
    batches = list(instantiate(cfg))
    keys = [k for b in batches for k in b["__key__"]]
    assert len(keys) == len(set(keys)) == len(captions)
    assert sorted(c for b in batches for c in b["condition_raw"]) == sorted(captions.values())
