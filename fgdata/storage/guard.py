"""Destinations this process writes under a lease: which guard, if any, covers a URL.

A job that owns a remote destination through a lease (:mod:`fgdata.jobs.lease`) registers a
:class:`Guard` for it; the backend of that scheme then stages every write to a final name under the
job's own prefix and moves it into place only after :meth:`Guard.confirm`, and checks the lease before
it changes anything else there. Storage code knows only this interface, never the lease itself.
"""

from __future__ import annotations

import threading
from typing import Protocol


class Guard(Protocol):
    """What the storage layer asks of a job's lease on ``dest``."""

    dest: str

    def exempt(self, path: str) -> bool:
        """True for the job's own lease objects and staging prefix: written without a check."""

    def stages(self, path: str) -> bool:
        """True for a final name (outside the job state): written to :meth:`staging_url` first."""

    def staging_url(self, path: str) -> str:
        """Where ``path`` is uploaded before it is moved to its final name."""

    def confirm(self, path: str) -> None:
        """Raise a one-line error naming ``path`` unless this job still holds the lease."""


_guards: list[Guard] = []
_lock = threading.Lock()


def register(guard: Guard) -> None:
    with _lock:
        _guards.append(guard)


def unregister(guard: Guard) -> None:
    with _lock:
        if guard in _guards:
            _guards.remove(guard)


def covering(path: str) -> Guard | None:
    """The guard whose destination holds ``path`` (the innermost, when destinations nest)."""
    bare = path.rstrip("/")
    with _lock:
        found = [g for g in _guards if bare == g.dest or bare.startswith(g.dest + "/")]
    return max(found, key=lambda g: len(g.dest), default=None)
