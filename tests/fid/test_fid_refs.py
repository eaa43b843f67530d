"""``fgdata fid-refs``: exact file formats, the reference accumulation, ranks, resume, shards, S3, detectors."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fidkit import png, random_images, write_edm_zip

from fgdata.errors import FgdataError
from fgdata.fid.refs import RefOptions, compute_refs
from fgdata.fid.stats import frechet_distance

CPU = {"device": "cpu", "batch_size": 3}


def _fid(tiny_net, weights):
    from fgdata.fid.detectors import load_inception

    return load_inception(str(weights), "cpu", build=tiny_net)


def _features(net, images: list[np.ndarray]) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return net(torch.from_numpy(np.stack(images).transpose(0, 3, 1, 2))).to(torch.float64).numpy()


def _tiny_loaded(tiny_net, weights):
    from safetensors.torch import load_file

    net = tiny_net()
    net.load_state_dict(load_file(str(weights)))
    return net.eval()


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_edm_npz_exact_format_and_numpy_equality(edm_zip, tmp_path, tiny_net, tiny_inception_weights):
    zip_path, images = edm_zip
    out = tmp_path / "refs" / "set.npz"
    summary = compute_refs(str(zip_path), str(out), RefOptions(chunk_size=4, **CPU),
                           detectors={"fid": _fid(tiny_net, tiny_inception_weights)})
    with np.load(out, allow_pickle=False) as z:
        assert sorted(z.files) == ["mu", "sigma"]
        mu, sigma = z["mu"], z["sigma"]
    assert mu.dtype == sigma.dtype == np.float64 and mu.shape == (2048,) and sigma.shape == (2048, 2048)
    f = _features(_tiny_loaded(tiny_net, tiny_inception_weights), images)
    assert _rel(mu, f.mean(0)) < 1e-10
    assert _rel(sigma, np.cov(f, rowvar=False)) < 1e-10
    prov = json.loads(Path(f"{out}.provenance.json").read_text())
    assert prov["images"] == summary.seen == len(images)  # every image once
    assert prov["format"] == "edm-npz" and prov["chunks"] == 3
    digest = hashlib.sha256(tiny_inception_weights.read_bytes()).hexdigest()
    assert prov["detectors"]["fid"]["files"] == {tiny_inception_weights.name: digest}
    assert prov["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert not Path(f"{out}.chunks").exists()
    again = compute_refs(str(zip_path), str(out), RefOptions(chunk_size=4, **CPU),
                         detectors={"fid": _fid(tiny_net, tiny_inception_weights)})
    assert again.kept and again.computed == 0
    redo = compute_refs(str(zip_path), str(out), RefOptions(chunk_size=4, resume=False, **CPU),
                        detectors={"fid": _fid(tiny_net, tiny_inception_weights)})
    assert not redo.kept and redo.computed == len(images)


def test_a_reference_fgdata_did_not_write_is_kept_unless_overwrite(edm_zip, tmp_path, tiny_net, tiny_inception_weights):
    zip_path, images = edm_zip
    out = tmp_path / "cifar10-32x32.npz"
    np.savez(out, mu=np.zeros(2048), sigma=np.eye(2048))  # e.g. the EDM authors' published file
    before = out.read_bytes()
    det = {"fid": _fid(tiny_net, tiny_inception_weights)}
    with pytest.raises(FgdataError, match=r"exists and fgdata did not write it .*--overwrite"):
        compute_refs(str(zip_path), str(out), RefOptions(chunk_size=4, **CPU), detectors=det)
    assert out.read_bytes() == before
    done = compute_refs(str(zip_path), str(out), RefOptions(chunk_size=4, overwrite=True, **CPU), detectors=det)
    assert done.seen == len(images) and out.read_bytes() != before


def test_the_work_folder_is_the_jobs_destination(edm_zip, tmp_path, tiny_net, tiny_inception_weights):
    """A file fgdata did not write in the work folder is refused in one line naming it; --overwrite removes it
    (saying so) and computes every chunk again; the output is a clean run's bytes and the folder, lock included,
    is gone."""
    zip_path, images = edm_zip
    det = {"fid": _fid(tiny_net, tiny_inception_weights)}
    clean, out = tmp_path / "clean.npz", tmp_path / "out.npz"
    compute_refs(str(zip_path), str(clean), RefOptions(chunk_size=4, **CPU), detectors=det)
    work = Path(f"{out}.chunks")
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    with pytest.raises(FgdataError, match=r"out\.npz\.chunks holds files fgdata did not write \(notes\.txt\)"):
        compute_refs(str(zip_path), str(out), RefOptions(chunk_size=4, **CPU), detectors=det)
    assert (work / "notes.txt").read_text() == "mine" and not out.exists()
    said: list[str] = []
    done = compute_refs(str(zip_path), str(out), RefOptions(chunk_size=4, overwrite=True, **CPU), detectors=det,
                        notify=said.append)
    assert any("notes.txt" in line and "--overwrite" in line for line in said), said
    assert done.computed == len(images) and out.read_bytes() == clean.read_bytes() and not work.exists()


def test_an_output_that_is_the_source_is_refused_even_with_overwrite(edm_zip, tmp_path, tiny_net,
                                                                      tiny_inception_weights):
    zip_path, _ = edm_zip
    before = zip_path.read_bytes()
    det = {"fid": _fid(tiny_net, tiny_inception_weights)}
    (tmp_path / "link.npz").symlink_to(zip_path)
    for out in (zip_path, tmp_path / "link.npz"):
        with pytest.raises(FgdataError, match="DST is SRC"):
            compute_refs(str(zip_path), str(out), RefOptions(chunk_size=4, overwrite=True, **CPU), detectors=det)
    assert zip_path.read_bytes() == before


@pytest.mark.slow  # end to end, several seconds
def test_edm2_pickle_is_a_dict_of_dicts(edm_zip, tmp_path, tiny_net, tiny_inception_weights, tiny_dinov2):
    import torch
    import torch.nn.functional as F
    from transformers import Dinov2Model

    from fgdata.fid.detectors import load_dinov2

    zip_path, images = edm_zip
    out = tmp_path / "set.pkl"
    dets = {"fid": _fid(tiny_net, tiny_inception_weights), "fd_dinov2": load_dinov2(str(tiny_dinov2), "cpu")}
    compute_refs(str(zip_path), str(out), RefOptions(chunk_size=5, **CPU), detectors=dets)
    with open(out, "rb") as fh:
        stats = pickle.load(fh)  # noqa: S301 - the reference's own reader, on a file this test wrote
    assert type(stats) is dict and sorted(stats) == ["fd_dinov2", "fid"]
    for metric, dim in (("fid", 2048), ("fd_dinov2", 32)):
        assert type(stats[metric]) is dict and sorted(stats[metric]) == ["mu", "sigma"]
        assert type(stats[metric]["mu"]) is np.ndarray and stats[metric]["mu"].dtype == np.float64
        assert stats[metric]["mu"].shape == (dim,) and stats[metric]["sigma"].shape == (dim, dim)
    # DINOv2 as EDM2 runs it: bicubic antialiased resize to 224, ImageNet mean/std, class token after the norm.
    model = Dinov2Model.from_pretrained(tiny_dinov2).eval()
    x = torch.from_numpy(np.stack(images).transpose(0, 3, 1, 2)).float()
    x = F.interpolate(x, size=(224, 224), mode="bicubic", antialias=True) / 255
    x = (x - torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)) / torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with torch.inference_mode():
        f = model(pixel_values=x).last_hidden_state[:, 0].double().numpy()  # already after the final norm
    assert _rel(stats["fd_dinov2"]["mu"], f.mean(0)) < 1e-5
    assert _rel(stats["fd_dinov2"]["sigma"], np.cov(f, rowvar=False)) < 1e-4


def test_resume_keeps_matching_chunks_from_any_world_size(edm_zip, tmp_path, tiny_net, tiny_inception_weights):
    zip_path, _ = edm_zip
    det = {"fid": _fid(tiny_net, tiny_inception_weights)}
    fresh = tmp_path / "fresh.npz"
    compute_refs(str(zip_path), str(fresh), RefOptions(chunk_size=4, **CPU), detectors=det)
    out = tmp_path / "resumed.npz"
    part = compute_refs(str(zip_path), str(out), RefOptions(chunk_size=4, **CPU), detectors=det, rank=1, world_size=2)
    assert part.computed == part.seen == 4 and part.provenance is None  # chunk 1 (images 4..7) only
    assert not out.exists()  # rank 1 never merges
    chunk0 = Path(f"{out}.chunks") / "chunk-00000.npz"
    chunk0.write_bytes(b"torn")  # a damaged chunk file is recomputed, never trusted
    done = compute_refs(str(zip_path), str(out), RefOptions(chunk_size=4, **CPU), detectors=det)
    assert done.reused == 4 and done.computed == 7 and done.seen == 11
    assert out.read_bytes() == fresh.read_bytes()


def test_only_the_options_that_change_the_statistics_join_the_fingerprint(edm_zip, tmp_path, tiny_net,
                                                                            tiny_inception_weights):
    """The job core's rule: fields not declared RUNTIME change the bytes. Another device name of the same type or
    another worker count keeps the output; another batch size is refused naming the flag, as prepare and shard
    refuse, and --no-resume or --overwrite compute it again."""
    from fgdata.jobs.options import byte_options

    assert byte_options(RefOptions(device="cpu", workers=2, resume=False)) == {"batch_size": 128, "chunk_size": 50_000}
    zip_path, _ = edm_zip
    det = {"fid": _fid(tiny_net, tiny_inception_weights)}
    out = str(tmp_path / "set.npz")
    compute_refs(str(zip_path), out, RefOptions(chunk_size=4, **CPU), detectors=det)
    before = Path(out).read_bytes()
    assert compute_refs(str(zip_path), out, RefOptions(chunk_size=4, workers=2, **CPU), detectors=det).kept
    with pytest.raises(FgdataError, match=rf"^{out}: an earlier run wrote it with other options \(--batch-size was 3, "
                                          r"now 5\); .*--no-resume"):
        compute_refs(str(zip_path), out, RefOptions(chunk_size=4, device="cpu", batch_size=5), detectors=det)
    assert Path(out).read_bytes() == before
    again = compute_refs(str(zip_path), out, RefOptions(chunk_size=4, device="cpu", batch_size=5, resume=False),
                         detectors=det)
    assert not again.kept and again.computed == 11
    replaced = compute_refs(str(zip_path), out, RefOptions(chunk_size=4, overwrite=True, **CPU), detectors=det)
    assert replaced.computed == 11 and Path(out).read_bytes() == before


def test_partial_chunks_of_other_options_are_refused_naming_the_flag(edm_zip, tmp_path, tiny_net,
                                                                     tiny_inception_weights):
    """Chunks an earlier run left with other weights or another chunk size are not silently thrown away: the
    rerun stops in one line naming the flag, and --no-resume computes every chunk again."""
    import torch
    from safetensors.torch import save_file

    zip_path, _ = edm_zip
    det = {"fid": _fid(tiny_net, tiny_inception_weights)}
    out = tmp_path / "set.npz"
    compute_refs(str(zip_path), str(out), RefOptions(chunk_size=4, **CPU), detectors=det, rank=1, world_size=2)
    work = f"{out}.chunks"
    with pytest.raises(FgdataError, match=rf"^{work}: .*\(--chunk-size was 4, now 2\); .*--no-resume"):
        compute_refs(str(zip_path), str(out), RefOptions(chunk_size=2, **CPU), detectors=det)
    torch.manual_seed(1)
    other = tmp_path / "other-weights.safetensors"
    save_file(tiny_net().state_dict(), str(other))
    with pytest.raises(FgdataError, match=r"--inception was 'tiny.safetensors sha256:[0-9a-f]{12}', "
                                          r"now 'other-weights.safetensors sha256:[0-9a-f]{12}'"):
        compute_refs(str(zip_path), str(out), RefOptions(chunk_size=4, **CPU), detectors={"fid": _fid(tiny_net, other)})
    assert not out.exists()
    redo = compute_refs(str(zip_path), str(out), RefOptions(chunk_size=2, resume=False, **CPU), detectors=det)
    assert (redo.computed, redo.reused, redo.seen) == (11, 0, 11)
    assert not Path(work).exists()  # chunk files, markers and the job record are gone


def _marker(work: Path, chunk: int) -> Path:
    return work / "units" / f"{chunk:06d}.json"


@pytest.mark.parametrize("damage", ["missing", "torn"])
@pytest.mark.slow  # end to end, several seconds
def test_a_chunk_whose_marker_is_missing_or_torn_is_computed_again_and_the_others_kept(
        damage, edm_zip, tmp_path, tiny_net, tiny_inception_weights):
    """Each chunk is a work unit of the job core: its marker says what the chunk file holds. A chunk file whose
    marker is gone, or cut short (a torn marker reads as absent), is computed again while the chunks with
    markers are kept."""
    from fgdata.jobs.units import Marker

    zip_path, _ = edm_zip
    det = {"fid": _fid(tiny_net, tiny_inception_weights)}
    options = RefOptions(chunk_size=2, **CPU)
    fresh = tmp_path / "fresh.npz"
    compute_refs(str(zip_path), str(fresh), options, detectors=det)
    out = tmp_path / "out.npz"
    share = compute_refs(str(zip_path), str(out), options, detectors=det, rank=1, world_size=2)
    assert share.computed == 5  # chunks 1, 3, 5: images 2-3, 6-7, 10
    work = Path(f"{out}.chunks")
    marker = Marker.parse(_marker(work, 3).read_bytes())
    assert marker is not None and (marker.unit, marker.first, marker.count, marker.written) == (3, 6, 2, 2)
    assert marker.launch is None and marker.failures == []
    assert [(s.name, s.samples, s.size) for s in marker.shards] == [
        ("chunk-00003.npz", 2, (work / "chunk-00003.npz").stat().st_size)]
    if damage == "missing":
        _marker(work, 3).unlink()
    else:
        _marker(work, 3).write_bytes(_marker(work, 3).read_bytes()[:40])
    done = compute_refs(str(zip_path), str(out), options, detectors=det)
    assert (done.reused, done.computed, done.seen) == (3, 8, 11)  # chunks 1 and 5 kept
    assert out.read_bytes() == fresh.read_bytes()
    assert not work.exists()


def test_outputs_sharing_a_work_dir_keep_their_chunks_apart(edm_zip, tmp_path, tiny_net, tiny_inception_weights):
    """``fid-refs all --work-dir D`` under torchrun: rank 1 goes on to the next output while rank 0 still adds the
    first one's chunks, so each output has its own folder in D and rank 0 finds its chunks as rank 1 left them."""
    zip_a, _ = edm_zip
    zip_b = write_edm_zip(tmp_path / "other.zip", random_images(11, seed=1))
    det = {"fid": _fid(tiny_net, tiny_inception_weights)}
    shared = tmp_path / "work"
    options = RefOptions(chunk_size=4, work_dir=str(shared), wait_timeout=1, **CPU)
    alone = RefOptions(chunk_size=4, **CPU)
    outs = {name: tmp_path / "refs" / f"{name}.npz" for name in ("a", "b")}
    for src, name in ((zip_a, "a"), (zip_b, "b")):  # rank 1 of both outputs first
        compute_refs(str(src), str(outs[name]), options, detectors=det, rank=1, world_size=2)
    assert sorted(p.name for p in shared.iterdir()) == ["a.npz.chunks", "b.npz.chunks"]
    for src, name in ((zip_a, "a"), (zip_b, "b")):
        done = compute_refs(str(src), str(outs[name]), options, detectors=det, rank=0, world_size=2)
        assert (done.computed, done.seen) == (7, 11)
        clean = tmp_path / f"clean-{name}.npz"
        compute_refs(str(src), str(clean), alone, detectors=det)
        assert outs[name].read_bytes() == clean.read_bytes()
    assert list(shared.iterdir()) == []


