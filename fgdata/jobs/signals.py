"""Every stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT): stop cleanly, keep only complete outputs, say how to continue.

Inside :func:`stop_on_signals`, each of them raises :class:`Interrupted` in the main thread (SIGHUP
is what a closed terminal or a lost ssh session sends; SIGQUIT is Ctrl-\\).
It is a ``BaseException``, so per-item ``except Exception`` handlers never swallow it; the
executors terminate their workers on the way out (no orphans), writers remove their
temporary files, and the CLI prints one line and exits 128 + the signal number (130 for
SIGINT, 143 for SIGTERM, 129 for SIGHUP, 131 for SIGQUIT). A signal that arrives inside
:func:`critical` (a shard being renamed into place and counted) waits until that step is done,
so a stop never leaves a half-finished step behind.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

RESUME_HINT = "rerun the same command to resume"
#: The signals that stop a job; a terminal sends SIGINT, SIGHUP and SIGQUIT to its whole process group.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Interrupted(BaseException):
    """The job was stopped by a signal; ``done`` inputs were fully accounted for before it stopped."""

    def __init__(self, signum: int, done: int = 0):
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
        self.done = done

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def line(self) -> str:
        return f"interrupted: {self.done} inputs done; {RESUME_HINT}"


_state = {"depth": 0, "pending": 0, "active": 0}


def _handler(signum: int, frame: FrameType | None) -> None:
    if _state["depth"]:
        _state["pending"] = signum
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn the stop signals into :class:`Interrupted` while the job runs (main thread only; nests)."""
    if threading.current_thread() is not threading.main_thread() or _state["active"]:
        yield
        return
    old = {s: signal.signal(s, _handler) for s in STOP_SIGNALS}
    _state["active"] = 1
    try:
        yield
    finally:
        _state["active"] = 0
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """Defer a stop signal until the enclosed step is complete."""
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        pending = _state["pending"]
        if not _state["depth"] and pending:
            _state["pending"] = 0
            raise Interrupted(pending)


def stop_if_signalled() -> None:
    """Inside :func:`critical`: raise the stop a signal asked for meanwhile, if any, now.

    For a wait in foreign code that swallows exceptions raised by signal handlers (Ray's ``wait`` checks
    signals from C++ and drops anything but KeyboardInterrupt): wait in short steps inside ``critical``
    and call this between them.
    """
    pending = _state["pending"]
    if pending:
        _state["pending"] = 0
        raise Interrupted(pending)


def rearm() -> None:
    """Take the stop signals back after a library installed its own handlers (``ray.init`` exits on SIGTERM)."""
    if _state["active"] and threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, _handler)


def ignore_in_worker() -> None:
    """For pool workers: what a terminal sends reaches the whole process group; only the parent decides what stops."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN if s != signal.SIGTERM else signal.SIG_DFL)
