"""Reading shards: sequential iteration (local or s3://) and random access by sample index."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from fgdata import storage
from fgdata.errors import DamagedShardError, ShardError, StorageError
from fgdata.shards.index import load_index
from fgdata.shards.keys import sort_shards
from fgdata.shards.scan import BLOCK, SampleEntry, ShardScan, TarDamage, group_samples, iter_members, pread_exact, scan_fileobj

# A sample up to this size is fetched in one read and sliced (fewer system calls); a larger one
# member by member, so it is held in memory once.
_ONE_READ = 4 << 20


@dataclass
class Sample:
    """One sample: key, members by extension, the shard it came from, its index in that shard."""

    key: str
    members: dict[str, bytes]
    shard: str
    index: int


def discover_shards(path: str) -> list[str]:
    """The ``.tar`` shards directly under a directory or s3 prefix, in shard order (:func:`sort_shards`)."""
    if not storage.is_dir(path):
        raise StorageError(f"{path}: not a directory")
    return [i.path for i in sort_shards(storage.list_dir(path, suffix=".tar"), name=lambda i: i.name)]


def iter_samples(path: str) -> Iterator[Sample]:
    """Yield every sample of a shard in tar order; raise DamagedShardError at damage.

    The error carries how many samples were good before the damage.
    """
    count = 0
    problems: list[str] = []
    with storage.open_read(path) as f:
        try:
            for entry, data in group_samples(iter_members(f, seekable=False, with_data=True), problems):
                yield Sample(entry.key, data, path, count)
                count += 1
        except TarDamage as exc:
            raise DamagedShardError(path, count, str(exc)) from exc


class ShardFile:
    """Random access to the samples of a local shard through its offset index.

    The index is used when it matches the shard's size; otherwise the shard is
    scanned once (headers only). Reads use ``os.pread`` so one instance can serve
    several threads.
    """

    def __init__(self, path: str, scan: ShardScan | None = None):
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise StorageError(f"{path}: {exc.strerror or exc}") from exc
        size = os.fstat(self._fd).st_size
        if scan is None:
            scan = load_index(path, expected_size=size)
        if scan is None:
            with open(path, "rb", buffering=0) as f:  # headers only: the payloads are read on demand
                scan = scan_fileobj(path, f, seekable=True, total=size, read_ahead=BLOCK)
        self.scan = scan

    @property
    def entries(self) -> list[SampleEntry]:
        return self.scan.samples

    def __len__(self) -> int:
        return len(self.scan.samples)

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of the shard, whatever their length (one ``pread`` stops short of 2 GiB)."""
        data = pread_exact(self._fd, end - start, start)
        if len(data) != end - start:
            raise DamagedShardError(self.path, 0, f"short read at byte {start}: the shard ends at byte {start + len(data)}")
        return data

    def sample(self, i: int, exts: set[str] | None = None) -> Sample:
        """Read sample ``i``; with ``exts`` only those members are read."""
        entry = self.scan.samples[i]
        members: dict[str, bytes] = {}
        if exts is None and entry.nbytes <= _ONE_READ:
            blob = self.read_range(entry.start, entry.end)
            for ext, (off, size) in entry.members.items():
                members[ext] = blob[off - entry.start : off - entry.start + size]
        else:
            for ext, (off, size) in entry.members.items():
                if exts is None or ext in exts:
                    members[ext] = self.read_range(off, off + size)
        return Sample(entry.key, members, self.path, i)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "ShardFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def require_shards(path: str) -> list[str]:
    """discover_shards, but an empty result is an error naming the path."""
    shards = discover_shards(path)
    if not shards:
        raise ShardError(f"{path}: no .tar shards found")
    return shards
