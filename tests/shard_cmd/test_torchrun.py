"""``fgdata shard images`` under torchrun: ranks own work units, rank 0 waits (bounded) and finalizes.

Real ``torch.distributed.run`` on CPU (``--standalone``: its store listens on a free port, which
``--no-resume`` needs for the launch id); a rank that never comes is a process started with ``RANK=0
WORLD_SIZE=2`` and no rank 1 (torchrun itself would stop every rank once one fails).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from faultkit import STOP_MARK, descendants, hold_all_then_one, hold_and_release
from fgdata.jobs.units import Plan
from fgdata.shards import discover_shards, iter_samples

REPO = Path(__file__).resolve().parents[2]
ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
#: 9 inputs (7 photos, 2 broken) in units of 3: units 0-2, so 2 ranks own {0, 2} and {1}, 3 ranks one each.
ARGS = ("--maxcount", "2", "--unit-size", "3", "--no-progress")

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory, sample_images: list[Path], sample_data: Path) -> Path:
    """The bundled photos with captions, plus a truncated JPEG and a text file named .jpg."""
    src = tmp_path_factory.mktemp("photos")
    for img in sample_images:
        shutil.copyfile(img, src / img.name)
        shutil.copyfile(sample_data / f"{img.stem}.txt", src / f"{img.stem}.txt")
    data = (sample_data / "hubble_deep_field.jpg").read_bytes()
    (src / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (src / "notes.jpg").write_text("this is not an image\n")
    return src


def launch(ranks: int, *args: object) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--standalone",
            "-m", "fgdata.cli.main", *map(str, args)]


def torchrun(ranks: int, *args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(launch(ranks, *args), capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, **ENV, **(env or {})})


def as_rank(rank: int, world: int, *args: object) -> subprocess.CompletedProcess:
    """One process that believes it is rank ``rank`` of ``world`` (as torchrun would start it)."""
    env = {**os.environ, **ENV, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
    return subprocess.run([sys.executable, "-m", "fgdata.cli.main", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=300, env=env)


def tree(root: Path) -> dict[str, str]:
    """Every output file's sha256 (the job's private state, locks and all, left out)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.relative_to(root).as_posix().startswith(".fgdata/")}


def members(dest: Path) -> list[tuple[str, dict]]:
    return [(s.key, s.members) for shard in discover_shards(str(dest)) for s in iter_samples(shard)]


def documents(stdout: str) -> dict[int, dict]:
    """The ``--json`` documents of all ranks (one each, in any order), by rank."""
    decoder, docs, rest = json.JSONDecoder(), {}, stdout.strip()
    while rest:
        doc, end = decoder.raw_decode(rest)
        docs[doc.get("rank", 0)] = doc
        rest = rest[end:].strip()
    return docs