@pytest.mark.slow  # end to end, several seconds
def test_shards_equal_the_zip_and_fid_with_itself_is_zero(edm_zip, tmp_path, tiny_net, tiny_inception_weights,
                                                         tiny_dinov2):
    import zipfile

    from fgdata.fid.detectors import load_dinov2
    from fgdata.shards import ShardWriter

    zip_path, images = edm_zip
    dets = {"fid": _fid(tiny_net, tiny_inception_weights), "fd_dinov2": load_dinov2(str(tiny_dinov2), "cpu")}
    shards = tmp_path / "shards"
    writer = ShardWriter(str(shards), maxcount=3)
    with zipfile.ZipFile(zip_path) as zf:  # the same PNG bytes as the zip, three per shard
        names = sorted(n for n in zf.namelist() if n.endswith(".png"))
        for i, name in enumerate(names):
            writer.write(f"s{i:04d}", {"png": zf.read(name), "cls": b"1"})
    writer.close()
    a, b = tmp_path / "zip.pkl", tmp_path / "wds.pkl"
    compute_refs(str(zip_path), str(a), RefOptions(chunk_size=4, **CPU), detectors=dets)
    summary = compute_refs(f"WDS:{shards}", str(b), RefOptions(chunk_size=4, **CPU), detectors=dets)
    assert summary.seen == len(images) and summary.provenance is not None
    assert summary.provenance["source"]["kind"] == "shards"
    sa, sb = (pickle.loads(p.read_bytes()) for p in (a, b))  # noqa: S301 - files this test wrote
    for metric in ("fid", "fd_dinov2"):
        assert _rel(sb[metric]["mu"], sa[metric]["mu"]) < 1e-12
        assert _rel(sb[metric]["sigma"], sa[metric]["sigma"]) < 1e-12
    # FD on the 32-d DINOv2 statistics: the dataset against itself read two ways, then against other images.
    same = frechet_distance(sa["fd_dinov2"]["mu"], sa["fd_dinov2"]["sigma"], sb["fd_dinov2"]["mu"], sb["fd_dinov2"]["sigma"])
    assert abs(same) < 1e-6 * np.trace(sa["fd_dinov2"]["sigma"])
    other = write_edm_zip(tmp_path / "other.zip", random_images(11, seed=1))
    c = tmp_path / "other.pkl"
    compute_refs(str(other), str(c), RefOptions(chunk_size=4, **CPU), detectors=dets)
    sc = pickle.loads(c.read_bytes())  # noqa: S301 - a file this test wrote
    differ = frechet_distance(sa["fd_dinov2"]["mu"], sa["fd_dinov2"]["sigma"], sc["fd_dinov2"]["mu"], sc["fd_dinov2"]["sigma"])
    assert differ > 1e-3 * np.trace(sa["fd_dinov2"]["sigma"])


