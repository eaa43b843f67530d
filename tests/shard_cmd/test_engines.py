"""S3 destination, the Ray engine on a local instance, and crash + rerun."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fgdata import storage
from fgdata.shards import discover_shards, iter_samples, read_shard_counts


def _samples(dest: str) -> list:
    return [s for shard in discover_shards(dest) for s in iter_samples(shard)]


def _members(dest: str) -> list[tuple[str, dict]]:
    return [(s.key, s.members) for s in _samples(dest)]


@pytest.mark.s3
@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_s3_destination(cli, corrupt_folder, s3_bucket, tmp_path):
    url = f"{s3_bucket}/photos"
    cli("shard", "images", corrupt_folder, url, "--maxcount", "3", "--no-progress")
    local = tmp_path / "local"
    cli("shard", "images", corrupt_folder, local, "--maxcount", "3", "--no-progress")
    names = sorted(i.name for i in storage.list_dir(url))
    assert names == sorted(p.name for p in local.iterdir() if p.name != ".fgdata")  # .fgdata: the local lock
    for name in names:
        assert storage.read_bytes(f"{url}/{name}") == (local / name).read_bytes(), name
    report = json.loads(storage.read_bytes(f"{url}/failures.json"))
    assert report["seen"] == report["written"] + report["failed"] and report["failed"] == 2


def test_ray_engine_matches_local_samples(cli, corrupt_folder, tmp_path, ray_local):
    local, ray_out = tmp_path / "local", tmp_path / "ray"
    cli("shard", "images", corrupt_folder, local, "--maxcount", "2", "--no-progress")
    result = cli("shard", "images", corrupt_folder, ray_out, "--maxcount", "2", "--unit-size", "3",
                 "--engine", "ray", "--no-progress", "--json")
    doc = json.loads(result.stdout)
    assert doc["seen"] == doc["written"] + doc["failed"] and doc["failed"] == 2
    assert _members(str(ray_out)) == _members(str(local))
    counts = read_shard_counts(str(ray_out / "shard_count.json"))
    assert list(counts) == [f"{i:05d}.tar" for i in range(len(counts))] and sum(counts.values()) == doc["written"]
    assert not any((ray_out / ".fgdata" / "work").glob("*/*"))  # no unit left a file half-built
    assert len(list((ray_out / ".fgdata" / "units").glob("*.json"))) == 3  # one marker per unit (8 inputs, 3 a unit): the resume state
    a, b = json.loads((ray_out / "failures.json").read_text()), json.loads((local / "failures.json").read_text())
    assert a == b
    for shard in discover_shards(str(ray_out)):  # each index names its shard
        assert json.loads(Path(shard + ".idx.json").read_text())["shard"] == Path(shard).name
    before = {p.name: p.read_bytes() for p in ray_out.iterdir() if p.is_file()}
    cli("shard", "images", corrupt_folder, ray_out, "--maxcount", "2", "--unit-size", "3", "--engine", "ray",
        "--no-progress")
    assert {p.name: p.read_bytes() for p in ray_out.iterdir() if p.is_file()} == before


def test_interrupted_clip_job_resumes_mid_video(cli, keyframed_clip, tmp_path, snapshot):
    """A crash that leaves only the first shard of a video's clips: the rerun writes the rest, once."""
    src = tmp_path / "videos"
    src.mkdir()
    for name in ("a", "b"):
        shutil.copyfile(keyframed_clip, src / f"{name}.mp4")
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    args = ("--clip-seconds", "1", "--maxcount", "2", "--no-progress")
    cli("shard", "videos", src, clean, *args)
    cli("shard", "videos", src, crashed, *args)
    for p in crashed.iterdir():
        if p.is_file() and p.name not in ("00000.tar", "00000.tar.idx.json", "shard_job.json"):
            p.unlink()  # as if the process died while writing 00001.tar (video a has 3 clips)
    cli("shard", "videos", src, crashed, *args)
    assert snapshot(crashed) == snapshot(clean)


@pytest.mark.slow  # starts its own Ray cluster in a fresh process
def test_ray_tasks_write_to_s3_under_the_driver_lease(corrupt_folder, s3_bucket, tmp_path):
    """Each Ray task stages its shards under the driver's lease prefix and moves them into place: the result
    equals a local run's, and nothing is left staged."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": str(repo), "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    args = ["--maxcount", "2", "--unit-size", "3", "--no-progress", "-q"]
    url = f"{s3_bucket}/ray"
    done = subprocess.run([sys.executable, "-m", "fgdata.cli.main", "shard", "images", str(corrupt_folder), url,
                           *args, "--engine", "ray"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    local = tmp_path / "local"
    subprocess.run([sys.executable, "-m", "fgdata.cli.main", "shard", "images", str(corrupt_folder), str(local),
                    *args], check=True, env=env, timeout=300)
    names = sorted(i.name for i in storage.list_dir(url))
    assert names == sorted(p.name for p in local.iterdir() if p.is_file())
    for name in names:
        assert storage.read_bytes(f"{url}/{name}") == (local / name).read_bytes(), name
    assert storage.list_recursive(f"{url}/.fgdata/staging") == []
