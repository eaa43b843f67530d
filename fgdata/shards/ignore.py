"""The ignore index: shard basename -> sample keys to skip."""

from __future__ import annotations

import json

from fgdata import storage
from fgdata.errors import FgdataError


def load_ignore_index(paths: list[str] | tuple[str, ...] | str | None) -> dict[str, set[str]]:
    """Merge ignore files; each must exist, be readable, non-empty JSON of name -> [keys]."""
    if paths is None:
        return {}
    if isinstance(paths, str):
        paths = [paths]
    merged: dict[str, set[str]] = {}
    for path in paths:
        try:
            raw = storage.read_bytes(path)
        except FgdataError as exc:
            raise FgdataError(f"ignore index {path}: cannot be read ({exc})") from exc
        except OSError as exc:
            raise FgdataError(f"ignore index {path}: cannot be read ({exc.strerror or exc})") from exc
        if not raw.strip():
            raise FgdataError(f"ignore index {path}: file is empty")
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise FgdataError(f"ignore index {path}: not valid JSON ({exc})") from exc
        if not isinstance(doc, dict) or not all(isinstance(v, list) and all(isinstance(k, str) for k in v) for v in doc.values()):
            raise FgdataError(f"ignore index {path}: expected a JSON object of shard name -> list of keys")
        for shard, keys in doc.items():
            merged.setdefault(shard, set()).update(keys)
    return merged


def ignore_index_bytes(mapping: dict[str, list[str] | set[str]]) -> bytes:
    from fgdata.shards.keys import sort_shards

    doc = {k: sorted(mapping[k]) for k in sort_shards(mapping) if mapping[k]}
    return (json.dumps(doc, indent=1) + "\n").encode()


def write_ignore_index(path: str, mapping: dict[str, list[str] | set[str]]) -> None:
    """Atomically write an ignore index (shards in numeric order, keys sorted)."""
    storage.write_bytes(path, ignore_index_bytes(mapping))