@pytest.mark.s3
@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_s3_zip_and_shards(edm_zip, tmp_path, s3_bucket, tiny_net, tiny_inception_weights):
    from fgdata import storage
    from fgdata.shards import ShardWriter

    zip_path, images = edm_zip
    det = {"fid": _fid(tiny_net, tiny_inception_weights)}
    storage.upload(str(zip_path), f"{s3_bucket}/data/set.zip")
    writer = ShardWriter(f"{s3_bucket}/wds", maxcount=4)
    for i, arr in enumerate(images):
        writer.write(f"s{i:04d}", {"png": png(arr)})
    writer.close()
    local = tmp_path / "local.npz"
    compute_refs(str(zip_path), str(local), RefOptions(chunk_size=4, **CPU), detectors=det)
    os.environ["FGDATA_CACHE"] = str(tmp_path / "cache")
    try:
        compute_refs(f"{s3_bucket}/data/set.zip", f"{s3_bucket}/refs/set.npz", RefOptions(chunk_size=4, **CPU),
                     detectors=det)
        compute_refs(f"WDS:{s3_bucket}/wds", str(tmp_path / "wds.npz"), RefOptions(chunk_size=4, **CPU), detectors=det)
    finally:
        del os.environ["FGDATA_CACHE"]
    assert storage.read_bytes(f"{s3_bucket}/refs/set.npz") == local.read_bytes()
    assert storage.exists(f"{s3_bucket}/refs/set.npz.provenance.json")
    assert _rel(np.load(tmp_path / "wds.npz")["sigma"], np.load(local)["sigma"]) < 1e-12


