"""ImageNet-64 (both flavours) and ImageNet-256: pixels against the reference algorithms, labels, order, reports."""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import edm_reference as ref
from faultkit import hold_and_release
from fgdata.errors import FgdataError
from fgdata.cli.prepare import Phases
from fgdata.prepare import ImagenetOptions, LatentZipOptions, RunSettings, prepare_imagenet64, prepare_imagenet256
from fgdata.sources.imagenet import KAGGLE_TRAIN


def phased(run: RunSettings, update) -> RunSettings:
    """``run`` drawing ``update(phase, done, total)`` per pass, as the CLI's bars do (the RGB pass is "convert")."""
    phases = Phases(["convert", "encode rank 0", "merge"], update)
    return replace(run, progress=phases.progress, on_start=phases.on_start)


def _pixels(zf: zipfile.ZipFile, name: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(zf.read(name))))


def _labels_json(train, files) -> bytes:
    labels = ref.toplevel_labels(str(train), files)
    return json.dumps({"labels": [[f"{i // 1000:05d}/img{i:08d}.png", labels[f]] for i, f in enumerate(files)]}).encode()


def test_imagenet64_pixels_labels_and_report(imagenet_root, tmp_path):
    summaries = prepare_imagenet64(ImagenetOptions(imagenet_root, tmp_path), RunSettings(workers=2))
    train = imagenet_root / KAGGLE_TRAIN
    assert [s.written for s in summaries] == [10, 10]
    converted = {c.input.rsplit("/", 1)[1]: c.mode for c in summaries[0].converted}
    assert converted == {"d.JPEG": "CMYK", "e.png": "P", "f.png": "RGBA", "g.png": "LA"}
    edm_files = ref.edm_files(str(train))
    with zipfile.ZipFile(tmp_path / "imagenet-64" / "imagenet-64x64.zip") as zf:
        assert zf.read("dataset.json") == _labels_json(train, edm_files)
        for i, f in enumerate(edm_files):
            src = Image.open(f)
            raw = ref.load_edm(f) if src.mode in ("RGB", "L") else np.asarray(src.convert("RGB"))
            np.testing.assert_array_equal(_pixels(zf, f"00000/img{i:08d}.png"), ref.edm_crop(raw, 64), err_msg=f)
    ref.convert_folder(str(train), str(tmp_path / "ref2.zip"), "edm2", 64)
    with zipfile.ZipFile(tmp_path / "imagenet-64" / "imagenet-64x64-edmv2.zip") as zf, \
            zipfile.ZipFile(tmp_path / "ref2.zip") as rz:
        assert zf.namelist() == rz.namelist() and zf.read("dataset.json") == rz.read("dataset.json")
        for name in zf.namelist()[:-1]:
            np.testing.assert_array_equal(_pixels(zf, name), _pixels(rz, name), err_msg=name)
    provenance = json.loads((tmp_path / "imagenet-64" / "imagenet-64x64.zip.provenance.json").read_text())
    assert provenance["written"] == 10 and len(provenance["converted_modes"]) == 4


