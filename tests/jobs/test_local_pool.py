"""The local executor on real worker processes: order, a worker that dies, no worker left behind."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from fgdata.errors import FgdataError
from fgdata.jobs.local import ordered_map


def square(x: int) -> int:
    return x * x


def die_on_five(x: int) -> int:
    if x == 5:
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's out-of-memory killer does
    return x


def big(x: int) -> bytes:
    return bytes([x % 256]) * (4 << 20)  # far more than a pipe holds: the worker sends it in many writes


def fail_on_seven(x: int) -> int:
    if x == 7:
        raise ValueError(f"input {x} is bad")
    return x


def failing_start() -> None:
    raise ValueError("no model here")


def test_results_come_in_argument_order_for_any_worker_count():
    expected = [x * x for x in range(50)]
    for workers, chunk in ((1, 1), (2, 1), (2, 7), (3, 4)):
        assert list(ordered_map(square, range(50), workers, chunk)) == expected


def test_workers_see_the_environment_of_the_moment_the_map_starts(monkeypatch):
    """The forkserver copies the environment once, when it starts; a setting made afterwards (credentials a
    library caller sets, a test's S3 fixture) still reaches the workers of every later map, and one removed is gone."""
    monkeypatch.setenv("FGDATA_TEST_BEFORE", "old")
    assert list(ordered_map(os.getenv, ["FGDATA_TEST_BEFORE"] * 4, workers=2)) == ["old"] * 4  # the server runs
    monkeypatch.setenv("FGDATA_TEST_AFTER", "set later")
    monkeypatch.delenv("FGDATA_TEST_BEFORE")
    got = list(ordered_map(os.getenv, ["FGDATA_TEST_AFTER", "FGDATA_TEST_BEFORE"] * 2, workers=2))
    assert got == ["set later", None] * 2


def test_a_worker_that_dies_is_a_one_line_error_not_a_hang():
    with pytest.raises(FgdataError, match="a worker process died") as err:
        list(ordered_map(die_on_five, range(20), 2, 1))
    assert "\n" not in str(err.value)
    assert not multiprocessing.active_children()


def test_stopping_early_leaves_no_worker_running():
    results = ordered_map(square, range(1000), 2, 1)
    assert next(results) == 0
    results.close()  # what an error or a signal in the consumer does
    assert not multiprocessing.active_children()


def test_stopping_while_workers_send_large_results_never_hangs():
    """Workers killed half-way through sending a result: the stop still ends (it once waited forever for the
    rest of the message)."""
    for _ in range(5):
        results = ordered_map(big, range(40), 2, 1)
        assert next(results)[:1] == b"\x00"
        results.close()
        assert not multiprocessing.active_children()


def test_an_error_in_fn_arrives_in_order_with_its_own_type():
    got = []
    with pytest.raises(ValueError, match="input 7 is bad") as err:
        for x in ordered_map(fail_on_seven, range(20), 2, 2):
            got.append(x)
    assert got == list(range(6))  # the chunk (6, 7) fails whole; everything before it arrived
    assert "fail_on_seven" in str(err.value.__cause__)  # the worker's traceback
    assert not multiprocessing.active_children()


def test_an_initializer_that_fails_ends_the_map_with_its_error():
    with pytest.raises(ValueError, match="no model here"):
        list(ordered_map(square, range(20), 2, 1, initializer=failing_start))
    assert not multiprocessing.active_children()


def test_workers_exit_when_the_job_is_killed(tmp_path):
    """SIGKILL of the job (nothing runs its cleanup): its pool workers exit by themselves."""
    import subprocess
    import sys

    from faultkit import alive, descendants

    script = tmp_path / "job.py"
    script.write_text(
        "import sys, time\n"
        "from fgdata.jobs.local import ordered_map\n"
        "for i in ordered_map(abs, range(100), 2, 1):\n"
        "    if i == 3:\n"
        "        print('running', flush=True)\n"
        "        time.sleep(3600)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "running"
    workers = [p for p in descendants(proc.pid) if "forkserver" in Path(f"/proc/{p}/cmdline").read_bytes().decode()]
    proc.kill()
    proc.wait()
    assert workers
    deadline = time.monotonic() + 60  # they exit as soon as the pipe closes; this only bounds a failure
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in workers), "a worker outlived the killed job"


def test_a_killed_job_s_multiprocessing_folder_is_removed_by_the_next_run(tmp_path, short_tmp):
    """SIGKILL of ``shard images --workers 2`` at a point the job signals leaves its ``pymp-*`` folder (the
    forkserver's socket) in a private TMPDIR; the rerun removes it, and its own at its normal end."""
    import signal
    import subprocess

    from faultkit import FGDATA, png_bytes, stop_and_signal

    from fgdata.jobs.local import POOL_LOCK

    src, tmp = tmp_path / "src", short_tmp
    src.mkdir()
    for i in range(12):
        (src / f"img{i:03d}.png").write_bytes(png_bytes(i, size=24))
    foreign = tmp / "pymp-other"  # another program's pool folder: not fgdata's to remove
    foreign.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    cmd = [*FGDATA, "shard", "images", str(src), str(tmp_path / "out"), "--maxcount", "2", "--no-progress",
           "--workers", "2"]
    stopped = stop_and_signal(cmd, after=1, sig=signal.SIGKILL, env=env)
    assert stopped.returncode == -signal.SIGKILL
    left = [p for p in tmp.glob("pymp-*") if p != foreign]
    assert left and all((p / POOL_LOCK).exists() for p in left), sorted(tmp.iterdir())
    again = subprocess.run(cmd, env={**env, "FGDATA_TEST_STOP_AFTER": ""}, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(tmp.glob("pymp-*")) == [foreign]


def test_the_reading_commands_maps_keep_order_and_name_what_they_did_when_a_worker_dies():
    """process_map and thread_map (what verify, report and count-shards are handed) give results in argument
    order; a worker that dies ends process_map with one line saying what it was doing and that nothing was
    written, with no worker left."""
    from fgdata.jobs.executor import process_map, thread_map
    from fgdata.jobs.local import WorkerDied

    assert list(process_map(2, "squaring")(square, range(30))) == [x * x for x in range(30)]
    assert list(thread_map(3)(square, range(30))) == [x * x for x in range(30)]
    with pytest.raises(WorkerDied, match="^a worker process died while squaring .*nothing was written$") as err:
        list(process_map(2, "squaring")(die_on_five, range(20)))
    assert "\n" not in str(err.value)
    assert not multiprocessing.active_children()