def test_latent_zip_and_non_zip_are_refused(tmp_path, tiny_net, tiny_inception_weights):
    import io
    import zipfile

    path = tmp_path / "latents.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(3):
            buf = io.BytesIO()
            np.save(buf, np.zeros((8, 4, 4), np.float32))
            zf.writestr(f"00000/img-mean-std-{i:08d}.npy", buf.getvalue())
    with pytest.raises(FgdataError, match="pixel space"):
        compute_refs(str(path), str(tmp_path / "x.npz"), RefOptions(**CPU),
                     detectors={"fid": _fid(tiny_net, tiny_inception_weights)})
    not_zip = tmp_path / "notes.zip"
    not_zip.write_text("hello")
    with pytest.raises(FgdataError, match="not a zip file"):
        compute_refs(str(not_zip), str(tmp_path / "y.npz"), RefOptions(**CPU),
                     detectors={"fid": _fid(tiny_net, tiny_inception_weights)})


def test_detector_loading_is_safe(tmp_path, tiny_net, tiny_inception_weights):
    import torch

    from fgdata.fid.detectors import check_name_hash, load_inception

    pkl = tmp_path / "detector.pkl"
    torch.manual_seed(0)
    with open(pkl, "wb") as fh:
        pickle.dump(tiny_net(), fh)
    with pytest.raises(FgdataError, match="--trust-pickle"):
        load_inception(str(pkl), "cpu")
    trusted = load_inception(str(pkl), "cpu", trust_pickle=True)
    assert trusted.provenance["loader"] == "pickle (trusted)"
    assert tuple(trusted.run(torch.zeros(2, 3, 8, 8, dtype=torch.uint8)).shape) == (2, 2048)
    # A .pth that pickles code is refused by weights_only loading.
    evil = tmp_path / "evil.pth"
    torch.save({"w": torch.zeros(1), "obj": tiny_net()}, evil)
    with pytest.raises(FgdataError, match="not a plain state dict"):
        load_inception(str(evil), "cpu")
    with pytest.raises(FgdataError, match="Inception-v3 layout"):
        load_inception(str(tiny_inception_weights), "cpu")  # the stand-in's weights do not fit the real layout
    # A downloaded file whose name carries a hash prefix (torch hub convention) must match it.
    named = tmp_path / "weights-deadbeef.pth"
    named.write_bytes(b"not the weights")
    with pytest.raises(FgdataError, match="does not start with deadbeef"):
        check_name_hash(named)


