"""The shard writer: deterministic, atomic WebDataset tar shards.

Each shard is written to a private temporary file in ``stage`` (:func:`fgdata.storage.temps.open_temp`); when
it closes, its offset index is written and the shard is renamed into place (or, for s3://, uploaded from a
local staging folder). Readers never see a partial shard under a final name. Shard ``n`` is named by
``name(n)`` (``pattern % n`` by default), so a caller that writes several parts of one dataset in parallel
(the job core's work units) gives each its own names and its own stage.

This module only writes tar: it keeps no record of which inputs a shard covers and never reads what a
directory already holds. Resuming, accounting and cleaning up after a kill belong to the job that runs it
(:mod:`fgdata.jobs.units`).
"""

from __future__ import annotations

import contextlib
import os
import re
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from fgdata import storage
from fgdata.errors import ShardError
from fgdata.shards.index import COUNT_FILE, write_index, write_shard_counts
from fgdata.shards.keys import validate_extension, validate_key
from fgdata.shards.scan import BLOCK, SampleEntry, ShardScan
from fgdata.storage.temps import open_temp

RECORD = 20 * BLOCK  # tar's record size; archives are padded to it, as GNU tar and Python's tarfile do
MTIME = 0


@dataclass
class WriteSummary:
    """What a writer wrote: its shards (full paths) and their sample counts (by basename)."""

    shards: list[str]
    samples: int
    counts: dict[str, int]


_USTAR_LIMIT = 0o77777777777  # the largest size an 11-digit octal field holds


def member_header(name: str, size: int) -> bytes:
    """The tar header of one member, identical to ``TarInfo.tobuf(PAX_FORMAT)`` for our fixed fields.

    Short ASCII names (the common case) are packed directly, several times faster than
    building a TarInfo; anything else (long or non-ASCII names, huge members) goes through
    tarfile, which adds the PAX records.
    """
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) < 100 and raw.isascii() and size <= _USTAR_LIMIT:
        header = bytearray(BLOCK)
        header[0 : len(raw)] = raw
        header[100:108] = b"0000644\0"
        header[108:116] = b"0000000\0"
        header[116:124] = b"0000000\0"
        header[124:136] = b"%011o\0" % size
        header[136:148] = b"%011o\0" % MTIME
        header[148:156] = b"        "
        header[156] = ord("0")
        header[257:265] = b"ustar\x0000"
        # The byte sum, from Adler-32's low half (1 + sum mod 65521): exact here, since a
        # header with a sub-100-byte ASCII name sums to far less than 65521.
        header[148:155] = b"%06o\0" % ((zlib.adler32(header) & 0xFFFF) - 1)
        return bytes(header)
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = MTIME
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


_ZEROS = bytes(BLOCK)


_IOV_MAX = 1024  # the fewest buffers one writev takes on Linux


def _write_all(fd: int, parts: list[bytes]) -> None:
    """Write the parts with as few system calls as the kernel allows (``writev``, no copying)."""
    for i in range(0, len(parts), _IOV_MAX):
        chunk = parts[i : i + _IOV_MAX]
        written = os.writev(fd, chunk)
        if written < sum(map(len, chunk)):  # a short write: finish from a joined copy of what is left
            rest = b"".join(chunk)[written:]
            while rest:
                rest = rest[os.write(fd, rest) :]


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    head, _, tail = pattern.partition("%")
    m = re.match(r"0?(\d*)d", tail)
    if not m:
        raise ShardError(f"shard pattern {pattern!r} needs one %d field, e.g. %05d.tar")
    rest = tail[m.end() :]
    return re.compile(re.escape(head) + r"(\d+)" + re.escape(rest) + r"$")


