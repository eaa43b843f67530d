"""Header-only tar scanning: count samples and recover byte offsets without reading payloads.

On a seekable file each member costs one 512-byte read and one seek, so counting
a shard of large samples reads a tiny fraction of its bytes. GNU long names
(``L``) and PAX extended headers (``x``) are honoured; global PAX headers are
skipped. Damage (bad header checksum, truncation) stops the scan and is reported
with the samples that were complete before it.
"""

from __future__ import annotations

import io
import os
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterator

from fgdata.shards.keys import split_member_name

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
# The most one ``pread``/``read`` system call returns on Linux; longer reads loop.
MAX_READ = 0x7FFFF000
# GNU long names and PAX records longer than this are damage: no real header needs more,
# and a forged size must not make the scanner allocate it.
MAX_EXTENSION_HEADER = 1 << 20
_STREAM_CHUNK = 64 << 20
_FILE_TYPES = ("0", "", "7")
_TYPEFLAG = {bytes([c]): ("" if c == 0 else chr(c)) for c in range(256)}
# What a type flag means to the scan (one dict lookup per header): a regular file; a type whose size
# means nothing (links, devices, directories, FIFOs: no data follows); an extension header (GNU long
# name or link, PAX); a GNU sparse file; anything else (its data is stepped over, as tarfile does).
_FILE, _NO_DATA, _EXTENSION, _SPARSE, _OTHER = range(5)
_CLASS = {t: _OTHER for t in _TYPEFLAG}
_CLASS.update({b"0": _FILE, b"\0": _FILE, b"7": _FILE, b"S": _SPARSE})
_CLASS.update(dict.fromkeys((b"1", b"2", b"3", b"4", b"5", b"6"), _NO_DATA))
_CLASS.update(dict.fromkeys((b"L", b"K", b"x", b"X", b"g"), _EXTENSION))
_OCTAL_DIGITS = b"01234567"


@dataclass(slots=True)
class MemberEntry:
    """One tar member: where its headers start, where its data starts, how long the data is.

    ``header_offset`` is the first of the member's headers, its GNU long-name or PAX
    extended header when it has one, so a sample's byte range holds all of its headers.
    """

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
    """Raised inside the member iterator; carries a one-line reason and the byte where the damage is.

    ``member`` names the member whose payload was cut short, when its header was
    intact: a sample before it is then known to be complete.
    """

    def __init__(self, reason: str, offset: int, member: str | None = None):
        super().__init__(reason)
        self.offset = offset
        self.member = member


def _number(raw: bytes, what: str, offset: int) -> int:
    """A non-negative numeric header field: octal digits (space or NUL padded) or GNU base-256.

    Anything else, a negative number included, is damage: a negative size would send the
    scan backwards.
    """
    if raw and raw[0] & 0x80:
        if raw[0] == 0x80:
            return int.from_bytes(raw[1:], "big")
        raise TarDamage(f"bad tar header at byte {offset}: {what} is a negative or invalid base-256 number", offset)
    text = raw.split(b"\0", 1)[0].strip()
    if not text:
        return 0
    if text.strip(_OCTAL_DIGITS):
        shown = text[:12].decode("ascii", "replace")
        raise TarDamage(f"bad tar header at byte {offset}: {what} {shown!r} is not a non-negative octal number", offset)
    return int(text, 8)