def test_a_stopped_run_keeps_its_finished_units_and_writes_a_torn_ones_again(imagenet_root, tmp_path, monkeypatch):
    import fgdata.prepare.build as build

    monkeypatch.setattr(build, "UNIT_INPUTS", 3)  # 11 inputs: units of 3, 3, 3 and 2
    tree = tmp_path / "train"
    shutil.copytree(imagenet_root / KAGGLE_TRAIN, tree)
    (tree / "n01484850" / "k.JPEG").write_bytes(b"\xff\xd8\xff\xe0 not a whole JPEG")  # fails, in the last unit
    full = prepare_imagenet64(ImagenetOptions(tree, tmp_path / "a"), RunSettings(workers=1))
    assert [(s.written, s.failed) for s in full] == [(10, 1), (10, 1)]

    def stop(phase, done, total):
        if done == 6:  # units 0 and 1 are in
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare_imagenet64(ImagenetOptions(tree, tmp_path / "b"), phased(RunSettings(workers=2), stop))
    folder = tmp_path / "b" / "imagenet-64"
    units = folder / ".fgdata" / "zips" / "imagenet-64x64.zip" / "units"
    assert sorted(p.name for p in units.iterdir()) == ["000000.json", "000001.json"]
    (units / "000001.json").write_text('{"format": "fgdata.unit", "vers')  # torn: its unit is written again
    started = []

    def record(phase, done, total):
        started.append(done)

    again = prepare_imagenet64(ImagenetOptions(tree, tmp_path / "b"), phased(RunSettings(workers=2), record))
    assert started[0] == 3 and [s.resumed for s in again] == [3, 3]  # unit 0 kept, written on from unit 1
    assert [(s.written, s.failed, s.converted) for s in again] == [(s.written, s.failed, s.converted) for s in full]
    for name in ("imagenet-64x64.zip", "imagenet-64x64-edmv2.zip", "failures.json"):
        assert (folder / name).read_bytes() == (tmp_path / "a" / "imagenet-64" / name).read_bytes(), name
    assert not (folder / ".fgdata" / "zips").exists()
    assert json.loads((folder / "failures.json").read_text())["failures"][0]["input"].endswith("k.JPEG")


def test_train_folder_and_max_images(imagenet_root, tmp_path):
    train = imagenet_root / KAGGLE_TRAIN
    [edm, _] = prepare_imagenet64(ImagenetOptions(train, tmp_path, max_images=4), RunSettings(workers=1))
    with zipfile.ZipFile(edm.path) as zf:
        assert len(zf.namelist()) == 5
        assert zf.read("dataset.json") == _labels_json(train, ref.edm_files(str(train))[:4])


def test_component_order_differs_from_string_order(sample_images, tmp_path):
    src = tmp_path / "src"
    for folder, photo in (("a", sample_images[0]), ("a-b", sample_images[1])):
        (src / folder).mkdir(parents=True)
        Image.open(photo).convert("RGB").save(src / folder / "x.png")
    edm, edm2 = prepare_imagenet64(ImagenetOptions(src, tmp_path / "out", allow_any_tree=True), RunSettings(workers=1))
    with zipfile.ZipFile(edm.path) as z1, zipfile.ZipFile(edm2.path) as z2:
        first_edm, first_edm2 = ref.edm_files(str(src))[0], ref.edm2_files(str(src))[0]
        assert first_edm.endswith("/a/x.png") and first_edm2.endswith("/a-b/x.png")
        np.testing.assert_array_equal(_pixels(z1, "00000/img00000000.png"), ref.edm_crop(ref.load_edm(first_edm), 64))
        np.testing.assert_array_equal(_pixels(z2, "00000/img00000000.png"), ref.adm_crop(ref.load_edm2(first_edm2), 64))


def test_strict_refuses_non_rgb_and_damaged_inputs_are_counted(imagenet_root, tmp_path):
    with pytest.raises(FgdataError, match="CMYK"):
        prepare_imagenet64(ImagenetOptions(imagenet_root, tmp_path / "strict", strict=True), RunSettings(workers=1))
    tree = tmp_path / "tree"
    shutil.copytree(imagenet_root / KAGGLE_TRAIN, tree)
    (tree / "n01440764" / "broken.JPEG").write_bytes(b"\xff\xd8\xff not a jpeg")
    edm, edm2 = prepare_imagenet64(ImagenetOptions(tree, tmp_path / "out"), RunSettings(workers=2))
    assert (edm.seen, edm.written, edm.failed) == (11, 10, 1) and edm.failures_path == str(tmp_path / "out" / "imagenet-64" / "failures.json")
    report = json.loads((tmp_path / "out" / "imagenet-64" / "failures.json").read_text())
    assert report["command"] == "prepare imagenet-64" and (report["seen"], report["written"], report["failed"]) == (11, 10, 1)
    assert report["failures"][0]["input"].endswith("broken.JPEG")


