"""Header-only tar scanning: count samples and recover byte offsets without reading payloads.

On a seekable file each member costs one 512-byte read and one seek, so counting
a shard of large samples reads a tiny fraction of its bytes. GNU long names
(``L``) and PAX extended headers (``x``) are honoured; global PAX headers are
skipped. Damage (bad header checksum, truncation) stops the scan and is reported
with the samples that were complete before it.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterator

from fgdata.shards.keys import split_member_name

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")
_FILE_TYPES = ("0", "", "7")
_TYPEFLAG = {bytes([c]): ("" if c == 0 else chr(c)) for c in range(256)}


@dataclass(slots=True)
class MemberEntry:
    """One tar member: where its header starts, where its data starts, how long the data is."""

    name: str
    header_offset: int
    data_offset: int
    size: int
    typeflag: str
    end: int  # offset just past the member's padded data

    @property
    def is_file(self) -> bool:
        return self.typeflag in _FILE_TYPES


@dataclass
class SampleEntry:
    """A sample: its key, the byte range of all its members, and each member's data range."""

    key: str
    start: int
    end: int
    members: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass
class ShardScan:
    """What a header scan learned about one shard."""

    shard: str
    size: int
    samples: list[SampleEntry]
    damage: str | None = None
    problems: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.samples)


class TarDamage(Exception):
    """Raised inside the member iterator; carries a one-line reason.

    ``member`` names the member whose payload was cut short, when its header was
    intact: a sample before it is then known to be complete.
    """

    def __init__(self, reason: str, member: str | None = None):
        super().__init__(reason)
        self.member = member


