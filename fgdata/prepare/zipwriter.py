"""Deterministic, resumable writer for EDM dataset zips.

Python's ``zipfile`` stamps wall-clock times and cannot append to a zip whose central directory was never
written (a killed run), so this module writes the STORED format itself: local headers carry the sizes, which
lets a rerun scan the partial file, keep every complete member and continue from there. The bytes depend only
on the members, so reruns and resumed runs produce identical archives.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fgdata import __version__
from fgdata.errors import FgdataError
from fgdata.jobs.report import Failure

class _Record:
    """One ZIP record layout: named little-endian fields, packed from keywords so no call lists 17 bare numbers.

    ``fixed`` holds the fields whose value never changes here (signatures, versions fgdata always writes).
    """

    def __init__(self, fields: str, fixed: dict[str, int] | None = None) -> None:
        pairs = [f.split(":") for f in fields.split()]
        self.names = tuple(name for name, _ in pairs)
        self.struct = struct.Struct("<" + "".join(code for _, code in pairs))
        self.size = self.struct.size
        self.fixed = fixed or {}

    def pack(self, **values: int) -> bytes:
        merged = {**self.fixed, **values}
        return self.struct.pack(*(merged[name] for name in self.names))

    def unpack(self, data: bytes) -> dict[str, int]:
        return dict(zip(self.names, self.struct.unpack(data)))


_LOCAL = _Record("signature:I version:H flags:H method:H time:H date:H crc:I csize:I usize:I name_len:H extra_len:H",
                 fixed={"signature": 0x04034B50})
_CENTRAL = _Record("signature:I made_by:H version:H flags:H method:H time:H date:H crc:I csize:I usize:I name_len:H "
                   "extra_len:H comment_len:H disk:H internal_attr:H external_attr:I offset:I",
                   fixed={"signature": 0x02014B50})
_EOCD = _Record("signature:I disk:H cd_disk:H disk_entries:H entries:H cd_size:I cd_offset:I comment_len:H",
                fixed={"signature": 0x06054B50})
_EOCD64 = _Record("signature:I record_size:Q made_by:H version:H disk:I cd_disk:I disk_entries:Q entries:Q "
                  "cd_size:Q cd_offset:Q", fixed={"signature": 0x06064B50})
_LOCATOR64 = _Record("signature:I eocd64_disk:I eocd64_offset:Q disks:I", fixed={"signature": 0x07064B50})
_DOS_DATE = (1 << 5) | 1  # 1980-01-01
_DOS_TIME = 0  # 00:00:00
_UNIX_MODE = (0o100644 << 16)  # regular file, rw-r--r--
_MADE_BY_UNIX = 3 << 8
_LIMIT32 = 0xFFFFFFFF


_MODES = {"r": os.O_RDONLY, "rb": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
          "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "r+b": os.O_RDWR}


def open_nofollow(path: Path, mode: str) -> Any:
    """``open(path, mode)`` that refuses a symbolic link: the resumable partial files have fixed names in the
    output folder (a rerun must find them), so a planted link there must never redirect a write."""
    try:
        fd = os.open(path, _MODES[mode] | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FgdataError(f"{path}: is a symbolic link; refusing to write through it") from None
        raise
    return os.fdopen(fd, mode)


def member_name(index: int, stem: str = "img", ext: str = "png") -> str:
    """EDM member name for output index ``index``: ``00000/img00000000.png``."""
    s = f"{index:08d}"
    return f"{s[:5]}/{stem}{s}.{ext}"


def dataset_json_bytes(labels: list[list] | None) -> bytes:
    """``dataset.json`` exactly as ``json.dumps`` writes it with default settings."""
    return json.dumps({"labels": labels}).encode("ascii")


def provenance_path(dest: Path) -> Path:
    """The sibling file for provenance: never a member, never the zip's own name."""
    return dest.with_name(dest.name + ".provenance.json")


@dataclass(frozen=True)
class _Entry:
    name: bytes
    crc: int
    size: int
    offset: int


def _scan_local_entries(path: Path) -> list[_Entry]:
    """Complete STORED members at the start of a partial zip; stops at the first torn or foreign record."""
    entries: list[_Entry] = []
    total = path.stat().st_size
    with open(path, "rb") as fh:
        offset = 0
        while offset + _LOCAL.size <= total:
            fh.seek(offset)
            head = _LOCAL.unpack(fh.read(_LOCAL.size))
            if (head["signature"] != _LOCAL.fixed["signature"] or head["flags"] != 0 or head["method"] != 0
                    or head["csize"] != head["usize"]):
                break
            csize = head["csize"]
            end = offset + _LOCAL.size + head["name_len"] + head["extra_len"] + csize
            if end > total:
                break
            entries.append(_Entry(fh.read(head["name_len"]), head["crc"], csize, offset))
            offset = end
    return entries