@pytest.fixture(scope="module")
def two_ranks(photos: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict]]:
    dest = tmp_path_factory.mktemp("runs") / "two"
    done = torchrun(2, "shard", "images", photos, dest, *ARGS, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    return dest, documents(done.stdout)


@pytest.mark.slow  # torchrun ranks as processes
def test_two_and_three_ranks_write_the_same_bytes_and_the_local_samples(photos, two_ranks, tmp_path, cli):
    two, docs = two_ranks
    three = tmp_path / "three"
    done = torchrun(3, "shard", "images", photos, three, *ARGS, "-q")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert tree(three) == tree(two)
    for dest in (two, three):  # one marker per unit, nothing half-built
        assert len(list((dest / ".fgdata" / "units").glob("*.json"))) == 3
        assert not any((dest / ".fgdata" / "work").glob("*/*"))

    local = tmp_path / "local"
    cli("shard", "images", photos, local, "--maxcount", "2", "--no-progress")
    assert members(two) == members(local)  # same samples, keys and order; only shard boundaries differ
    assert json.loads((two / "failures.json").read_text()) == json.loads((local / "failures.json").read_text())
    # rank 1 reports its share (unit 1: 3 inputs), rank 0 the whole job and its report file
    assert (docs[1]["rank"], docs[1]["world"], docs[1]["seen"], docs[1]["failures_file"]) == (1, 2, 3, None)
    assert (docs[0]["seen"], docs[0]["written"], docs[0]["failed"]) == (9, 7, 2)
    assert docs[0]["failures_file"] == str(two / "failures.json")
    assert list(json.loads((two / "shard_count.json").read_text())) == [f"{i:05d}.tar" for i in range(5)]


def test_ranks_write_the_bytes_of_the_ray_engine(photos, two_ranks, tmp_path, cli, ray_local):
    two, _ = two_ranks
    ray_out = tmp_path / "ray"
    cli("shard", "images", photos, ray_out, *ARGS, "--engine", "ray")
    assert tree(ray_out) == tree(two)  # the job record too: a job started on one can finish on the other


def test_a_rank_that_never_comes_is_named_then_the_job_resumes(photos, two_ranks, tmp_path):
    two, _ = two_ranks
    dest = tmp_path / "out"
    cmd = ("shard", "images", photos, dest, *ARGS, "--wait-timeout", "0.2")
    alone = as_rank(0, 2, *cmd, "-q")  # -q: no "waiting for ..." note, only the error
    assert alone.returncode == 1, alone.stderr
    lines = alone.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {dest}: work units of other ranks: still missing"), lines
    assert lines[0].endswith("unit 000001 (rank 1, not started) (is that rank still running? rerun the same command "
                             "to resume)")
    assert sorted(p.name for p in (dest / ".fgdata" / "units").glob("*.json")) == ["000000.json", "000002.json"]

    late = as_rank(1, 2, *cmd, "--json")
    assert late.returncode == 0, late.stderr
    assert json.loads(late.stdout)["rank"] == 1

    again = as_rank(0, 2, *cmd, "--json")  # rank 0 keeps its finished units and merges
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["resumed"] == 6  # its own units 0 and 2; unit 1 was rank 1's work
    assert tree(dest) == tree(two)


@pytest.mark.slow  # torchrun ranks as processes
def test_killed_ranks_resume_to_the_same_bytes(photos, two_ranks, tmp_path):
    """Each rank pauses once its first unit's first shard is in place (the job signals it); torchrun and every
    rank are SIGKILLed, then the launch is rerun: the units that did not finish are written again."""
    two, _ = two_ranks
    dest = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "0",
           "-m", "fgdata.cli.main", "shard", "images", str(photos), str(dest), *ARGS]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **ENV, "FGDATA_TEST_STOP_AFTER": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stderr is not None
        paused = 0
        for line in proc.stderr:
            paused += STOP_MARK in line
            if paused == 2:
                break
        assert paused == 2, "both ranks pause after their first shard"
        ranks = descendants(proc.pid)  # torchrun starts each rank in its own session: kill them by pid
        for pid in [proc.pid, *ranks]:
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    units = dest / ".fgdata" / "units"
    plans = {p.name: Plan.parse(p.read_bytes()) for p in units.glob("*.json")}  # no unit finished: plans only
    assert sorted(plans) == ["000000.json", "000001.json"] and all(plans.values()), plans
    assert sorted(p.name for p in dest.glob("*.tar")) == ["00000.tar", "00002.tar"]  # units 0 and 1: first shards
    alone = as_rank(0, 2, "shard", "images", photos, dest, *ARGS, "--wait-timeout", "0.2", "-q")
    assert alone.returncode == 1 and "unit 000001 (rank 1, started)" in alone.stderr, alone.stderr
    again = torchrun(2, "shard", "images", photos, dest, *ARGS)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("1 work unit(s) an earlier run stopped half-way") == 1  # rank 1's unit 1
    assert tree(dest) == tree(two)


@pytest.mark.parametrize("args, message", [
    (("images", "{src}", "{dst}", "--engine", "ray"), "--engine ray starts its own workers: launch it once"),
    (("prompts", "{src}/rocket.txt", "{dst}"), "shard prompts runs in one process: launch it once"),
])
def test_what_cannot_run_under_torchrun_says_so(photos, tmp_path, monkeypatch, cli, args, message):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = cli("shard", *[a.format(src=photos, dst=tmp_path / "out") for a in args], expect=1)
    assert message in str(result.exception)


def test_a_local_job_is_resumed_by_ranks(photos, two_ranks, tmp_path, monkeypatch, cli):
    """One process and the ranks write the same units: ranks finish (here: find finished) a local job's units."""
    two, _ = two_ranks
    dest = tmp_path / "out"
    cli("shard", "images", photos, dest, *ARGS)
    before = tree(dest)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    doc = json.loads(cli("shard", "images", photos, dest, *ARGS, "--json").stdout)
    assert doc["resumed"] == 6 and (doc["seen"], doc["written"]) == (9, 7)  # its units 0 and 2; unit 1 is rank 1's
    assert tree(dest) == before == tree(two)


