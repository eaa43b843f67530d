"""Helpers the encode and kd producers share: batching, decode-ahead, per-sample seeds, merged json.

The job around them (tasks, ranks, markers, resume, the failure report) is :mod:`fgdata.encode.tasks`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from fgdata.errors import FgdataError
from fgdata.encode.tasks import Result, Task
from fgdata.shards.metadata import FGDATA_FIELD

T = TypeVar("T")
R = TypeVar("R")


def sample_seed(seed: int, key: str) -> int:
    """A per-sample seed from the global seed and the sample key: any subset regenerates identically."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def prefetch_map(fn: Callable[[T], R], items: Iterable[T], workers: int, ahead: int) -> Iterator[tuple[T, R | BaseException]]:
    """``(item, fn(item) or its exception)`` in order, with up to ``ahead`` items decoding on threads.

    Decoders (Pillow, PyAV) release the GIL, so the CPU decodes the next batch while the model runs.
    """

    def call(item: T) -> R | BaseException:
        try:
            return fn(item)
        except Exception as exc:  # noqa: BLE001 - the caller turns it into a per-sample failure
            return exc

    if workers <= 0:
        for item in items:
            yield item, call(item)
        return
    pending: list[tuple[T, Future]] = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fgdata-decode") as pool:
        for item in items:
            pending.append((item, pool.submit(call, item)))
            if len(pending) > ahead:
                first, fut = pending.pop(0)
                yield first, fut.result()
        for item, fut in pending:
            yield item, fut.result()


def batches(items: Iterable[T], size: int) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def batched_results(items: Iterable[Result | T], size: int,
                    run: Callable[[list[T]], Iterable[Result]]) -> Iterator[Result]:
    """``run`` on batches of the good items; each failure :class:`Result` among ``items`` passes through.

    A failure comes out just before the results of the batch it was read with (the ones after the last
    batch come last), so the shard's samples and failures stay in input order, batch by batch.
    """
    failed: list[Result] = []

    def good() -> Iterator[T]:
        for item in items:
            if isinstance(item, Result):
                failed.append(item)
            else:
                yield item

    for batch in batches(good(), size):
        yield from failed
        failed.clear()
        yield from run(batch)
    yield from failed


def user_json(old: bytes | None) -> dict[str, Any]:
    """The sample's own ``json`` member as an object (``{}`` when it has none).

    fgdata adds its fields to an object only: a member that is not valid JSON, holds a list, a number or a
    string, or has a ``fgdata`` field that is not an object, fails that sample with this reason (checked before
    the model runs), never replaced or wrapped.
    """
    if not old:
        return {}
    try:
        doc = json.loads(old)
    except ValueError as e:
        raise FgdataError(f"metadata: the sample's json member is not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        kind = "a list" if isinstance(doc, list) else "text" if isinstance(doc, str) else \
            "null" if doc is None else "a boolean" if isinstance(doc, bool) else "a number"
        raise FgdataError(f"metadata: the sample's json member holds {kind}, not a JSON object; "
                          "fgdata adds its fields to an object only")
    if not isinstance(doc.get(FGDATA_FIELD, {}), dict):
        raise FgdataError(f"metadata: the sample's json has its own {FGDATA_FIELD!r} field (not an object); "
                          "it is reserved for fgdata's metadata")
    return doc


def merged_json(old: bytes | None, fields: dict[str, Any]) -> bytes:
    """The sample's json with fgdata's provenance fields set under its ``fgdata`` key (others kept), deterministic bytes."""
    from fgdata.shards.metadata import with_fgdata_fields

    return json.dumps(with_fgdata_fields(user_json(old), fields), sort_keys=True, separators=(",", ":")).encode()


def task_samples(task: Task) -> Iterator[Any]:
    """The input shard's samples, then a failure :class:`Result` if the shard is damaged (the job goes on)."""
    from fgdata.errors import DamagedShardError
    from fgdata.shards import iter_samples

    assert task.source is not None
    try:
        yield from iter_samples(task.source)
    except DamagedShardError as exc:
        yield Result(exc.good, f"<after {exc.good} samples>", None, f"damaged shard: {exc.reason}")
