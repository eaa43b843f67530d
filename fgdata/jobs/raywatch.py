"""The watchdog of a local Ray cluster a job started: its processes end with the job, even one killed with SIGKILL.

Ray ties its GCS and raylet to the driver, but the agents the raylet starts (dashboard and runtime-env agents)
outlive a driver killed with SIGKILL. The driver starts this watchdog in its own session with a pipe on its
stdin; every second the watchdog notes the driver's descendants (pid and start time). A driver that ends
normally has shut its cluster down and says ``done`` before closing the pipe; a pipe that closes without it
(the driver was killed) makes the watchdog kill the processes it noted that still run, by pid and only while
the start time still matches (a reused pid is left alone). Then it exits.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

from fgdata.children import process_start

SCAN_S = 1.0
DONE = b"done"


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def watch(driver: int) -> None:
    """Note ``driver``'s descendants until stdin closes, then kill those still running."""
    seen: dict[int, int] = {}
    me = os.getpid()
    while True:
        ready, _, _ = select.select([0], [], [], SCAN_S)
        said = os.read(0, 4096) if ready else b"-"
        if DONE in said:
            return
        if not said:
            break
        for pid in _descendants(driver):
            start = process_start(pid)
            if pid != me and start is not None:
                seen.setdefault(pid, start)
    for pid, start in seen.items():
        if process_start(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start() -> subprocess.Popen | None:
    """Start the watchdog for this process (Linux only: it reads /proc); :func:`stop` it after a clean shutdown."""
    if not os.path.isdir("/proc/self"):
        return None
    return subprocess.Popen([sys.executable, "-m", "fgdata.jobs.raywatch", str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)


def stop(watchdog: subprocess.Popen) -> None:
    """The cluster was shut down cleanly: the watchdog exits without killing anything."""
    assert watchdog.stdin is not None
    try:
        watchdog.stdin.write(DONE)
        watchdog.stdin.close()
    except OSError:
        pass
    watchdog.wait()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]))
