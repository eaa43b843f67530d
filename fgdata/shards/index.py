"""The per-shard offset index and the dataset's shard-count file.

Index format, ``<shard>.idx.json`` beside each shard (one JSON object, UTF-8)::

    {"format": "fgdata.shard-index", "version": 1, "shard": "00000.tar", "size": 123456,
     "samples": [[key, start, end, {ext: [data_offset, data_size], ...}], ...],
     "job": {...}}                       # optional: the writer's resume record

``start``/``end`` bound every byte of the sample (headers included), so a sample
is one ranged read. ``job`` is ignored by readers.

An index is tied to its shard by what the shard itself holds, so a rewritten shard of the
same size is not read through its old index: ``size`` must equal the shard's byte size,
and where the index says the first and the last sample begin, the shard must hold the
header bytes fgdata's writer writes for their first members (its headers are a pure
function of name and size). That costs two ranged reads (where the storage has none,
s3:// and http(s)://, the first header is read from the start of a stream), needs no field
the index does not already have (so indexes of every fgdata version are checked alike), and
rejects any shard another tool rewrote, whose headers carry other owners, modes or times.
A shard rewritten by fgdata with its first and last samples in place is not told apart:
``fgdata verify`` compares the whole index.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from typing import Any, BinaryIO

from fgdata import storage
from fgdata.errors import FgdataError, ShardError
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


def _first_headers(entry: SampleEntry) -> tuple[int, bytes]:
    """Where a sample's first member's data begins, and the header bytes fgdata's writer puts before it."""
    from fgdata.shards.writer import member_header  # the writer imports this module

    ext, (offset, size) = min(entry.members.items(), key=lambda item: item[1][0])
    return offset, member_header(f"{entry.key}.{ext}", size)


def _matches_shard(shard: str, scan: ShardScan) -> bool:
    """Whether the shard holds the headers ``scan`` (its index) names at its first and last samples (module docstring)."""
    if not scan.samples:
        return True  # nothing to read through it; the size alone decides
    ends = [scan.samples[0]] if len(scan.samples) == 1 else [scan.samples[0], scan.samples[-1]]
    expected = [(e.start, *_first_headers(e)) for e in ends]
    if expected[0][0] != 0 or any(off - start != len(want) for start, off, want in expected):
        return False  # fgdata's first sample starts at byte 0, and its headers fill the gap before the data
    try:
        if not storage.random_access(shard):
            _, off, want = expected[0]
            with storage.open_read(shard) as f:
                return f.read(off) == want
        return all(storage.read_range(shard, start, len(want)) == want for start, _, want in expected)
    except (FgdataError, OSError):
        return False  # unreadable here: the scan that replaces the index says why


def load_index(shard: str, expected_size: int | None = None) -> ShardScan | None:
    """The shard's index, or None when it is missing, invalid or stale: its size differs
    from ``expected_size`` (when given) or its first and last headers differ from the shard's."""
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
    return scan if _matches_shard(shard, scan) else None


def read_shard_counts(path: str) -> dict[str, int]:
    """Read a shard-count JSON (a file path or URL); validate it maps names to counts."""
    try:
        doc = json.loads(storage.read_bytes(path))
    except ValueError as exc:
        raise ShardError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in doc.items()):
        raise ShardError(f"{path}: a shard-count file maps shard names to non-negative integers")
    return doc


def write_count_entries(out: BinaryIO, entries: Iterable[tuple[str, int]]) -> None:
    """A shard-count file from ``(shard name, samples)`` pairs in file order, streamed (a job's finalize need not
    hold every shard's count); the layout is ``json.dumps(counts, indent=1)`` plus a newline."""
    out.write(b"{")
    n = 0
    for n, (name, samples) in enumerate(entries, 1):
        out.write(b"%s\n %s: %d" % (b"," if n > 1 else b"", json.dumps(name).encode(), samples))
    out.write(b"\n}\n" if n else b"}\n")


def shard_counts_bytes(counts: dict[str, int]) -> bytes:
    """A shard-count file's bytes, shards in numeric order."""
    from fgdata.shards.keys import sort_shards

    buf = io.BytesIO()
    write_count_entries(buf, ((k, counts[k]) for k in sort_shards(counts)))
    return buf.getvalue()


def write_shard_counts(path: str, counts: dict[str, int]) -> None:
    """Atomically write a shard-count file, shards in numeric order."""
    storage.write_bytes(path, shard_counts_bytes(counts))
