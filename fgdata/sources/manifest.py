"""Manifest source: a CSV, JSONL or Parquet table (local, s3:// or http(s)://) with a path column, as work items.

Each row is one input, in row order (its ``index`` gives the key, see
:mod:`fgdata.sources.folder`). The path column holds a local path or a URL; a relative
path is taken relative to the manifest's folder (an http(s) manifest's URL without its query), and a
``file://`` URL names a local file. A manifest read from s3:// or http(s):// came from elsewhere: its rows
must be URLs (a relative path resolves to one), and a row naming a local file is a refused item
(``local-path``) unless ``allow_local_paths``. A row whose URL scheme fgdata cannot read is refused alone.
The item's name (the sample's ``fgdata.source``, and what reports call it) is the row's path with the
credentials of a URL redacted (:mod:`fgdata.storage.redact`); only the fetch uses it as given. The caption
column (optional) becomes the
``txt`` member; every other column is kept as JSON metadata (where ``--caption-field`` may find the
caption of a row without one, see :mod:`fgdata.producers.media`). CSV cells are text: a metadata cell
that reads as a plain number (``3``, ``-0.5``, ``1e-3``, but not ``007``) is stored as a JSON
number; the path and caption cells always stay text. CSV cells may be of any size.

A path that is not text (a JSON or Parquet number, list or object) makes that row a refused item,
reported with the row and the type it found; a caption that is not text is a warning of that row, which
is written without a caption (for prompts, where the caption is the sample, the row is refused).
Neither is ever stored as a Python repr.
A CSV row with more cells than the header is refused the same way, and so is a JSONL line that is
not valid JSON or not a JSON object (reported as ``FILE:line``, the line counted from 1): one bad
line never stops the job. Rows are counted from 0, like the ``input`` field of the failure report.

Manifests are streamed, never loaded whole: :func:`iter_manifest` and :func:`iter_prompts` read CSV
row by row, JSONL line by line and Parquet one row batch (:data:`PARQUET_BATCH_ROWS` rows) at a time,
and undo ``.gz`` and ``.zst`` compression as they read, so memory holds one batch (or one line), not the
file. A manifest that is not a local file (s3://, http(s)://) is first copied as it is to a temporary file in
fgdata's cache folder (``$FGDATA_CACHE``) and read from there: the job core reads rows as its units finish, and
a remote stream held open across such pauses can be dropped (an s3 stream then restarts from its first byte).
That costs disk, not memory (an http(s) body is held in memory while it is fetched, within the download body
limit). Parquet needs to seek: a compressed Parquet manifest is also copied, uncompressed, to a temporary file.
Whether the path (or caption) column exists is decided on the first readable row (a CSV header or a
Parquet schema gives every row the same columns); the refused JSONL lines before it are already yielded.
A manifest that ends without a row is an error when the stream ends; so is a compressed file that ends
early: never a shorter manifest.

:func:`iter_prompts` reads prompt-only inputs: a text file with one prompt per line (blank
lines skipped), or a manifest's caption column.
"""

from __future__ import annotations

import contextlib
import csv
import io
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO, Union

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.shards.metadata import parse_json
from fgdata.sources.folder import printable_name
from fgdata.workitem import WorkItem

MANIFEST_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".parquet")
#: Compressed text manifests (``list.csv.gz``, ``list.jsonl.zst``): the table type is the suffix before these.
COMPRESSED_SUFFIXES = (".gz", ".zst")
#: Rows of a Parquet manifest decoded at once: the memory bound of reading one.
PARQUET_BATCH_ROWS = 8192
_READ_BYTES = 1 << 16
#: Compressed bytes fed to the zstd decoder at once: a block of a few bytes can stand for 128 KiB, so small
#: feeds keep the decoded output of one step small even for a file made to inflate.
_ZSTD_FEED_BYTES = 1024
_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?")


