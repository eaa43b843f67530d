"""The per-shard offset index and the dataset's shard-count file.

Index format, ``<shard>.idx.json`` beside each shard (one JSON object, UTF-8)::

    {"format": "fgdata.shard-index", "version": 1, "shard": "00000.tar", "size": 123456,
     "samples": [[key, start, end, {ext: [data_offset, data_size], ...}], ...],
     "job": {...}}                       # optional: the writer's resume record

``start``/``end`` bound every byte of the sample (headers included), so a sample
is one ranged read; ``size`` is the shard's byte size and lets a reader reject a
stale index. ``job`` is ignored by readers.
"""

from __future__ import annotations

import json
from typing import Any

from fgdata import storage
from fgdata.errors import ShardError
from fgdata.shards.scan import SampleEntry, ShardScan

INDEX_SUFFIX = ".idx.json"
INDEX_FORMAT = "fgdata.shard-index"
INDEX_VERSION = 1
COUNT_FILE = "shard_count.json"


def index_path(shard: str) -> str:
    return shard + INDEX_SUFFIX


def index_bytes(scan: ShardScan, job: dict[str, Any] | None = None) -> bytes:
    doc: dict[str, Any] = {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION,
        "shard": storage.basename(scan.shard),
        "size": scan.size,
        "samples": [[s.key, s.start, s.end, {k: list(v) for k, v in s.members.items()}] for s in scan.samples],
    }
    if job is not None:
        doc["job"] = job
    return json.dumps(doc, separators=(",", ":"), sort_keys=False).encode()


def parse_index(shard: str, data: bytes) -> tuple[ShardScan, dict[str, Any] | None]:
    """Parse index bytes; raise ShardError when they are not an fgdata index."""
    try:
        doc = json.loads(data)
        if doc.get("format") != INDEX_FORMAT or doc.get("version") != INDEX_VERSION:
            raise ValueError("unknown format or version")
        samples = [SampleEntry(k, int(a), int(b), {e: (int(o), int(n)) for e, (o, n) in m.items()}) for k, a, b, m in doc["samples"]]
        scan = ShardScan(shard=shard, size=int(doc["size"]), samples=samples)
        _check_ranges(scan)
        return scan, doc.get("job")
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardError(f"{index_path(shard)}: not a valid shard index ({exc})") from exc


def _check_ranges(scan: ShardScan) -> None:
    """Byte ranges a reader can trust: samples in order inside the shard, members inside their sample."""
    last = 0
    for s in scan.samples:
        if not last <= s.start <= s.end <= scan.size:
            raise ValueError(f"sample {s.key!r} spans bytes {s.start}-{s.end}, after byte {last} of {scan.size}")
        for ext, (off, size) in s.members.items():
            if size < 0 or not s.start <= off <= off + size <= s.end:
                raise ValueError(f"member {s.key}.{ext} at {off}+{size} is outside its sample")
        last = s.end


def write_index(scan: ShardScan, dest_shard: str, job: dict[str, Any] | None = None) -> None:
    """Atomically write the index of ``scan`` beside ``dest_shard``."""
    storage.write_bytes(index_path(dest_shard), index_bytes(scan, job))


def load_index(shard: str, expected_size: int | None = None) -> ShardScan | None:
    """The shard's index, or None when it is missing, invalid or stale (size mismatch)."""
    path = index_path(shard)
    try:
        data = storage.read_bytes(path)
    except Exception:  # noqa: BLE001 - a missing or unreadable index only means "scan instead"
        return None
    try:
        scan, _ = parse_index(shard, data)
    except ShardError:
        return None
    if expected_size is not None and scan.size != expected_size:
        return None
    return scan


def read_shard_counts(path: str) -> dict[str, int]:
    """Read a shard-count JSON (a file path or URL); validate it maps names to counts."""
    try:
        doc = json.loads(storage.read_bytes(path))
    except ValueError as exc:
        raise ShardError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in doc.items()):
        raise ShardError(f"{path}: a shard-count file maps shard names to non-negative integers")
    return doc


def shard_counts_bytes(counts: dict[str, int]) -> bytes:
    from fgdata.shards.keys import sort_shards

    ordered = {k: counts[k] for k in sort_shards(counts)}
    return (json.dumps(ordered, indent=1) + "\n").encode()


def write_shard_counts(path: str, counts: dict[str, int]) -> None:
    """Atomically write a shard-count file, shards in numeric order."""
    storage.write_bytes(path, shard_counts_bytes(counts))
