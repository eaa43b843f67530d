"""Writers stopped, then rerun, end byte-identical to an uninterrupted run, with no temporary file left.

The ShardWriter alone is SIGKILLed at seeded random moments (and checked right after each kill: no partial file
under a final name; once its temporaries are removed, only complete shards are left, and writing again gives the
uninterrupted run's bytes). The writer keeps no resume state: resuming is the job's, tested on the commands below. The commands are stopped where the job itself says it is (``FGDATA_TEST_STOP_AFTER``: it
pauses after its N-th output) and then sent SIGKILL, SIGTERM or SIGINT, so no trial depends on timing. The full
matrix of signals runs on ``shard images`` (here and in tests/jobs/test_shard_job.py); every other command is
stopped once, with the signal that command is given below (each signal's handling is the job core's, shared by
every command, so one per command tests the command's own resume). The stopped runs are real processes sent real
signals; the uninterrupted runs and the reruns, which no signal reaches, run in the test's process.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from faultkit import FGDATA, kill_trials, png_bytes, stop_and_signal, stop_trials, tree, uninterrupted
from fgdata.storage.temps import clean_temps

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # several full runs per test (tests/jobs/test_shard_job.py
# keeps a kill-and-rerun of every signal in the quick set)

WRITER = r"""
import sys, time
from fgdata.shards import ShardWriter

dest, n = sys.argv[1], int(sys.argv[2])
w = ShardWriter(dest, maxcount=7)
for i in range(n):
    time.sleep(0.003)  # stretch the job so kills land mid-shard, mid-close and between shards
    w.write(f"s_{i:05d}", {"bin": bytes([i % 256]) * (700 + 37 * i), "txt": str(i).encode()})
s = w.close()
print(s.samples, len(s.shards))
"""


def _killed_enough(results, trials: int) -> None:
    # Every trial is checked either way; most must actually have interrupted the job to mean anything.
    assert sum(r.killed for r in results) >= trials // 2, [(round(r.delay, 3), r.killed) for r in results]


def _only_complete_shards_after_cleaning(dest: Path) -> None:
    """Remove what the killed writer left under temporary names: only finished files may remain (their bytes
    were checked against the uninterrupted run just before)."""
    clean_temps(str(dest))
    left = [p.name for p in dest.iterdir()] if dest.exists() else []
    assert all(not name.startswith(".") for name in left), left


def test_shard_writer(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    results = kill_trials([sys.executable, str(script), "{out}", "150"], out=tmp_path, clean=tmp_path / "clean",
                          seed=1, trials=7, exact=lambda rel: rel.endswith((".tar", ".tar.idx.json")),
                          after_kill=_only_complete_shards_after_cleaning)
    _killed_enough(results, 7)


STOPS = [(1, signal.SIGKILL), (2, signal.SIGTERM), (3, signal.SIGINT)]  # the full matrix: shard images only


def test_shard_images(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(60):
        (src / f"img{i:03d}.png").write_bytes(png_bytes(i, size=24))
        (src / f"img{i:03d}.txt").write_text(f"caption {i}")
    (src / "broken.png").write_bytes(b"not a png")  # a failed input: failures are part of the output
    cmd = [*FGDATA, "shard", "images", str(src), "{out}", "--maxcount", "4", "--no-progress", "--workers", "2"]
    stop_trials(cmd, out=tmp_path, clean=tmp_path / "clean", stops=STOPS)


def _objects(bucket_url: str, prefix: str) -> dict[str, str]:
    """key below ``prefix`` -> sha256 of every object there (fgdata's job state aside)."""
    import hashlib

    import boto3

    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"], region_name="us-east-1")
    bucket = bucket_url.removeprefix("s3://")
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix) + 1:]
            if not rel.startswith(".fgdata/"):
                body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
                out[rel] = hashlib.sha256(body).hexdigest()
    return out


def test_shard_videos_split_scenes(tmp_path):
    """--split scenes on the job core: several clips per video over several shards of a unit, stopped after a
    shard and resumed, ends with the uninterrupted run's bytes (clips, fields, failures.json)."""
    pytest.importorskip("av")
    from scenes_synth import build, encode

    src = tmp_path / "src"
    src.mkdir()
    plan = [("shot", 0, 30, 1.0), ("cut",), ("shot", 1, 30, 0.0), ("cut",), ("shot", 2, 30, 2.0)]
    for i in range(3):
        (src / f"v{i}.mp4").write_bytes(encode(build((128, 72), plan, seed=i).frames, gop=10, audio=i == 0))
    (src / "broken.mp4").write_bytes(b"not a video")  # a failed input: failures are part of the output
    cmd = [*FGDATA, "shard", "videos", str(src), "{out}", "--split", "scenes", "--maxcount", "2",
           "--unit-size", "2", "--no-progress", "--workers", "2"]
    stop_trials(cmd, out=tmp_path, clean=tmp_path / "clean", stops=[(2, signal.SIGTERM)])