def partial_paths(dest: Path) -> tuple[Path, Path]:
    """A killed run's resumable files for ``dest``: the members so far and the options they were written with."""
    return dest.with_name(dest.name + ".partial"), dest.with_name(dest.name + ".partial.json")


@dataclass(frozen=True)
class ZipState:
    """What a partial zip is written with (``<zip>.partial.json``): the fingerprint record of its run, the
    options that change bytes and the facts of its inputs (:class:`fgdata.prepare.options.Fingerprint`)."""

    record: dict[str, Any]

    def to_bytes(self) -> bytes:
        return json.dumps(self.record, sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes) -> ZipState | None:
        """The state in ``data``; None when it is torn or not a JSON object."""
        try:
            doc = json.loads(data)
        except ValueError:
            return None
        return cls(doc) if isinstance(doc, dict) else None


def read_partial_state(dest: Path) -> ZipState | None:
    """What an unfinished earlier run of ``dest`` was writing with; None when there is no such run (or its
    state is torn or foreign)."""
    partial, state = partial_paths(dest)
    if not partial.is_file() or partial.is_symlink():
        return None
    try:
        with open_nofollow(state, "rb") as fh:
            return ZipState.parse(fh.read())
    except (OSError, FgdataError):
        return None


@dataclass(frozen=True)
class Converted:
    """An input converted to RGB on the way in, and its source mode."""

    input: str
    mode: str

    def to_json(self) -> dict[str, str]:
        return {"input": self.input, "mode": self.mode}