def _uncompressed_name(path: str) -> str:
    lower = storage.without_query(path).lower()
    for suffix in COMPRESSED_SUFFIXES:
        if lower.endswith(suffix):
            return lower[: -len(suffix)]
    return lower


def is_manifest(path: str) -> bool:
    return _uncompressed_name(path).endswith(MANIFEST_SUFFIXES)


def text_cells(path: str) -> bool:
    """Whether the manifest's cells are all text (a CSV): an empty one then stands for a missing value."""
    return _uncompressed_name(path).endswith(".csv")


class _GzipStream(io.RawIOBase):
    """A ``.gz`` file (every member) decoded as it is read; damage (a file that ends early) is a one-line error."""

    def __init__(self, path: str, source: BinaryIO):
        import gzip

        super().__init__()
        self._path = path
        self._inner = gzip.GzipFile(fileobj=source, mode="rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        import gzip
        import zlib

        try:
            return self._inner.readinto(buffer)
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise FgdataError(f"{self._path}: not a readable gzip file ({e})") from None


class _ZstdStream(io.RawIOBase):
    """Every frame of a ``.zst`` file (``pzstd`` writes several), decoded as it is read; a file that ends inside
    a frame is an error, never a shorter manifest."""

    def __init__(self, path: str, source: BinaryIO, zstandard: Any):
        super().__init__()
        self._path = path
        self._source = source
        self._zstandard = zstandard
        self._frame = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False  # the current frame has been fed bytes and has not ended
        self._input = b""
        self._input_at = 0
        self._output = memoryview(b"")
        self._source_done = False

    def readable(self) -> bool:
        return True

    def _decode_some(self) -> bool:
        """Feed the decoder one small piece; False at the clean end of the file."""
        if self._input_at == len(self._input):
            self._input, self._input_at = (b"", 0) if self._source_done else (self._source.read(_READ_BYTES), 0)
            if not self._input:
                self._source_done = True
                if self._in_frame:
                    raise FgdataError(f"{self._path}: a truncated zstd file (it ends inside a frame)")
                return False
        end = self._input_at + _ZSTD_FEED_BYTES
        piece = self._input[self._input_at:end]
        self._input_at = min(end, len(self._input))
        try:
            self._output = memoryview(self._frame.decompress(piece))
        except self._zstandard.ZstdError as e:
            raise FgdataError(f"{self._path}: not a readable zstd file ({e})") from None
        self._in_frame = True
        if self._frame.eof:  # the frame ended inside this piece: the next frame starts with its unused bytes
            self._input, self._input_at = self._frame.unused_data + self._input[self._input_at:], 0
            self._frame = self._zstandard.ZstdDecompressor().decompressobj()
            self._in_frame = False
        return True

    def readinto(self, buffer: Any) -> int:
        while not len(self._output):
            if not self._decode_some():
                return 0
        n = min(len(buffer), len(self._output))
        buffer[:n] = self._output[:n]
        self._output = self._output[n:]
        return n


@contextlib.contextmanager
def _local(path: str) -> Iterator[str]:
    """``path`` when it is a local file, else a temporary copy in fgdata's cache folder (removed after).

    The job core reads its inputs as units finish, so the stream can pause for minutes: a remote read held open
    that long can be dropped by the server, and an s3 stream restarts from the first byte; a local copy cannot.
    """
    if storage.random_access(path):
        yield path
        return
    import os
    import tempfile

    from fgdata.storage.cache import cache_root

    os.makedirs(cache_root(), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".manifest-", dir=cache_root()) as folder:
        yield storage.local_copy(path, folder)


@contextlib.contextmanager
def _open_uncompressed(path: str) -> Iterator[BinaryIO]:
    """A binary stream of the manifest's table bytes: ``.gz`` and ``.zst`` undone as they are read."""
    lower = storage.without_query(path).lower()
    with _local(path) as local, storage.open_read(local) as source:
        if lower.endswith(".gz"):
            yield io.BufferedReader(_GzipStream(path, source), _READ_BYTES)
        elif lower.endswith(".zst"):
            try:
                import zstandard  # type: ignore[import-not-found, unused-ignore]
            except ImportError:
                raise FgdataError(f"{path}: reading .zst manifests needs zstandard: pip install zstandard") from None
            yield io.BufferedReader(_ZstdStream(path, source, zstandard), _READ_BYTES)
        else:
            yield source


def _cell(value: str) -> Any:
    if _NUMBER.fullmatch(value):
        number = float(value)
        return int(value) if value.lstrip("-").isdigit() else number
    return value


def _json_safe(value: Any) -> Any:
    """Parquet cells can be timestamps, decimals or bytes: make them JSON values, deterministically (a NaN
    cell, which JSON cannot hold, is null: it means a missing value)."""
    if isinstance(value, float) and value != value:
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    return str(value)


@dataclass(frozen=True)
class BadRow:
    """A manifest line that is not a row (not JSON, or not a JSON object): that item fails, not the job."""

    name: str  # "FILE:line"
    reason: str


Row = Union[dict[str, Any], BadRow]


def _text_lines(path: str, stream: BinaryIO) -> Iterator[str]:
    """The UTF-8 text of ``stream`` (a BOM dropped), cut into lines exactly as ``str.splitlines`` cuts the whole."""
    text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="\n")
    try:
        for chunk in text:  # every separator splitlines knows but "\n" lies inside one chunk
            yield from chunk.splitlines()
    except UnicodeDecodeError as e:
        raise FgdataError(f"{path}: not UTF-8 ({e})") from None
    finally:
        text.detach()  # the caller closes the stream


