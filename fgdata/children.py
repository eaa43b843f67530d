"""Child processes that die with the process that started them, however it dies (SIGKILL included).

A killed job must leave nothing running: an s5cmd upload that outlives its job lands after the next
job has finished and overwrites its output. Nothing in a process killed with SIGKILL runs, so the
kernel has to do it: on Linux each child asks for SIGKILL when its parent dies
(``prctl(PR_SET_PDEATHSIG)``), between ``fork`` and ``exec``. Chosen over a watchdog process
(``start_new_session`` plus a process that kills the session when the job's pipe closes) because it
covers every level with nothing else alive: the job's own children, and those of its pool workers,
which themselves exit with the job (:mod:`fgdata.jobs.local`).

Caveats, and how fgdata meets them:

- The signal follows the *thread* that started the child, not the process: fgdata starts each child
  from the thread that waits for it (a call), or from a thread that lives as long as the reader
  using the child (a stream).
- ``preexec_fn`` runs in the forked child of a process that may have threads: the function does
  one foreign call, resolved in the parent beforehand, and one ``getppid`` (no import, no lock).
- A parent that died between ``fork`` and the ``prctl`` would go unnoticed: the child compares its
  parent with the pid recorded before the fork and exits at once when they differ.

Elsewhere than Linux there is no such call: children stop when the job stops them.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1


@functools.lru_cache(maxsize=1)
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def die_with_parent() -> dict[str, Any]:
    """Keyword arguments for ``subprocess.Popen``/``run``: the child is killed when this process dies."""
    prctl = _prctl()
    if prctl is None:
        return {}
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return {"preexec_fn": arm}


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot; Linux ``/proc``), which a reused pid does not share;
    None for a process that is gone, a zombie, or where this cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None
