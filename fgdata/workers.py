"""How many worker processes a job uses when the user does not say (one per CPU this process may run on), and
the shape of a map that a layer above hands down (:class:`OrderedMap`).

Kept at the top, apart from every command, so that each job (prepare, fid-refs, ...) takes the same default
without importing another command's code, and so that layers that may not import the job core (``shards``,
``report``) can still take its pools as an argument.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def default_workers() -> int:
    """The CPUs this process may run on (its affinity where the OS has one, else all), at least 1."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


class OrderedMap(Protocol):
    """``map(fn, items)``, results in ``items`` order, on whatever runs them: the caller's layer chooses (the job
    core's pools, :func:`fgdata.jobs.executor.process_map` and :func:`~fgdata.jobs.executor.thread_map`), the
    layer that takes one only says what to run."""

    def __call__(self, fn: Callable[[T], R], items: Iterable[T], /) -> Iterator[R]: ...


def serial_map(fn: Callable[[T], R], items: Iterable[T], /) -> Iterator[R]:
    """:class:`OrderedMap` in this process, one item at a time: the default where no pool is handed down."""
    return map(fn, items)