@dataclass(frozen=True)
class Provenance:
    """``<zip>.provenance.json`` of a zip fgdata wrote (docs/FORMATS.md), read back.

    ``record`` is the document as written: the fingerprint record (compared key by key on a rerun), the
    transform and what each pass adds; the fields a rerun reads are typed beside it. A latent unit's part has
    no counts (``written`` None) and names its ``launch``.
    """

    record: dict[str, Any]
    written: int | None = None
    failures: tuple[Failure, ...] = ()
    converted: tuple[Converted, ...] = ()
    launch: str | None = None

    @classmethod
    def parse(cls, data: bytes) -> Provenance | None:
        """The provenance in ``data``; None when it is torn, foreign (not fgdata's) or malformed."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or not str(doc.get("tool", "")).startswith("fgdata"):
                return None
            written = doc.get("written")
            return cls(doc, None if written is None else int(written),
                       tuple(Failure(str(f["input"]), str(f["reason"])) for f in doc.get("failures") or ()),
                       tuple(Converted(str(c["input"]), str(c["mode"])) for c in doc.get("converted_modes") or ()),
                       doc.get("launch"))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    @classmethod
    def read(cls, dest: Path) -> Provenance | None:
        """The provenance beside ``dest``; None when it is missing, torn or foreign."""
        try:
            return cls.parse(provenance_path(dest).read_bytes())
        except OSError:
            return None


class EdmZipWriter:
    """Append members in index order to ``<dest>.partial``; :meth:`finish` adds ``dataset.json`` and renames.

    ``state`` describes the inputs and options. A partial file is resumed only when its recorded state is
    identical, so a rerun with other options never mixes two datasets.
    """

    def __init__(self, dest: str | os.PathLike[str], state: ZipState, resume: bool = True):
        self.dest = Path(dest)
        self.partial, self.state = partial_paths(self.dest)
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        state_bytes = state.to_bytes()
        entries: list[_Entry] = []
        if resume and read_partial_state(self.dest) == ZipState.parse(state_bytes):
            entries = _scan_local_entries(self.partial)
        else:
            self.partial.unlink(missing_ok=True)
            with open_nofollow(self.state, "wb") as fh:
                fh.write(state_bytes)
        self._entries = entries
        self._fh = open_nofollow(self.partial, "r+b" if entries else "wb")
        self._truncate_at(len(entries))

    def flush(self) -> None:
        """Push the members written so far to the file (a resumed run finds them complete)."""
        self._fh.flush()

    @property
    def count(self) -> int:
        """Members written so far (after a resume: the complete members found in the partial file)."""
        return len(self._entries)

    def names(self) -> list[str]:
        return [e.name.decode("utf-8") for e in self._entries]

    @property
    def size(self) -> int:
        """Bytes of members written so far."""
        return self._fh.tell()

    def keep_valid_prefix(self, expected: Callable[[int], str], limit: int | None = None) -> int:
        """Drop resumed members from the first one whose name differs from ``expected(i)`` (or beyond ``limit``)."""
        keep = 0
        for i, entry in enumerate(self._entries):
            if (limit is not None and i >= limit) or entry.name.decode("utf-8", "replace") != expected(i):
                break
            keep = i + 1
        self._truncate_at(keep)
        return keep

    def _truncate_at(self, count: int) -> None:
        del self._entries[count:]
        end = 0
        if self._entries:
            last = self._entries[-1]
            end = last.offset + _LOCAL.size + len(last.name) + last.size
        self._fh.seek(end)
        self._fh.truncate(end)

    def add(self, name: str, data: bytes | memoryview) -> None:
        """Append one STORED member with fixed timestamp and attributes."""
        raw = name.encode("utf-8")
        size = len(data)
        if size >= _LIMIT32 or not raw.isascii():
            raise FgdataError(f"{self.dest}: member {name!r} must have an ASCII name and be under 4 GiB")
        offset = self._fh.tell()
        crc = zlib.crc32(data)
        self._fh.write(_LOCAL.pack(version=20, flags=0, method=0, time=_DOS_TIME, date=_DOS_DATE, crc=crc, csize=size,
                                   usize=size, name_len=len(raw), extra_len=0))
        self._fh.write(raw)
        self._fh.write(data)
        self._entries.append(_Entry(raw, crc, size, offset))

    def finish(self, dataset_json: bytes | None, provenance: dict[str, Any] | None = None) -> Path:
        """Write ``dataset.json`` last, the central directory (Zip64 when needed), then rename into place."""
        if dataset_json is not None:
            self.add("dataset.json", dataset_json)
        cd_offset = self._fh.tell()
        for e in self._entries:
            extra = b""
            offset32 = e.offset
            version = 20
            if e.offset >= _LIMIT32:
                extra = struct.pack("<HHQ", 1, 8, e.offset)
                offset32 = _LIMIT32
                version = 45
            self._fh.write(_CENTRAL.pack(
                made_by=_MADE_BY_UNIX | version, version=version, flags=0, method=0, time=_DOS_TIME, date=_DOS_DATE,
                crc=e.crc, csize=e.size, usize=e.size, name_len=len(e.name), extra_len=len(extra), comment_len=0,
                disk=0, internal_attr=0, external_attr=_UNIX_MODE, offset=offset32))
            self._fh.write(e.name)
            self._fh.write(extra)
        cd_end = self._fh.tell()
        count, cd_size = len(self._entries), cd_end - cd_offset
        if count >= 0xFFFF or cd_offset >= _LIMIT32 or cd_size >= _LIMIT32:
            self._fh.write(_EOCD64.pack(record_size=44, made_by=45, version=45, disk=0, cd_disk=0, disk_entries=count,
                                        entries=count, cd_size=cd_size, cd_offset=cd_offset))
            self._fh.write(_LOCATOR64.pack(eocd64_disk=0, eocd64_offset=cd_end, disks=1))
        self._fh.write(_EOCD.pack(disk=0, cd_disk=0, disk_entries=min(count, 0xFFFF), entries=min(count, 0xFFFF),
                                  cd_size=min(cd_size, _LIMIT32), cd_offset=min(cd_offset, _LIMIT32), comment_len=0))
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self.partial, self.dest)
        self.state.unlink(missing_ok=True)
        if provenance is not None:
            write_provenance(self.dest, provenance)
        return self.dest

    def close(self) -> None:
        """Leave the partial file for a later resume (used on errors and interrupts)."""
        if not self._fh.closed:
            self._fh.flush()
            self._fh.close()


def write_provenance(dest: Path, info: dict[str, Any]) -> Path:
    """Write the provenance sibling atomically."""
    from fgdata import storage

    path = provenance_path(dest)
    text = json.dumps({"tool": f"fgdata {__version__}", **info}, indent=2, sort_keys=True) + "\n"
    storage.write_bytes(str(path), text.encode())
    return path


def validate_zip(path: Path, count: int, stem: str = "img", ext: str = "png") -> str | None:
    """Why an existing zip is not a complete ``count``-image dataset, or None if it is."""
    import zipfile

    if not path.is_file():
        return "missing"
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            if len(names) != count + 1 or names[-1] != "dataset.json":
                return f"has {len(names)} members, expected {count} images and dataset.json"
            if count and (names[0] != member_name(0, stem, ext) or names[-2] != member_name(count - 1, stem, ext)):
                return "member names differ from the expected ones"
            json.loads(zf.read("dataset.json"))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return f"unreadable ({exc})"
    return None
