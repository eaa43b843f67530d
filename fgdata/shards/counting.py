"""Counting samples per shard, for shard_count.json.

Local shards are counted header-only (payloads are seeked over). On S3 a shard's
index is used when one exists beside it; otherwise the shard is streamed and only
its headers are parsed.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from fgdata import storage
from fgdata.shards.index import INDEX_SUFFIX, load_index
from fgdata.shards.reader import discover_shards
from fgdata.shards.scan import ShardScan, scan_shard


@dataclass
class ShardCount:
    shard: str
    name: str
    samples: int
    bytes: int
    damage: str | None = None
    from_index: bool = False


def count_one(path: str, size: int | None = None, use_index: bool = False) -> ShardCount:
    """Count one shard; a damaged shard reports the samples before the damage."""
    scan: ShardScan | None = load_index(path, expected_size=size) if use_index else None
    from_index = scan is not None
    if scan is None:
        try:
            scan = scan_shard(path)
        except Exception as exc:  # noqa: BLE001 - an unreadable shard is reported, not fatal
            return ShardCount(path, storage.basename(path), 0, size or 0, damage=str(exc).splitlines()[0])
    return ShardCount(path, storage.basename(path), len(scan.samples), size if size is not None else scan.size, scan.damage, from_index)


def count_shards(
    path: str, *, workers: int = 8, progress: Callable[[ShardCount], None] | None = None
) -> list[ShardCount]:
    """Count every shard under a directory or s3 prefix, in shard order."""
    shards = discover_shards(path)
    sizes = {info.path: info.size for info in storage.list_dir(path)}
    remote = storage.is_s3(path)
    indexed = {p[: -len(INDEX_SUFFIX)] for p in sizes if p.endswith(INDEX_SUFFIX)} if remote else set()

    def work(shard: str) -> ShardCount:
        result = count_one(shard, sizes.get(shard), use_index=shard in indexed)
        if progress is not None:
            progress(result)
        return result

    if workers <= 1 or len(shards) <= 1:
        return [work(s) for s in shards]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(work, shards))
