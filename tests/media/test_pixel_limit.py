"""Pillow's MAX_IMAGE_PIXELS is refused on every path: header fast paths, Pillow, prepare, loaders, verify, shard."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from fgdata.shards import discover_shards, iter_samples

from fgdata.media import ImageDecodeError, check_member, decode_member, describe_image, load_image_for_training
from fgdata.media.image import image_size, open_image


LIMIT = "decompression bomb"  # our message, or Pillow's beyond twice the limit


@pytest.mark.parametrize("ext", ["jpg", "png"])
def test_every_decode_path_refuses_a_bomb(ext, bombs, tmp_path):
    data = bombs[ext]
    assert len(data) < 1000
    calls = [
        lambda: describe_image(data),
        lambda: image_size(data),
        lambda: open_image(data),
        lambda: load_image_for_training(data, 64),  # JPEG frame header + simplejpeg
        lambda: load_image_for_training(data, 64, simplejpeg=False),
        lambda: load_image_for_training(data, 64, resize="reference"),
        lambda: decode_member(ext, data),
    ]
    for call in calls:
        with pytest.raises(ImageDecodeError, match=LIMIT):
            call()
    assert check_member(ext, data) == "image-decode"  # verify --decode

    from fgdata.prepare.transforms import open_rgb

    path = tmp_path / "bomb.img"
    path.write_bytes(data)
    with pytest.raises(ImageDecodeError, match=LIMIT):
        open_rgb(str(path))


def test_the_class_loader_refuses_a_png_bomb_before_pyspng(tmp_path, sample_data, bombs):
    from fgdata.loaders.image_loader import ImageZipDataset

    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.open(sample_data / "chelsea.png").convert("RGB").resize((8, 8)).save(folder / "a.png")
    (folder / "b.png").write_bytes(bombs["png"])
    ds = ImageZipDataset(str(folder), use_labels=False, use_pyspng=True)
    assert ds[0]["real"].shape == (3, 8, 8)
    with pytest.raises(ImageDecodeError, match=LIMIT):
        ds[1]


def test_the_limit_is_pillows_own_setting_at_one_times(monkeypatch, sample_data, bombs):
    """Above 1x Pillow only warns; fgdata refuses. ``MAX_IMAGE_PIXELS = None`` turns the check off, as in Pillow."""
    data = (sample_data / "rocket.jpg").read_bytes()
    w, h = Image.open(io.BytesIO(data)).size
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", w * h - 1)
    for call in (lambda: describe_image(data), lambda: open_image(data), lambda: load_image_for_training(data, 32)):
        with pytest.raises(ImageDecodeError, match=f"{w}x{h}"):
            call()
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", w * h)
    assert describe_image(data)["width"] == w
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert image_size(bombs["jpg"]) == image_size(bombs["png"]) == (65000, 65000)  # header only: nothing decoded


# -- raising the limit for one job: --max-pixels and FGDATA_MAX_PIXELS ------------------------------------


@pytest.fixture(scope="module")
def over_the_limit(tmp_path_factory) -> Path:
    """A real 13500x13500 grey JPEG (182 million pixels, above Pillow's default limit of about 179 million)."""
    folder = tmp_path_factory.mktemp("huge") / "src"
    folder.mkdir()
    Image.new("L", (13500, 13500), 90).save(folder / "scan.jpg", quality=50)
    (folder / "scan.txt").write_text("a large scan")
    return folder


def _shard(*args, expect: int = 0, env: dict | None = None) -> dict:
    from typer.testing import CliRunner

    from fgdata.cli.main import app

    result = CliRunner().invoke(app, ["shard", "images", *map(str, args), "--no-progress", "--json"], env=env)
    assert result.exit_code == expect, (result.output, result.exception)
    return json.loads(result.stdout)


def test_an_image_over_the_default_limit_shards_with_max_pixels_and_max_side(over_the_limit, tmp_path):
    assert Image.MAX_IMAGE_PIXELS is not None and 13500 * 13500 > Image.MAX_IMAGE_PIXELS  # the default stays
    dest = tmp_path / "out"
    doc = _shard(over_the_limit, dest, "--max-side", "2048", expect=1)
    assert (doc["seen"], doc["written"], doc["failed"]) == (1, 0, 1)
    (entry,) = json.loads((dest / "failures.json").read_text())["failures"]
    assert entry["reason"].startswith("image-decode: ") and LIMIT in entry["reason"]
    assert "--max-pixels" in entry["reason"] and "FGDATA_MAX_PIXELS" in entry["reason"]

    doc = _shard(over_the_limit, dest, "--max-side", "2048", "--max-pixels", "200000000", "--no-resume")
    assert (doc["seen"], doc["written"], doc["failed"]) == (1, 1, 0)
    (sample,) = iter_samples(discover_shards(str(dest))[0])
    assert Image.open(io.BytesIO(sample.members["jpg"])).size == (2048, 2048)
    assert sample.members["txt"] == b"a large scan"
    assert json.loads((dest / "shard_job.json").read_text())["options"]["max_pixels"] == 200_000_000
    assert Image.MAX_IMAGE_PIXELS is not None and 13500 * 13500 > Image.MAX_IMAGE_PIXELS  # restored after the job


def test_the_environment_variable_sets_the_flag_and_the_flag_can_lower_it(sample_images, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for p in sample_images[:2]:
        shutil.copyfile(p, src / p.name)
    doc = _shard(src, tmp_path / "low", "--max-pixels", "100", expect=1)
    assert doc["failed"] == 2
    doc = _shard(src, tmp_path / "env", env={"FGDATA_MAX_PIXELS": "100"}, expect=1)
    assert doc["failed"] == 2
    assert json.loads((tmp_path / "env" / "shard_job.json").read_text())["options"]["max_pixels"] == 100
    assert _shard(src, tmp_path / "default")["written"] == 2


def test_every_decoding_process_reads_the_variable(tmp_path):
    """Loaders and verify run outside shard and prepare: the variable alone sets their limit (a fresh process)."""
    path = tmp_path / "wide.png"
    Image.new("L", (3000, 1000)).save(path)
    code = ("import sys; from fgdata.media import describe_image; "
            "print(describe_image(open(sys.argv[1], 'rb').read())['width'])")
    run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         env={**os.environ, "FGDATA_MAX_PIXELS": "1000"})
    assert run.returncode == 1 and LIMIT in run.stderr and "FGDATA_MAX_PIXELS=N" in run.stderr
    run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         env={**os.environ, "FGDATA_MAX_PIXELS": "3000000"})
    assert run.returncode == 0 and run.stdout.strip() == "3000"


def test_prepare_takes_max_pixels(sample_images, tmp_path):
    tree = tmp_path / "tree" / "cats"
    tree.mkdir(parents=True)
    for p in sample_images[:2]:
        Image.open(p).convert("RGB").resize((80, 60)).save(tree / f"{p.stem}.jpg")
    root = tmp_path / "root"
    args = [sys.executable, "-m", "fgdata", "prepare", "imagenet-64", "--imagenet-source", str(tmp_path / "tree"),
            "--allow-any-tree", "--data-root", str(root), "--no-progress", "--json", "--workers", "1"]
    run = subprocess.run([*args, "--max-pixels", "100"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    failures = json.loads((root / "imagenet-64" / "failures.json").read_text())["failures"]
    assert len(failures) == 2 and all("--max-pixels" in f["reason"] for f in failures)
    run = subprocess.run([*args, "--no-resume"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and json.loads(run.stdout)["written"] == 2, run.stderr