def test_real_inception_architecture(inception_weights):
    import torch

    from fgdata.fid.detectors import load_inception
    from fgdata.fid.inception import InceptionV3, resize_like_tf

    net = InceptionV3().eval()
    keys = net.state_dict()
    assert keys["Conv2d_1a_3x3.conv.weight"].shape == (32, 3, 3, 3) and keys["fc.weight"].shape == (1008, 2048)
    assert "Mixed_7c.branch3x3dbl_3b.bn.running_var" in keys and len(keys) == 94 * 6 + 2  # 94 conv+bn layers and the classifier
    det = load_inception(str(inception_weights), "cpu")
    images = torch.from_numpy(np.stack(random_images(2, size=40)).transpose(0, 3, 1, 2).copy())
    with torch.inference_mode():
        f = det.run(images)
    assert f.dtype == torch.float32 and tuple(f.shape) == (2, 2048) and torch.isfinite(f).all()
    # TF1 bilinear resize: output pixel j samples source j * in / out; same size is the identity.
    x = torch.rand(1, 3, 598, 598, dtype=torch.float64)
    assert torch.allclose(resize_like_tf(x), x[:, :, ::2, ::2], atol=1e-9)
    y = torch.rand(1, 3, 299, 299, dtype=torch.float64)
    assert torch.allclose(resize_like_tf(y), y, atol=1e-9)


def _cli(args: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    full = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "fgdata", *args], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _cli_setup(tmp_path: Path, tiny_net) -> tuple[dict[str, str], list[str]]:
    """The stand-in detector as a trusted pickle (cheap in a subprocess) and the options every run shares."""
    import torch

    detector = tmp_path / "stand-in.pkl"
    torch.manual_seed(0)
    detector.write_bytes(pickle.dumps(tiny_net()))
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), str(Path(__file__).parent)])}
    return env, ["--inception", str(detector), "--trust-pickle", "--device", "cpu", "--chunk-size", "2",
                 "--batch-size", "2", "--workers", "1", "--no-progress"]


