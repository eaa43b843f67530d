"""Helpers the encode and kd producers share: batched results, per-sample seeds, merged json.

Batching and decode-ahead, which ``fid-refs`` uses too, are :mod:`fgdata.compute`'s.

The job around them (tasks, ranks, markers, resume, the failure report) is :mod:`fgdata.encode.tasks`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from fgdata.compute import batches
from fgdata.errors import FgdataError
from fgdata.encode.tasks import Result, Task
from fgdata.shards.metadata import FGDATA_FIELD

T = TypeVar("T")


def sample_seed(seed: int, key: str) -> int:
    """A per-sample seed from the global seed and the sample key: any subset regenerates identically."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


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