def test_imagenet256_rgb_and_latents(imagenet_root, tiny_vae_dir, tmp_path):
    import torch
    from diffusers import AutoencoderKL

    rgb, sd = prepare_imagenet256(ImagenetOptions(imagenet_root, tmp_path, max_images=6),
                                  LatentZipOptions(str(tiny_vae_dir), device="cpu", batch_size=4), RunSettings(workers=2))
    assert rgb.written == 6 and sd.written == 6
    vae = AutoencoderKL.from_pretrained(tiny_vae_dir).eval()
    files = ref.edm2_files(str(imagenet_root / KAGGLE_TRAIN))[:6]
    with zipfile.ZipFile(rgb.path) as rz, zipfile.ZipFile(sd.path) as lz:
        names = lz.namelist()
        assert names == [f"00000/img-mean-std-{i:08d}.npy" for i in range(6)] + ["dataset.json"]
        rgb_labels = json.loads(rz.read("dataset.json"))["labels"]
        assert json.loads(lz.read("dataset.json"))["labels"] == [[n, lab] for n, (_, lab) in zip(names, rgb_labels)]
        for i, f in enumerate(files):
            pixels = _pixels(rz, f"00000/img{i:08d}.png")
            np.testing.assert_array_equal(pixels, ref.adm_crop(ref.load_edm2(f), 256))
            data = lz.read(names[i])
            assert len(data) == 32896 and lz.getinfo(names[i]).compress_type == zipfile.ZIP_STORED
            got = np.load(io.BytesIO(data), allow_pickle=False)
            assert got.dtype == np.dtype("<f4") and got.shape == (8, 32, 32)
            x = torch.from_numpy(pixels.copy()).permute(2, 0, 1)[None].float() / 127.5 - 1
            with torch.no_grad():
                dist = vae.encode(x).latent_dist
            want = torch.cat([dist.mean, torch.exp(0.5 * torch.clamp(dist.logvar, -30, 20))], 1)[0].numpy()
            # 1e-4 relative for sources at least 256 px; sources upsampled from under 130 px are nearly
            # flat, and this random 0.25 M-parameter VAE amplifies float32 reduction-order noise on them (2.4e-4).
            tolerance = 1e-4 if min(Image.open(f).size) >= 256 else 5e-4
            assert np.linalg.norm(got - want) <= tolerance * np.linalg.norm(want), f
    provenance = json.loads((tmp_path / "imagenet-256" / "imagenet_256_sd.zip.provenance.json").read_text())
    assert provenance["vae"] == str(tiny_vae_dir) and provenance["dtype"] == "float32"


def test_two_ranks_merge_into_the_single_rank_zip(imagenet_root, tiny_vae_dir, tmp_path):
    from fgdata.prepare.latents import encode_latent_zip

    latents = LatentZipOptions(str(tiny_vae_dir), device="cpu", batch_size=3)
    prepare_imagenet256(ImagenetOptions(imagenet_root, tmp_path, max_images=5), latents)
    rgb, single = tmp_path / "imagenet-256" / "imagenet_256_rgb.zip", tmp_path / "imagenet-256" / "imagenet_256_sd.zip"
    dest = tmp_path / "two" / "imagenet_256_sd.zip"
    part = encode_latent_zip(rgb, dest, latents, rank=1, world_size=2)
    assert (part.seen, part.whole_job, part.failures_path) == (2, False, None) and not dest.exists()  # images 3, 4
    assert part.path == str(dest)  # its share of the zip rank 0 writes
    encode_latent_zip(rgb, dest, latents, rank=0, world_size=2)
    with zipfile.ZipFile(single) as a, zipfile.ZipFile(dest) as b:
        assert a.namelist() == b.namelist() and a.read("dataset.json") == b.read("dataset.json")
        for name in a.namelist()[:-1]:
            x, y = (np.load(io.BytesIO(z.read(name))) for z in (a, b))
            assert np.linalg.norm(x - y) <= 1e-4 * np.linalg.norm(x)
    assert sorted(p.name for p in dest.parent.iterdir() if p.name != ".fgdata") == [
        "failures.json", "imagenet_256_sd.zip", "imagenet_256_sd.zip.provenance.json"]


