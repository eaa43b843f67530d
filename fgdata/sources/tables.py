"""Media inside Parquet and Arrow tables, as work items: the layout the Hugging Face hub and ``datasets`` use.

A *media table source* is any of:

- a ``.parquet`` or ``.arrow`` file;
- a ``datasets`` ``save_to_disk`` folder (``state.json`` lists its Arrow files, in order);
- a folder of Parquet files, such as a hub dataset's ``data/train-00000-of-00004.parquet`` (every ``.parquet`` file
  below it, in sorted path order).

The media column (``--image-column`` / ``--video-column``; by default the column ``datasets`` declares as
``Image()`` / ``Video()``, else ``image`` / ``video``) holds either the bytes (a binary column) or a struct of
``bytes`` and ``path`` (``datasets``' ``Image()`` layout). The bytes are the input; ``path`` gives the extension
and names the input in failures (and in the json's ``fgdata.source``); a struct without bytes but with a ``path``
reads that file (relative to the table's folder), as a manifest row would. The caption column becomes ``txt``;
every other column goes to the json as a manifest's columns do (a NaN cell as null). Another binary column is
refused before anything is read, in one line: it would be neither an input nor readable json.

Rows are numbered across the files in order (keys ``sample_%06d`` of that number) and streamed one record batch
(:data:`TABLE_BATCH_ROWS` rows) at a time, so memory holds one batch of media (a Parquet file decodes one row
group's pages at a time), plus the inputs of the work units in flight. A table that is not a local file is first
copied to fgdata's cache folder, as a manifest is.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from fgdata import storage
from fgdata.errors import FgdataError, OptionError
from fgdata.workitem import WorkItem
from fgdata.sources.manifest import _json_safe, _local

TABLE_SUFFIXES = (".parquet", ".arrow")
#: Rows of a media table decoded at once: a batch of media bytes is what one read holds.
TABLE_BATCH_ROWS = 64
_STATE = "state.json"
_INFO = "dataset_info.json"
_FEATURE = {"images": "Image", "videos": "Video"}


def is_table_file(path: str) -> bool:
    return path.lower().endswith(TABLE_SUFFIXES)


def table_files(src: str, explicit: bool) -> list[str] | None:
    """The table files of ``src`` when it is a media table source, in row order; None when it is not one (a plain
    folder of media, a CSV or JSONL manifest). A folder of Parquet files counts only when ``explicit`` (a media
    column was named): a media folder may hold other files too."""
    if is_table_file(src) and not src.lower().endswith(".parquet"):
        return [src]
    if src.lower().endswith(".parquet"):
        return [src] if explicit else None
    if not storage.is_dir(src):
        return None
    state = storage.join(src, _STATE)
    if storage.exists(state):
        try:
            files = [f["filename"] for f in json.loads(storage.read_bytes(state))["_data_files"]]
        except (ValueError, KeyError, TypeError):
            raise FgdataError(f"{state}: not a datasets save_to_disk state (no _data_files list)") from None
        return [storage.join(src, f) for f in files]
    if not explicit:
        return None
    files = sorted(i.path for i in storage.list_tree(src)[0] if i.path.lower().endswith(".parquet"))
    if not files:
        raise FgdataError(f"{src}: no .parquet files below it (a media table folder holds them, e.g. data/*.parquet)")
    return files


def media_column(src: str, kind: str, named: str | None) -> str:
    """The media column: the one named, else the one ``datasets`` declares as ``Image()``/``Video()``, else
    ``image`` / ``video``."""
    if named:
        return named
    info = storage.join(src, _INFO) if storage.is_dir(src) else None
    if info and storage.exists(info):
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            features = json.loads(storage.read_bytes(info)).get("features") or {}
            for name, feature in features.items():
                if isinstance(feature, dict) and feature.get("_type") == _FEATURE[kind]:
                    return str(name)
    return "image" if kind == "images" else "video"


def _binary(t: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return True
    if pa.types.is_struct(t):
        return any(_binary(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _binary(t.value_type)
    return False


def _check_schema(path: str, schema: Any, column: str, flag: str) -> None:
    """The media column must be binary or a ``{bytes, path}`` struct; no other column may hold binary data."""
    import pyarrow as pa

    names = schema.names
    if column not in names:
        raise OptionError(f"{flag}: {storage.basename(path)} has no column {column!r} (columns: {', '.join(names)})")
    t = schema.field(column).type
    media_ok = (pa.types.is_binary(t) or pa.types.is_large_binary(t)
                or (pa.types.is_struct(t) and t.get_field_index("bytes") >= 0))
    if not media_ok:
        raise OptionError(f"{flag}: column {column!r} of {storage.basename(path)} holds {t}, not media bytes "
                          "(binary, or a struct of bytes and path)")
    for name in names:
        if name != column and _binary(schema.field(name).type):
            raise FgdataError(f"{path}: column {name!r} holds binary data, which fgdata does not write as json; "
                              f"shard it as the media ({flag} {name}) or drop it from the table")


def _batches(path: str, local: str) -> Iterator[Any]:
    """The record batches of one table file, streamed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if local.lower().endswith(".parquet"):
            table = pq.ParquetFile(local)
            yield table.schema_arrow
            yield from table.iter_batches(batch_size=TABLE_BATCH_ROWS)
            return
        source = pa.memory_map(local)
        try:
            reader: Any = pa.ipc.open_stream(source)  # what datasets writes
        except pa.ArrowInvalid:
            source.seek(0)
            reader = pa.ipc.open_file(source)
            yield reader.schema
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
            return
        yield reader.schema
        yield from reader
    except (pa.ArrowException, OSError) as e:
        raise FgdataError(f"{path}: not a readable {'Parquet' if path.endswith('.parquet') else 'Arrow'} file "
                          f"({e})") from None


def iter_table(files: list[str], column: str, caption_column: str, flag: str) -> Iterator[WorkItem]:
    """One work item per row of the tables, in order, streamed (see the module docstring)."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise FgdataError("reading Parquet and Arrow tables needs pyarrow: pip install 'fgdata[parquet]'") from None
    index = 0
    for path in files:
        with _local(path) as local:
            batches = _batches(path, local)
            _check_schema(path, next(batches), column, flag)
            for batch in batches:
                for row in batch.to_pylist():
                    yield _item(path, index, row, column, caption_column)
                    index += 1
    if index == 0:
        raise FgdataError(f"{files[0]}: the table has no rows")


def _item(table: str, index: int, row: dict[str, Any], column: str, caption_column: str) -> WorkItem:
    cell = row.get(column)
    data, name = (cell.get("bytes"), cell.get("path")) if isinstance(cell, dict) else (cell, None)
    label = name or f"{storage.basename(table)}:row {index}"
    caption = row.get(caption_column)
    metadata = {str(k): _json_safe(v) for k, v in row.items() if k not in (column, caption_column)}
    warning = None
    if caption is not None and not isinstance(caption, str):
        warning = f"caption: column {caption_column!r} in row {index} holds {type(caption).__name__}, not text; " \
                  "written without a caption"
        caption = None
    if data is None and name:  # datasets keeps a file's path alone until the bytes are embedded
        path = name if storage.is_absolute(name) else storage.join(storage.parent(table), name)
        return WorkItem(index=index, name=label, path=path, caption=caption, metadata=metadata, warning=warning)
    if data is None:
        return WorkItem(index=index, name=label, refused=f"missing-media: row {index} of {storage.basename(table)} "
                                                          f"has no {column!r} bytes")
    return WorkItem(index=index, name=label, data=bytes(data), caption=caption, metadata=metadata, warning=warning)