def test_video_clips_under_ranks_equal_the_local_samples(keyframed_clip, tmp_path, cli):
    src = tmp_path / "videos"
    src.mkdir()
    for name in ("a", "b", "c"):
        shutil.copyfile(keyframed_clip, src / f"{name}.mp4")
    args = ("--clip-seconds", "1", "--maxcount", "2", "--no-progress", "--json")
    done = torchrun(2, "shard", "videos", src, tmp_path / "ranks", *args, "--unit-size", "1", "--workers", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    local = json.loads(cli("shard", "videos", src, tmp_path / "local", *args).stdout)
    got, want = members(tmp_path / "ranks"), members(tmp_path / "local")
    assert [k for k, _ in got] == [k for k, _ in want] and len(got) == 9  # 3 clips of each video, in order
    assert got == want
    ranks = documents(done.stdout)
    assert ranks[0]["clips"] == local["clips"] and local["clips"]["written"] == 9  # rank 0 reports the whole job
    assert ranks[1]["clips"]["written"] == 3  # rank 1: its own unit


@pytest.mark.s3
@pytest.mark.slow  # torchrun ranks as processes
def test_ranks_write_to_s3_the_bytes_they_write_locally(photos, two_ranks, s3_bucket):
    from fgdata import storage

    two, _ = two_ranks
    url = f"{s3_bucket}/photos"
    done = torchrun(2, "shard", "images", photos, url, *ARGS)
    assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(i.name for i in storage.list_dir(url))
    assert names == sorted(tree(two))  # no unit, marker or plan left behind
    for name in names:
        assert storage.read_bytes(f"{url}/{name}") == (two / name).read_bytes(), name


@pytest.mark.slow  # torchrun ranks as processes
def test_no_resume_under_ranks_redoes_every_unit(photos, two_ranks, tmp_path):
    two, _ = two_ranks
    dest = tmp_path / "out"
    cmd = ("shard", "images", photos, dest, *ARGS)
    for rank in (1, 0):  # ranks started one after the other: rank 0 waits for nothing
        assert as_rank(rank, 2, *cmd).returncode == 0
    assert tree(dest) == tree(two)
    again = torchrun(2, *cmd, "--no-resume", "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    assert [doc["resumed"] for doc in documents(again.stdout).values()] == [0, 0]
    assert "--no-resume: writing every work unit" in again.stderr  # rank 0 says that earlier outputs go
    assert tree(dest) == tree(two)


def test_no_resume_needs_the_launch_store_and_says_so(photos, tmp_path):
    """Files alone cannot tell launches apart: a rank started by hand, without torchrun's store, is refused."""
    alone = as_rank(0, 2, "shard", "images", photos, tmp_path / "out", *ARGS, "--no-resume")
    assert alone.returncode == 1
    lines = alone.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --no-resume with WORLD_SIZE=2 needs torchrun's store at "
                                                   "MASTER_ADDR:MASTER_PORT=?:?"), lines


@pytest.mark.slow  # end to end, several seconds
def test_no_resume_never_merges_a_unit_an_earlier_launch_left(photos, two_ranks, tmp_path):
    """An earlier launch's rank 1 finished unit 1 from other captions, and its rank 0 never came. The rerun with
    --no-resume holds rank 1 where it is about to remove that unit (the job signals the point): rank 0 must
    wait for unit 1 of this launch instead of merging the earlier one, and the result is a fresh run's bytes."""
    two, _ = two_ranks
    old = tmp_path / "old"
    shutil.copytree(photos, old)
    for caption in old.glob("*.txt"):
        caption.write_text("a caption of the earlier run\n")
    dest = tmp_path / "out"
    planted = as_rank(1, 2, "shard", "images", old, dest, *ARGS)  # same options, so the same fingerprint
    assert planted.returncode == 0, planted.stderr
    assert (dest / ".fgdata" / "units" / "000001.json").is_file()

    # Rank 0 runs units 0 and 2, then either waits for unit 1 or (the bug) merges the earlier one and reports.
    run = hold_and_release(launch(2, "shard", "images", photos, dest, *ARGS, "--no-resume", "--json"),
                           hold="no-resume@1", until=lambda line: "work units of other ranks" in line
                           or line.startswith("{"), env=ENV, cwd=REPO)
    assert "at no-resume (rank 1," in run.holds[0]
    assert run.seen.startswith("waiting for ") and "1 missing" in run.seen, run.seen
    assert run.returncode == 0, run.output[-3000:]
    assert tree(dest) == tree(two)
    markers = [json.loads(p.read_text()) for p in (dest / ".fgdata" / "units").glob("*.json")]
    assert len(markers) == 3 and len({m["launch"] for m in markers}) == 1 and markers[0]["launch"]  # this launch's


def test_a_file_gone_while_another_rank_lists_dst_is_left_out(photos, two_ranks, tmp_path):
    """The ranks' first checks of DST interleave: both are held where they have read DST's names and not yet
    looked at the files (the job signals the point), with a killed run's temporary among them. Rank 0 goes on
    alone: it writes the one unit (all 9 inputs), removes the temporary with the other leftovers and finishes. Rank
    1, released, then finds a listed file gone, as when rank 0 renames its job record into place meanwhile; it
    stopped with "DST: directory not found" and must go on instead."""
    two, _ = two_ranks
    dest = tmp_path / "out"
    dest.mkdir()
    leftover = dest / ".00000.tar.fgtmp-0123456789abcdef"
    leftover.write_bytes(b"the first half of a shard")
    cmd = launch(2, "shard", "images", photos, dest, "--maxcount", "2", "--unit-size", "9", "--no-progress", "--json")
    run = hold_all_then_one(cmd, hold="dest-listed", ranks=2, first=0, until=lambda line: line.startswith("{"),
                            env=ENV, cwd=REPO)
    assert len(run.holds) == 2 and run.seen == "{\n", run.output[-3000:]
    assert run.returncode == 0, run.output[-3000:]
    assert not leftover.exists() and "Traceback" not in run.output
    docs = documents("".join(line for line in run.output.splitlines(keepends=True)
                             if line.startswith(("{", "}", " "))))
    assert (docs[0]["seen"], docs[0]["written"], docs[1]["seen"]) == (9, 7, 0)  # rank 1 owns no unit
    assert members(dest) == members(two)
