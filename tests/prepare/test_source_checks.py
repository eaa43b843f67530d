"""Checks that run before any long pass: the ImageNet tree must look like ImageNet, and every model must be found."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from fgdata.sources.imagenet import KAGGLE_TRAIN

MISSING = "fgdata-tests/no-such-model"


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``fgdata ARGS`` in this process; with ``env``, a fresh one: the hub library reads its ``HF_*`` settings once,
    when it is imported."""
    if env is None:
        from inprocess import fgdata

        return fgdata(*args)
    return subprocess.run([sys.executable, "-m", "fgdata", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def _one_line_error(run: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert run.returncode == 1 and len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    return " ".join(lines[0].split())


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _photos(folder: Path, sample_images: list[Path], n: int = 2) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for p in sample_images[:n]:
        Image.open(p).convert("RGB").resize((80, 60)).save(folder / f"{p.stem}.JPEG")


def test_a_flat_photo_folder_is_not_imagenet(sample_images, tmp_path):
    flat = tmp_path / "photos"
    _photos(flat, sample_images)
    out = tmp_path / "out"
    line = _one_line_error(_cli("prepare", "imagenet-64", "--imagenet-source", flat, "--data-root", out))
    assert f"expected {flat / KAGGLE_TRAIN}" in line and "--allow-any-tree" in line
    assert _files(out) == []


def test_class_folders_without_synset_names_need_allow_any_tree(sample_images, tmp_path):
    tree = tmp_path / "pets"
    _photos(tree / "cats", sample_images)
    _photos(tree / "dogs", sample_images[2:])
    out = tmp_path / "out"
    line = _one_line_error(_cli("prepare", "imagenet-64", "--imagenet-source", tree, "--data-root", out))
    assert "'cats' is not a synset folder like n01440764" in line
    assert _files(out) == []
    run = _cli("prepare", "imagenet-64", "--imagenet-source", tree, "--data-root", out, "--allow-any-tree",
               "--workers", "1")
    assert run.returncode == 0, run.stderr
    assert (out / "imagenet-64" / "imagenet-64x64.zip").is_file()


def test_links_out_of_the_imagenet_tree_are_refused_per_image_unless_followed(sample_images, tmp_path):
    """The folder source's rule: an image that is a symlink, or lies in a linked folder, resolving outside the
    tree is a failure naming its target; links that stay inside are read; --follow-symlinks reads them all."""
    import json
    import zipfile

    train = tmp_path / "src" / "train"
    _photos(train / "n01440764", sample_images, 3)
    elsewhere = tmp_path / "elsewhere"
    _photos(elsewhere / "n01443537", sample_images[2:], 2)
    (train / "n01443537").symlink_to(elsewhere / "n01443537")  # a linked class folder
    (train / "n01440764" / "zz_out.JPEG").symlink_to(elsewhere / "n01443537" / f"{sample_images[2].stem}.JPEG")
    (train / "n01440764" / "zz_in.JPEG").symlink_to(train / "n01440764" / f"{sample_images[0].stem}.JPEG")
    out = tmp_path / "out"
    run = _cli("prepare", "imagenet-64", "--imagenet-source", train, "--data-root", out, "--workers", "1", "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert (doc["seen"], doc["written"], doc["failed"]) == (7, 4, 3)
    report = json.loads((out / "imagenet-64" / "failures.json").read_text())
    failures = {Path(f["input"]).name: f["reason"] for f in report["failures"]}
    target = elsewhere / "n01443537" / f"{sample_images[2].stem}.JPEG"
    assert failures["zz_out.JPEG"] == (f"symlink: zz_out.JPEG points to {target}, outside the source folder; "
                                       "pass --follow-symlinks to read it")
    assert len(failures) == 3 and "zz_in.JPEG" not in failures
    followed = _cli("prepare", "imagenet-64", "--imagenet-source", train, "--data-root", tmp_path / "followed",
                    "--workers", "1", "--follow-symlinks", "--json")
    assert followed.returncode == 0, followed.stderr
    assert (json.loads(followed.stdout)["written"], json.loads(followed.stdout)["failed"]) == (7, 0)
    with zipfile.ZipFile(tmp_path / "followed" / "imagenet-64" / "imagenet-64x64.zip") as zf:
        assert len(zf.namelist()) == 8


def test_a_kaggle_root_with_a_stray_folder_in_train_is_refused(imagenet_root, tmp_path):
    root = tmp_path / "kaggle"
    shutil.copytree(imagenet_root, root)
    (root / KAGGLE_TRAIN / "holiday-photos").mkdir()
    from fgdata.errors import FgdataError
    from fgdata.prepare import ImagenetOptions, RunSettings, prepare_imagenet64

    with pytest.raises(FgdataError, match="'holiday-photos' is not a synset folder"):
        prepare_imagenet64(ImagenetOptions(root, tmp_path / "out"), RunSettings(workers=1))
    assert _files(tmp_path / "out") == []


# -- models: found (or refused in one line) before any output ---------------------------------------


@pytest.fixture
def offline_empty_cache(tmp_path) -> dict:
    return {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}


def _model_commands(tmp_path: Path, shards: Path, imagenet_root: Path, model: str) -> dict[str, tuple[list, Path]]:
    """Each command that needs a model, with the output it must not have written when the model is missing."""
    out = tmp_path / "out"
    return {
        "prepare imagenet-256": (["prepare", "imagenet-256", "--imagenet-source", imagenet_root, "--data-root", out,
                                  "--vae", model, "--workers", "1"], out),
        "encode latents": (["encode", "latents", shards, out / "latents", "--vae", model, "-q"], out),
        "encode text": (["encode", "text", shards, out / "text", "--encoder", model, "-q"], out),
        "encode neg-prompt": (["encode", "neg-prompt", "--encoder", model, "--text", "blurry",
                               "--out", out / "neg.npy"], out),
        "kd pairs": (["kd", "pairs", out / "pairs", "--prompts", shards, "--teacher", model, "--steps", "4",
                      "--latent-shape", "4,8,8", "-q"], out),
        "kd paths": (["kd", "paths", out / "paths", "--prompts", shards, "--teacher", model, "--steps", "4",
                      "--latent-shape", "4,8,8", "-q"], out),
    }


@pytest.fixture(scope="module")
def caption_shards(tmp_path_factory, sample_images) -> Path:
    from fgdata.shards import ShardWriter

    dest = tmp_path_factory.mktemp("shards") / "in"
    with ShardWriter(str(dest)) as w:
        for i, p in enumerate(sample_images[:2]):
            w.write(f"s{i}", {"jpg": p.read_bytes() if p.suffix == ".jpg" else sample_images[-1].read_bytes(),
                              "txt": b"a photo"})
    return dest


@pytest.mark.parametrize("command", ["prepare imagenet-256", "encode latents", "encode text", "encode neg-prompt",
                                     "kd pairs", "kd paths"])
def test_offline_and_a_missing_model_fail_in_one_line_before_any_output(command, offline_empty_cache, tmp_path,
                                                                          caption_shards, imagenet_root):
    args, out = _model_commands(tmp_path, caption_shards, imagenet_root, MISSING)[command]
    line = _one_line_error(_cli(*args, env=offline_empty_cache))
    assert line.startswith(f"error: {MISSING}: HF_HUB_OFFLINE is set and this ") and "not in the cache" in line
    assert _files(out) == []  # refused before the first pass wrote anything (the RGB zip, shards, state)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_route_to_the_hub_fails_in_one_line_before_the_rgb_pass(tmp_path, imagenet_root):
    env = {"HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf-home"),
           "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"}
    out = tmp_path / "out"
    run = _cli("prepare", "imagenet-256", "--imagenet-source", imagenet_root, "--data-root", out,
               "--vae", "stabilityai/sd-vae-ft-mse", env=env)
    line = _one_line_error(run)
    assert "stabilityai/sd-vae-ft-mse: cannot reach http://127.0.0.1:" in line and "not in the cache" in line
    assert _files(out) == []


def test_a_missing_model_directory_is_named(tmp_path, imagenet_root):
    out = tmp_path / "out"
    line = _one_line_error(_cli("prepare", "imagenet-256", "--imagenet-source", imagenet_root, "--data-root", out,
                                "--vae", "./models/no-such-vae"))
    assert line == "error: ./models/no-such-vae: no such VAE directory (--vae)"
    assert _files(out) == []


@pytest.mark.slow  # a fresh process that loads the model libraries
def test_a_cached_model_passes_offline_and_loads_from_the_cache(tmp_path, tiny_vae_dir):
    """The real hub cache layout (refs/main -> snapshots/<rev>/): the check admits it and from_pretrained loads it."""
    cache = tmp_path / "hub"
    snapshot = cache / "models--fgdata-tests--tiny-vae" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_vae_dir, snapshot)
    (cache / "models--fgdata-tests--tiny-vae" / "refs").mkdir()
    (cache / "models--fgdata-tests--tiny-vae" / "refs" / "main").write_text("0" * 40)
    code = ("from fgdata.compute import check_model\n"
            "from fgdata.encode.vae import load_vae\n"
            "check_model('fgdata-tests/tiny-vae', 'VAE', '--vae')\n"
            "print(type(load_vae('fgdata-tests/tiny-vae')).__name__)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)})
    assert run.returncode == 0 and run.stdout.strip() == "AutoencoderKL", run.stderr


def test_a_broken_local_vae_fails_before_the_rgb_pass(tmp_path, imagenet_root, tiny_vae_dir):
    broken = tmp_path / "vae"
    shutil.copytree(tiny_vae_dir, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:100])  # a torn download
    out = tmp_path / "out"
    line = _one_line_error(_cli("prepare", "imagenet-256", "--imagenet-source", imagenet_root, "--data-root", out,
                                "--vae", broken, "--workers", "1"))
    assert line.startswith(f"error: {broken}: cannot load the VAE")
    assert _files(out) == []