def _csv_rows(path: str, stream: BinaryIO) -> Iterator[Row]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # the default 128 KiB refuses long captions
    text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
    reader = csv.DictReader(text)
    try:
        if reader.fieldnames is None:
            raise FgdataError(f"{path}: empty CSV (no header row)")
        for row in reader:
            # Cells past the header land under the key None; the item refuses such rows.
            yield {k: v for k, v in row.items() if v is not None}
    except csv.Error as e:
        raise FgdataError(f"{path}: line {reader.line_num}: not valid CSV ({e})") from None
    except UnicodeDecodeError as e:
        raise FgdataError(f"{path}: not UTF-8 ({e})") from None
    finally:
        text.detach()


def _jsonl_rows(path: str, stream: BinaryIO) -> Iterator[Row]:
    base = _base(path)
    n = 0
    for chunk in stream:  # lines as bytes.splitlines cuts the whole file (a lone "\r" ends a line too)
        for line in chunk.splitlines():
            n += 1
            if not line.strip():
                continue
            try:
                row = parse_json(line)
            except ValueError as e:
                yield BadRow(f"{base}:{n}", f"manifest: line {n} of {base} is not valid JSON ({e})")
                continue
            if not isinstance(row, dict):
                yield BadRow(f"{base}:{n}", f"manifest: line {n} of {base} holds {_type_name(row)}, not a JSON object")
                continue
            yield row


@contextlib.contextmanager
def _seekable(path: str, stream: BinaryIO) -> Iterator[IO[bytes]]:
    """``stream`` when it can seek, else (compressed) a temporary copy of it in fgdata's cache folder."""
    if stream.seekable():
        yield stream
        return
    import os
    import shutil
    import tempfile

    from fgdata.storage.cache import cache_root

    os.makedirs(cache_root(), exist_ok=True)
    with tempfile.TemporaryFile(prefix=".manifest-", dir=cache_root()) as copy:
        shutil.copyfileobj(stream, copy, _READ_BYTES)
        copy.seek(0)
        yield copy


def _parquet_rows(path: str, stream: BinaryIO) -> Iterator[Row]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise FgdataError("reading Parquet manifests needs pyarrow: pip install 'fgdata[parquet]'") from None
    with _seekable(path, stream) as table:
        try:
            batches = pq.ParquetFile(table).iter_batches(batch_size=PARQUET_BATCH_ROWS)
            for batch in batches:
                for row in batch.to_pylist():
                    yield {str(k): _json_safe(v) for k, v in row.items()}
        except (pa.ArrowException, OSError) as e:
            raise FgdataError(f"{path}: not a readable Parquet file ({e})") from None


