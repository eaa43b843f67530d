"""Manifest source: a CSV, JSONL or Parquet table (local or s3://) with a path column, as work items.

Each row is one input, in row order (its ``index`` gives the key, see
:mod:`fgdata.sources.folder`). The path column holds a local path or an s3:// URL; a relative
path is taken relative to the manifest's folder. The caption column (optional) becomes the
``txt`` member; every other column is kept as JSON metadata. CSV cells are text: a cell that
reads as a plain number (``3``, ``-0.5``, ``1e-3``, but not ``007``) is stored as a JSON number.

:func:`read_prompts` reads prompt-only inputs: a text file with one prompt per line (blank
lines skipped), or a manifest's caption column.
"""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.sources.folder import WorkItem

MANIFEST_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".parquet")
_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?")


def is_manifest(path: str) -> bool:
    return path.lower().endswith(MANIFEST_SUFFIXES)


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


def read_rows(path: str) -> list[dict[str, Any]]:
    """All rows of a manifest as dicts, in file order."""
    lower = path.lower()
    data = storage.read_bytes(path)
    if lower.endswith(".csv"):
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise FgdataError(f"{path}: not UTF-8 ({e})") from None
        reader = csv.DictReader(io.StringIO(text, newline=""))
        if reader.fieldnames is None:
            raise FgdataError(f"{path}: empty CSV (no header row)")
        return [{k: _cell(v) for k, v in row.items() if k is not None and v is not None} for row in reader]
    if lower.endswith((".jsonl", ".ndjson")):
        rows = []
        for n, line in enumerate(data.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise FgdataError(f"{path}:{n}: not valid JSON ({e})") from None
            if not isinstance(row, dict):
                raise FgdataError(f"{path}:{n}: each line must be a JSON object")
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
        return [_json_safe(row) for row in table.to_pylist()]
    raise FgdataError(f"{path}: a manifest must end in {', '.join(MANIFEST_SUFFIXES)}")


def _resolve(manifest: str, value: str) -> str:
    if storage.is_s3(value) or value.startswith("/"):
        return value
    return storage.join(storage.parent(manifest), value)


def _require_column(path: str, rows: list[dict[str, Any]], column: str) -> None:
    if rows and not any(column in row for row in rows):
        raise FgdataError(f"{path}: no column {column!r} (columns: {', '.join(sorted(rows[0]))})")


def read_manifest(path: str, path_column: str = "path", caption_column: str = "caption") -> list[WorkItem]:
    """One work item per row; a row with an empty path still becomes an item (it fails, and is reported)."""
    rows = read_rows(path)
    if not rows:
        raise FgdataError(f"{path}: the manifest has no rows")
    _require_column(path, rows, path_column)
    items = []
    for index, row in enumerate(rows):
        value = row.get(path_column)
        media = _resolve(path, str(value)) if value not in (None, "") else ""
        caption = row.get(caption_column)
        metadata = {k: v for k, v in row.items() if k not in (path_column, caption_column)}
        items.append(
            WorkItem(
                index=index,
                name=str(value) if value not in (None, "") else f"{storage.basename(path)}:row {index}",
                path=media,
                caption=None if caption is None else str(caption),
                metadata=metadata,
            )
        )
    return items


def read_prompts(path: str, caption_column: str = "caption") -> list[WorkItem]:
    """Prompt-only items: one per non-blank line of a text file, or one per manifest row."""
    if is_manifest(path):
        rows = read_rows(path)
        _require_column(path, rows, caption_column)
        return [
            WorkItem(index=i, name=f"{storage.basename(path)}:row {i}",
                     caption=None if row.get(caption_column) is None else str(row.get(caption_column)))
            for i, row in enumerate(rows)
        ]
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