class ShardWriter:
    """Write samples into numbered shards under ``maxcount`` / ``maxsize`` limits.

    ``write(key, members)`` takes a whole sample (extension -> bytes), so its
    members are always adjacent; members are written in sorted extension order
    with fixed mtime, owner and mode, so the same samples give the same bytes.
    """

    def __init__(
        self,
        dest: str,
        *,
        pattern: str = "%05d.tar",
        name: Callable[[int], str] | None = None,
        maxcount: int = 1000,
        maxsize: int | None = None,
        stage: str | None = None,
        count_file: bool = True,
        on_shard: Callable[[str, int, int], None] | None = None,
        publishing: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
    ):
        """``name``: shard number -> file name (default ``pattern % n``); ``stage``: the local folder where
        shards are built (default: :func:`fgdata.storage.staging_dir`, which is ``dest`` itself when local);
        ``count_file``: rewrite ``shard_count.json`` when the writer closes (a job core that assembles it
        itself passes False); ``on_shard(name, samples, size)``: called once each shard is in place;
        ``publishing``: a context the move into place runs in (the job core defers stop signals there)."""
        if maxcount < 1:
            raise ShardError("maxcount must be at least 1")
        if maxsize is not None and maxsize < BLOCK * 4:
            raise ShardError("maxsize must be at least 2048 bytes")
        self.dest = dest.rstrip("/") or dest
        if name is None:
            _pattern_regex(pattern)
        self._name = name or (lambda n: pattern % n)
        self.maxcount = maxcount
        self.maxsize = maxsize
        self._stage = stage or storage.staging_dir(self.dest)
        os.makedirs(self._stage, exist_ok=True)
        self._builds_in_dest = storage.within(self._stage, self.dest) is not None
        self._count_file = count_file
        self._on_shard = on_shard
        self._publishing = publishing
        self._keys: set[str] = set()
        self._counts: dict[str, int] = {}
        self._shards: list[str] = []
        self._shard_no = 0
        self._file: BinaryIO | None = None
        self._tmp: str | None = None
        self._entries: list[SampleEntry] = []
        self._bytes = 0
        self._closed = False

    @property
    def shard_no(self) -> int:
        """The number of the shard the next sample goes to (or opens)."""
        return self._shard_no

    def _where(self) -> str:
        """The file being written, for an error (a full disk): the shard's own path when it is built in DST,
        else the local file it is built in (a node's cache, for an s3:// DST), with the shard it becomes."""
        final = storage.join(self.dest, self._name(self._shard_no))
        if self._builds_in_dest:
            return final
        return f"{self._tmp or self._stage} (the local build of {final})"

    def _open(self) -> None:
        with storage.writing_to(self._where()):
            fd, self._tmp = open_temp(self._stage, self._name(self._shard_no))
        self._file = os.fdopen(fd, "wb", buffering=0)  # whole samples go out in one writev
        self._entries = []
        self._bytes = 0

    def write(self, key: str, members: dict[str, bytes]) -> None:
        """Append one sample; raise ShardError for a bad or duplicate key or extension."""
        if self._closed:
            raise ShardError("writer is closed")
        validate_key(key)
        if not members:
            raise ShardError(f"sample {key!r} has no members")
        exts: dict[str, bytes] = {}
        for ext, data in members.items():
            low = validate_extension(ext)
            if low in exts:
                raise ShardError(f"sample {key!r} has extension {low!r} twice")
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise ShardError(f"sample {key!r} member {low!r} must be bytes, not {type(data).__name__}")
            exts[low] = bytes(data)
        if key in self._keys:
            raise ShardError(f"sample key {key!r} is not unique in {self.dest}")
        headers = [(ext, member_header(f"{key}.{ext}", len(exts[ext]))) for ext in sorted(exts)]
        size = sum(len(h) + (len(exts[e]) + BLOCK - 1) // BLOCK * BLOCK for e, h in headers)
        if self._file is not None and self._full(size):
            self._close_shard()
        if self._file is None:
            self._open()
        assert self._file is not None
        start = self._bytes
        offsets: dict[str, tuple[int, int]] = {}
        parts: list[bytes] = []
        pos = start
        for ext, header in headers:
            data = exts[ext]
            pos += len(header)
            offsets[ext] = (pos, len(data))
            pad = -len(data) % BLOCK
            parts += (header, data, _ZEROS[:pad]) if pad else (header, data)
            pos += len(data) + pad
        with storage.writing_to(self._where()):
            _write_all(self._file.fileno(), parts)
        self._bytes = pos
        self._entries.append(SampleEntry(key, start, pos, offsets))
        self._keys.add(key)

    def _full(self, size: int) -> bool:
        """Whether the open shard closes before a sample of ``size`` bytes (headers and padding included)."""
        return len(self._entries) >= self.maxcount or (
            self.maxsize is not None and bool(self._entries) and self._bytes + size + 2 * BLOCK > self.maxsize)

    def _close_shard(self) -> None:
        total = self._seal()
        assert self._tmp is not None
        name = self._name(self._shard_no)
        final = storage.join(self.dest, name)
        # A stop may land while the shard is staged (s3 under a lease: a long upload to the job's own prefix) ...
        staged = storage.stage(self._tmp, final)
        if staged != self._tmp:  # uploaded, and the local file removed
            self._tmp = None
        with self._publishing():  # ... but not while it is moved into place
            # The index first: a shard never sits under its final name without one; a stale index is told apart
            # by its size and the headers of its first and last samples (fgdata.shards.index.load_index).
            write_index(ShardScan(shard=final, size=total, samples=self._entries), final)
            storage.publish(staged, final)
        self._tmp = None
        self._counts[name] = len(self._entries)
        self._shards.append(final)
        self._shard_no += 1
        self._entries = []
        self._bytes = 0
        if self._on_shard is not None:
            self._on_shard(name, self._counts[name], total)

    def _seal(self) -> int:
        """Pad the open shard to whole records and close its file; returns its size."""
        assert self._file is not None and self._tmp is not None
        end = self._bytes + 2 * BLOCK
        total = (end + RECORD - 1) // RECORD * RECORD
        with storage.writing_to(self._where()):
            _write_all(self._file.fileno(), [bytes(total - self._bytes)])
        self._file.close()  # no fsync: the rename is atomic against a crashed process, which is what resume relies on
        self._file = None
        return total

    def close(self) -> WriteSummary:
        """Close the last shard (and write ``shard_count.json`` when asked); return what was written."""
        if not self._closed:
            if self._file is not None and self._entries:
                self._close_shard()
            elif self._file is not None:
                self._file.close()
                os.unlink(self._tmp)  # type: ignore[arg-type]
                self._file = self._tmp = None
            if self._count_file:
                write_shard_counts(storage.join(self.dest, COUNT_FILE), self._counts)
            self._closed = True
        return WriteSummary(shards=list(self._shards), samples=sum(self._counts.values()), counts=dict(self._counts))

    def abort(self) -> None:
        """Stop without closing the open shard (its temporary file is removed)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = None
        self._closed = True

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