def _checksum_ok(header: bytes, offset: int) -> bool:
    """Verify the header checksum (the byte sum with the checksum field read as spaces).

    The byte sum comes from zlib's Adler-32, whose low half is ``1 + sum mod 65521``:
    one C call instead of a Python-level sum. A header's sum is at most 512 * 255 < 2 * 65521,
    so the true sum is one of two candidates, and both are accepted. Old tars that summed
    signed bytes are accepted too (checked only when the unsigned sum fails).
    """
    stored = header[148:156]
    digits = stored[:6]
    try:
        if digits.isdigit() and stored[6] in (0, 32):  # the usual "%06o\0 "
            expected = int(digits, 8)
        else:
            expected = _number(stored, "checksum", offset)
    except (TarDamage, ValueError):
        return False
    low = (zlib.adler32(header) & 0xFFFF) - 1
    adjust = 8 * 32 + 1 - (zlib.adler32(stored) & 0xFFFF)  # the same low half: the field's exact sum, at most 2040
    if expected in (low % 65521 + adjust, low % 65521 + 65521 + adjust):
        return True
    unsigned = sum(header) + adjust
    high = sum(1 for b in header[:148] + header[156:] if b & 0x80)
    return expected == unsigned - 256 * high


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax_records(payload: bytes, offset: int) -> dict[str, str]:
    """PAX records ``"<length> <key>=<value>\\n"`` up to the NUL padding; a malformed record is damage.

    Every record moves the parse forward by its declared length, which must be positive.
    """
    records: dict[str, str] = {}
    pos = 0
    while pos < len(payload) and payload[pos]:
        space = payload.find(b" ", pos, pos + 21)
        digits = payload[pos:space] if space > pos else b""
        length = int(digits) if digits.isdigit() else 0
        end = pos + length
        key, eq, value = payload[space + 1 : end - 1].partition(b"=")
        if length <= 0 or end > len(payload) or payload[end - 1 : end] != b"\n" or not eq or not key:
            raise TarDamage(f"bad PAX record at byte {offset}", offset)
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return records


class _PositionedRaw(io.RawIOBase):
    """A raw reader over ``fd`` that keeps its own position (``preadv``): the file's offset is untouched."""

    def __init__(self, fd: int, pos: int):
        self.fd = fd
        self.pos = pos

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        n = os.preadv(self.fd, [buffer], self.pos)
        self.pos += n
        return n


