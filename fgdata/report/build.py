"""Read the shards, summarise them and draw the page: what ``fgdata report`` and ``fgdata quickstart`` run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fgdata.media.preview import Tile
from fgdata.report.collect import Stats
from fgdata.shards import ShardSet


@dataclass
class Report:
    doc: dict[str, Any]  # the JSON document (see fgdata.report.summary.summarise)
    stats: Stats
    html: str  # the self-contained page


def build_report(shards: Sequence[str] | ShardSet, *, name: str, paths: Sequence[str], sample: int = 1000, tiles: int = 24,
                 workers: int = 4, thresholds: dict[str, float] | None = None,
                 progress: Callable[[str], None] | None = None) -> Report:
    """The report on ``shards`` (each folder a dataset of its own); ``paths`` are what the user named (shown on the
    page)."""
    from fgdata.report import html
    from fgdata.report.collect import collect
    from fgdata.report.summary import summarise

    selection = shards if isinstance(shards, ShardSet) else list(shards)
    stats = collect(selection, sample=sample, tiles=tiles, workers=workers, progress=progress)
    doc = summarise(stats, name=name, paths=paths, thresholds=thresholds, sample=sample)
    downloads = download_stats(selection.shards if isinstance(selection, ShardSet) else selection)
    if downloads is not None:
        doc["downloads"] = downloads
    filtered = selection_stats(selection.shards if isinstance(selection, ShardSet) else selection)
    if filtered is not None:
        doc["selection"] = filtered
    return Report(doc, stats, html.render(doc, stats))


def download_stats(shards: Sequence[str]) -> dict[str, Any] | None:
    """The totals of a URL job's ``shard_stats.json`` in the shards' folder (successes, failures by reason,
    retryable), or None: shards from several folders, no such file, or one that is not fgdata's."""
    import json

    from fgdata import storage
    from fgdata.jobs.stats import STATS_FILE

    folders = {storage.parent(s) for s in shards}
    if len(folders) != 1:
        return None
    path = storage.join(folders.pop(), STATS_FILE)
    if not storage.exists(path):
        return None
    try:
        doc = json.loads(storage.read_bytes(path))
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != "fgdata.shard-stats":
        return None
    return {"file": path, "successes": doc.get("successes", 0), "failed": doc.get("failed", 0),
            "failed_by_reason": doc.get("failed_by_reason", {}), "retryable": doc.get("retryable", 0)}


def selection_stats(shards: Sequence[str]) -> dict[str, Any] | None:
    """What a shard job's row selection (``--where``, ``--keep-top``) left out, from the job's ``failures.json`` in
    the shards' folder (inputs seen, filtered by reason, the ``--keep-top`` cut), or None: shards from several
    folders, no such file, or a job that selected no rows."""
    import json

    from fgdata import storage
    from fgdata.jobs.report import FAILURES_FILE, FORMAT

    folders = {storage.parent(s) for s in shards}
    if len(folders) != 1:
        return None
    path = storage.join(folders.pop(), FAILURES_FILE)
    if not storage.exists(path):
        return None
    try:
        doc = json.loads(storage.read_bytes(path))
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "filtered" not in doc:
        return None
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
