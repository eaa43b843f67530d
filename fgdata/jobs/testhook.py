"""A test hook: stop a job at a point the job itself chooses, so kill tests need no timing.

``FGDATA_TEST_STOP_AFTER=N``: once the job has finished its N-th output (a shard under its final
name, an encoded output shard, a block of zip members), it prints :data:`MARK` on stderr and
waits there until it is signalled. A test reads stderr until the mark, then sends SIGKILL,
SIGTERM or SIGINT, reruns the command and compares the bytes. Unset (always, outside tests),
this costs one dictionary lookup per output.
"""

from __future__ import annotations

import os
import sys
import time

STOP_ENV = "FGDATA_TEST_STOP_AFTER"
MARK = "fgdata-test-hook: paused"


def output_done(done: int) -> None:
    """Called by the job after each finished output, with the number finished so far in this run."""
    limit = os.environ.get(STOP_ENV)
    if not limit or done != int(limit):
        return
    print(f"{MARK} after {done} outputs", file=sys.stderr, flush=True)
    while True:  # until the test's signal arrives (a handler raises, or the process dies)
        time.sleep(3600)
