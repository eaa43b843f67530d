"""A test hook: stop a job at a point the job itself chooses, so kill tests need no timing.

``FGDATA_TEST_STOP_AFTER=N``: once the job has finished its N-th output (a shard under its final
name, an encoded output shard, a block of zip members), it prints :data:`MARK` on stderr and
waits there until it is signalled. A test reads stderr until the mark, then sends SIGKILL,
SIGTERM or SIGINT, reruns the command and compares the bytes. Unset (always, outside tests),
this costs one dictionary lookup per output.

``FGDATA_TEST_HOLD=POINT@RANK,...``: when the job reaches a named point (see :func:`hold`) on that
rank (``POINT`` alone: on every rank), it prints :data:`HELD` with the point, rank and pid on stderr and
waits for SIGUSR1, then goes on. A test holds one rank there to order two ranks' steps without timing, or holds
a pool worker at :data:`WORKER_RESULT` (its result computed, not yet sent; rank 0 in a worker) to SIGKILL it
there, as the system's out-of-memory killer would.

``FGDATA_TEST_LOADS=FILE``: each model load appends its process id and what it loaded to ``FILE`` (see
:func:`model_loaded`), so a test can count the loads of every process of a job, Ray workers included.
"""

from __future__ import annotations

import os
import signal
import sys
import time

STOP_ENV = "FGDATA_TEST_STOP_AFTER"
MARK = "fgdata-test-hook: paused"
HOLD_ENV = "FGDATA_TEST_HOLD"
HELD = "fgdata-test-hook: held"
LOADS_ENV = "FGDATA_TEST_LOADS"
WORKER_RESULT = "worker-result"


def _say(line: str) -> None:
    """One line on stderr in one write: ranks share torchrun's stderr, and ``print`` writes the line and its end
    apart, so two ranks' lines could run together and a test reading line by line would miss one."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def output_done(done: int) -> None:
    """Called by the job after each finished output, with the number finished so far in this run."""
    limit = os.environ.get(STOP_ENV)
    if not limit or done != int(limit):
        return
    _say(f"{MARK} after {done} outputs")
    while True:  # until the test's signal arrives (a handler raises, or the process dies)
        time.sleep(3600)


def hold(point: str, rank: int) -> None:
    """Called by the job at ``point``; held there until SIGUSR1 when :data:`HOLD_ENV` names it for ``rank``."""
    spec = os.environ.get(HOLD_ENV)
    if not spec or not ({point, f"{point}@{rank}"} & {s.strip() for s in spec.split(",")}):
        return
    release = {signal.SIGUSR1}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, release)  # blocked first, so a quick signal is not lost
    try:
        _say(f"{HELD} at {point} (rank {rank}, pid {os.getpid()})")
        signal.sigwait(release)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def model_loaded(what: str) -> None:
    """Called after each model load; appends ``PID<TAB>WHAT`` to the file :data:`LOADS_ENV` names (one write in
    append mode, so the lines of several processes never interleave)."""
    path = os.environ.get(LOADS_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()}\t{what}\n".encode())
    finally:
        os.close(fd)
