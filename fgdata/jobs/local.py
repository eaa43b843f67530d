"""The local executor: a process pool that returns results in argument order, with bounded memory.

Workers start with ``forkserver`` (``spawn`` where it is missing), never ``fork``: a fork
while any thread runs (Ray's, a decoder's, the progress bar's) can copy a held lock and hang
the child. The forkserver imports ``preload`` once, so each worker starts in milliseconds; workers
are started without re-running the caller's main script (for the CLI that would import Typer and
rich again in every worker, a third of a second each), since they only run importable functions.
Results are consumed oldest first with at most ``WINDOW_PER_WORKER`` chunks per worker in
flight, so the output does not depend on the number of workers and a slow writer never lets
results pile up. On any exit other than the normal end (an error, :class:`Interrupted`) the
workers are killed and joined: no worker outlives the job. A worker that dies is an error, not a hang.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from contextlib import contextmanager
from itertools import islice
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from fgdata.errors import FgdataError
from fgdata.jobs.signals import RESUME_HINT, ignore_in_worker

T = TypeVar("T")
R = TypeVar("R")
WINDOW_PER_WORKER = 4


def _apply_chunk(fn: Callable[[T], R], chunk: list[T]) -> list[R]:
    return [fn(a) for a in chunk]


def _exit_with_parent(parent_alive: Connection) -> None:
    """Block until the job's end of the pipe closes (the job ended or was killed), then exit at once."""
    try:
        parent_alive.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(1)


def _init_worker(parent_alive: Connection, initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    ignore_in_worker()
    # A worker must not outlive a job killed with SIGKILL: nothing else would ever tell it to stop.
    threading.Thread(target=_exit_with_parent, args=(parent_alive,), daemon=True).start()
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


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Kill the workers now (an error or a signal: their chunks are abandoned) and wait for them."""
    terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None:
        terminate()
    else:
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.kill()
    pool.shutdown(wait=True, cancel_futures=True)


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

    ``fn`` and ``initializer`` must be module-level functions of an importable module, not of the
    caller's ``__main__`` (workers never run it), or partials of them;
    ``initializer(*initargs)`` runs once per worker. A worker that dies (killed by the system,
    out of memory, a crash in a decoder library) ends the map with a one-line :class:`FgdataError`
    instead of a wait for a result that will never come.
    """
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from map(fn, args)
        return
    pending: deque[Future[list[R]]] = deque()
    it = iter(args)
    task = partial(_apply_chunk, fn)

    def submit() -> bool:
        chunk = list(islice(it, chunksize))
        if chunk:
            pending.append(pool.submit(task, chunk))
        return bool(chunk)

    finished = False
    ctx = pool_context(preload)
    parent_alive, alive_end = ctx.Pipe(duplex=False)  # workers get a copy of the receiving end; the job holds both
    with _main_script_hidden():  # workers start on the first submits, up to ``workers`` of them
        pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                   initargs=(parent_alive, initializer, initargs))
        try:
            while len(pending) < workers * WINDOW_PER_WORKER and submit():
                pass
        except BaseException:
            _stop_workers(pool)
            alive_end.close()
            parent_alive.close()
            raise
    try:
        while pending:
            try:
                results = pending.popleft().result()
            except BrokenProcessPool:
                raise FgdataError(f"a worker process died (killed by the system, out of memory, or a crash in a "
                                  f"decoder); the outputs completed before it are kept; {RESUME_HINT}") from None
            submit()
            yield from results
        finished = True
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:
            _stop_workers(pool)
        alive_end.close()
        parent_alive.close()


def threaded_map(fn: Callable[[T], R], args: Iterable[T], threads: int, ahead: int) -> Iterator[R]:
    """``map(fn, args)`` on ``threads`` threads of this process, in order, for calls that mostly wait (fetches).

    There is no batch to finish: a thread that ends a call takes the next argument at once, up to ``ahead``
    calls past the oldest result not yet consumed, so one slow call holds only its own thread while the others
    go on (its later results wait, at most ``ahead`` of them). On any exit other than the normal end the calls
    not started are dropped and the threads are not waited for."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix="fgdata-fetch")
    pending: deque[Future[R]] = deque()
    it = iter(args)
    try:
        pending.extend(pool.submit(fn, a) for a in islice(it, max(ahead, threads)))
        while pending:
            result = pending.popleft().result()
            pending.extend(pool.submit(fn, a) for a in islice(it, 1))
            yield result
    finally:
        pool.shutdown(wait=False, cancel_futures=True)

