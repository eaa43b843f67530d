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

The pool is our own rather than ``concurrent.futures.ProcessPoolExecutor``: that one reads results in a
thread from one pipe all workers share, and a worker killed half-way through sending a result leaves that
thread blocked forever on the rest of the message (Python 3.11: a stopped job hung at exit). Here each worker
sends its results on its own pipe, read by the job itself: a worker that dies mid-message closes its pipe,
so the read ends with an error instead of waiting.

multiprocessing keeps the forkserver's socket in a ``pymp-*`` folder of the temporary directory and removes
it at a normal exit only; a job killed with SIGKILL would leave one per run. The process that starts a pool
therefore holds a lock file in its folder while it lives (:func:`_own_temp_folder`), and each first pool of a
process removes the folders whose lock no live process holds: those of killed jobs. Folders without that lock
file (other programs' pools) are never touched.
"""

from __future__ import annotations

import copy
import fcntl
import glob
import multiprocessing
import multiprocessing.util
import os
import pickle
import shutil
import stat
import sys
import tempfile
import threading
import traceback
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from itertools import islice
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.queues import Queue
from typing import Any, Generic, TypeVar

from fgdata.errors import FgdataError
from fgdata.jobs import outputs
from fgdata.jobs.signals import RESUME_HINT, ignore_in_worker

T = TypeVar("T")
R = TypeVar("R")
WINDOW_PER_WORKER = 4
#: The lock file in a pool's multiprocessing folder, held (``flock``) by the process the folder belongs to.
POOL_LOCK = ".fgdata-pool.lock"
_held_lock: int | None = None  # this process's lock on its own folder, kept open until it exits
_DIED = (f"a worker process died (killed by the system, out of memory, or a crash in a decoder); the outputs "
         f"completed before it are kept; {RESUME_HINT}")


class WorkerDied(FgdataError):
    """A worker process died (killed by the system, out of memory, a crash in a decoder): the map cannot finish."""


class RemoteTraceback(Exception):
    """Where a worker's exception was raised: its traceback, as the worker printed it."""


def _exit_with_parent(parent_alive: Connection) -> None:
    """Block until the job's end of the pipe closes (the job ended or was killed), then exit at once."""
    try:
        parent_alive.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(1)


def _portable(error: BaseException) -> tuple[BaseException, str]:
    """``error`` as it can cross to the job (its own type when it pickles), with the worker's traceback."""
    text = "".join(traceback.format_exception(error))
    try:
        pickle.dumps(error)
        copy.copy(error)  # rebuilds it from its reduce value, as the job's end will when it receives it
    except Exception:
        error = RuntimeError(f"{type(error).__name__}: {error}")
    return error, text


def _serve(fn: Callable[[Any], Any], tasks: Queue[tuple[int, list[Any]] | None], results: Connection, parent_alive: Connection,
           initializer: Callable[..., None] | None, initargs: tuple[Any, ...], environ: dict[str, str]) -> None:
    """A worker: take ``(index, chunk)`` tasks until ``None``; send ``(index, results, error, traceback)`` back.

    ``environ`` is the job's environment when the pool started: the forkserver copied the environment once, when
    it started, so credentials or settings the process set since (a library caller, a test) would be missing."""
    os.environ.clear()
    os.environ.update(environ)
    ignore_in_worker()
    # A worker must not outlive a job killed with SIGKILL: nothing else would ever tell it to stop.
    threading.Thread(target=_exit_with_parent, args=(parent_alive,), daemon=True).start()
    try:
        if initializer is not None:
            initializer(*initargs)
    except Exception as error:
        results.send((-1, None, *_portable(error)))  # the answer to no task: the job stops with it
        return
    while (task := tasks.get()) is not None:
        index, chunk = task
        try:
            done = [fn(a) for a in chunk]
            outputs.worker_result()
            results.send((index, done, None, ""))  # pickled whole before a byte is written
        except Exception as error:
            results.send((index, None, *_portable(error)))


class _Pool(Generic[R]):
    """``workers`` processes fed from one task queue, each answering on its own pipe."""

    def __init__(self, fn: Callable[[Any], R], workers: int, initializer: Callable[..., None] | None,
                 initargs: tuple[Any, ...], preload: Sequence[str]):
        _own_temp_folder()
        ctx = pool_context(preload)
        self.tasks = ctx.Queue()  # its feeder thread writes: a put never waits for a busy worker
        self.alive_reader, self.alive_writer = ctx.Pipe(duplex=False)  # workers exit when the job's end closes
        self.processes: list[Any] = []
        self.answers: list[Connection] = []
        try:
            with _main_script_hidden():
                for _ in range(workers):
                    reader, writer = ctx.Pipe(duplex=False)
                    process = ctx.Process(target=_serve, daemon=True,
                                          args=(fn, self.tasks, writer, self.alive_reader, initializer, initargs,
                                                dict(os.environ)))
                    self.answers.append(reader)
                    process.start()
                    writer.close()  # the worker holds the only writing end: its death reads as the pipe's end
                    self.processes.append(process)
        except BaseException:
            self.close(finished=False)
            raise

    def collect(self) -> dict[int, list[R] | BaseException]:
        """Wait for at least one answer; a worker that died or failed to start ends the job."""
        ready = wait([*self.answers, *(p.sentinel for p in self.processes)])
        got: dict[int, list[R] | BaseException] = {}
        for answer in self.answers:
            if answer not in ready:
                continue
            try:
                index, results, error, text = answer.recv()
            except (EOFError, OSError):
                raise WorkerDied(_DIED) from None
            if index < 0:
                raise error from RemoteTraceback(text)
            if error is not None:
                error.__cause__ = RemoteTraceback(text)
            got[index] = results if error is None else error
        for answer, process in zip(self.answers, self.processes):
            if process.sentinel in ready and not answer.poll():
                raise WorkerDied(_DIED)
        return got

    def close(self, finished: bool) -> None:
        """Normal end: let the workers leave. Any other exit: kill them (their chunks are abandoned). Either way
        wait for every worker and release every pipe."""
        if finished:
            for _ in self.processes:
                self.tasks.put(None)
        else:
            for process in self.processes:
                process.kill()
            self.tasks.cancel_join_thread()
        for process in self.processes:
            process.join()
        self.tasks.close()
        for end in (*self.answers, self.alive_reader, self.alive_writer):
            end.close()


def _lock(path: str, create: bool) -> int | None:
    """An open descriptor of ``path`` holding its exclusive ``flock``; None when another process holds it, or when
    ``path`` is missing (``create`` False) or a link. A killed process's lock goes with it."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _own_temp_folder() -> None:
    """Mark this process's multiprocessing folder as a pool's (its lock, held while the process lives), then
    remove the marked folders of this user whose lock nobody holds: left by jobs that were killed (module
    docstring). Runs once per process, before its first pool starts."""
    global _held_lock
    if _held_lock is not None:
        return
    own = multiprocessing.util.get_temp_dir()
    _held_lock = _lock(os.path.join(own, POOL_LOCK), create=True)
    for folder in glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), "pymp-*")):
        try:
            st = os.lstat(folder)
        except OSError:
            continue
        if folder == own or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        fd = _lock(os.path.join(folder, POOL_LOCK), create=False)
        if fd is not None:  # marked, and its process is gone
            shutil.rmtree(folder, ignore_errors=True)
            os.close(fd)


def pool_context(preload: Sequence[str] = ()) -> ForkServerContext | SpawnContext:
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

    ``fn`` and ``initializer`` must be module-level functions of an importable module, not of the
    caller's ``__main__`` (workers never run it), or partials of them; each worker receives ``fn`` once and
    runs ``initializer(*initargs)`` once. An exception ``fn`` raises reaches the caller, with its own type, at
    its argument's place in the order. A worker that dies (killed by the system, out of memory, a crash in a
    decoder library) ends the map with a one-line :class:`FgdataError` instead of a wait for a result that
    will never come. Only as many workers start as there are chunks in the first window.
    """
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from map(fn, args)
        return
    it = iter(args)
    chunks = iter(lambda: list(islice(it, chunksize)), [])
    window = workers * WINDOW_PER_WORKER
    first = list(islice(chunks, window))
    if not first:
        return
    pool: _Pool[R] = _Pool(fn, min(workers, len(first)), initializer, initargs, preload)
    finished = False
    try:
        for sent, chunk in enumerate(first):
            pool.tasks.put((sent, chunk))
        sent, index = len(first), 0
        ready: dict[int, list[R] | BaseException] = {}
        while index < sent:
            while index not in ready:
                ready.update(pool.collect())
            results = ready.pop(index)
            if isinstance(results, BaseException):
                raise results
            index += 1
            for chunk in islice(chunks, 1):
                pool.tasks.put((sent, chunk))
                sent += 1
            yield from results
        finished = True
    finally:
        pool.close(finished)


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

