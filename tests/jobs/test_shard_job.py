"""The job core under ``fgdata shard``: lock, temporaries, ownership of DST, signals, resume, the failure report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from faultkit import FGDATA, alive, leftovers, png_bytes, run_cli, stop_and_signal, tree
from inprocess import fgdata  # reruns and refusals: their files, output and exit status are what is checked

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's inputs (read only: every test writes its own DST)."""
    src = tmp_path_factory.mktemp("photos") / "src"
    src.mkdir()
    for i in range(24):
        (src / f"img{i:03d}.png").write_bytes(png_bytes(i, size=24))
        (src / f"img{i:03d}.txt").write_text(f"caption {i}")
    (src / "broken.png").write_bytes(b"not a png")
    return src


def shard_cmd(src: Path, dest: Path | str, *extra: str) -> list[str]:
    return [*FGDATA, "shard", "images", str(src), str(dest), "--maxcount", "4", "--no-progress", *extra]


def gone(pids: list[int]) -> bool:
    """Whether every pid has exited; the forkserver notices its parent's exit on its own, so allow it a moment."""
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def no_state(rel: str) -> bool:
    return rel.startswith(".fgdata/")


@pytest.fixture(scope="module")
def clean(photos: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An uninterrupted run's files, once for the module."""
    dest = tmp_path_factory.mktemp("clean") / "clean"
    done = fgdata(*shard_cmd(photos, dest)[3:])
    assert done.returncode == 0, done.stderr
    return tree(dest, no_state)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGKILL, -9)])
def test_signal_at_a_signalled_point_then_rerun_is_identical(photos, tmp_path, clean, sig, code):
    dest = tmp_path / "out"
    stopped = stop_and_signal(shard_cmd(photos, dest, "--workers", "2"), after=2, sig=sig)
    assert stopped.returncode == code, stopped.stderr
    assert stopped.workers, "the pool had workers while the job was paused"
    if sig != signal.SIGKILL:
        last = stopped.stderr.strip().splitlines()[-1]
        # units of 4 inputs; broken.png sorts first. The job paused once unit 1's shard was in place, before the
        # unit's marker: unit 0 (1 failed + 3 written) is done, unit 1 is written again on the rerun
        assert last == "interrupted: 4 inputs done; rerun the same command to resume", stopped.stderr
        assert "Traceback" not in stopped.stderr
        assert gone(stopped.workers), "pool workers outlived the job"
    # only complete shards under final names: one per unit
    assert sorted(p.name for p in dest.glob("*.tar")) == ["00000.tar", "00001.tar"]
    again = fgdata(*shard_cmd(photos, dest)[3:])
    assert again.returncode == 0, again.stderr
    assert tree(dest, no_state) == clean
    assert leftovers(dest) == []


def test_second_job_on_the_same_dest_is_refused_and_a_dead_lock_is_taken_over(photos, tmp_path, clean):
    dest = tmp_path / "out"
    env = {**os.environ, "FGDATA_TEST_STOP_AFTER": "1"}
    first = subprocess.Popen(shard_cmd(photos, dest), env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             text=True, start_new_session=True)
    try:
        for line in first.stderr:
            if "fgdata-test-hook: paused" in line:
                break
        second = run_cli(*shard_cmd(photos, dest)[3:])
        assert second.returncode == 1
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "another fgdata job is writing here" in lines[0] and f"pid {first.pid}" in lines[0]
        assert first.poll() is None, "the first job is untouched"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    owner = json.loads((dest / ".fgdata" / "lock").read_text())
    assert owner["pid"] == first.pid  # a stale lock: its process is dead
    again = fgdata(*shard_cmd(photos, dest)[3:])
    assert again.returncode == 0, again.stderr
    assert tree(dest, no_state) == clean


def test_planted_symlinks_at_temp_names_are_never_followed(photos, tmp_path, clean):
    dest = tmp_path / "out"
    dest.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name in [".00000.tar.tmp-1", f".00000.tar.tmp-{os.getpid()}", ".00000.tar.fgtmp-0000000000000000",
                 ".shard_count.json.tmp-1-ab"]:
        (dest / name).symlink_to(victim)
    done = fgdata(*shard_cmd(photos, dest)[3:])
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious"
    assert not [p for p in dest.rglob("*") if p.is_symlink()]
    assert tree(dest, no_state) == clean


def test_a_record_half_written_by_a_killed_job_is_removed_by_the_rerun(photos, tmp_path, clean):
    """A job killed while it wrote a unit's marker leaves that marker's temporary file in ``.fgdata/units``; the
    rerun, holding the lock, removes it with the other temporaries (a worker killed mid-write did this once)."""
    dest = tmp_path / "out"
    done = fgdata(*shard_cmd(photos, dest)[3:])
    assert done.returncode == 0, done.stderr
    half = [dest / ".fgdata" / "units" / ".000001.json.tmp-18575-4facd10b", dest / ".fgdata" / ".x.json.tmp-7-0a1b2c3d"]
    for path in half:
        path.write_bytes(b'{"unit": 1, "sha')
    again = fgdata(*shard_cmd(photos, dest)[3:])
    assert again.returncode == 0, again.stderr
    assert leftovers(dest) == []
    assert tree(dest, no_state) == clean


