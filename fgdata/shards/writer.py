"""The shard writer: deterministic, atomic, resumable WebDataset tar shards.

Each shard is written to a private temporary file (``O_EXCL|O_NOFOLLOW``, an unpredictable
name: :func:`fgdata.jobs.dest.open_temp`); when it closes, its offset index (with the
writer's resume record) is written, the shard is renamed into place (or uploaded, for
s3://, from a staging folder that is never the system temp folder; under a job's lease to the
job's staging prefix first, which a stop may interrupt, then moved into place), and
``shard_count.json`` is rewritten. A rerun after a crash removes the temporaries, keeps the
complete shards, drops the partial one and tells the caller (``resume_point``) which input
to continue from, so it ends with the same bytes as an uninterrupted run.

Given ``stamps`` (input position -> a stamp of that input's content, :mod:`fgdata.sources.stamps`), each shard
also leaves ``.fgdata/inputs/<shard>.json`` (the stamps of the inputs it covers, written once the shard is in
place, so a stamp never vouches for bytes that are not there), and a rerun lists, per complete shard, the inputs
that changed since (:attr:`ShardRecord.changed`). The stamps stay out of the shards and their indexes, so the output bytes never
depend on file times. :meth:`ShardWriter.rewind` and :meth:`ShardWriter.adopt` let the job rewrite exactly the
shards whose inputs changed (see :func:`fgdata.jobs.shard.write_range`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from fgdata import storage
from fgdata.errors import ShardError
from fgdata.jobs import testhook
from fgdata.jobs.dest import clean_temps, open_temp
from fgdata.jobs.signals import critical
from fgdata.shards.index import COUNT_FILE, index_path, parse_index, write_index, write_shard_counts
from fgdata.shards.keys import validate_extension, validate_key
from fgdata.shards.scan import BLOCK, SampleEntry, ShardScan

RECORD = 20 * BLOCK  # tar's record size; archives are padded to it, as GNU tar and Python's tarfile do
MTIME = 0
INPUTS_DIR = ".fgdata/inputs"  # per shard: the stamps of the inputs it covers


@dataclass
class Failure:
    """One input that produced no sample, and why; also a warning about an input that was written."""

    input: int | None
    name: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"input": self.input, "name": self.name, "reason": self.reason}


@dataclass
class ShardRecord:
    """What a rerun knows of one complete shard: the input positions it covers and which of them changed since."""

    name: str
    input_start: int
    input_end: int
    first_size: int  # bytes of its first sample: whether that sample still fits after a rewritten shard
    last_key: str
    changed: list[int] = field(default_factory=list)


@dataclass
class ResumePoint:
    """Where a resumed job continues: the first input not covered by a complete shard."""

    next_input: int = 0
    samples: int = 0
    shards: int = 0
    failures: list[Failure] = field(default_factory=list)
    warnings: list[Failure] = field(default_factory=list)
    records: list[ShardRecord] = field(default_factory=list)


@dataclass
class WriteSummary:
    shards: list[str]
    samples: int
    failures: list[Failure]
    counts: dict[str, int]
    warnings: list[Failure] = field(default_factory=list)  # inputs written with a part missing or changed


_USTAR_LIMIT = 0o77777777777  # the largest size an 11-digit octal field holds


def _member_header(name: str, size: int) -> bytes:
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
        maxcount: int = 1000,
        maxsize: int | None = None,
        resume: bool = True,
        stage: str | None = None,
        stamps: Callable[[int], str] | None = None,
        first_input: int = 0,
    ):
        """``stage``: where an s3:// destination's shards are built (default: this host's staging folder);
        ``stamps``: input position -> its stamp, to record and compare (see the module docstring);
        ``first_input``: the first input position this writer covers (a work unit's)."""
        if maxcount < 1:
            raise ShardError("maxcount must be at least 1")
        if maxsize is not None and maxsize < BLOCK * 4:
            raise ShardError("maxsize must be at least 2048 bytes")
        self.dest = dest.rstrip("/") or dest
        self.pattern = pattern
        self._regex = _pattern_regex(pattern)
        self.maxcount = maxcount
        self.maxsize = maxsize
        self._stage = stage or storage.staging_dir(self.dest)
        os.makedirs(self._stage, exist_ok=True)
        self._keys: set[str] = set()
        self._counts: dict[str, int] = {}
        self._failures: list[Failure] = []
        self._pending: list[Failure] = []
        self._warnings: list[Failure] = []
        self._pending_warnings: list[Failure] = []
        self._first_input = first_input
        self._shard_no = 0
        self._input_end = first_input
        self._file: BinaryIO | None = None
        self._tmp: str | None = None
        self._entries: list[SampleEntry] = []
        self._bytes = 0
        self._closed = False
        self._closed_here = 0  # shards closed by this writer (the test hook counts them)
        self._stamps = stamps
        self._shard_start = first_input  # the first input position the open shard covers
        self.inputs_done = 0  # inputs covered by complete shards: what a rerun will not redo
        clean_temps(self._stage)
        self.resume_point = self._load_resume() if resume else self._start_over()

    # -- job state ---------------------------------------------------------

    def _options(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "maxcount": self.maxcount, "maxsize": self.maxsize}

    def _existing(self) -> dict[int, storage.FileInfo]:
        if not storage.is_dir(self.dest):
            return {}
        found = {}
        for info in storage.list_dir(self.dest):
            m = self._regex.match(info.name)
            if m:
                found[int(m.group(1))] = info
        return found

    def _stamps_path(self, name: str) -> str:
        return storage.join(self.dest, INPUTS_DIR, name + ".json")

    def _remove_shard(self, info: storage.FileInfo) -> None:
        storage.remove(info.path)
        for side in (index_path(info.path), self._stamps_path(info.name)):
            if storage.exists(side):
                storage.remove(side)

    def _start_over(self) -> ResumePoint:
        for info in self._existing().values():
            self._remove_shard(info)
        count_file = storage.join(self.dest, COUNT_FILE)
        if storage.exists(count_file):
            storage.remove(count_file)
        return ResumePoint()

    def _changed(self, name: str, start: int, end: int) -> list[int]:
        """Positions in ``[start, end)`` whose stamp differs from the one recorded with shard ``name``."""
        if self._stamps is None:
            return []
        try:
            doc = json.loads(storage.read_bytes(self._stamps_path(name)))
            if (doc["start"], doc["end"]) != (start, end):
                raise ValueError("another range")
            recorded = doc["stamps"]
        except Exception:  # noqa: BLE001 - no usable record (a shard of an older fgdata): it cannot tell
            return []
        return [p for p, old in enumerate(recorded, start) if old != self._stamps(p)]

    def _take(self, info: storage.FileInfo) -> ShardRecord | None:
        """Count one existing shard as complete (its samples, keys and failures); None when it is not."""
        try:
            scan, job = parse_index(info.path, storage.read_bytes(index_path(info.path)))
        except Exception:  # noqa: BLE001 - no usable index: the shard is not known complete
            return None
        if scan.size != info.size or job is None:
            return None
        if job.get("options") != self._options():
            raise ShardError(
                f"{self.dest}: existing shards were written with {job.get('options')}, not {self._options()}; "
                "rerun with the same options or without resume to start over"
            )
        self._counts[info.name] = len(scan.samples)
        self._keys.update(s.key for s in scan.samples)
        self._failures.extend(Failure(f["input"], f["name"], f["reason"]) for f in job.get("failures", []))
        self._warnings.extend(Failure(f["input"], f["name"], f["reason"]) for f in job.get("warnings", []))
        start = self._input_end
        self._input_end = int(job.get("input_end", self._input_end + len(scan.samples)))
        self._shard_start = self._input_end
        self._shard_no += 1
        first = scan.samples[0] if scan.samples else None
        return ShardRecord(info.name, start, self._input_end, first.end - first.start if first else 0,
                           scan.samples[-1].key if scan.samples else "",
                           self._changed(info.name, start, self._input_end))

    def _load_resume(self, stop: int | None = None) -> ResumePoint:
        """Take the complete shards from the first on (``stop``: only those before it)."""
        existing = self._existing()
        records = []
        while self._shard_no in existing and (stop is None or self._shard_no < stop):
            record = self._take(existing[self._shard_no])
            if record is None:
                break
            records.append(record)
        return self._point(records)

    def _point(self, records: list[ShardRecord]) -> ResumePoint:
        self.inputs_done = self._input_end
        return ResumePoint(next_input=self._input_end, samples=sum(self._counts.values()), shards=self._shard_no,
                           failures=list(self._failures), warnings=list(self._warnings), records=records)

    def rewind(self, shard: int) -> None:
        """Continue from complete shard ``shard`` as if it and those after it were not written (their files stay
        until they are replaced, adopted or removed by :meth:`close`)."""
        if self._file is not None or self._closed:
            raise ShardError("rewind: the writer has already started writing")
        self._keys.clear()
        self._counts.clear()
        self._failures.clear()
        self._warnings.clear()
        self._shard_no = 0
        self._input_end = self._shard_start = self._first_input
        self.resume_point = self._load_resume(stop=shard)

    def lines_up(self, record: ShardRecord) -> bool:
        """Whether the open shard ends where the earlier run's shard before ``record`` ended: same number, same
        input position, and the next sample (``record``'s first) would not fit in it. Then the shards from
        ``record`` on can be kept as they are (:meth:`adopt`)."""
        number = self._regex.match(record.name)
        return (self._file is not None and bool(self._entries) and number is not None
                and int(number.group(1)) == self._shard_no + 1 and self._input_end == record.input_start
                and self._full(record.first_size))

    def adopt(self, stop: int) -> list[ShardRecord]:
        """Close the open shard, then keep the existing shards up to (not including) number ``stop`` as complete."""
        if self._file is not None and self._entries:
            self._close_shard()
        existing = self._existing()
        taken = []
        while self._shard_no < stop and self._shard_no in existing:
            record = self._take(existing[self._shard_no])
            if record is None:
                break
            taken.append(record)
        write_shard_counts(storage.join(self.dest, COUNT_FILE), self._counts)
        self.resume_point = self._point(self.resume_point.records + taken)
        return taken

    # -- writing -----------------------------------------------------------

    def _shard_name(self, n: int) -> str:
        return self.pattern % n

    def _open(self) -> None:
        fd, self._tmp = open_temp(self._stage, self._shard_name(self._shard_no))
        self._file = os.fdopen(fd, "wb", buffering=0)  # whole samples go out in one writev
        self._entries = []
        self._bytes = 0

    def write(self, key: str, members: dict[str, bytes], input_pos: int | None = None) -> None:
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
        headers = [(ext, _member_header(f"{key}.{ext}", len(exts[ext]))) for ext in sorted(exts)]
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
        with storage.writing_to(storage.join(self.dest, self._shard_name(self._shard_no))):
            _write_all(self._file.fileno(), parts)
        self._bytes = pos
        self._entries.append(SampleEntry(key, start, pos, offsets))
        self._keys.add(key)
        self._input_end = max(self._input_end, (input_pos + 1) if input_pos is not None else self._input_end + 1)

    def _full(self, size: int) -> bool:
        """Whether the open shard closes before a sample of ``size`` bytes (headers and padding included)."""
        return len(self._entries) >= self.maxcount or (
            self.maxsize is not None and bool(self._entries) and self._bytes + size + 2 * BLOCK > self.maxsize)

    def fail(self, input_pos: int | None, name: str, reason: str) -> None:
        """Record an input that produced no sample (it goes to the failure report)."""
        failure = Failure(input_pos, name, reason)
        self._pending.append(failure)
        if input_pos is not None:
            self._input_end = max(self._input_end, input_pos + 1)

    def warn(self, input_pos: int | None, name: str, reason: str) -> None:
        """Record a warning about an input whose sample was written (it goes to the failure report's warnings)."""
        self._pending_warnings.append(Failure(input_pos, name, reason))

    def _close_shard(self) -> None:
        total = self._seal()
        assert self._tmp is not None
        # A stop may land while the shard is staged (s3 under a lease: a long upload to the job's own prefix) ...
        staged = storage.stage(self._tmp, storage.join(self.dest, self._shard_name(self._shard_no)))
        if staged != self._tmp:  # uploaded, and the local file removed
            self._tmp = None
        with critical():  # ... but waits while it is moved into place and counted
            self._finish_shard(staged, total)
        self._closed_here += 1
        testhook.output_done(self._closed_here)

    def _seal(self) -> int:
        """Pad the open shard to whole records and close its file; returns its size."""
        assert self._file is not None and self._tmp is not None
        end = self._bytes + 2 * BLOCK
        total = (end + RECORD - 1) // RECORD * RECORD
        with storage.writing_to(storage.join(self.dest, self._shard_name(self._shard_no))):
            _write_all(self._file.fileno(), [bytes(total - self._bytes)])
        self._file.close()  # no fsync: the rename is atomic against a crashed process, which is what resume relies on
        self._file = None
        return total

    def _finish_shard(self, staged: str, total: int) -> None:
        name = self._shard_name(self._shard_no)
        final = storage.join(self.dest, name)
        scan = ShardScan(shard=final, size=total, samples=self._entries)
        job = {
            "options": self._options(),
            "input_end": self._input_end,
            "failures": [f.to_json() for f in self._pending],
        }
        if self._pending_warnings:
            job["warnings"] = [f.to_json() for f in self._pending_warnings]
        write_index(scan, final, job)
        storage.publish(staged, final)
        if self._stamps is not None:  # after the shard: a stamp never vouches for bytes that are not in place
            stamps = [self._stamps(p) for p in range(self._shard_start, self._input_end)]
            storage.write_bytes(self._stamps_path(name), json.dumps(
                {"start": self._shard_start, "end": self._input_end, "stamps": stamps}).encode())
        self._tmp = None
        self._counts[name] = len(self._entries)
        self._failures.extend(self._pending)
        self._pending = []
        self._warnings.extend(self._pending_warnings)
        self._pending_warnings = []
        write_shard_counts(storage.join(self.dest, COUNT_FILE), self._counts)
        self._shard_no += 1
        self._entries = []
        self._bytes = 0
        self._shard_start = self._input_end
        self.inputs_done = self._input_end

    def close(self) -> WriteSummary:
        """Close the last shard, drop stale shards past the end, and return what was written."""
        if not self._closed:
            if self._file is not None and self._entries:
                self._close_shard()
            elif self._file is not None:
                self._file.close()
                os.unlink(self._tmp)  # type: ignore[arg-type]
            for n, info in self._existing().items():
                if n >= self._shard_no:
                    self._remove_shard(info)
            write_shard_counts(storage.join(self.dest, COUNT_FILE), self._counts)
            self._failures.extend(self._pending)
            self._pending = []
            self._warnings.extend(self._pending_warnings)
            self._pending_warnings = []
            self._closed = True
            self.inputs_done = self._input_end
        names = [self._shard_name(n) for n in range(self._shard_no)]
        return WriteSummary(
            shards=[storage.join(self.dest, n) for n in names],
            samples=sum(self._counts.values()),
            failures=list(self._failures),
            counts=dict(self._counts),
            warnings=list(self._warnings),
        )

    def abort(self) -> None:
        """Stop without closing the open shard (its temporary file is removed; a staged copy goes with the job's
        staging prefix)."""
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
