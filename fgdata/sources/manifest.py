"""Manifest source: a CSV, JSONL or Parquet table (local or s3://) with a path column, as work items.

Each row is one input, in row order (its ``index`` gives the key, see
:mod:`fgdata.sources.folder`). The path column holds a local path or an s3:// URL; a relative
path is taken relative to the manifest's folder. The caption column (optional) becomes the
``txt`` member; every other column is kept as JSON metadata (where ``--caption-field`` may find the
caption of a row without one, see :mod:`fgdata.producers.media`). CSV cells are text: a metadata cell
that reads as a plain number (``3``, ``-0.5``, ``1e-3``, but not ``007``) is stored as a JSON
number; the path and caption cells always stay text. CSV cells may be of any size.

A path that is not text (a JSON or Parquet number, list or object) makes that row a refused item,
reported with the row and the type it found; a caption that is not text is a warning of that row, which
is written without a caption (for ``read_prompts``, where the caption is the sample, the row is refused).
Neither is ever stored as a Python repr.
A CSV row with more cells than the header is refused the same way, and so is a JSONL line that is
not valid JSON or not a JSON object (reported as ``FILE:line``, the line counted from 1): one bad
line never stops the job. Rows are counted from 0, like the ``input`` field of the failure report.

:func:`read_prompts` reads prompt-only inputs: a text file with one prompt per line (blank
lines skipped), or a manifest's caption column.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from dataclasses import dataclass
from collections.abc import Iterator
from typing import Any, Union

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.shards.metadata import parse_json
from fgdata.sources.folder import WorkItem, printable_name

MANIFEST_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".parquet")
#: Compressed text manifests (``list.csv.gz``, ``list.jsonl.zst``): the table type is the suffix before these.
COMPRESSED_SUFFIXES = (".gz", ".zst")
_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?")


def _uncompressed_name(path: str) -> str:
    lower = path.lower()
    for suffix in COMPRESSED_SUFFIXES:
        if lower.endswith(suffix):
            return lower[: -len(suffix)]
    return lower


def is_manifest(path: str) -> bool:
    return _uncompressed_name(path).endswith(MANIFEST_SUFFIXES)


def _decompress(path: str, data: bytes) -> bytes:
    """The bytes of a ``.gz`` or ``.zst`` manifest, uncompressed (a damaged one is a one-line error)."""
    lower = path.lower()
    if lower.endswith(".gz"):
        import gzip

        try:
            return gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise FgdataError(f"{path}: not a readable gzip file ({e})") from None
    if lower.endswith(".zst"):
        try:
            import zstandard  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise FgdataError(f"{path}: reading .zst manifests needs zstandard: pip install zstandard") from None
        return _unzstd(path, data, zstandard)
    return data


def _unzstd(path: str, data: bytes, zstandard: Any) -> bytes:
    """Every frame of a ``.zst`` file (``pzstd`` writes several); a file that ends inside a frame is an error,
    never a shorter manifest."""
    parts = []
    rest = data
    try:
        while rest:
            frame = zstandard.ZstdDecompressor().decompressobj()
            parts.append(frame.decompress(rest))
            if not frame.eof:
                raise FgdataError(f"{path}: a truncated zstd file (it ends inside a frame)")
            rest = frame.unused_data
    except zstandard.ZstdError as e:
        raise FgdataError(f"{path}: not a readable zstd file ({e})") from None
    return b"".join(parts)


def _cell(value: str) -> Any:
    if _NUMBER.fullmatch(value):
        number = float(value)
        return int(value) if value.lstrip("-").isdigit() else number
    return value


def _json_safe(value: Any) -> Any:
    """Parquet cells can be timestamps, decimals or bytes: make them JSON values, deterministically."""
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


def read_rows(path: str) -> list[Row]:
    """All rows of a manifest as dicts, in file order; an unreadable JSONL line as a :class:`BadRow` in its place."""
    lower = _uncompressed_name(path)
    data = _decompress(path, storage.read_bytes(path))
    if lower.endswith(".csv"):
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise FgdataError(f"{path}: not UTF-8 ({e})") from None
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # the default 128 KiB refuses long captions
        reader = csv.DictReader(io.StringIO(text, newline=""))
        try:
            if reader.fieldnames is None:
                raise FgdataError(f"{path}: empty CSV (no header row)")
            # Cells past the header land under the key None; read_manifest refuses such rows.
            return [{k: v for k, v in row.items() if v is not None} for row in reader]
        except csv.Error as e:
            raise FgdataError(f"{path}: line {reader.line_num}: not valid CSV ({e})") from None
    if lower.endswith((".jsonl", ".ndjson")):
        rows: list[Row] = []
        base = storage.basename(path)
        for n, line in enumerate(data.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = parse_json(line)
            except ValueError as e:
                rows.append(BadRow(f"{base}:{n}", f"manifest: line {n} of {base} is not valid JSON ({e})"))
                continue
            if not isinstance(row, dict):
                rows.append(BadRow(f"{base}:{n}", f"manifest: line {n} of {base} holds {_type_name(row)}, "
                                                  "not a JSON object"))
                continue
            rows.append(row)
        return rows
    if lower.endswith(".parquet"):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise FgdataError("reading Parquet manifests needs pyarrow: pip install 'fgdata[parquet]'") from None
        try:
            table = pq.read_table(pa.BufferReader(data))
        except (pa.ArrowException, OSError) as e:
            raise FgdataError(f"{path}: not a readable Parquet file ({e})") from None
        return [{str(k): _json_safe(v) for k, v in row.items()} for row in table.to_pylist()]
    raise FgdataError(f"{path}: a manifest must end in {', '.join(MANIFEST_SUFFIXES)}")


def _resolve(manifest: str, value: str) -> str:
    if storage.is_absolute(value):
        return value
    return storage.join(storage.parent(manifest), value)


def _require_column(path: str, rows: list[Row], column: str) -> None:
    """Refuse a manifest none of whose readable rows has ``column`` (when no row is readable, each fails alone)."""
    good = [row for row in rows if isinstance(row, dict)]
    if good and not any(column in row for row in good):
        raise FgdataError(f"{path}: no column {column!r} (columns: {', '.join(sorted(k for k in good[0] if k is not None))})")


def _row_name(path: str, index: int) -> str:
    return f"{storage.basename(path)}:row {index}"


def _not_text(path: str, index: int, row: dict[str, Any], columns: dict[str, str]) -> str | None:
    """Why the row cannot be used as given (a non-text path or caption, extra CSV cells), or None.

    ``columns`` maps what a column is for (``path``, ``caption``) to its name.
    """
    if None in row:
        return f"manifest: row {index} of {storage.basename(path)} has more cells than the header"
    for what, column in columns.items():
        value = row.get(column)
        where = f"column {column!r} in row {index} of {storage.basename(path)}"
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # JSON may escape a lone surrogate
                return f"{what}: {where} is not valid Unicode (a lone surrogate)"
        elif value is not None:
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


def read_manifest(path: str, path_column: str = "path", caption_column: str = "caption") -> list[WorkItem]:
    """One work item per row; a row with an empty or unusable path still becomes an item (it fails, and is reported)."""
    rows = read_rows(path)
    if not rows:
        raise FgdataError(f"{path}: the manifest has no rows")
    _require_column(path, rows, path_column)
    numbers = path.lower().endswith(".csv")
    items = []
    for index, row in enumerate(rows):
        if isinstance(row, BadRow):
            items.append(WorkItem(index=index, name=row.name, refused=row.reason))
            continue
        refused = _not_text(path, index, row, {"path": path_column})
        bad_caption = None if refused else _not_text(path, index, row, {"caption": caption_column})
        value = row.get(path_column)
        if refused or not value:
            name = printable_name(value) if isinstance(value, str) and value else _row_name(path, index)
            items.append(WorkItem(index=index, name=name, refused=refused))
            continue
        metadata = {k: _cell(v) if numbers else v for k, v in row.items() if k not in (path_column, caption_column)}
        items.append(WorkItem(index=index, name=value, path=_resolve(path, value),
                              caption=None if bad_caption else row.get(caption_column), metadata=metadata,
                              warning=f"{bad_caption}; written without a caption" if bad_caption else None))
    return items


def read_prompts(path: str, caption_column: str = "caption") -> list[WorkItem]:
    """Prompt-only items: one per non-blank line of a text file, or one per manifest row."""
    if is_manifest(path):
        rows = read_rows(path)
        _require_column(path, rows, caption_column)
        items = []
        for i, row in enumerate(rows):
            if isinstance(row, BadRow):
                items.append(WorkItem(index=i, name=row.name, refused=row.reason))
                continue
            refused = _not_text(path, i, row, {"caption": caption_column})
            items.append(WorkItem(index=i, name=_row_name(path, i), refused=refused,
                                  caption=None if refused else row.get(caption_column)))
        return items
    try:
        text = storage.read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise FgdataError(f"{path}: not UTF-8 ({e})") from None
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            items.append(WorkItem(index=len(items), name=f"{storage.basename(path)}:{n}", caption=line.strip()))
    if not items:
        raise FgdataError(f"{path}: no prompts (the file is empty)")
    return items


def iter_manifest(path: str, path_column: str = "path", caption_column: str = "caption") -> Iterator[WorkItem]:
    """TEMPORARY shim until the streamed reader lands."""
    return iter(read_manifest(path, path_column, caption_column))


def iter_prompts(path: str, caption_column: str = "caption") -> Iterator[WorkItem]:
    """TEMPORARY shim until the streamed reader lands."""
    return iter(read_prompts(path, caption_column))