def pread_exact(fd: int, n: int, offset: int) -> bytes:
    """``n`` bytes at ``offset``, fewer only at the end of the file.

    One ``pread`` returns at most :data:`MAX_READ` bytes; a longer read is filled by a
    buffered reader that reads straight into the one result object, so a member over
    2 GiB costs its size in memory once.
    """
    if n <= MAX_READ:
        data = os.pread(fd, n, offset)
        if len(data) == n or not data:
            return data
        chunks = [data]
        got = len(data)
        while got < n:
            chunk = os.pread(fd, n - got, offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    with io.BufferedReader(_PositionedRaw(fd, offset), buffer_size=1 << 20) as reader:
        return reader.read(n)


class _Source:
    """Forward reads over a stream, or over a seekable file (skips become seeks)."""

    def __init__(self, fileobj: BinaryIO, seekable: bool, total: int | None):
        self.f = fileobj
        self.seekable = seekable
        self.total = total
        self.pos = 0

    def read_exact(self, n: int) -> bytes:
        """Read n bytes, fewer only at the end of the data.

        Streams may return short reads; long reads go in chunks, so a forged size costs
        at most the bytes that really follow.
        """
        if self.total is not None:
            n = min(n, max(self.total - self.pos, 0))
        chunks = []
        remaining = n
        while remaining:
            chunk = self.f.read(min(remaining, _STREAM_CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
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
    json), and skipping a payload is arithmetic: no seek calls, no page mapping. A caller
    that reads the payloads itself later passes ``window=BLOCK``: headers only.
    """

    WINDOW = 4096

    def __init__(self, fd: int, total: int, window: int = WINDOW):
        self.fd = fd
        self.total = total
        self.window = window
        self.pos = 0
        self.buf = b""
        self.buf_start = 0

    def read_exact(self, n: int) -> bytes:
        pos = self.pos
        off = pos - self.buf_start
        if off + n <= len(self.buf):
            data = self.buf[off : off + n]
        elif n <= self.window:
            self.buf = os.pread(self.fd, self.window, pos)
            self.buf_start = pos
            data = self.buf[:n]
        else:  # a payload: never ask for more than the file holds
            data = pread_exact(self.fd, min(n, max(self.total - pos, 0)), pos)
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
    with_data: bool | Callable[[str], bool] = False, max_data: int | None = None,
    read_ahead: int = _PreadSource.WINDOW,
) -> Iterator[tuple[MemberEntry, bytes | None]]:
    """Yield (member, data-or-None) for every member; raise TarDamage on corruption.

    With ``with_data`` (True, or a predicate on the member name) the payload of those
    regular files is read and returned, unless it is over ``max_data`` bytes (then None);
    other payloads are skipped: stepped over in a regular file (positioned reads), read
    and dropped in a stream. This loop is the cost of ``count-shards``, so it keeps
    per-member work to one header parse: of the steps below, only reading a checked header
    is a call on every member; extension headers are rare (``benchmarks/bench_scan.py``
    times the loop against an earlier checkout's).

    It cannot loop: every size is a validated non-negative number and every step moves
    forward by at least one block, so a shard of N bytes yields at most N / 512 members.
    """
    src = _open_source(fileobj, seekable, total, read_ahead)
    read, skip = src.read_exact, src.skip
    limit = -1 if not with_data else (max_data if max_data is not None else 1 << 80)
    wants = None if isinstance(with_data, bool) else with_data
    pending: int | None = None  # the first extension header (of any kind) not yet followed by its member
    extensions: list[tuple[int, bytes, bytes]] = []  # the member's own (offset, typeflag, payload), outermost first
    last_offset = -1
    while True:
        header_offset = src.pos
        if header_offset <= last_offset:  # cannot happen with validated sizes; the guarantee is checked, not assumed
            raise TarDamage(f"tar header offsets do not increase at byte {header_offset}", header_offset)
        last_offset = header_offset
        header = _read_header(read, header_offset, pending)
        if header is None:
            return
        typeflag = header[156:157]
        cls = _CLASS[typeflag]
        raw_size = header[124:135]  # the usual "%011o\0" is parsed here, anything else by _number
        if header[135] in (0, 32) and not raw_size.strip(_OCTAL_DIGITS):
            size = int(raw_size, 8)
        else:
            size = _number(header[124:136], "size field", header_offset)
        if cls == _EXTENSION:
            if pending is None:
                pending = header_offset
            _read_extension(read, typeflag, size, header_offset, extensions)
            continue
        if cls == _SPARSE:
            raise TarDamage(f"GNU sparse member at byte {header_offset} (not supported in shards)", header_offset)
        name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if typeflag == b"\0" and name.endswith("/"):  # V7 marks a directory by a slash after its own name
            cls = _NO_DATA
        if header[345] and header[257:263] == b"ustar\0":  # POSIX ustar: a path prefix may be present
            name = f"{_cstr(header[345:500])}/{name}"
        start = header_offset
        if extensions:
            start, name, size = _apply_extensions(extensions, name, size)
            extensions = []
        pending = None
        data_offset = src.pos
        if cls == _NO_DATA:
            yield MemberEntry(name, start, data_offset, size, "5" if typeflag == b"\0" else _TYPEFLAG[typeflag], data_offset), None
            continue
        padded = (size + BLOCK - 1) & -BLOCK
        entry = MemberEntry(name, start, data_offset, size, _TYPEFLAG[typeflag], data_offset + padded)
        if cls != _FILE or size > limit or (wants is not None and not wants(name)):
            if not skip(padded):
                raise TarDamage(f"truncated member {name!r} at byte {data_offset}", data_offset, member=name)
            yield entry, None
        else:
            data = read(size)
            if len(data) < size or not skip(padded - size):
                raise TarDamage(f"truncated member {name!r} at byte {data_offset}", data_offset, member=name)
            yield entry, data


def _open_source(fileobj: BinaryIO, seekable: bool, total: int | None, read_ahead: int) -> _Source | _PreadSource:
    """Positioned reads where the shard is a regular file of known size, else forward reads over the stream."""
    if seekable and total is not None:
        try:
            return _PreadSource(fileobj.fileno(), total, read_ahead)
        except (AttributeError, OSError):  # io.UnsupportedOperation is an OSError: an in-memory file
            pass
    return _Source(fileobj, seekable, total)


def _read_header(read: Callable[[int], bytes], offset: int, pending: int | None) -> bytes | None:
    """The next header, its checksum verified; None where the archive ends (no more data, or a zero block).

    An end that leaves an extension header (at ``pending``) without its member is damage.
    """
    header = read(BLOCK)
    if len(header) < BLOCK:
        if not header and pending is None:
            return None
        raise TarDamage(f"truncated tar header at byte {offset}", offset)
    if header == ZERO_BLOCK:
        if pending is not None:
            raise TarDamage(f"extended header at byte {pending} is followed by the end of the archive", offset)
        return None
    if not _checksum_ok(header, offset):
        raise TarDamage(f"bad tar header checksum at byte {offset}", offset)
    return header


def _read_extension(read: Callable[[int], bytes], typeflag: bytes, size: int, offset: int,
                    extensions: list[tuple[int, bytes, bytes]]) -> None:
    """Read a GNU long-name or PAX header's payload; one for the next member is added to ``extensions``.

    A global PAX header belongs to the archive, not to the next member: it is read and checked only.
    """
    if size > MAX_EXTENSION_HEADER:
        raise TarDamage(f"bad tar header at byte {offset}: extended header of {size} bytes", offset)
    padded = (size + BLOCK - 1) & -BLOCK
    payload = read(padded)
    if len(payload) < padded:
        raise TarDamage(f"truncated extended header at byte {offset}", offset)
    if typeflag != b"g":
        extensions.append((offset, typeflag, payload))
    elif {"path", "size"} & _pax_records(payload, offset).keys():
        raise TarDamage(f"global PAX header at byte {offset} sets a path or size for every "
                        "member (not supported in shards)", offset)


def _apply_extensions(extensions: list[tuple[int, bytes, bytes]], name: str, size: int) -> tuple[int, str, int]:
    """(where the member's headers start, its name, its size) once its extension headers are applied.

    The outermost header has the last word, as in tarfile.
    """
    start = extensions[0][0]
    for _, kind, payload in reversed(extensions):
        if kind == b"L":
            name = _cstr(payload)
        elif kind in (b"x", b"X"):
            pax = _pax_records(payload, start)
            if any(k.startswith("GNU.sparse.") for k in pax):
                raise TarDamage(f"GNU sparse member at byte {start} (not supported in shards)", start)
            if "path" in pax:
                name = pax["path"]
            if "size" in pax:
                if not (pax["size"].isascii() and pax["size"].isdigit()):
                    raise TarDamage(f"bad PAX size {pax['size'][:24]!r} at byte {start}", start)
                size = int(pax["size"])
    return start, name, size


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


def scan_fileobj(shard: str, fileobj: BinaryIO, *, seekable: bool, total: int | None,
                 read_ahead: int = _PreadSource.WINDOW) -> ShardScan:
    """Scan an open shard; see :func:`scan_shard`."""
    problems: list[str] = []
    samples: list[SampleEntry] = []
    damage = None
    try:
        for sample, _ in group_samples(iter_members(fileobj, seekable=seekable, total=total, read_ahead=read_ahead), problems):
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


def scan_shard(path: str, read_ahead: int = _PreadSource.WINDOW) -> ShardScan:
    """Header-only scan of a shard: payloads are seeked over where the storage allows, else streamed and discarded.

    ``read_ahead``: bytes fetched per header read of a seekable shard; ``BLOCK`` reads exactly the
    headers (for a caller that reads the payloads itself afterwards).
    """
    from fgdata import storage

    with storage.open_read(path, buffering=4096) as f:
        if not f.seekable():
            return scan_fileobj(path, f, seekable=False, total=None)
        total = f.seek(0, os.SEEK_END)
        f.seek(0)
        return scan_fileobj(path, f, seekable=True, total=total, read_ahead=read_ahead)