def test_shard_images_to_s3(tmp_path, s3_bucket):
    """Stopped while writing to S3, then rerun: the objects equal an uninterrupted run's, and neither the bucket
    nor this host's staging folder keeps a partial shard."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"img{i:03d}.png").write_bytes(png_bytes(i, size=24))
    cache = tmp_path / "cache"
    env = {"FGDATA_CACHE": str(cache)}

    def argv(name: str) -> list[str]:
        return [*FGDATA, "shard", "images", str(src), f"{s3_bucket}/{name}", "--maxcount", "4", "--no-progress",
                "--workers", "2"]

    clean = uninterrupted(argv("clean"), env=env)
    assert clean.returncode == 0, clean.stderr[-2000:]
    reference = _objects(s3_bucket, "clean")
    assert len([k for k in reference if k.endswith(".tar")]) == 8
    # killed after its 2nd shard: the rerun on this host takes the dead job's lease over at once
    stopped = stop_and_signal(argv("stopped"), after=2, sig=signal.SIGKILL, env=env)
    assert stopped.returncode == -signal.SIGKILL, stopped.stderr[-2000:]
    again = uninterrupted(argv("stopped"), env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert _objects(s3_bucket, "stopped") == reference, "the rerun's objects differ from an uninterrupted run's"
    staged = [p.relative_to(cache).as_posix() for p in (cache / "staging").rglob("*") if p.is_file()]
    assert staged and all(p.endswith("/.fgdata/lock") for p in staged), staged  # the (free) lock files only


def _cifar_tarball(path: Path, per_batch: int) -> None:
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            batch = {"labels": [int(x) for x in rng.integers(0, 10, per_batch)],
                     "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)}
            data = pickle.dumps(batch, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_prepare_cifar10(tmp_path):
    tarball = tmp_path / "cifar-10-python.tar.gz"
    _cifar_tarball(tarball, per_batch=600)  # 3000 training rows: 6 blocks of 500
    cmd = [*FGDATA, "prepare", "cifar10", "--source", str(tarball), "--skip-md5", "--data-root", "{out}", "--workers", "2"]
    stop_trials(cmd, out=tmp_path, clean=tmp_path / "clean", stops=[(3, signal.SIGINT)])


def test_prepare_says_what_a_stopped_run_keeps_and_the_rerun_resumes_from_it(tmp_path):
    """3000 rows in blocks of 500 and units of 1,000: stopped after block 3 (inside unit 1), the run keeps unit 0
    only, says so, and the rerun reports those 1,000 inputs as resumed."""
    tarball = tmp_path / "cifar-10-python.tar.gz"
    _cifar_tarball(tarball, per_batch=600)
    cmd = [*FGDATA, "prepare", "cifar10", "--source", str(tarball), "--skip-md5", "--data-root", str(tmp_path),
           "--workers", "2", "--no-progress"]
    stopped = stop_and_signal(cmd, after=3, sig=signal.SIGINT)
    assert stopped.returncode == 130 and "interrupted: 1000 inputs done" in stopped.stderr, stopped.stderr[-2000:]
    again = uninterrupted([*cmd, "--json"])
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads(again.stdout)
    assert (summary["resumed"], summary["seen"], summary["written"]) == (1000, 3000, 3000)


@pytest.fixture(scope="module")
def tiny_t5_dir(tmp_path_factory) -> Path:
    import torch
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    path = tmp_path_factory.mktemp("t5")
    torch.manual_seed(0)
    T5EncoderModel(T5Config(vocab_size=384, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2,
                            relative_attention_num_buckets=8)).save_pretrained(path)
    ByT5Tokenizer().save_pretrained(path)
    return path


def test_encode_text(tmp_path, tiny_t5_dir):
    from faultkit import write_dataset

    src = tmp_path / "src"
    write_dataset(src, n=48, maxcount=4, kinds=("txt",))
    cmd = [*FGDATA, "encode", "text", str(src), "{out}", "--encoder", str(tiny_t5_dir), "--max-length", "16",
           "--batch-size", "2", "--quiet"]
    stop_trials(cmd, out=tmp_path, clean=tmp_path / "clean", stops=[(2, signal.SIGTERM)], env={"HF_HUB_OFFLINE": "1"})


def _imagenet_tree(root: Path, sample_images, n: int) -> None:
    """``n`` real photos at varied sizes in two synset folders of an ImageNet-shaped train tree, and one broken file."""
    from PIL import Image

    train = root / "ILSVRC" / "Data" / "CLS-LOC" / "train"
    for k in range(n):
        folder = train / f"n0144076{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        photo = Image.open(sample_images[k % len(sample_images)]).convert("RGB")
        photo.resize((96 + 16 * (k % 8), 80 + 8 * (k % 8))).save(folder / f"img{k}.JPEG", quality=90)
    (train / "n01440761" / "broken.JPEG").write_bytes(b"not a jpeg")  # a failed input is part of the output


def test_prepare_imagenet64(tmp_path, sample_images):
    """50 inputs in blocks of 16: the job pauses after block 2, is killed, and the rerun resumes."""
    _imagenet_tree(tmp_path / "imagenet", sample_images, 49)
    cmd = [*FGDATA, "prepare", "imagenet-64", "--imagenet-source", str(tmp_path / "imagenet"), "--data-root", "{out}",
           "--workers", "2", "--no-progress"]
    stop_trials(cmd, out=tmp_path, clean=tmp_path / "clean", stops=[(2, signal.SIGKILL)])
    report = (tmp_path / "clean" / "imagenet-64" / "failures.json").read_text()
    assert '"seen": 50' in report and '"written": 49' in report and "broken.JPEG" in report


def test_prepare_imagenet256(tmp_path, tiny_vae_dir, sample_images):
    """Both passes, one stop in each: output 1 is the RGB zip's only block, outputs 2-5 the latent batches (the
    last one just before the part file is finished and merged)."""
    _imagenet_tree(tmp_path / "imagenet", sample_images, 8)
    cmd = [*FGDATA, "prepare", "imagenet-256", "--imagenet-source", str(tmp_path / "imagenet"), "--data-root", "{out}",
           "--vae", str(tiny_vae_dir), "--device", "cpu", "--batch-size", "2", "--workers", "2", "--no-progress"]
    stops = [(1, signal.SIGTERM), (5, signal.SIGKILL)]
    stop_trials(cmd, out=tmp_path, clean=tmp_path / "clean", stops=stops, env={"HF_HUB_OFFLINE": "1"})
    report = (tmp_path / "clean" / "imagenet-256" / "failures.json").read_text()
    assert '"seen": 9' in report and '"written": 8' in report and "broken.JPEG" in report


def test_a_unit_stopped_half_way_leaves_its_plan_and_is_said_on_the_rerun(tmp_path):
    """A unit leaves its plan (position range, inputs' fingerprint) when it starts; killed after its first shard,
    its marker file still holds that plan (no finished unit), and the rerun says it writes the unit again."""
    import json

    from fgdata.jobs.units import Marker, Plan

    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"img{i:03d}.png").write_bytes(png_bytes(i, size=24))

    def argv(dest: Path) -> list[str]:  # units of 8 inputs in shards of 4: two shards per unit
        return [*FGDATA, "shard", "images", str(src), str(dest), "--maxcount", "4", "--unit-size", "8",
                "--no-progress", "--workers", "1"]

    clean = uninterrupted(argv(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stderr[-2000:]
    dest = tmp_path / "out"
    stopped = stop_and_signal(argv(dest), after=1, sig=signal.SIGKILL)
    assert stopped.returncode == -signal.SIGKILL
    data = (dest / ".fgdata" / "units" / "000000.json").read_bytes()
    plan = Plan.parse(data)
    assert Marker.parse(data) is None and plan is not None
    assert (plan.unit, plan.first, plan.count, plan.launch) == (0, 0, 8, None)
    finished = Marker.parse((tmp_path / "clean" / ".fgdata" / "units" / "000000.json").read_bytes())
    assert finished is not None and plan.inputs == finished.inputs and plan.options == finished.options

    again = uninterrupted([*argv(dest)[:-2], "--json"])
    assert again.returncode == 0, again.stderr[-2000:]
    assert "1 work unit(s) an earlier run stopped half-way were written again from their start" in again.stderr
    assert json.loads(again.stdout)["restarted_units"] == 1
    state = lambda rel: rel.startswith(".fgdata/")  # noqa: E731 - the lock and this host's figures
    assert tree(dest, state) == tree(tmp_path / "clean", state)
