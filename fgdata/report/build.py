"""Read the shards, summarise them and draw the page: what ``fgdata report`` and ``fgdata quickstart`` run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fgdata.media.preview import Tile
from fgdata.report.collect import Stats
from fgdata.shards import ShardSet
from fgdata.workers import OrderedMap, serial_map


@dataclass
class Report:
    doc: dict[str, Any]  # the JSON document (see fgdata.report.summary.summarise)
    stats: Stats
    html: str  # the self-contained page


def build_report(shards: Sequence[str] | ShardSet, *, name: str, paths: Sequence[str], sample: int = 1000, tiles: int = 24,
                 pool: OrderedMap = serial_map, thresholds: dict[str, float] | None = None,
                 progress: Callable[[str], None] | None = None) -> Report:
    """The report on ``shards`` (each folder a dataset of its own); ``paths`` are what the user named (shown on the
    page); ``pool`` reads the shards (see :func:`fgdata.report.collect.collect`)."""
    from fgdata.report import html
    from fgdata.report.collect import collect
    from fgdata.report.summary import summarise

    selection = shards if isinstance(shards, ShardSet) else list(shards)
    stats = collect(selection, sample=sample, tiles=tiles, pool=pool, thresholds=thresholds, progress=progress)
    doc = summarise(stats, name=name, paths=paths, thresholds=thresholds, sample=sample)
    paths_ = selection.shards if isinstance(selection, ShardSet) else selection
    downloads = download_stats(paths_)
    if downloads is not None:
        doc["downloads"] = downloads
    per_shard = filtered_per_shard(paths_)
    for row in doc["shards"] if per_shard else []:
        row.update(per_shard.get(row["path"], {}))
    selected = selection_stats(paths_)
    if selected is not None:
        doc["selection"] = selected
        counted = [(row["filtered"], row["shard"]) for row in doc["shards"] if "filtered" in row]
        if counted:  # the spread over the shards, and the shard with the most (the first of those)
            most = max(counted, key=lambda c: c[0])
            selected["per_shard"] = {"min": min(c[0] for c in counted), "max": most[0], "most": most[1]}
    filtered = filtered_counts(paths_)
    if filtered:
        doc["filtered"] = filtered
    if "clips" in doc:
        doc["clips"]["filtered"] = filtered
    return Report(doc, stats, html.render(doc, stats))


def _job_file(shards: Sequence[str], name: str, form: str) -> tuple[str, dict[str, Any]] | None:
    """The path and document of the job file ``name`` (format ``form``) in the shards' one folder, or None:
    shards from several folders, no such file, or one that is not fgdata's."""
    import json

    from fgdata import storage

    folders = {storage.parent(s) for s in shards}
    if len(folders) != 1:
        return None
    path = storage.join(folders.pop(), name)
    if not storage.exists(path):
        return None
    try:
        doc = json.loads(storage.read_bytes(path))
    except ValueError:
        return None
    return (path, doc) if isinstance(doc, dict) and doc.get("format") == form else None


def filtered_counts(shards: Sequence[str]) -> dict[str, int]:
    """Outputs a filter dropped, by reason (``too-short``, ``motion-below-min``...), from the warnings of the
    job's ``failures.json`` (``filtered: INPUT: REASON: details``); empty when there is none."""
    from collections import Counter

    from fgdata.catalog import FAILURES_FILE, FAILURES_FORMAT

    found = _job_file(shards, FAILURES_FILE, FAILURES_FORMAT)
    counts: Counter[str] = Counter()
    for w in found[1].get("warnings", []) if found else []:
        prefix = f"filtered: {w.get('input')}: " if isinstance(w, dict) else ""
        if prefix and str(w.get("reason", "")).startswith(prefix):
            counts[w["reason"][len(prefix):].split(":")[0]] += 1
    return dict(sorted(counts.items()))


def download_stats(shards: Sequence[str]) -> dict[str, Any] | None:
    """The totals of a URL job's ``shard_stats.json`` in the shards' folder (successes, failures by reason,
    retryable), or None: shards from several folders, no such file, one that is not fgdata's, or a job whose
    inputs were not URLs (a file without ``downloads`` is a URL job's: only those wrote one before)."""
    from fgdata.catalog import STATS_FILE, STATS_FORMAT

    found = _job_file(shards, STATS_FILE, STATS_FORMAT)
    if found is None or found[1].get("downloads") is False:
        return None
    path, doc = found
    out = {"file": path, "successes": doc.get("successes", 0), "failed": doc.get("failed", 0),
           "failed_by_reason": doc.get("failed_by_reason", {}), "retryable": doc.get("retryable", 0)}
    if "filtered" in doc:  # a job that selected rows: what it left out, by reason
        out.update(filtered=doc["filtered"], filtered_by_reason=doc.get("filtered_by_reason", {}))
    return out


def filtered_per_shard(shards: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Shard path -> the inputs a row selection (or a source shard's failed downloads) left out that count for it
    (``filtered``, ``filtered_by_reason``), from the job's ``shard_stats.json`` in the shards' folder; empty when
    there is none or the job left nothing out."""
    from fgdata import storage
    from fgdata.catalog import STATS_FILE, STATS_FORMAT

    found = _job_file(shards, STATS_FILE, STATS_FORMAT)
    if found is None or "filtered" not in found[1] or not isinstance(found[1].get("shards"), dict):
        return {}
    folder = storage.parent(found[0])
    return {storage.join(folder, name): {"filtered": row.get("filtered", 0),
                                         "filtered_by_reason": row.get("filtered_by_reason", {})}
            for name, row in found[1]["shards"].items() if isinstance(row, dict)}


def selection_stats(shards: Sequence[str]) -> dict[str, Any] | None:
    """What a shard job's row selection (``--where``, ``--keep-top``) left out, from the job's ``failures.json`` in
    the shards' folder (inputs seen, filtered by reason, the ``--keep-top`` cut), or None: shards from several
    folders, no such file, or a job that selected no rows."""
    from fgdata.catalog import FAILURES_FILE, FAILURES_FORMAT

    found = _job_file(shards, FAILURES_FILE, FAILURES_FORMAT)
    if found is None or "filtered" not in found[1]:
        return None
    path, doc = found
    return {"file": path, "seen": doc.get("seen", 0), "written": doc.get("written", 0),
            "failed": doc.get("failed", 0), "filtered": doc["filtered"],
            "filtered_by_reason": doc.get("filtered_by_reason", {}), **(doc.get("selection") or {})}


def write_contact_sheet(tiles: Sequence[Tile], path: str) -> int:
    """The tiles as one contact-sheet PNG (local or s3://), for ``report``, ``quickstart`` and ``inspect
    --preview`` alike; returns how many were drawn."""
    from fgdata import storage
    from fgdata.errors import FgdataError
    from fgdata.report.plots import contact_sheet

    if not tiles:
        raise FgdataError(f"{path}: no images or videos to put in a contact sheet")
    storage.write_bytes(path, contact_sheet(list(tiles)))
    return len(tiles)