def test_a_stopped_latent_pass_keeps_its_finished_units_and_appends_them_in_order(imagenet_root, tiny_vae_dir,
                                                                                 tmp_path, monkeypatch):
    """Latent units of 2 positions (5 latents: units 0, 1 and 2): a stop in unit 2 leaves units 0 and 1 with their
    markers and parts and unit 2 with its plan; a torn marker's unit is encoded again, and the zip the one
    finishing step appends is the uninterrupted run's, byte for byte."""
    import fgdata.prepare.build as build
    from fgdata.jobs.units import Marker, Plan

    monkeypatch.setattr(build, "UNIT_INPUTS", 2)
    latents = LatentZipOptions(str(tiny_vae_dir), device="cpu", batch_size=1)
    prepare_imagenet256(ImagenetOptions(imagenet_root, tmp_path / "a", max_images=5), latents, RunSettings(workers=1))

    def stop(phase, done, total):
        if phase.startswith("encode") and done == 5:  # the last latent of unit 2 is in its part, not its marker
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare_imagenet256(ImagenetOptions(imagenet_root, tmp_path / "b", max_images=5), latents,
                            phased(RunSettings(workers=1), stop))
    folder = tmp_path / "b" / "imagenet-256"
    job = folder / ".fgdata" / "zips" / "imagenet_256_sd.zip"
    found = [(p.name, Marker.parse(p.read_bytes()), Plan.parse(p.read_bytes())) for p in sorted((job / "units").iterdir())]
    assert [(name, m is not None, p is not None) for name, m, p in found] == [
        ("000000.json", True, False), ("000001.json", True, False), ("000002.json", False, True)]
    assert sorted(p.name for p in (job / "parts").iterdir()) == [
        "unit000000.zip", "unit000000.zip.provenance.json", "unit000001.zip", "unit000001.zip.provenance.json",
        "unit000002.zip.partial", "unit000002.zip.partial.json"]
    assert not (folder / "imagenet_256_sd.zip").exists()
    (job / "units" / "000001.json").write_text('{"format": "fgdata.unit", "vers')  # torn: its unit is encoded again
    started = []

    def record(phase, done, total):
        if phase.startswith("encode"):
            started.append(done)

    again = prepare_imagenet256(ImagenetOptions(imagenet_root, tmp_path / "b", max_images=5), latents,
                                phased(RunSettings(workers=1), record))
    assert started[0] == 2 and again[0].kept  # unit 0 kept, encoded on from unit 1
    for name in ("imagenet_256_sd.zip", "imagenet_256_sd.zip.provenance.json", "failures.json"):
        assert (folder / name).read_bytes() == (tmp_path / "a" / "imagenet-256" / name).read_bytes(), name
    assert not (folder / ".fgdata" / "zips").exists()


def test_rank_0_never_merges_a_part_written_with_other_options(imagenet_root, tiny_vae_dir, tmp_path, monkeypatch):
    """Rank 1's finished unit of bfloat16 latents (its marker and part) sits where the unit's go; a float32 job's
    rank 0 waits for rank 1's own unit (here: in vain, bounded) instead of appending it."""
    from fgdata.prepare.latents import encode_latent_zip

    prepare_imagenet256(ImagenetOptions(imagenet_root, tmp_path, max_images=5),
                        LatentZipOptions(str(tiny_vae_dir), device="cpu", batch_size=3))
    rgb = tmp_path / "imagenet-256" / "imagenet_256_rgb.zip"
    dest = tmp_path / "two" / "imagenet_256_sd.zip"
    other = LatentZipOptions(str(tiny_vae_dir), dtype="bfloat16", device="cpu", batch_size=3)
    assert encode_latent_zip(rgb, dest, other, rank=1, world_size=2).seen == 2
    monkeypatch.setenv("FGDATA_WAIT_TIMEOUT", "0.2")
    latents = LatentZipOptions(str(tiny_vae_dir), device="cpu", batch_size=3)
    with pytest.raises(FgdataError, match=r"the other ranks' units: still missing after .*: unit 1 \(rank 1\)"):
        encode_latent_zip(rgb, dest, latents, rank=0, world_size=2)
    assert not dest.exists()


