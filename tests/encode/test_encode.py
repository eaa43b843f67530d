"""encode latents / text / neg-prompt and kd pairs / paths, end to end with tiny from_pretrained models.

The outputs are read back through the loader presets exactly as a trainer would."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fgdata.encode.tasks import TaskFigures
from fgdata.jobs.summary import payload_of
from fgdata.shards import iter_samples, read_shard_counts

from .conftest import PROMPTS, write_shards

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from faultkit import hold_and_release, leftovers, stop_and_signal  # noqa: E402
from inprocess import fgdata  # noqa: E402  (the console entry in this process: exit codes and one-line errors)
from job_summary import check_json_summary  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def load(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True)


def samples(dest: Path) -> dict[str, dict[str, bytes]]:
    from fgdata.shards import discover_shards

    return {s.key: s.members for shard in discover_shards(str(dest)) for s in iter_samples(shard)}


def first_batch(cfg, dest: Path, **fields):
    from fgdata.configs import instantiate

    cfg = cfg.copy()
    cfg.datatags = ["WDS:" + str(dest)]
    cfg.batch_size = 2
    cfg.num_workers = 0
    cfg.deterministic = True
    cfg.train = False
    for k, v in fields.items():
        setattr(cfg, k, v)
    return next(iter(instantiate(cfg)))


def cli_process(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The console entry in a fresh process, for what is read when the model libraries load (-q's quieting)."""
    return subprocess.run([sys.executable, "-m", "fgdata.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})


class Ran:
    def __init__(self, result):
        self.returncode, self.stdout, self.exception = result.exit_code, result.stdout, result.exception
        self.stderr = result.stderr + (repr(result.exception) if result.exception else "")


def cli(*args: str) -> Ran:
    """The Typer app in this process (models and imports stay warm)."""
    from typer.testing import CliRunner

    from fgdata.cli.main import app

    return Ran(CliRunner().invoke(app, list(args), catch_exceptions=True))


@pytest.fixture(scope="module")
def image_latents(tmp_path_factory, models, image_shards) -> Path:
    """Latents + text embeddings merged in place + neg_prompt_emb.npy beside the shards, all through the CLI."""
    dst = tmp_path_factory.mktemp("lat") / "shards"
    r = cli("encode", "latents", str(image_shards), str(dst), "--vae", str(models["vae"]), "--size", "64",
            "--batch-size", "4", "--json")
    assert r.returncode == 0, r.stderr
    doc = check_json_summary(r.stdout, "encode latents", dst)
    assert (doc["seen"], doc["written"], doc["failed"]) == (7, 6, 1) and doc["source"] == str(image_shards)
    assert doc["failures_file"] == str(dst / "failures.json")
    r = cli("encode", "text", str(image_shards), str(dst), "--into", str(dst), "--encoder", str(models["t5"]),
            "--max-length", "24", "-q")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""  # -q on success: nothing at all
    r = cli("encode", "neg-prompt", "--preset", "neg_prompt_wan", "--encoder", str(models["t5"]), "--max-length", "24",
            "-o", str(dst.parent / "neg_prompt_emb.npy"))
    assert r.returncode == 0, r.stderr
    return dst


@pytest.mark.slow  # end to end, several seconds
def test_image_latents_members_provenance_and_loader(image_latents, image_shards, models):
    got = samples(image_latents)
    assert sorted(got) == [f"sample_{i:06d}" for i in range(6)]  # the broken image is a reported failure
    first = got["sample_000000"]
    assert sorted(first) == ["json", "latent.pth", "txt", "txt_emb.pth"]  # media dropped, txt/json kept
    assert load(first["latent.pth"]).shape == (4, 8, 8) and load(first["latent.pth"]).dtype == torch.float32
    meta = json.loads(first["json"])
    assert meta["score"] == 0 and meta["fgdata"]["latent"]["flip"] is False
    assert meta["fgdata"]["txt_emb"]["padding"] == "zero"

    # Model space: the stored latent is the VAE's posterior mean times the SD scaling factor.
    from diffusers import AutoencoderKL

    from fgdata.media.image import load_image_for_training

    src = next(iter_samples(str(image_shards / "00000.tar")))
    ext = next(e for e in src.members if e in ("png", "jpg"))
    x = torch.from_numpy(load_image_for_training(src.members[ext], 64, simplejpeg=False))[None]
    with torch.inference_mode():
        mean = AutoencoderKL.from_pretrained(str(models["vae"])).encode(x).latent_dist.mean[0]
    torch.testing.assert_close(load(first["latent.pth"]), mean * 0.18215, rtol=1e-4, atol=1e-5)

    prov = json.loads((image_latents / "provenance.json").read_text())["jobs"]
    assert prov["latents"]["latent_space"] == {"normalization": "global", "formula": "(z - shift_factor) * scaling_factor",
                                               "scaling_factor": 0.18215, "shift_factor": 0.0}
    assert prov["latents"]["samples"] == 6 and prov["latents"]["failed"] == 1
    assert prov["text"]["shape"] == [24, 32] and "zero" in prov["text"]["padding_semantics"]
    report = json.loads((image_latents / "failures.json").read_text())
    assert report["command"] == "encode text" and report["failed"] == 0 and report["not_updated"] == 0
    markers = sorted((image_latents / ".fgdata" / "latents" / "units").glob("*.json"))  # the latents job's own
    failed = [f["input"].rsplit("#", 1)[1] for m in markers for f in json.loads(m.read_text())["failures"]]
    assert failed == ["sample_000006"]
    assert read_shard_counts(str(image_latents / "shard_count.json")) == {"00000.tar": 3, "00001.tar": 3}

    neg = np.load(image_latents.parent / "neg_prompt_emb.npy", allow_pickle=False)
    assert neg.shape == (24, 32) and neg.dtype == np.float32

    from fgdata.configs import ImageLatentLoaderConfig

    batch = first_batch(ImageLatentLoaderConfig, image_latents)  # relative files_map: the datatag's parent
    assert batch["real"].shape == (2, 4, 8, 8) and batch["real"].dtype == torch.float32
    assert batch["condition"].shape == (2, 24, 32)
    assert batch["neg_condition"].shape == (2, 24, 32)
    assert batch["fname"] == ["sample_000000", "sample_000001"]


def test_text_padding_semantics(tmp_path, models, image_shards):
    from fgdata.encode.text import TextOptions, encode_text, load_text_encoder

    t5 = load_text_encoder(str(models["t5"]), max_length=24)
    emb = t5.encode(["ab", ""])
    # ByT5: "ab" is 2 byte tokens + EOS; everything after the prompt's 3 tokens is exactly zero.
    assert emb[0, :3].abs().sum() > 0 and emb[0, 3:].abs().sum() == 0
    assert emb[1, :1].abs().sum() > 0 and emb[1, 1:].abs().sum() == 0

    encode_text(str(image_shards), str(tmp_path / "clip"), TextOptions(encoder=str(models["clip"])), batch_size=3)
    got = samples(tmp_path / "clip")
    assert sorted(got["sample_000000"]) == ["json", "png", "txt", "txt_emb.pth"] or "jpg" in got["sample_000000"]
    emb = load(got["sample_000001"]["txt_emb.pth"])
    assert emb.shape == (77, 32) and emb[-1].abs().sum() > 0  # CLIP keeps its padding positions
    prov = json.loads((tmp_path / "clip" / "provenance.json").read_text())["jobs"]["text"]
    assert prov["padding"] == "keep" and prov["text_encoder_class"] == "CLIPTextModel"


def test_video_latents_per_channel_space(tmp_path, models, video_shards):
    from fgdata.configs import VideoLatentLoaderConfig
    from fgdata.encode.latents import LatentOptions, encode_latents
    from fgdata.encode.text import TextOptions, encode_neg_prompt, encode_text

    dst = tmp_path / "vid"
    s = encode_latents(str(video_shards), str(dst), LatentOptions(vae=str(models["wan_vae"]), kind="video",
                                                                   size="32x24", frames=9, batch_size=2,
                                                                   save_dtype="bfloat16"))
    assert (s.written, s.failed) == (2, 0)
    encode_text(str(dst), str(dst), TextOptions(encoder=str(models["t5"]), max_length=16))
    encode_neg_prompt(str(tmp_path / "neg_prompt_emb.npy"), encoder=str(models["t5"]), text="blurry", max_length=16)
    got = samples(dst)["vid_000"]
    lat = load(got["latent.pth"])
    assert lat.shape == (4, 3, 3, 4) and lat.dtype == torch.bfloat16  # 9 frames -> 3, 24x32 -> 3x4
    meta = json.loads(got["json"])["fgdata"]["latent"]
    assert meta["cropping_params"]["crop_w"] == 32 and meta["space"].startswith("(z - latents_mean)")
    space = json.loads((dst / "provenance.json").read_text())["jobs"]["latents"]["latent_space"]
    assert space["latents_std"] == [2.0, 1.5, 1.0, 0.5] and space["normalization"] == "per-channel"
    batch = first_batch(VideoLatentLoaderConfig, dst)
    assert batch["real"].shape == (2, 4, 3, 3, 4) and batch["condition"].shape == (2, 16, 32)
    assert batch["neg_condition"].shape == (2, 16, 32)


@pytest.fixture(scope="module")
def prompt_shards(tmp_path_factory) -> Path:
    items = [(f"p_{i:03d}", {"txt": PROMPTS[i].encode(), "json": b'{"src": 1}'}) for i in range(5)]
    return write_shards(tmp_path_factory.mktemp("prompts") / "shards", items, per_shard=2)


def test_text_overwrite_and_no_resume_say_what_they_remove(tmp_path, models, prompt_shards):
    """Notices go to stderr before anything is removed; with --json stdout stays the one summary document."""
    dst = tmp_path / "emb"
    dst.mkdir()
    (dst / "stray.tar").write_bytes(b"not fgdata's")
    args = ["encode", "text", str(prompt_shards), str(dst), "--encoder", str(models["t5"]), "--max-length", "8"]
    r = cli(*args, "--json")
    assert r.returncode == 1 and "stray.tar" in str(r.exception) and "--overwrite" in str(r.exception)
    assert (dst / "stray.tar").exists()
    r = cli(*args, "--overwrite", "--json")
    assert r.returncode == 0, r.stderr
    assert "--overwrite: removing 1 file(s)" in r.stderr and "stray.tar" in r.stderr
    assert not (dst / "stray.tar").exists()
    doc = check_json_summary(r.stdout, "encode text", dst)
    assert (doc["written"], doc["failed"], doc["shards_written"]) == (5, 0, 3)
    r = cli(*args, "--no-resume", "--json")
    assert r.returncode == 0, r.stderr
    assert "--no-resume: redoing 3 output shard(s)" in r.stderr
    assert check_json_summary(r.stdout, "encode text", dst)["shards_written"] == 3


def test_text_overwrite_replaces_a_run_with_other_options_and_stale_outputs(tmp_path, models, prompt_shards):
    """--overwrite redoes the job whatever options made the earlier outputs, and removes fgdata's outputs no task
    of this job writes (an earlier job's with other inputs), listing them; without it the rerun is refused."""
    dst = tmp_path / "emb"
    args = ["encode", "text", str(prompt_shards), str(dst), "--encoder", str(models["t5"])]
    assert cli(*args, "--max-length", "8", "--json").returncode == 0
    for suffix in ("", ".idx.json"):  # an output of an earlier job over more input shards
        (dst / f"00009.tar{suffix}").write_bytes((dst / f"00000.tar{suffix}").read_bytes())
    r = cli(*args, "--max-length", "12", "--json")
    assert r.returncode == 1 and "--max-length was 8, now 12" in str(r.exception)
    r = cli(*args, "--max-length", "12", "--overwrite", "--json")
    assert r.returncode == 0, r.stderr
    assert "--overwrite: removing 2 file(s)" in r.stderr and "00009.tar" in r.stderr
    assert "--overwrite: redoing 3 output shard(s)" in r.stderr and not (dst / "00009.tar").exists()
    assert json.loads((dst / "provenance.json").read_text())["jobs"]["text"]["options"]["max_length"] == 12
    assert check_json_summary(r.stdout, "encode text", dst)["shards_written"] == 3


def test_a_rerun_writes_again_an_output_shard_that_changed_since_its_marker(tmp_path, models, prompt_shards):
    """The unit rule: a task is kept only while its shard is in DST with the size its marker records; one
    replaced since (here by another shard of the folder) or removed is written again, to a fresh run's bytes."""
    dst = tmp_path / "emb"
    args = ["encode", "text", str(prompt_shards), str(dst), "--encoder", str(models["t5"]), "--max-length", "8",
            "--json"]
    assert cli(*args).returncode == 0
    fresh = {p.name: p.read_bytes() for p in dst.glob("0*.tar")}
    (dst / "00000.tar").write_bytes(fresh["00002.tar"])  # 1 sample, not 2: another size
    (dst / "00001.tar").unlink()
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    doc = check_json_summary(r.stdout, "encode text", dst)
    assert (doc["shards_written"], doc["shards_resumed"], doc["written"]) == (2, 1, 5)
    assert {p.name: p.read_bytes() for p in dst.glob("0*.tar")} == fresh


def test_a_folder_of_the_earlier_marker_layout_is_refused_in_one_line(tmp_path, models, prompt_shards):
    """fgdata 0.2 left one JSON object per output shard in ``.fgdata/<command>/``: a rerun says in one line what
    to do; ``--no-resume`` writes the folder again and clears them, and the next rerun resumes."""
    dst = tmp_path / "emb"
    args = ["encode", "text", str(prompt_shards), str(dst), "--encoder", str(models["t5"]), "--max-length", "8"]
    assert cli(*args, "-q").returncode == 0
    state = dst / ".fgdata" / "text"
    for name in ("00000.tar", "00001.tar", "00002.tar"):  # what the earlier version left for each output shard
        (state / f"{name}.json").write_text(json.dumps({
            "shard": name, "source": str(prompt_shards / name), "samples": 2, "written": 2, "failures": [],
            "command": "encode text", "fingerprint": "0123456789abcdef", "options": {"max_length": 8},
            "fgdata": "0.2.0", "launch": None}))
    r = cli(*args, "--json")
    assert r.returncode == 1 and r.stdout == ""
    assert str(r.exception) == (f"{dst}: written by an earlier fgdata version (3 marker(s) in .fgdata/text/); "
                                "rerun with --no-resume to write it again")
    r = cli(*args, "--no-resume", "--json")
    assert r.returncode == 0, r.stderr
    assert check_json_summary(r.stdout, "encode text", dst)["shards_written"] == 3
    assert not list(state.glob("*.tar.json"))
    r = cli(*args, "--json")
    assert r.returncode == 0, r.stderr
    assert check_json_summary(r.stdout, "encode text", dst)["shards_resumed"] == 3


def test_text_in_place_drops_the_other_tools_indexes_of_shards_it_rewrites(tmp_path, models):
    """Energon's files beside the input shards do not make the folder foreign; each rewritten shard's ``.tar.idx``
    would give wrong offsets, so it goes (said), and ``.nv-meta`` stays with a note to regenerate it."""
    items = [(f"p_{i:03d}", {"txt": PROMPTS[i].encode()}) for i in range(3)]
    shards = write_shards(tmp_path / "ds", items, per_shard=2)
    (shards / ".nv-meta").mkdir()
    (shards / ".nv-meta" / "dataset.yaml").write_text("__class__: TextWebdataset\n")
    for name in ("00000.tar", "00001.tar"):
        (shards / f"{name}.idx").write_bytes(bytes(16))
    r = cli("encode", "text", str(shards), str(shards), "--encoder", str(models["t5"]), "--max-length", "8", "--json")
    assert r.returncode == 0, r.stderr
    assert "removing 2 file(s)" in r.stderr and "00000.tar.idx" in r.stderr and "00001.tar.idx" in r.stderr
    assert ".nv-meta" in r.stderr and "regenerate" in r.stderr
    assert not list(shards.glob("*.tar.idx")) and (shards / ".nv-meta" / "dataset.yaml").exists()


KD_ARGS = ["--latent-shape", "4,8,8", "--steps", "6", "--guidance-scale", "2.0", "--max-length", "16"]


@pytest.mark.slow  # end to end, several seconds
def test_kd_pairs_and_paths_load_and_regenerate(tmp_path, models, prompt_shards):
    from fgdata.configs import PairLoaderConfig, PathLoaderConfig, PromptLoaderConfig
    from fgdata.encode.kd import KdOptions, kd_run

    teacher = str(models["teacher_unet"])
    r = cli("kd", "pairs", str(tmp_path / "pairs"), "--prompts", str(prompt_shards), "--teacher", teacher,
            "--batch-size", "3", *KD_ARGS, "--json")
    assert r.returncode == 0, r.stderr
    doc = check_json_summary(r.stdout, "kd pairs", tmp_path / "pairs")
    assert (doc["seen"], doc["written"], doc["failed"]) == (5, 5, 0)
    r = cli("kd", "paths", str(tmp_path / "paths"), "--prompts", str(prompt_shards), "--teacher", teacher,
            "--record-steps", "0,2,3,5", *KD_ARGS, "-q")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""  # -q on success: nothing at all
    pairs, paths = samples(tmp_path / "pairs"), samples(tmp_path / "paths")
    assert sorted(pairs) == sorted(paths) == [f"p_{i:03d}" for i in range(5)]
    p0, q0 = pairs["p_000"], paths["p_000"]
    assert sorted(p0) == ["json", "latent.pth", "noise.pth", "txt", "txt_emb.pth"]
    assert sorted(q0) == ["json", "latent.pth", "path.pth", "txt", "txt_emb.pth"]
    path = load(q0["path.pth"])
    assert path.shape == (4, 4, 8, 8)
    torch.testing.assert_close(path[0], load(p0["noise.pth"]))  # path[0] is the starting noise (DDIM sigma 1)
    torch.testing.assert_close(load(q0["latent.pth"]), load(p0["latent.pth"]), rtol=1e-4, atol=1e-4)
    meta = json.loads(q0["json"])
    assert meta["src"] == 1 and meta.keys() == {"src", "fgdata"}  # the user's field is kept, fgdata's are namespaced
    meta = meta["fgdata"]
    assert meta["path_timesteps"] == sorted(meta["path_timesteps"], reverse=True)
    assert len(meta["path_timesteps"]) == 4 and meta["kd"]["guidance_scale"] == 2.0
    prov = json.loads((tmp_path / "paths" / "provenance.json").read_text())["jobs"]["kd-paths"]
    assert prov["scheduler_class"] == "DDIMScheduler" and prov["record_steps"] == [0, 2, 3, 5]

    # Any subset regenerates: one prompt alone, another batch size, same noise and x0.
    write_shards(tmp_path / "one", [("p_003", {"txt": PROMPTS[3].encode()})], per_shard=1)
    kd_run(str(tmp_path / "one"), str(tmp_path / "one_out"),
           KdOptions(mode="pairs", teacher=teacher, steps=6, guidance_scale=2.0, latent_shape="4,8,8", max_length=16,
                     batch_size=1))
    again = samples(tmp_path / "one_out")["p_003"]
    assert again["noise.pth"] == pairs["p_003"]["noise.pth"]
    torch.testing.assert_close(load(again["latent.pth"]), load(pairs["p_003"]["latent.pth"]), rtol=1e-4, atol=1e-4)

    batch = first_batch(PairLoaderConfig, tmp_path / "pairs")
    assert {"real", "noise", "condition", "fname", "shard"} <= set(batch) and "neg_condition" not in batch
    assert batch["real"].shape == batch["noise"].shape == (2, 4, 8, 8) and batch["condition"].shape == (2, 16, 32)
    batch = first_batch(PathLoaderConfig, tmp_path / "paths")
    assert batch["path"].shape == (2, 4, 4, 8, 8) and "neg_condition" not in batch
    batch = first_batch(PromptLoaderConfig, tmp_path / "paths")
    assert batch["condition_raw"] == [PROMPTS[0], PROMPTS[1]]


def test_kd_prompt_file_and_shape_from_size(tmp_path, models):
    from fgdata.encode.kd import KdOptions, kd_run

    (tmp_path / "p.txt").write_text("a cat\n\na dog\na bird\n")
    s = kd_run(str(tmp_path / "p.txt"), str(tmp_path / "out"),
               KdOptions(mode="paths", teacher=str(models["teacher_unet"]), steps=4, size="64", path_steps=2,
                         per_shard=2, max_length=16))
    assert (s.written, s.failed) == (3, 0)
    assert read_shard_counts(str(tmp_path / "out" / "shard_count.json")) == {"00000.tar": 2, "00001.tar": 1}
    got = samples(tmp_path / "out")
    assert load(got["sample_000002"]["path.pth"]).shape == (2, 4, 8, 8)  # 64 px / 8 (4-block VAE)
    assert got["sample_000001"]["txt"] == b"a dog"


@pytest.mark.slow  # torchrun ranks as processes
def test_torchrun_two_ranks_match_one_process(tmp_path, models, image_shards):
    args = ["encode", "latents", str(image_shards), None, "--vae", str(models["vae"]), "--size", "32",
            "--batch-size", "2", "-q"]
    one = cli(*[a or str(tmp_path / "one") for a in args])
    assert one.returncode == 0, one.stderr
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", "0", "-m", "fgdata.cli.main",
                          *[a or str(tmp_path / "two") for a in args]],
                         capture_output=True, text=True, cwd=REPO, timeout=240,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert two.returncode == 0, two.stderr
    a, b = samples(tmp_path / "one"), samples(tmp_path / "two")
    assert sorted(a) == sorted(b) and len(a) == 6
    for key in a:
        torch.testing.assert_close(load(a[key]["latent.pth"]), load(b[key]["latent.pth"]), rtol=1e-4, atol=1e-5)
    for name in ("shard_count.json", "failures.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    # Each rank encoded only its own shards (i mod 2), and both reported.
    markers = sorted(p.name for p in (tmp_path / "two" / ".fgdata" / "latents" / "units").glob("*.json"))
    assert markers == ["000000.json", "000001.json", "000002.json"]


@pytest.mark.slow  # torchrun ranks as processes
def test_torchrun_rank_whose_share_all_failed_does_not_fail_the_job(tmp_path, models, sample_images):
    """Each rank prints its own share's summary; only the whole job's account decides the exit code."""
    good = [(f"s_{i}", {"jpg": sample_images[0].read_bytes()}) for i in range(2)]
    src = write_shards(tmp_path / "src", [*good, ("s_2", {"jpg": b"not an image"})], per_shard=2)
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", "0", "-m", "fgdata.cli.main", "encode", "latents", str(src),
                          str(tmp_path / "out"), "--vae", str(models["vae"]), "--size", "32", "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=240,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert two.returncode == 0, two.stderr
    decoder, docs, at = json.JSONDecoder(), {}, 0
    while two.stdout[at:].strip():  # one document per rank, in either order
        doc, end = decoder.raw_decode(two.stdout[at:].lstrip())
        at = len(two.stdout) - len(two.stdout[at:].lstrip()) + end
        docs[doc.get("rank", 0)] = doc
    assert (docs[1]["written"], docs[1]["failed"], docs[1]["failures_file"]) == (0, 1, None)  # its share: 00001.tar
    assert (docs[0]["seen"], docs[0]["written"], docs[0]["failed"]) == (3, 2, 1)  # the job, finished by rank 0
    assert docs[0]["failures_file"] == str(tmp_path / "out" / "failures.json")


@pytest.mark.slow  # torchrun ranks as processes
def test_torchrun_no_resume_never_counts_a_shard_an_earlier_launch_left(tmp_path, models):
    """An earlier launch's rank 1 encoded 00001.tar from other prompts (3 there) and its rank 0 never came. The
    rerun with --no-resume holds rank 1 where it is about to remove that marker (the job signals the point):
    rank 0 must wait for this launch's marker, so the counts and the report are a fresh run's."""
    old = write_shards(tmp_path / "old", [(f"o_{i}", {"txt": PROMPTS[i].encode()}) for i in range(7)], per_shard=3)
    new = write_shards(tmp_path / "new", [(f"n_{i}", {"txt": PROMPTS[i].encode()}) for i in range(5)], per_shard=2)
    dst = tmp_path / "out"
    flags = ["--encoder", str(models["t5"]), "--max-length", "8", "--no-progress"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    # the earlier launch's rank 1 alone, in this process: RANK and WORLD_SIZE are read when the job starts
    planted = fgdata("encode", "text", old, dst, *flags, env={"RANK": "1", "WORLD_SIZE": "2"})
    assert planted.returncode == 0, planted.stderr
    planted_marker = json.loads((dst / ".fgdata" / "text" / "units" / "000001.json").read_text())
    assert [(s["name"], s["samples"]) for s in planted_marker["shards"]] == [("00001.tar", 3)]

    # rank 0 encodes 00000 and 00002, then either waits for 00001 or (the bug) counts the earlier one and ends
    run = hold_and_release([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                            "-m", "fgdata.cli.main", "encode", "text", str(new), str(dst), *flags, "--no-resume",
                            "--json"], hold="no-resume@1", env=env, cwd=REPO,
                           until=lambda line: "output shards of other ranks" in line or line.startswith("{"))
    assert "at no-resume (rank 1," in run.holds[0]
    assert run.seen.startswith("waiting for ") and "1 missing" in run.seen, run.seen
    assert run.returncode == 0, run.output[-3000:]
    fresh = cli("encode", "text", str(new), str(tmp_path / "fresh"), *flags, "-q")
    assert fresh.returncode == 0, fresh.stderr
    for name in ("shard_count.json", "failures.json"):
        assert (dst / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes(), name
    assert sorted(samples(dst)) == [f"n_{i}" for i in range(5)]


@pytest.mark.slow  # end to end, several seconds
def test_stopped_job_resumes_to_identical_output(tmp_path, models):
    """Stopped after its 2nd output shard (the job pauses there itself), sent SIGTERM, rerun: identical bytes.
    One signal here: the full matrix of signals runs on ``shard`` (tests/jobs/test_shard_job.py)."""
    from fgdata.encode.kd import KdOptions, kd_run

    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(f"prompt number {i}" for i in range(8)) + "\n")
    options = KdOptions(mode="pairs", teacher=str(models["teacher_unet"]), steps=6, guidance_scale=2.0,
                        latent_shape="4,8,8", max_length=16, per_shard=2, batch_size=1)
    kd_run(str(prompts), str(tmp_path / "ref"), options)

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fgdata.cli.main", "kd", "pairs", str(out), "--prompts", str(prompts),
           "--teacher", options.teacher, "--per-shard", "2", "--batch-size", "1", *KD_ARGS, "-q"]
    stopped = stop_and_signal(cmd, after=2, sig=signal.SIGTERM, cwd=REPO, env={"HF_HUB_OFFLINE": "1"})
    assert stopped.returncode == 143, stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == "interrupted: 4 inputs done; rerun the same command to resume"
    summary = kd_run(str(prompts), str(out), options)
    figures = payload_of(summary, TaskFigures)
    assert (figures.shards_skipped, figures.shards_done) == (2, 2)
    assert leftovers(out) == []
    ref_s, out_s = samples(tmp_path / "ref"), samples(out)
    assert sorted(ref_s) == sorted(out_s) and len(out_s) == 8
    for key in ref_s:
        assert ref_s[key]["noise.pth"] == out_s[key]["noise.pth"]
    for name in ("shard_count.json", "00000.tar", "00003.tar"):
        assert (tmp_path / "ref" / name).read_bytes() == (out / name).read_bytes(), name


def test_rerun_with_other_options_is_refused(tmp_path, models, prompt_shards):
    from fgdata.encode.kd import KdOptions, kd_run
    from fgdata.errors import FgdataError

    def options(steps: int) -> KdOptions:
        return KdOptions(mode="pairs", teacher=str(models["teacher_unet"]), steps=steps, latent_shape="4,8,8",
                         max_length=16)

    kd_run(str(prompt_shards), str(tmp_path / "o"), options(2))
    before = (tmp_path / "o" / "00000.tar").read_bytes()
    kd_run(str(prompt_shards), str(tmp_path / "o"), options(2))  # same options: all resumed
    assert (tmp_path / "o" / "00000.tar").read_bytes() == before
    with pytest.raises(FgdataError, match="--steps was 2, now 3"):
        kd_run(str(prompt_shards), str(tmp_path / "o"), options(3))


def test_offline_hub_id_is_one_line(tmp_path, prompt_shards):
    r = fgdata("encode", "text", prompt_shards, tmp_path / "o", "--encoder", "google/umt5-xxl", "-q",
               env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: google/umt5-xxl: HF_HUB_OFFLINE is set") and "--encoder DIR" in lines[-1]
    assert "Traceback" not in r.stderr
    r = cli("encode", "latents", str(prompt_shards), str(tmp_path / "o"), "--vae", "stabilityai/sd-vae-ft-mse", "-q")
    assert r.returncode == 1 and "HF_HUB_OFFLINE is set" in str(r.exception)


def test_neg_prompt_refuses_bad_input(tmp_path, models):
    """A bad --preset, or neither --preset nor --text: usage errors (exit 2) that say what to give."""
    r = cli("encode", "neg-prompt", "--preset", "nope", "--encoder", str(models["t5"]), "-o", str(tmp_path / "n.npy"))
    assert r.returncode == 2 and "neg_prompt_wan" in r.stderr
    r = cli("encode", "neg-prompt", "--encoder", str(models["t5"]), "-o", str(tmp_path / "n.npy"))
    assert r.returncode == 2 and "exactly one of --preset" in r.stderr
    assert not (tmp_path / "n.npy").exists()


@pytest.mark.slow  # a Ray instance
def test_ray_engine_matches_local(tmp_path, models, image_shards):
    pytest.importorskip("ray")
    from fgdata.encode.latents import LatentOptions, encode_latents

    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "stray.txt").write_text("not fgdata's")
    r = cli("encode", "latents", str(image_shards), str(tmp_path / "ray"), "--vae", str(models["vae"]), "--size", "32",
            "--engine", "ray", "--workers", "2", "--overwrite", "--json")
    assert r.returncode == 0, r.stderr
    assert "--overwrite: removing 1 file(s)" in r.stderr and "stray.txt" in r.stderr  # said by the driver
    assert check_json_summary(r.stdout, "encode latents", tmp_path / "ray")["written"] == 6
    encode_latents(str(image_shards), str(tmp_path / "local"), LatentOptions(vae=str(models["vae"]), size=32))
    a, b = samples(tmp_path / "local"), samples(tmp_path / "ray")
    assert sorted(a) == sorted(b) and len(a) == 6
    assert (tmp_path / "local" / "shard_count.json").read_bytes() == (tmp_path / "ray" / "shard_count.json").read_bytes()


def test_text_into_in_place_keeps_every_sample_and_member(tmp_path, models):
    """`encode text CAPTIONS L --into L` where some samples have no caption: nothing lost, nothing hidden."""
    latents = tmp_path / "latents"
    items = [(f"s_{i:03d}", {"latent.pth": bytes([i]) * 64, "json": json.dumps({"i": i}).encode(),
                             "cls": str(i % 3).encode()}) for i in range(8)]
    write_shards(latents, items, per_shard=4)  # 00000.tar: s_000..s_003, 00001.tar: s_004..s_007
    captions = [(key, {"txt": f"caption {key}".encode()}) for key, _ in items if key not in ("s_001", "s_004", "s_005")]
    # the caption shards must share the latent shards' names: split them the same way
    write_shards(tmp_path / "captions", [c for c in captions if c[0] < "s_004"], per_shard=100)
    write_shards(tmp_path / "captions" / "b", [c for c in captions if c[0] >= "s_004"], per_shard=100)
    (tmp_path / "captions" / "b" / "00000.tar").rename(tmp_path / "captions" / "00001.tar")
    before = samples(latents)

    r = cli("encode", "text", str(tmp_path / "captions"), str(latents), "--into", str(latents),
            "--encoder", str(models["t5"]), "--max-length", "16", "--json")
    assert r.returncode == 0, r.stderr
    doc = check_json_summary(r.stdout, "encode text", latents)
    assert (doc["seen"], doc["written"], doc["failed"], doc["not_updated"]) == (8, 5, 3, 3)
    after = samples(latents)
    assert sorted(after) == sorted(before)  # every sample is still there
    for key, members in before.items():
        for ext, data in members.items():
            if ext != "json":
                assert after[key][ext] == data, (key, ext)  # every member it had, byte for byte
        assert json.loads(after[key]["json"])["i"] == json.loads(members["json"])["i"]
        assert ("txt_emb.pth" in after[key]) == (key not in ("s_001", "s_004", "s_005"))
    assert read_shard_counts(str(latents / "shard_count.json")) == {"00000.tar": 4, "00001.tar": 4}
    report = json.loads((latents / "failures.json").read_text())
    assert (report["seen"], report["written"], report["failed"], report["not_updated"]) == (8, 5, 3, 3)
    assert sorted(f["input"].rsplit("#", 1)[1] for f in report["failures"]) == ["s_001", "s_004", "s_005"]
    assert all(f["kept"] for f in report["failures"])
    prov = json.loads((latents / "provenance.json").read_text())["jobs"]["text"]
    assert (prov["samples"], prov["written"], prov["not_updated"]) == (8, 5, 3)


def test_a_json_member_that_is_not_an_object_fails_that_sample_and_is_kept(tmp_path, models):
    """fgdata adds its fields to a JSON object only: a list, a number or broken JSON is never replaced or wrapped."""
    latents = tmp_path / "latents"
    odd = {1: b"[1, 2, 3]", 2: b"42", 3: b"{not json", 4: b'{"fgdata": "mine"}'}
    items = [(f"s_{i:03d}", {"latent.pth": bytes([i]) * 64, "txt": f"caption {i}".encode(),
                             "json": odd.get(i, json.dumps({"i": i}).encode())}) for i in range(6)]
    write_shards(latents, items, per_shard=6)
    before = samples(latents)
    r = cli("encode", "text", str(latents), str(latents), "--into", str(latents), "--encoder", str(models["t5"]),
            "--max-length", "16", "--json")
    assert r.returncode == 0, r.stderr
    doc = check_json_summary(r.stdout, "encode text", latents)
    assert (doc["seen"], doc["written"], doc["failed"]) == (6, 2, 4)
    reasons = {f["input"].rsplit("#", 1)[1]: f["reason"] for f in json.loads((latents / "failures.json").read_text())["failures"]}
    assert reasons == {
        "s_001": "metadata: the sample's json member holds a list, not a JSON object; fgdata adds its fields to an object only",
        "s_002": "metadata: the sample's json member holds a number, not a JSON object; fgdata adds its fields to an object only",
        "s_003": reasons["s_003"],
        "s_004": "metadata: the sample's json has its own 'fgdata' field (not an object); it is reserved for fgdata's metadata"}
    assert reasons["s_003"].startswith("metadata: the sample's json member is not valid JSON (")
    after = samples(latents)
    for i in odd:
        assert after[f"s_{i:03d}"] == before[f"s_{i:03d}"]  # kept whole: the json member byte for byte, no embedding
    assert "txt_emb.pth" in after["s_000"] and json.loads(after["s_000"]["json"])["i"] == 0


@pytest.mark.slow  # a fresh process that loads the model libraries
def test_neg_prompt_takes_the_shared_output_flags_and_q_silences_the_model_libraries(tmp_path):
    """-q: nothing on stdout or stderr (no "Loading weights" bar); --json: one document; the bar library's own bars
    go with ours (--no-progress)."""
    from .conftest import tiny_t5

    encoder = tiny_t5(tmp_path / "t5")
    quiet = cli_process("encode", "neg-prompt", "--encoder", str(encoder), "--text", "blurry", "--max-length", "8",
                        "-o", str(tmp_path / "q.npy"), "-q")
    assert quiet.returncode == 0, quiet.stderr
    assert (quiet.stdout, quiet.stderr) == ("", "")
    assert np.load(tmp_path / "q.npy", allow_pickle=False).shape == (8, 32)
    # the libraries are loaded by now in this process: --no-progress tells them directly (a fresh process's -q
    # above goes through the environment they read when they load)
    doc = fgdata("encode", "neg-prompt", "--encoder", encoder, "--text", "blurry", "--max-length", "8",
                 "-o", tmp_path / "j.npy", "--json", "--no-progress")
    assert doc.returncode == 0, doc.stderr
    record = json.loads(doc.stdout)
    assert record["command"] == "encode neg-prompt" and record["output"] == str(tmp_path / "j.npy")
    assert record["shape"] == [8, 32] and "Loading weights" not in doc.stderr


def test_rerunning_latents_after_text_was_merged_in_place_keeps_the_shards(image_latents, image_shards, models,
                                                                            tmp_path):
    """`encode latents SRC L`, `encode text SRC L --into L`, then the first step again: the shards grew when the
    text step merged its members in, and the latents step keeps them (no second pass over the VAE)."""
    dst = tmp_path / "shards"
    shutil.copytree(image_latents, dst)
    before = {p.name: p.read_bytes() for p in dst.glob("*.tar")}
    r = cli("encode", "latents", str(image_shards), str(dst), "--vae", str(models["vae"]), "--size", "64",
            "--batch-size", "4", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["shards_written"], doc["shards_resumed"]) == (0, len(list(image_shards.glob("*.tar"))))
    assert {p.name: p.read_bytes() for p in dst.glob("*.tar")} == before  # the text members are still there


def _ray_shards(tmp_path: Path, sample_images, n: int) -> Path:
    items = [(f"s_{i:03d}", {"png": sample_images[i % len(sample_images)].read_bytes(), "txt": f"c {i}".encode()})
             for i in range(n)]
    return write_shards(tmp_path / "src", items, per_shard=1)


def _loads(path: Path, what: str) -> list[str]:
    """The process ids of the loads of ``what`` that FGDATA_TEST_LOADS recorded."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [pid for pid, name in (line.split("\t") for line in lines) if name == what]


@pytest.mark.slow  # a Ray instance
def test_ray_loads_the_model_once_per_worker_process_not_per_unit(tmp_path, models, sample_images, monkeypatch):
    """Each input shard is its own Ray task asking for a GPU (a logical one here, as ``--device cuda`` asks), and a
    worker process keeps its loaded VAE for the next units of the job: no process loads it twice (Ray would end a
    GPU task's process after one task by default), and the driver never loads it (the workers hand back its
    provenance record)."""
    ray = pytest.importorskip("ray")
    from fgdata.encode.latents import LatentOptions, encode_latents
    from fgdata.jobs.driver import RunSettings

    src = _ray_shards(tmp_path, sample_images, 6)
    loads = tmp_path / "loads.txt"
    monkeypatch.setenv("FGDATA_TEST_LOADS", str(loads))  # the cluster's workers inherit it
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        summary = encode_latents(str(src), str(tmp_path / "ray"), LatentOptions(vae=str(models["vae"]), size=32),
                                 run=RunSettings(engine="ray", workers=1, num_gpus=1.0))
    finally:
        ray.shutdown()
    assert (summary.written, payload_of(summary, TaskFigures).shards_done) == (6, 6)
    pids = _loads(loads, "VAE")
    assert pids and len(pids) == len(set(pids)) and str(os.getpid()) not in pids, pids
    assert len(pids) < 6  # not once per unit (the node has two CPUs and one GPU: Ray keeps one or two processes)
    prov = json.loads((tmp_path / "ray" / "provenance.json").read_text())["jobs"]["latents"]
    assert prov["vae_class"] == "AutoencoderKL" and prov["written"] == 6


@pytest.mark.slow  # a Ray instance
def test_ray_rerun_of_a_finished_job_keeps_every_unit_without_ray(tmp_path, models, sample_images, monkeypatch):
    """The driver decides resume: a rerun that keeps every unit submits no Ray task (it does not even reach the
    cluster, here an address where none listens) and loads no model, and the output stays byte for byte."""
    pytest.importorskip("ray")
    src = _ray_shards(tmp_path, sample_images, 4)
    dst = tmp_path / "ray"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    args = ("encode", "latents", str(src), str(dst), "--vae", str(models["vae"]), "--size", "32", "--engine", "ray",
            "--workers", "2", "--json")
    assert cli(*args).returncode == 0
    before = {p.name: p.read_bytes() for p in dst.iterdir() if p.is_file()}
    loads = tmp_path / "loads.txt"
    monkeypatch.setenv("FGDATA_TEST_LOADS", str(loads))
    r = cli(*args, "--ray-address", "127.0.0.1:9")  # the discard port: nothing of Ray answers there
    assert r.returncode == 0, r.stderr
    doc = check_json_summary(r.stdout, "encode latents", dst)
    assert (doc["shards_written"], doc["shards_resumed"], doc["written"]) == (0, 4, 4)
    assert {p.name: p.read_bytes() for p in dst.iterdir() if p.is_file()} == before
    assert not loads.exists()


@pytest.mark.parametrize("argv", [
    ["encode", "latents", "SRC", "DST", "--vae", "/no/such/vae", "-q"],
    ["encode", "text", "SRC", "DST", "--encoder", "/no/such/encoder", "-q"],
    ["kd", "pairs", "DST", "--teacher", "/no/such/teacher", "--prompts", "PROMPTS", "--steps", "4", "-q"],
])
def test_a_missing_model_fails_before_the_model_libraries_load(tmp_path, argv):
    """The one-line error comes before diffusers or transformers are imported (each takes seconds), so a wrong
    model path fails at once; -q's quieting of those libraries imports nothing."""
    (tmp_path / "prompts.txt").write_text("a cat\n")
    write_shards(tmp_path / "src", [("s_000", {"txt": b"a cat", "jpg": b"not needed"})], per_shard=1)
    args = [str(tmp_path / "src") if a == "SRC" else str(tmp_path / "dst") if a == "DST" else
            str(tmp_path / "prompts.txt") if a == "PROMPTS" else a for a in argv]
    code = ("import sys\nfrom fgdata.cli.main import run\nsys.argv = ['fgdata', *sys.argv[1:]]\ntry:\n    run()\n"
            "except SystemExit as exc:\n    code = exc.code\n"
            "print(code, sorted(m for m in ('diffusers', 'transformers', 'torch') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "no such" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] in ("1 []", "2 []"), proc.stdout
