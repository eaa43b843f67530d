"""The local executor: a process pool that returns results in argument order, with bounded memory.

Workers start with ``forkserver`` (``spawn`` where it is missing), never ``fork``: a fork
while any thread runs (Ray's, a decoder's, the progress bar's) can copy a held lock and hang
the child. The forkserver imports ``preload`` once, so each worker starts in milliseconds; workers
are started without re-running the caller's main script (for the CLI that would import Typer and
rich again in every worker, a third of a second each), since they only run importable functions.
Results are consumed oldest first with at most ``WINDOW_PER_WORKER`` chunks per worker in
flight, so the output does not depend on the number of workers and a slow writer never lets
results pile up. On any exit other than the normal end (an error, :class:`Interrupted`) the
pool is terminated and joined: no worker outlives the job.
"""

from __future__ import annotations

import multiprocessing
import sys
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from contextlib import contextmanager
from itertools import islice
from multiprocessing.pool import AsyncResult
from typing import Any, TypeVar

from fgdata.jobs.signals import ignore_in_worker

T = TypeVar("T")
R = TypeVar("R")
WINDOW_PER_WORKER = 4


def _apply_chunk(fn: Callable[[T], R], chunk: list[T]) -> list[R]:
    return [fn(a) for a in chunk]


def _init_worker(initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    ignore_in_worker()
    if initializer is not None:
        initializer(*initargs)


def pool_context(preload: Sequence[str] = ()) -> Any:
    """A forkserver (or spawn) multiprocessing context, with ``preload`` imported once in the server."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        if preload:
            ctx.set_forkserver_preload(list(preload))
        return ctx
    return multiprocessing.get_context("spawn")


@contextmanager
def _main_script_hidden() -> Iterator[None]:
    """While workers start: a bare ``__main__``, so multiprocessing does not re-import the caller's script in them."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def ordered_map(
    fn: Callable[[T], R],
    args: Iterable[T],
    workers: int,
    chunksize: int = 1,
    initializer: Callable[..., None] | None = None,
    initargs: tuple[Any, ...] = (),
    preload: Sequence[str] = (),
) -> Iterator[R]:
    """``map(fn, args)`` on ``workers`` processes (in this process when ``workers <= 1``), in order.

    ``fn`` and ``initializer`` must be importable module-level functions (or partials of them);
    ``initializer(*initargs)`` runs once per worker.
    """
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from map(fn, args)
        return
    with _main_script_hidden():
        pool = pool_context(preload).Pool(workers, initializer=_init_worker, initargs=(initializer, initargs))
    pending: deque[AsyncResult[list[R]]] = deque()
    it = iter(args)
    task = partial(_apply_chunk, fn)

    def submit() -> bool:
        chunk = list(islice(it, chunksize))
        if chunk:
            pending.append(pool.apply_async(task, (chunk,)))
        return bool(chunk)

    finished = False
    try:
        while len(pending) < workers * WINDOW_PER_WORKER and submit():
            pass
        while pending:
            results = pending.popleft().get()
            submit()
            yield from results
        finished = True
    finally:
        if finished:
            pool.close()
        else:
            pool.terminate()
        pool.join()
