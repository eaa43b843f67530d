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


def test_results_come_in_argument_order_for_any_worker_count():
    expected = [x * x for x in range(50)]
    for workers, chunk in ((1, 1), (2, 1), (2, 7), (3, 4)):
        assert list(ordered_map(square, range(50), workers, chunk)) == expected


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