def iter_rows(path: str) -> Iterator[Row]:
    """The rows of a manifest as dicts, in file order, streamed; an unreadable JSONL line as a :class:`BadRow`."""
    lower = _uncompressed_name(path)
    if not lower.endswith(MANIFEST_SUFFIXES):
        raise FgdataError(f"{path}: a manifest must end in {', '.join(MANIFEST_SUFFIXES)}")
    with _open_uncompressed(path) as stream:
        if lower.endswith(".csv"):
            yield from _csv_rows(path, stream)
        elif lower.endswith(".parquet"):
            yield from _parquet_rows(path, stream)
        else:
            yield from _jsonl_rows(path, stream)


def _base(path: str) -> str:
    """The manifest's name as rows and reasons show it (an http(s) URL's query, which may sign it, left out)."""
    return storage.basename(storage.without_query(path))


def _resolve(manifest: str, value: str) -> str:
    if storage.is_absolute(value):
        return value
    return storage.join(storage.parent(manifest), value)


@dataclass(frozen=True)
class _Columns:
    """How a manifest's rows are read: its path and caption columns, whether CSV cells may be numbers, and
    whether a remote manifest may name local files."""

    path: str
    caption: str
    numbers: bool
    remote: bool  # the manifest was read from s3:// or http(s)://
    allow_local_paths: bool
    readable: set[str] = field(default_factory=set)  # URL schemes of its rows found readable (checked once)


def _locate(manifest: str, index: int, value: str, columns: _Columns) -> tuple[str, str | None]:
    """Where a row's file is (a local path or a URL), or why the row is refused: an unknown URL scheme, or a
    local file (a path, or a ``file://`` URL) named by a manifest that was itself read from s3:// or
    http(s):// (a list from elsewhere must not pick files off this machine) unless ``allow_local_paths``."""
    if value.startswith("file://"):
        try:
            location = storage.file_url_path(value)
        except FgdataError:
            return "", f"path: row {index} of {_base(manifest)}: a file:// URL of another host"
    elif storage.is_url(value):
        scheme = value.partition(":")[0]
        if scheme not in columns.readable:
            try:
                storage.backend_for(value)
            except FgdataError:
                return "", f"path: row {index} of {_base(manifest)}: {scheme}:// is not a scheme fgdata reads"
            columns.readable.add(scheme)
        return value, None
    else:
        location = _resolve(manifest, value)
    if not columns.remote or columns.allow_local_paths or storage.is_url(location):
        return location, None
    return "", (f"local-path: row {index} of {_base(manifest)} names a local file, but the manifest was read from "
                f"{manifest.partition(':')[0]}://: its rows must be URLs (--allow-local-paths reads local files)")


def _with_column(path: str, rows: Iterator[Row], column: str) -> Iterator[Row]:
    """``rows``, refusing a manifest whose first readable row has no ``column`` (a header or schema gives every
    row the same columns); when no row is readable, each fails alone."""
    checked = False
    for row in rows:
        if not checked and isinstance(row, dict):
            if column not in row:
                columns = ", ".join(sorted(k for k in row if k is not None))
                raise FgdataError(f"{path}: no column {column!r} (columns: {columns})")
            checked = True
        yield row


def _row_name(path: str, index: int) -> str:
    return f"{_base(path)}:row {index}"