def _padded(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


def _octal(field_bytes: bytes) -> int:
    """Parse a numeric tar field: octal text or GNU base-256 for large values."""
    if field_bytes and field_bytes[0] & 0x80:
        value = int.from_bytes(field_bytes[1:], "big")
        return value
    text = field_bytes.split(b"\0", 1)[0].strip(b" \0")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError as exc:
        raise TarDamage(f"bad numeric header field {text[:16]!r}") from exc


def _checksum_ok(header: bytes) -> bool:
    """Verify the header checksum (the byte sum with the checksum field read as spaces).

    The byte sum comes from zlib's Adler-32, whose low half is ``1 + sum mod 65521``:
    one C call instead of a Python-level sum. A header's sum is at most 512 * 255 < 2 * 65521,
    so the true sum is one of two candidates, and both are accepted.
    """
    stored = header[148:156]
    try:
        expected = int(stored.strip(b" \0") or b"0", 8)
    except ValueError:
        return False
    low = (zlib.adler32(header) & 0xFFFF) - 1
    adjust = 8 * 32 - sum(stored)
    return expected in (low % 65521 + adjust, low % 65521 + 65521 + adjust)


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax_records(payload: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(payload):
        space = payload.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(payload[pos:space])
        except ValueError as exc:
            raise TarDamage("bad PAX header record") from exc
        if length <= 0:
            raise TarDamage("bad PAX header record")
        record = payload[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


class _Source:
    """Forward reads over a stream, or over a seekable file (skips become seeks)."""

    def __init__(self, fileobj: BinaryIO, seekable: bool, total: int | None):
        self.f = fileobj
        self.seekable = seekable
        self.total = total
        self.pos = 0

    def read_exact(self, n: int) -> bytes:
        """Read n bytes, fewer only at the end of the data (streams may return short reads)."""
        data = self.f.read(n) or b""
        if len(data) < n and data:
            chunks = [data]
            remaining = n - len(data)
            while remaining:
                chunk = self.f.read(remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            data = b"".join(chunks)
        self.pos += len(data)
        return data

    def skip(self, n: int) -> bool:
        """Skip n bytes; False if the data ends first."""
        if self.seekable:
            if self.total is not None and self.pos + n > self.total:
                self.pos = self.total
                return False
            self.f.seek(n, os.SEEK_CUR)
            self.pos += n
            return True
        remaining = n
        while remaining:
            chunk = self.f.read(min(remaining, 1 << 20))
            if not chunk:
                return False
            self.pos += len(chunk)
            remaining -= len(chunk)
        return True


class _PreadSource:
    """Positioned reads of a regular file with a small read-ahead window.

    One ``pread`` fetches a header together with the small members behind it (captions,
    json), and skipping a payload is arithmetic: no seek calls, no page mapping.
    """

    WINDOW = 4096

    def __init__(self, fd: int, total: int):
        self.fd = fd
        self.total = total
        self.pos = 0
        self.buf = b""
        self.buf_start = 0

    def read_exact(self, n: int) -> bytes:
        pos = self.pos
        off = pos - self.buf_start
        if off < 0 or off + n > len(self.buf):
            self.buf = os.pread(self.fd, max(n, self.WINDOW), pos)
            self.buf_start = pos
            off = 0
        data = self.buf[off : off + n]
        self.pos = pos + len(data)
        return data

    def skip(self, n: int) -> bool:
        if self.pos + n > self.total:
            self.pos = self.total
            return False
        self.pos += n
        return True


def iter_members(
    fileobj: BinaryIO, *, seekable: bool = True, total: int | None = None,
    with_data: bool | Callable[[str], bool] = False,
) -> Iterator[tuple[MemberEntry, bytes | None]]:
    """Yield (member, data-or-None) for every member; raise TarDamage on corruption.

    With ``with_data`` (True, or a predicate on the member name) the payload of those
    regular files is read and returned; otherwise it is skipped: stepped over in a regular file (positioned reads), read and dropped
    in a stream. This loop is the cost of ``count-shards``, so it
    keeps per-member work to one header parse.
    """
    src: _Source | _PreadSource
    if seekable and total is not None and hasattr(fileobj, "fileno"):
        src = _PreadSource(fileobj.fileno(), total)
    else:
        src = _Source(fileobj, seekable, total)
    read, skip = src.read_exact, src.skip
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        header_offset = src.pos
        header = read(BLOCK)
        if len(header) < BLOCK:
            if not header:
                return
            raise TarDamage(f"truncated tar header at byte {header_offset}")
        if header == ZERO_BLOCK:
            return
        if not _checksum_ok(header):
            raise TarDamage(f"bad tar header checksum at byte {header_offset}")
        typeflag = header[156:157]
        try:
            size = int(header[124:136].rstrip(b"\0 ") or b"0", 8)
        except ValueError:
            size = _octal(header[124:136])  # base-256 for members over 8 GiB, or damage
        padded = (size + BLOCK - 1) & -BLOCK
        if typeflag in (b"L", b"x", b"g"):
            payload = read(padded)
            if len(payload) < padded:
                raise TarDamage(f"truncated extended header at byte {header_offset}")
            if typeflag == b"L":
                long_name = payload[:size].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif typeflag == b"x":
                pax = _pax_records(payload[:size])
            continue
        name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if header[345] and header[257:263] == b"ustar\0":  # POSIX ustar: a path prefix may be present
            name = f"{_cstr(header[345:500])}/{name}"
        if long_name is not None or pax:
            if long_name is not None:
                name = long_name
            if "path" in pax:
                name = pax["path"]
            if "size" in pax:
                try:
                    size = int(pax["size"])
                except ValueError as exc:
                    raise TarDamage(f"bad PAX size at byte {header_offset}") from exc
                padded = (size + BLOCK - 1) & -BLOCK
            long_name = None
            pax = {}
        data_offset = src.pos
        entry = MemberEntry(name, header_offset, data_offset, size, _TYPEFLAG[typeflag], data_offset + padded)
        if typeflag not in _REGULAR:
            yield entry, None
        elif with_data is True or (with_data and with_data(name)):
            data = read(size)
            if len(data) < size or not skip(padded - size):
                raise TarDamage(f"truncated member {name!r} at byte {data_offset}", member=name)
            yield entry, data
        else:
            if not skip(padded):
                raise TarDamage(f"truncated member {name!r} at byte {data_offset}", member=name)
            yield entry, None


def group_samples(members: Iterator[tuple[MemberEntry, bytes | None]], problems: list[str]) -> Iterator[tuple[SampleEntry, dict[str, bytes]]]:
    """Group adjacent members with the same key into samples.

    At damage, the sample still open is yielded unless the damaged member belongs
    to it: its members so far are intact, while a sample whose own member was cut
    short is not readable.
    """
    current: SampleEntry | None = None
    data: dict[str, bytes] = {}
    try:
        for entry, payload in members:
            if entry.typeflag not in _FILE_TYPES:
                continue
            name = entry.name  # the key rule of split_member_name, inlined: this loop is count-shards' cost
            dot = name.find(".", name.rfind("/") + 1)
            key, ext = (name, "") if dot < 0 else (name[:dot], name[dot + 1 :].lower())
            if current is not None and key == current.key:
                if ext in current.members:
                    problems.append(f"{key}: extension {ext!r} repeats within the sample")
                current.members[ext] = (entry.data_offset, entry.size)
                current.end = entry.end
                if payload is not None:
                    data[ext] = payload
                continue
            if current is not None:
                yield current, data
            current = SampleEntry(key, entry.header_offset, entry.end, {ext: (entry.data_offset, entry.size)})
            data = {ext: payload} if payload is not None else {}
    except TarDamage as exc:
        if current is not None and (exc.member is None or split_member_name(exc.member)[0] != current.key):
            yield current, data
        raise
    if current is not None:
        yield current, data


def scan_fileobj(shard: str, fileobj: BinaryIO, *, seekable: bool, total: int | None) -> ShardScan:
    """Scan an open shard; see :func:`scan_shard`."""
    problems: list[str] = []
    samples: list[SampleEntry] = []
    damage = None
    try:
        for sample, _ in group_samples(iter_members(fileobj, seekable=seekable, total=total), problems):
            samples.append(sample)
    except TarDamage as exc:
        damage = str(exc)
    seen: set[str] = set()
    for s in samples:
        if s.key in seen:
            problems.append(f"{s.key}: key appears in more than one place (members not adjacent or duplicate key)")
        seen.add(s.key)
    size = total if total is not None else (samples[-1].end if samples else 0)
    return ShardScan(shard=shard, size=size, samples=samples, damage=damage, problems=problems)


def scan_shard(path: str) -> ShardScan:
    """Header-only scan of a local shard or an s3:// shard (streamed, payloads discarded)."""
    from fgdata import storage

    if storage.is_s3(path):
        with storage.open_read(path) as stream:
            scan = scan_fileobj(path, stream, seekable=False, total=None)
        return scan
    try:
        f = open(path, "rb", buffering=4096)
    except OSError as exc:
        from fgdata.errors import StorageError

        raise StorageError(f"{path}: {exc.strerror or exc}") from exc
    with f:
        total = os.fstat(f.fileno()).st_size
        return scan_fileobj(path, f, seekable=True, total=total)