def test_another_ranks_file_being_written_is_not_a_strangers(tmp_path):
    """Ranks share DST: while one rank checks it for files fgdata did not write, another may be mid-way through an
    atomic write of any kind of file (a chunk's ``.npz``); that temporary name is fgdata's, a look-alike is not."""
    from fgdata.jobs.dest import foreign_files

    dest = tmp_path / "work"
    dest.mkdir()
    ours = [f".chunk-00001.npz.tmp-{os.getpid()}-0a1b2c3d", ".anything.bin.tmp-7-ffffffff"]
    theirs = [".notes.txt.tmp-7", ".chunk.npz.tmp-7-xyz", "chunk.npz.tmp-7-0a1b2c3d"]
    for name in ours + theirs:
        (dest / name).write_bytes(b"x")
    assert sorted(foreign_files(str(dest))) == sorted(theirs)


def test_foreign_files_are_refused_then_removed_with_overwrite(photos, tmp_path, clean):
    import webdataset as wds

    dest = tmp_path / "out"
    dest.mkdir()
    with wds.TarWriter(str(dest / "00007.tar")) as sink:
        sink.write({"__key__": "theirs", "txt": "someone else's"})
    (dest / "README.md").write_text("mine")
    refused = fgdata(*shard_cmd(photos, dest)[3:])
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "fgdata did not write" in lines[0] and "00007.tar" in lines[0] and "README.md" in lines[0]
    assert (dest / "00007.tar").exists() and (dest / "README.md").exists()
    done = fgdata(*shard_cmd(photos, dest, "--overwrite")[3:])
    assert done.returncode == 0, done.stderr
    assert "--overwrite: removing 2 file(s)" in done.stderr and "00007.tar" in done.stderr
    assert tree(dest, no_state) == clean
    counts = json.loads((dest / "shard_count.json").read_text())
    assert sorted(counts) == sorted(p.name for p in dest.glob("*.tar"))  # the count file lists every shard there


def test_no_resume_says_what_it_deletes(photos, tmp_path, clean):
    dest = tmp_path / "out"
    assert fgdata(*shard_cmd(photos, dest)[3:]).returncode == 0
    again = fgdata(*shard_cmd(photos, dest, "--no-resume")[3:])
    assert again.returncode == 0, again.stderr
    assert "--no-resume: removing" in again.stderr and "00000.tar" in again.stderr
    assert tree(dest, no_state) == clean


def test_other_byte_changing_options_are_refused_by_name(photos, tmp_path):
    dest = tmp_path / "out"
    assert fgdata(*shard_cmd(photos, dest)[3:]).returncode == 0
    refused = fgdata(*shard_cmd(photos, dest, "--max-side", "8")[3:])
    assert refused.returncode == 1
    assert "--max-side was not set, now 8" in refused.stderr and "--no-resume" in refused.stderr
    # options that do not change bytes do not matter
    assert fgdata(*shard_cmd(photos, dest, "--workers", "2")[3:]).returncode == 0


def test_failure_report_schema(photos, tmp_path):
    dest = tmp_path / "out"
    assert fgdata(*shard_cmd(photos, dest)[3:]).returncode == 0
    report = json.loads((dest / "failures.json").read_text())
    assert report["command"] == "shard images"
    assert (report["seen"], report["written"], report["failed"]) == (25, 24, 1)
    assert report["failures"] == [{"input": "broken.png", "reason": report["failures"][0]["reason"], "index": 0}]
    assert report["failures"][0]["reason"].startswith("image-decode:")


@pytest.mark.s3
@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_s3_kill_and_rerun_leaves_no_staging(photos, tmp_path, s3_bucket, monkeypatch, short_tmp):
    from fgdata import storage

    cache, temp = tmp_path / "cache", short_tmp  # the job's own system temp folder: what it leaves there is its own
    env = {"FGDATA_CACHE": str(cache), "TMPDIR": str(temp)}
    url = f"{s3_bucket}/shards"
    reference = tmp_path / "local"
    assert fgdata(*shard_cmd(photos, reference)[3:]).returncode == 0
    stopped = stop_and_signal(shard_cmd(photos, url), after=2, sig=signal.SIGKILL, env=env)
    assert stopped.returncode == -9
    [stage] = [p for p in (cache / "staging").iterdir()]  # this host's staging folder for that URL
    (stage / ".00002.tar.fgtmp-0123456789abcdef").write_bytes(b"half a shard")  # as if killed mid-shard
    again = run_cli(*shard_cmd(photos, url)[3:], env=env)
    assert again.returncode == 0, again.stderr
    got = {i.name: storage.read_bytes(i.path) for i in storage.list_dir(url)}
    assert got == {p.name: p.read_bytes() for p in reference.iterdir() if p.is_file()}
    assert not [p for p in (cache / "staging").rglob("*") if p.is_file() and p.name != "lock"]
    assert not [p for p in temp.rglob("*") if p.is_file()]  # staging lives under FGDATA_CACHE, never in TMPDIR
