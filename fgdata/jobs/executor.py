"""Where work units run: one call, :func:`run_units`, for every command; the library chooses the executor.

A command turns its pending units into calls, one typed value per unit (the unit itself or a frozen dataclass of
the command's), and names a module-level function that runs one unit; :func:`run_units` runs ``fn(shared, call)``
for each on the executor the command chose (``shared``: what every unit needs, one typed value, or None):

- :class:`Pool`: this machine, ``workers`` processes (:func:`fgdata.jobs.local.ordered_map`; one worker: in
  this process), results in call order;
- :class:`Ray`: a Ray cluster (:mod:`fgdata.jobs.ray_executor`), results as units finish.

Commands that only read (``verify``, ``report``, ``count-shards``) take their pool as an
:class:`~fgdata.workers.OrderedMap`: :func:`process_map` (this pool, for work that decodes) or :func:`thread_map`
(threads, for work that mostly waits on storage), so a worker that dies ends them as it ends a writing job.

torchrun ranks are not an executor of their own: each rank keeps the units it owns
(:func:`fgdata.jobs.ranks.owner`) and runs them on its own pool, and rank 0 waits for the others' markers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from fgdata.workers import OrderedMap

T = TypeVar("T")
R = TypeVar("R")
C = TypeVar("C")
S = TypeVar("S")


@dataclass(frozen=True)
class Pool:
    """``workers`` local processes (1: this process); the forkserver imports ``preload`` once; each worker runs
    ``initializer(*initargs)`` once before its first unit."""

    workers: int = 1
    preload: tuple[str, ...] = ()
    initializer: Callable[..., None] | None = None
    initargs: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Ray:
    """A Ray cluster (``address`` None: ``RAY_ADDRESS``, else a private local one), ``num_gpus`` per unit, at most
    ``in_flight`` units at a time (None: twice the cluster's CPUs); ``max_calls``: units per worker process
    before it exits (0: no limit, so a loaded model serves every unit of the process)."""

    address: str | None = None
    num_gpus: float = 0.0
    in_flight: int | None = None
    max_calls: int | None = None


Executor = Pool | Ray


def _apply(call: C, fn: Callable[[S, C], R], shared: S) -> R:
    return fn(shared, call)


def run_units(fn: Callable[[S, C], R], calls: Iterable[C], executor: Executor, shared: S) -> Iterator[R]:
    """``fn(shared, call)`` for every call, on ``executor``: in call order on a :class:`Pool`, as units
    finish on :class:`Ray`. ``calls`` is read only as fast as the executor takes units, so a stream of any
    length holds only the units in flight. A unit that fails ends the run with its error."""
    if isinstance(executor, Ray):
        from fgdata.jobs.ray_executor import stream_units

        for _, result in stream_units(fn, calls, shared, address=executor.address, num_gpus=executor.num_gpus,
                                      in_flight=executor.in_flight, max_calls=executor.max_calls):
            yield result
        return
    from fgdata.jobs.local import ordered_map

    yield from ordered_map(partial(_apply, fn=fn, shared=shared), calls, executor.workers, 1,
                           initializer=executor.initializer, initargs=executor.initargs, preload=executor.preload)


def process_map(workers: int, doing: str, preload: tuple[str, ...] = ()) -> OrderedMap:
    """The local process pool (:func:`fgdata.jobs.local.ordered_map`) as an :class:`OrderedMap` for a command that
    writes nothing until every result is in: a worker that dies ends the map with one line saying it died while
    ``doing`` (e.g. "checking the shards") and that nothing was written, rather than the writing jobs' resume hint."""
    from fgdata.jobs.local import WorkerDied, ordered_map

    def run(fn: Callable[[T], R], items: Iterable[T], /) -> Iterator[R]:
        try:
            yield from ordered_map(fn, items, workers, preload=preload)
        except WorkerDied:
            raise WorkerDied(f"a worker process died while {doing} (killed by the system, out of memory, or a crash "
                             "in a decoder); nothing was written") from None

    return run


def thread_map(threads: int) -> OrderedMap:
    """:func:`fgdata.jobs.local.threaded_map` as an :class:`OrderedMap`, ``threads`` calls at a time and at most
    ``WINDOW_PER_WORKER`` results per thread waiting: for calls that mostly wait on storage (counting, reading
    headers)."""
    from fgdata.jobs.local import WINDOW_PER_WORKER, threaded_map

    def run(fn: Callable[[T], R], items: Iterable[T], /) -> Iterator[R]:
        return threaded_map(fn, items, threads, threads * WINDOW_PER_WORKER)

    return run