def _not_text(path: str, index: int, row: dict[str, Any], columns: dict[str, str]) -> str | None:
    """Why the row cannot be used as given (a non-text path or caption, extra CSV cells), or None.

    ``columns`` maps what a column is for (``path``, ``caption``) to its name.
    """
    if None in row:
        return f"manifest: row {index} of {_base(path)} has more cells than the header"
    for what, column in columns.items():
        value = row.get(column)
        if value is None or (isinstance(value, str) and value.isascii()):
            continue
        where = f"column {column!r} in row {index} of {_base(path)}"
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # JSON may escape a lone surrogate
                return f"{what}: {where} is not valid Unicode (a lone surrogate)"
        else:
            return f"{what}: {where} holds {_type_name(value)}, not text"
    return None


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else f"a {type(value).__name__}"


def _media_item(path: str, index: int, row: Row, columns: _Columns) -> WorkItem:
    """The work item of one manifest row; a row with an empty or unusable path still becomes one (it fails).
    The item's name (what the sample's json and every report call it) is the row's path with the credentials
    of a URL redacted; its ``path`` is what is read."""
    if isinstance(row, BadRow):
        return WorkItem(index=index, name=row.name, refused=row.reason)
    refused = _not_text(path, index, row, {"path": columns.path})
    bad_caption = None if refused else _not_text(path, index, row, {"caption": columns.caption})
    value = row.get(columns.path)
    location = ""
    if not refused and value:
        location, refused = _locate(path, index, value, columns)
    if refused or not value:
        name = printable_name(storage.redact_url(value)) if isinstance(value, str) and value else _row_name(path, index)
        return WorkItem(index=index, name=name, refused=refused)
    metadata = {k: _cell(v) if columns.numbers else v for k, v in row.items() if k not in (columns.path, columns.caption)}
    # a remote manifest's relative row is a URL too ("img.png?token=…")
    name = storage.redact_url(value, relative=True) if columns.remote or "://" in value else value
    return WorkItem(index=index, name=name, path=location,
                    caption=None if bad_caption else row.get(columns.caption), metadata=metadata,
                    warning=f"{bad_caption}; written without a caption" if bad_caption else None)


def iter_manifest(path: str, path_column: str = "path", caption_column: str = "caption",
                  allow_local_paths: bool = False) -> Iterator[WorkItem]:
    """One work item per row, in row order, streamed (see the module docstring for the memory bound).

    ``allow_local_paths``: a manifest read from s3:// or http(s):// may name local files (refused otherwise)."""
    columns = _Columns(path_column, caption_column, text_cells(path), storage.is_url(path), allow_local_paths)
    index = -1
    for index, row in enumerate(_with_column(path, iter_rows(path), path_column)):
        yield _media_item(path, index, row, columns)
    if index < 0:
        raise FgdataError(f"{path}: the manifest has no rows")


def read_manifest(path: str, path_column: str = "path", caption_column: str = "caption",
                  allow_local_paths: bool = False) -> list[WorkItem]:
    """All of :func:`iter_manifest` in a list."""
    return list(iter_manifest(path, path_column, caption_column, allow_local_paths))


def iter_prompts(path: str, caption_column: str = "caption") -> Iterator[WorkItem]:
    """Prompt-only items, streamed: one per non-blank line of a text file, or one per manifest row."""
    if is_manifest(path):
        for i, row in enumerate(_with_column(path, iter_rows(path), caption_column)):
            if isinstance(row, BadRow):
                yield WorkItem(index=i, name=row.name, refused=row.reason)
                continue
            refused = _not_text(path, i, row, {"caption": caption_column})
            yield WorkItem(index=i, name=_row_name(path, i), refused=refused,
                           caption=None if refused else row.get(caption_column))
        return
    base = _base(path)
    count = 0
    with _local(path) as local, storage.open_read(local) as stream:
        for n, line in enumerate(_text_lines(path, stream), 1):
            if line.strip():
                yield WorkItem(index=count, name=f"{base}:{n}", caption=line.strip())
                count += 1
    if not count:
        raise FgdataError(f"{path}: no prompts (the file is empty)")


def read_prompts(path: str, caption_column: str = "caption") -> list[WorkItem]:
    """All of :func:`iter_prompts` in a list."""
    return list(iter_prompts(path, caption_column))
