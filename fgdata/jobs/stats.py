"""``shard_stats.json`` beside ``failures.json`` for jobs that download or leave inputs out: successes, failures
and filtered inputs by reason, per shard.

A failure belongs to the shard of its work unit that was open when it happened (the next shard the unit
closes); failures after a unit's last shard count for that shard, and a unit that wrote no shard has its
failures in the totals only. Units are the same for every executor, so the file is the same for ``--workers``,
Ray and torchrun runs of the same job. ``retryable`` counts the failures that another try may fix (timeouts,
dropped connections, 429, 5xx). A job that leaves inputs out (``--where``, ``--keep-top``, a source shard's
failed downloads) adds ``filtered`` and ``filtered_by_reason``, to the totals and to each shard: an input left
out counts for the shard of the input before it (:mod:`fgdata.sources.selection`), and the totals are the sum
of the units' (a unit that wrote no shard: in the totals only). The command's own fields of the totals
(``downloads``: whether the inputs were URLs) come from its report fields.
"""

from __future__ import annotations

import json
from typing import IO, TYPE_CHECKING

from fgdata.catalog import STATS_FILE as STATS_FILE  # the name the job core imports from here
from fgdata.catalog import STATS_FORMAT as FORMAT

if TYPE_CHECKING:
    from fgdata.jobs.options import JsonValue
    from fgdata.jobs.units import Totals

VERSION = 1


def write_stats(out: IO[bytes], totals: Totals, per_shard: IO[bytes], fields: dict[str, JsonValue] | None = None,
                filtered: bool = False) -> None:
    """Write the file to ``out``: the job's ``totals`` (successes, failed, failed_by_reason, retryable), the
    command's own ``fields``, with ``filtered`` the inputs left out by reason, then the shards from ``per_shard``,
    one ``[name, {"samples", "failed_by_reason", ...}]`` JSON line each."""
    head: dict[str, JsonValue] = {"successes": totals.written, "failed": totals.failed,
                                  "failed_by_reason": dict(sorted(totals.failed_by_reason.items())),
                                  "retryable": totals.retryable, **(fields or {})}
    if filtered:
        head.update(filtered=totals.filtered, filtered_by_reason=dict(sorted(totals.filtered_by_reason.items())))
    out.write(b"{\n")
    for key, value in {"format": FORMAT, "version": VERSION, **head}.items():
        out.write(f" {json.dumps(key)}: {json.dumps(value)},\n".encode())
    out.write(b' "shards": {')
    per_shard.seek(0)
    n = 0
    for n, line in enumerate(per_shard, 1):
        name, doc = json.loads(line)
        out.write(b"%s\n  %s: %s" % (b"," if n > 1 else b"", json.dumps(name).encode(), json.dumps(doc).encode()))
    out.write(b"\n }\n}\n" if n else b"}\n}\n")
