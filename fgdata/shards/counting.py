"""Counting samples per shard, for shard_count.json.

Local shards are counted header-only (payloads are stepped over). On S3 a shard's
index is used when one exists beside it; otherwise the shard is streamed and only
its headers are parsed. A shard that cannot be read at all gets no count: its
entry in the count file is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.shards.index import COUNT_FILE, INDEX_SUFFIX, load_index, read_shard_counts, write_shard_counts
from fgdata.shards.scan import ShardScan, scan_shard
from fgdata.shards.select import ShardSet, resolve_shards
from fgdata.workers import OrderedMap, serial_map


@dataclass
class ShardCount:
    """One shard's count: ``samples`` readable before any ``damage``; with ``error`` the shard
    could not be read at all and ``samples`` means nothing."""

    shard: str
    name: str
    samples: int
    bytes: int
    damage: str | None = None
    from_index: bool = False
    error: str | None = None


@dataclass
class CountFileUpdate:
    """What writing one count file did: the shards it now counts, and the unreadable ones
    whose old entry was kept or that have no entry."""

    path: str
    counts: dict[str, int]
    kept: dict[str, int] = field(default_factory=dict)
    uncounted: list[str] = field(default_factory=list)


def count_one(path: str, size: int | None = None, use_index: bool = False) -> ShardCount:
    """Count one shard; a damaged shard reports the samples before the damage, an unreadable one an error."""
    scan: ShardScan | None = load_index(path, expected_size=size) if use_index else None
    from_index = scan is not None
    if scan is None:
        try:
            scan = scan_shard(path)
        except (FgdataError, OSError) as exc:  # storage failed: the content is unknown, not bad
            return ShardCount(path, storage.basename(path), 0, size or 0, error=str(exc).splitlines()[0])
    return ShardCount(path, storage.basename(path), len(scan.samples), size if size is not None else scan.size, scan.damage, from_index)


def count_shards(
    paths: str | Sequence[str] | ShardSet, *, pool: OrderedMap = serial_map,
    progress: Callable[[ShardCount], None] | None = None,
) -> list[ShardCount]:
    """Count every shard that ``paths`` names (a folder, shards, a brace pattern; see :func:`resolve_shards`).

    ``pool`` runs the counts (the tar format knows nothing of the job core: the caller hands down its threads,
    :func:`fgdata.jobs.executor.thread_map`; default one shard at a time); ``progress`` is called from it."""
    selection = paths if isinstance(paths, ShardSet) else resolve_shards(paths)
    sizes = selection.sizes
    indexed: set[str] = set()
    for folder in selection.folders:
        if not storage.random_access(folder):  # an index saves streaming the shard; a local scan seeks, as cheap
            indexed.update(i.path.removesuffix(INDEX_SUFFIX) for i in storage.list_dir(folder, suffix=INDEX_SUFFIX))

    def work(shard: str) -> ShardCount:
        result = count_one(shard, sizes.get(shard), use_index=shard in indexed)
        if progress is not None:
            progress(result)
        return result

    return list(pool(work, selection.shards))


def _existing(path: str) -> dict[str, int]:
    try:
        return read_shard_counts(path) if storage.exists(path) else {}
    except FgdataError:
        return {}  # an invalid count file is replaced; nothing in it can be kept


def write_counts(rows: list[ShardCount], selection: ShardSet, output: str | None = None) -> list[CountFileUpdate]:
    """Write the counts beside the shards (one ``shard_count.json`` per folder) or all into ``output``.

    A folder given whole gets a count file that lists exactly its shards; otherwise
    the counted shards' entries are updated and the others kept. A shard that could not be read
    keeps its old entry, or gets none: a count is only written for a shard that was read.
    """
    groups: dict[str, list[ShardCount]] = {}
    for row in rows:
        target = output or storage.join(selection.folder_of(row.shard), COUNT_FILE)
        groups.setdefault(target, []).append(row)
    updates = []
    for target, group in groups.items():
        names = [r.name for r in group]
        if len(set(names)) < len(names):
            dup = next(n for n in names if names.count(n) > 1)
            folders = sorted({storage.parent(r.shard) for r in group if r.name == dup})
            raise FgdataError(f"{target}: {dup} is a shard of {' and '.join(folders)}; one count file cannot "
                              "hold both, so write each folder's counts beside it (leave out --output / --counts-output)")
        old = _existing(target)
        whole = all(selection.given_whole(r.shard) for r in group)
        counts = {} if whole else dict(old)
        update = CountFileUpdate(target, counts)
        for r in group:
            if r.error is None:
                counts[r.name] = r.samples
            elif r.name in old:
                counts[r.name] = update.kept[r.name] = old[r.name]
            else:
                counts.pop(r.name, None)
                update.uncounted.append(r.name)
        write_shard_counts(target, counts)
        updates.append(update)
    return updates