@pytest.mark.slow  # torchrun ranks as processes
def test_cli_named_output_and_two_ranks_equal_one(tmp_path, tiny_net):
    """Through the CLI: the named output and its JSON summary (parsed and rendered here, in this process), and two
    rank processes that write the same bytes."""
    from inprocess import fgdata

    root = tmp_path / "root"
    zip_path = write_edm_zip(root / "cifar10" / "cifar10-32x32.zip", random_images(7, size=8))
    env, common = _cli_setup(tmp_path, tiny_net)
    one = fgdata("fid-refs", "all", "--data-root", root, *common, env={"HF_HUB_OFFLINE": "1"})
    assert one.returncode == 0, one.stderr
    assert "skipped" in one.stderr and "fgdata prepare imagenet-64" in one.stderr  # notes go to stderr
    named = root / "fid-refs" / "cifar10-32x32.npz"
    assert "inputs seen" in one.stdout and "wrote" in one.stdout  # the summary table every writing command prints
    again = fgdata("fid-refs", "cifar10", "--data-root", root, "--json", *common, env={"HF_HUB_OFFLINE": "1"})
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)  # one JSON document, nothing else on stdout
    assert list(doc)[:7] == ["command", "source", "output", "seen", "written", "failed", "failures_file"]
    assert (doc["command"], doc["source"], doc["output"]) == ("fid-refs", str(zip_path), str(named))
    assert (doc["seen"], doc["written"], doc["failed"], doc["failures_file"]) == (7, 7, 0, f"{named}.failures.json")
    assert [o["path"] for o in doc["outputs"]] == [str(named)] and doc["skipped"] == []
    assert doc["outputs"][0]["kept"] is True and doc["outputs"][0]["computed"] == 0
    assert sorted(np.load(named).files) == ["mu", "sigma"] and Path(f"{named}.provenance.json").is_file()
    two = tmp_path / "two.npz"
    ranks = [_cli(["fid-refs", "--dataset-zip", str(zip_path), "-o", str(two), "--json", *common],
                  env={**env, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r)}) for r in (0, 1)]
    docs = []
    for p in ranks:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        docs.append(json.loads(out))
    assert two.read_bytes() == named.read_bytes()
    # Chunks of 2: rank 1 has chunks 1 and 3 (3 images) and reports only that share; rank 0 reports the job.
    assert (docs[1]["rank"], docs[1]["world"], docs[1]["seen"], docs[1]["outputs"][0]["computed"]) == (1, 2, 3, 3)
    assert "rank" not in docs[0] and docs[0]["seen"] == docs[0]["written"] == 7
    assert docs[0]["outputs"][0]["computed"] == 4
    prov = json.loads(Path(f"{two}.provenance.json").read_text())
    assert prov["world_size"] == 2 and prov["images"] == 7 and prov["chunks"] == 4


@pytest.mark.slow  # a job stopped and rerun
def test_cli_killed_after_a_chunk_resumes_to_the_same_bytes(edm_zip, tmp_path, tiny_net):
    import signal

    from fgdata.jobs.testhook import MARK, STOP_ENV

    from inprocess import fgdata

    zip_path, _ = edm_zip
    env, common = _cli_setup(tmp_path, tiny_net)
    clean, out = tmp_path / "clean.npz", tmp_path / "out.npz"
    ref = fgdata("fid-refs", "--dataset-zip", zip_path, "-o", clean, *common)  # the reference: nothing stops it
    assert ref.returncode == 0, ref.stderr
    p = _cli(["fid-refs", "--dataset-zip", str(zip_path), "-o", str(out), *common], env={**env, STOP_ENV: "2"})
    assert p.stderr is not None
    for line in p.stderr:
        if MARK in line:
            break
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    assert not out.exists() and len(list(Path(f"{out}.chunks").glob("chunk-*.npz"))) == 2
    again = fgdata("fid-refs", "--dataset-zip", zip_path, "-o", out, "--json", *common)  # the rerun, in this process
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert doc["seen"] == doc["written"] == 11 and doc["failed"] == 0
    assert (doc["outputs"][0]["computed"], doc["outputs"][0]["reused"]) == (7, 4)  # the first two chunks of 2 kept
    assert out.read_bytes() == clean.read_bytes()