@pytest.mark.slow  # torchrun ranks as processes
def test_no_resume_under_torchrun_rebuilds_both_zips_never_reading_the_earlier_ones(imagenet_root, tiny_vae_dir,
                                                                                   tmp_path):
    """The second launch (--no-resume) holds rank 0 where it is about to replace the earlier RGB zip (the job
    signals the point): rank 1 must wait for this launch's RGB zip, not take the earlier one (and then skip its
    latent part because the earlier latent zip is complete). Both launches write the same bytes."""
    import hashlib
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "FGDATA_WAIT_TIMEOUT": "200"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", "-m",
           "fgdata.cli.main", "prepare", "imagenet-256", "--imagenet-source", str(imagenet_root), "--data-root",
           str(tmp_path), "--vae", str(tiny_vae_dir), "--device", "cpu", "--max-images", "5", "--batch-size", "3",
           "--workers", "1", "--no-progress", "--json"]
    out = tmp_path / "imagenet-256"

    def digests() -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir()) if p.is_file()}

    first = subprocess.run(cmd, capture_output=True, text=True, cwd=repo, env=env, timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    before = digests()
    assert {"imagenet_256_rgb.zip", "imagenet_256_sd.zip", "imagenet_256_sd.zip.provenance.json"} <= set(before)

    # rank 1 either waits for the RGB zip of this launch or (the bug) goes on with the earlier one and ends;
    # rank 0 holds twice: before it replaces the RGB zip, and before it replaces its latent part
    run = hold_and_release([*cmd, "--no-resume"], hold="no-resume@0", releases=2, env=env, cwd=repo,
                           until=lambda line: "the RGB zip" in line or line.startswith("{"))
    assert all("at no-resume (rank 0," in line for line in run.holds)
    assert run.seen.startswith("waiting for ") and "the RGB zip: 1 missing" in run.seen, run.seen
    assert run.returncode == 0, run.output[-3000:]
    assert digests() == before


def test_offline_hub_id_fails_in_one_line(monkeypatch, tmp_path):
    from fgdata.encode.vae import load_vae

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(FgdataError) as info:
        load_vae("stabilityai/sd-vae-ft-mse")
    assert "HF_HUB_OFFLINE" in str(info.value) and "--vae DIR" in str(info.value) and "\n" not in str(info.value)


def test_latent_zip_of_other_options_is_refused_then_rebuilt_with_no_resume(imagenet_root, tiny_vae_dir, tmp_path):
    source = ImagenetOptions(imagenet_root, tmp_path, max_images=3)
    latents = LatentZipOptions(str(tiny_vae_dir), device="cpu", batch_size=4)
    bf16 = LatentZipOptions(str(tiny_vae_dir), "bfloat16", device="cpu", batch_size=4)
    prepare_imagenet256(source, latents, RunSettings(workers=1))
    with pytest.raises(FgdataError, match=r"imagenet_256_sd.zip: an earlier run wrote it with other options "
                                          r"\(--dtype was 'float32', now 'bfloat16'\)"):
        prepare_imagenet256(source, bf16, RunSettings(workers=1))
    said: list[str] = []
    rgb, sd = prepare_imagenet256(source, bf16, RunSettings(workers=1, resume=False, notify=said.append))
    assert said[0].startswith("--no-resume: removing 2 file(s)") and "imagenet_256_rgb.zip" in said[0]
    assert any("imagenet_256_sd.zip" in line for line in said[1:])
    assert json.loads(Path(sd.path + ".provenance.json").read_text())["dtype"] == "bfloat16"
    report = json.loads((tmp_path / "imagenet-256" / "failures.json").read_text())
    assert (report["command"], report["seen"], report["written"], report["failed"]) == ("prepare imagenet-256", 3, 3, 0)
    other_batch = LatentZipOptions(str(tiny_vae_dir), "bfloat16", device="cpu", batch_size=2)  # RUNTIME: same bytes
    again = prepare_imagenet256(source, other_batch, RunSettings(workers=1))
    assert all(s.kept for s in again) and (again[-1].seen, again[-1].written, again[-1].failed) == (3, 3, 0)
