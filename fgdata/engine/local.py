"""The local engine: transform items in a process pool, write results in input order through ShardWriter.

Results are consumed strictly in position order (a bounded window of futures, oldest first),
so the shards do not depend on the number of workers, and memory stays bounded when the
writer is slower than the workers.

Resume: ``ShardWriter.resume_point.next_input`` says where to continue. Clips of one video can
straddle a shard boundary; their non-final clips are written with ``input_pos = position - 1``
so a shard that closes mid-video does not mark that video done. On resume, the clips already
in complete shards are skipped by key.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import TypeVar

from fgdata import storage
from fgdata.engine.transform import Outcome, ShardOptions, transform
from fgdata.shards import ShardWriter, load_index
from fgdata.sources.folder import WorkItem, sample_key

T = TypeVar("T")
R = TypeVar("R")
WINDOW_PER_WORKER = 4

#: ``progress(inputs_done, bytes_read)``: increments, called after each input is written or failed.
ProgressFn = Callable[[int, int], None]


def _apply_chunk(fn: Callable[[T], R], chunk: list[T]) -> list[R]:
    return [fn(a) for a in chunk]


def ordered_map(
    fn: Callable[[T], R],
    args: Iterable[T],
    workers: int,
    chunksize: int = 1,
    initializer: Callable[..., None] | None = None,
    initargs: tuple = (),
) -> Iterator[R]:
    """``map(fn, args)`` on ``workers`` processes, results in argument order.

    Arguments travel in chunks of ``chunksize`` (cheap items: fewer round trips), with at most
    ``WINDOW_PER_WORKER`` chunks per worker in flight so memory stays bounded. The pool forks,
    so workers start in milliseconds with the parent's modules already imported, unless Ray
    lives in this process (its threads do not survive a fork): then a preloaded forkserver.
    ``initializer(*initargs)`` runs once per worker (in-process when ``workers <= 1``), so large
    read-only inputs reach forked workers without pickling.
    """
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from map(fn, args)
        return
    if "ray" in sys.modules:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["fgdata.engine.transform"])
    else:
        ctx = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=initializer, initargs=initargs)
    pending: deque[Future] = deque()
    it = iter(args)
    task = partial(_apply_chunk, fn)

    def submit() -> bool:
        chunk = list(islice(it, chunksize))
        if chunk:
            pending.append(pool.submit(task, chunk))
        return bool(chunk)

    try:
        while len(pending) < workers * WINDOW_PER_WORKER and submit():
            pass
        while pending:
            results = pending.popleft().result()
            submit()
            yield from results
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _transform_at(task: tuple[int, WorkItem], options: ShardOptions) -> Outcome:
    return transform(task[0], task[1], options)


def _keys_in_complete_shards(writer: ShardWriter, prefix: str) -> set[str]:
    """Keys starting with ``prefix`` in the last complete shards (the clips of a half-written video)."""
    keys: set[str] = set()
    for n in range(writer.resume_point.shards - 1, -1, -1):
        scan = load_index(storage.join(writer.dest, writer.pattern % n))
        if scan is None:
            break
        keys.update(s.key for s in scan.samples if s.key.startswith(prefix))
        if not scan.samples or not scan.samples[0].key.startswith(prefix):
            break
    return keys


@dataclass
class RangeResult:
    written: int  # inputs in the range that produced samples (resumed ones included)
    nbytes: int  # input bytes read in this run


def write_range(
    writer: ShardWriter,
    items: Sequence[WorkItem],
    order: Sequence[int],
    first: int,
    stop: int,
    options: ShardOptions,
    workers: int = 1,
    progress: ProgressFn | None = None,
) -> RangeResult:
    """Transform positions ``[first, stop)`` (``order[p]`` is the item at position p) and write them."""
    point = writer.resume_point
    start = max(first, point.next_input)
    resumed_failures = sum(1 for f in point.failures if f.input is not None and first <= f.input < start)
    written = (start - first) - resumed_failures
    if progress and start > first:
        progress(start - first, 0)
    skip: set[str] = set()
    if options.clip_seconds is not None and start < stop and point.shards:
        skip = _keys_in_complete_shards(writer, sample_key(items[order[start]].index) + "_")
    nbytes = 0
    tasks = ((p, items[order[p]]) for p in range(start, stop))
    chunksize = 1 if options.kind == "videos" else 16
    for out in ordered_map(partial(_transform_at, options=options), tasks, workers, chunksize):
        if out.reason is not None:
            writer.fail(out.position, out.name, out.reason)
        else:
            last = len(out.samples) - 1
            for j, (key, members) in enumerate(out.samples):
                if key not in skip:
                    writer.write(key, members, input_pos=out.position if j == last else out.position - 1)
            written += 1
        nbytes += out.nbytes
        if progress:
            progress(1, out.nbytes)
    return RangeResult(written=written, nbytes=nbytes)