@pytest.mark.slow  # a planted rank process and a torchrun launch of two ranks
def test_no_resume_under_torchrun_never_adds_a_chunk_an_earlier_launch_left(tmp_path, tiny_net):
    """An earlier launch's rank 1 left chunks 1 and 3 of the same zip name, size and count (the images in
    another order: the same fingerprint), and its rank 0 never came. The rerun with --no-resume holds rank 1
    before it redoes them (the job signals the point): rank 0 must wait for this launch's chunks, so the
    output is a clean run's bytes."""
    from faultkit import hold_and_release
    from inprocess import fgdata

    env, common = _cli_setup(tmp_path, tiny_net)
    images = random_images(7, size=8)
    zip_path, out, clean = tmp_path / "data.zip", tmp_path / "out.npz", tmp_path / "clean.npz"
    write_edm_zip(zip_path, images[::-1])
    size = zip_path.stat().st_size
    args = ["fid-refs", "--dataset-zip", str(zip_path), "-o", str(out), *common]
    # the earlier launch's rank 1 alone, in this process: the rank variables are read when the job starts
    planted = fgdata(*args, env={"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert planted.returncode == 0, planted.stderr
    assert sorted(p.name for p in Path(f"{out}.chunks").glob("chunk-*.npz")) == ["chunk-00001.npz", "chunk-00003.npz"]
    write_edm_zip(zip_path, images)
    assert zip_path.stat().st_size == size
    ref = fgdata("fid-refs", "--dataset-zip", zip_path, "-o", clean, *common)  # the reference, in this process
    assert ref.returncode == 0, ref.stderr

    run = hold_and_release([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                            "-m", "fgdata", *args, "--no-resume", "--json"], hold="no-resume@1",
                           env={**env, "HF_HUB_OFFLINE": "1"}, cwd=tmp_path,
                           until=lambda line: line.startswith("waiting for ") or line.startswith("{"))
    assert "at no-resume (rank 1," in run.holds[0]
    assert run.seen.startswith(f"waiting for {out}.chunks: 2 missing"), run.seen
    assert run.returncode == 0, run.output[-3000:]
    assert out.read_bytes() == clean.read_bytes()


def test_offline_without_weights_names_the_flag(edm_zip, tmp_path, monkeypatch):
    from fgdata.fid.detectors import DINOV2_DEFAULT, load_dinov2, load_inception
    from fgdata.fid.refs import metrics_for

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    with pytest.raises(FgdataError, match="pass --inception PATH"):
        load_inception(device="cpu")
    with pytest.raises(FgdataError, match="--dinov2"):
        load_dinov2(DINOV2_DEFAULT, "cpu")
    with pytest.raises(FgdataError, match=r"\.npz .*\.pkl"):
        metrics_for(str(tmp_path / "refs.txt"))
    zip_path, _ = edm_zip
    from inprocess import fgdata

    done = fgdata("fid-refs", "--dataset-zip", zip_path, "-o", tmp_path / "x.npz", "--device", "cpu")
    err = done.stderr
    assert done.returncode == 1 and len(err.strip().splitlines()) == 1 and "--inception" in err, err


def test_named_datasets_read_and_write_the_exact_paths(tmp_path):
    from fgdata.fid.refs import FID_REFS, metrics_for, named_paths

    expected = {
        "cifar10": ("cifar10/cifar10-32x32.zip", "fid-refs/cifar10-32x32.npz", ("fid",)),
        "imagenet-64": ("imagenet-64/imagenet-64x64.zip", "fid-refs/imagenet-64x64.npz", ("fid",)),
        "imagenet-64-edmv2": ("imagenet-64/imagenet-64x64-edmv2.zip", "fid-refs/imagenet-64x64-edmv2.pkl",
                              ("fid", "fd_dinov2")),
        "imagenet-256": ("imagenet-256/imagenet_256_rgb.zip", "fid-refs/imagenet_256.pkl", ("fid", "fd_dinov2")),
    }
    assert sorted(FID_REFS) == sorted(expected)
    for name, (zip_rel, out_rel, metrics) in expected.items():
        zip_path, out = named_paths(name, tmp_path)
        assert zip_path == tmp_path / zip_rel and out == tmp_path / out_rel
        assert metrics_for(str(out)) == metrics


@pytest.mark.slow  # a fresh process that loads the model libraries
def test_quiet_silences_the_model_libraries_bars(edm_zip, tmp_path, tiny_net, tiny_dinov2):
    """-q: DINOv2 loads through from_pretrained without its "Loading weights" bar; nothing on stdout or stderr."""
    zip_path, _ = edm_zip
    env, common = _cli_setup(tmp_path, tiny_net)
    common = [c for c in common if c != "--no-progress"]  # -q alone must be enough
    run = _cli(["fid-refs", "--dataset-zip", str(zip_path), "-o", str(tmp_path / "refs.pkl"), "--dinov2",
                str(tiny_dinov2), *common, "-q"], env=env)
    out, err = run.communicate(timeout=240)
    assert run.returncode == 0, err
    assert "Loading weights" not in err and "it/s" not in err
    assert (out, err) == ("", "")
    assert (tmp_path / "refs.pkl").is_file()


def test_chunk_and_provenance_files_read_back_typed_and_torn_ones_as_absent(tmp_path):
    from fgdata.fid.refs import ChunkFile, RefProvenance
    from fgdata.fid.stats import Moments

    path = tmp_path / "chunk-00000.npz"
    moments = {"fid": Moments(2, np.arange(3.0), np.eye(3))}
    path.write_bytes(ChunkFile(moments).to_bytes())
    whole = ChunkFile.read(str(path), ("fid",))
    assert whole is not None and whole.moments["fid"].n == 2 and np.array_equal(whole.moments["fid"].s2, np.eye(3))
    assert ChunkFile.read(str(path), ("fid", "fd_dinov2")) is None
    path.write_bytes(path.read_bytes()[:100])
    assert ChunkFile.read(str(path), ("fid",)) is None
    assert RefProvenance.parse(b'{"fingerprint": "fp", "images": 11, "format": "edm-npz"}') == RefProvenance(
        {"fingerprint": "fp", "images": 11, "format": "edm-npz"}, "fp", 11)
    assert RefProvenance.parse(b'{"fingerprint": "fp"') is None and RefProvenance.parse(b'{"images": 3}') is None


def test_undecodable_images_are_failures_in_the_report(tmp_path, sample_images, tiny_net, tiny_inception_weights):
    """A truncated PNG and a JPEG with a broken header, cut from the bundled photos, are left out of the
    statistics and listed in ``<out>.failures.json`` (the report every writing command writes); a rank's
    chunk keeps its failures, so the run that adds the chunks counts them too, and a kept output still says so."""
    import zipfile

    from PIL import Image

    from fgdata.jobs.report import FORMAT

    pngs = sorted(p for p in sample_images if p.suffix == ".png")
    jpeg = next(p for p in sample_images if p.suffix == ".jpg").read_bytes()
    good = [np.asarray(Image.open(p).convert("RGB").resize((16, 16))) for p in pngs[:4]]
    truncated = pngs[0].read_bytes()[: pngs[0].stat().st_size // 3]
    broken = jpeg[:2] + b"\0" * 64 + jpeg[66:]
    zip_path = tmp_path / "set.zip"
    members = [png(good[0]), png(good[1]), truncated, png(good[2]), broken, png(good[3])]
    with zipfile.ZipFile(zip_path, "w") as zf:
        for i, data in enumerate(members):
            zf.writestr(f"00000/img{i:08d}.{'jpg' if data is broken else 'png'}", data)
    det = {"fid": _fid(tiny_net, tiny_inception_weights)}
    out = tmp_path / "set.npz"
    options = RefOptions(chunk_size=2, **CPU)
    share = compute_refs(str(zip_path), str(out), options, detectors=det, rank=1, world_size=2)
    assert (share.seen, share.written, share.failed, share.whole_job) == (2, 1, 1, False)  # chunk 1: images 2, 3
    done = compute_refs(str(zip_path), str(out), options, detectors=det)
    assert (done.seen, done.written, done.failed, done.reused) == (6, 4, 2, 2)
    assert done.failures_path == f"{out}.failures.json"
    report = json.loads(Path(done.failures_path).read_text())
    assert (report["format"], report["command"], report["seen"], report["written"], report["failed"]) == (
        FORMAT, "fid-refs", 6, 4, 2)
    assert [f["input"].rsplit(": ", 1)[1] for f in report["failures"]] == ["00000/img00000002.png",
                                                                           "00000/img00000004.jpg"]
    assert all(f["reason"].startswith("image-decode: ") and " at 0x" not in f["reason"] for f in report["failures"])
    f = _features(_tiny_loaded(tiny_net, tiny_inception_weights), good)
    with np.load(out) as z:
        assert _rel(z["mu"], f.mean(0)) < 1e-10 and _rel(z["sigma"], np.cov(f, rowvar=False)) < 1e-10
    kept = compute_refs(str(zip_path), str(out), options, detectors=det)
    assert kept.kept and (kept.seen, kept.written, kept.failed, kept.failures_path) == (6, 4, 2, done.failures_path)


def test_cli_counts_an_undecodable_image_as_failed(tmp_path, sample_images, tiny_net):
    import zipfile

    photo = next(p for p in sample_images if p.suffix == ".png").read_bytes()
    zip_path = tmp_path / "set.zip"
    with zipfile.ZipFile(zip_path, "w") as zf:
        for i, arr in enumerate(random_images(3, size=8)):
            zf.writestr(f"00000/img{i:08d}.png", png(arr))
        zf.writestr("00000/img00000003.png", photo[: len(photo) // 2])  # truncated
    out = tmp_path / "set.npz"
    from inprocess import fgdata

    _, common = _cli_setup(tmp_path, tiny_net)
    run = fgdata("fid-refs", "--dataset-zip", zip_path, "-o", out, "--json", *common)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert (doc["seen"], doc["written"], doc["failed"], doc["failures_file"]) == (4, 3, 1, f"{out}.failures.json")
    assert doc["outputs"][0]["failed"] == 1
    assert json.loads(Path(f"{out}.failures.json").read_text())["failures"][0]["input"].endswith("img00000003.png")
