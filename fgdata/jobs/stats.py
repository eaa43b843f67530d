"""``shard_stats.json`` beside ``failures.json`` for jobs that download: successes and failures by reason, per shard.

A failure belongs to the shard whose inputs it sat between: shard ``k`` covers the input positions
from the previous shard's end (its index records ``input_end``) up to its own; failures after the
last shard count for the last shard. The same positions are used by every executor, so the file is
the same for ``--workers``, Ray and torchrun runs of the same job. ``retryable`` counts the failures
that another try may fix (timeouts, dropped connections, 429, 5xx).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from fgdata import storage
from fgdata.shards import Failure
from fgdata.shards.index import index_path, parse_index
from fgdata.storage.http import retryable

STATS_FILE = "shard_stats.json"


def _category(reason: str) -> str:
    return reason.split(":", 1)[0].strip()


def _input_ends(dest: str, names: list[str]) -> list[int]:
    """Each shard's end position (one past its last input), from its index's resume record."""
    ends: list[int] = []
    for name in names:
        shard = storage.join(dest, name)
        _, record = parse_index(shard, storage.read_bytes(index_path(shard)))
        ends.append(int((record or {}).get("input_end", ends[-1] if ends else 0)))
    return ends


def write_stats(dest: str, counts: dict[str, int], failures: list[Failure], written: int) -> dict[str, Any]:
    """Write ``DST/shard_stats.json`` atomically and return it."""
    names = list(counts)
    ends = _input_ends(dest, names)
    per_shard: dict[str, Counter[str]] = {name: Counter() for name in names}
    for f in failures:
        if not names:
            break
        k = next((i for i, end in enumerate(ends) if f.input is not None and f.input < end), len(names) - 1)
        per_shard[names[k]][_category(f.reason)] += 1
    doc = {
        "format": "fgdata.shard-stats",
        "version": 1,
        "successes": written,
        "failed": len(failures),
        "failed_by_reason": dict(sorted(Counter(_category(f.reason) for f in failures).items())),
        "retryable": sum(retryable(f.reason) for f in failures),
        "shards": {name: {"samples": counts[name], "failed_by_reason": dict(sorted(per_shard[name].items()))}
                   for name in names},
    }
    storage.write_bytes(storage.join(dest, STATS_FILE), (json.dumps(doc, indent=1) + "\n").encode())
    return doc
