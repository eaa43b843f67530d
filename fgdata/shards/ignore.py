"""The ignore index: shard -> sample keys to skip, as a list of keys or (``fgdata dedup``) an object of key ->
record saying why (docs/FORMATS.md).

A shard is named by its basename, its absolute path or URL, or (``fgdata dedup``) a *qualified name*: the
trailing parts of its path, from its dataset's folder name down (``a/00000.tar``). A qualified name still
matches after the datasets move (another disk, a sync to s3), and two datasets whose shard names collide stay
apart by their folder names; the loaders match it against the end of each shard's path."""

from __future__ import annotations

import json
from typing import Any

from fgdata import storage
from fgdata.errors import FgdataError


def _keys_of(value: object) -> list[str] | None:
    """The keys a shard's entry lists: a list of keys, or the keys of an object of key -> record object."""
    if isinstance(value, list) and all(isinstance(k, str) for k in value):
        return value
    if isinstance(value, dict) and all(isinstance(r, dict) for r in value.values()):
        return list(value)
    return None


def load_ignore_index(paths: list[str] | tuple[str, ...] | str | None) -> dict[str, set[str]]:
    """Merge ignore files; each must exist, be readable, non-empty JSON of name -> [keys] or {key: record}."""
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
        listed = {shard: _keys_of(v) for shard, v in doc.items()} if isinstance(doc, dict) else None
        if listed is None or any(keys is None for keys in listed.values()):
            raise FgdataError(f"ignore index {path}: expected a JSON object of shard name -> list of keys "
                              "(or -> object of key -> record)")
        for shard, keys in listed.items():
            merged.setdefault(shard, set()).update(keys or ())
    return merged


def shard_parts(shard: str) -> list[str]:
    """The ``/``-separated parts of a shard's absolute path or URL, without the scheme."""
    full = storage.absolute(shard)
    if storage.is_url(full):
        full = full.split("://", 1)[1]
    return [p for p in full.split("/") if p]


def qualified_names(shards: list[str]) -> dict[str, str]:
    """Each shard's qualified name: the fewest trailing parts of its path (at least its folder's name and its
    own) that tell every two of ``shards`` apart, the same count for all; the absolute path or URL where no
    count does (a shard at the top of a disk or bucket has no folder name)."""
    parts = {s: shard_parts(s) for s in shards}
    longest = max((len(p) for p in parts.values()), default=0)
    for depth in range(2, longest + 1):
        if any(len(p) < depth for p in parts.values()):
            break
        names = {s: "/".join(p[-depth:]) for s, p in parts.items()}
        if len(set(names.values())) == len(names):
            return names
    return {s: storage.absolute(s) for s in shards}


def ignore_index_bytes(mapping: dict[str, list[str] | set[str]]) -> bytes:
    from fgdata.shards.keys import sort_shards

    doc = {k: sorted(mapping[k]) for k in sort_shards(mapping) if mapping[k]}
    return (json.dumps(doc, indent=1) + "\n").encode()


def write_ignore_index(path: str, mapping: dict[str, list[str] | set[str]]) -> None:
    """Atomically write an ignore index (shards in numeric order, keys sorted)."""
    storage.write_bytes(path, ignore_index_bytes(mapping))


def write_ignore_records(path: str, mapping: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Atomically write an ignore index whose shards map each key to a record (shards in numeric order, keys
    sorted), as ``fgdata dedup`` writes it."""
    from fgdata.shards.keys import sort_shards

    doc = {s: {k: mapping[s][k] for k in sorted(mapping[s])} for s in sort_shards(mapping) if mapping[s]}
    storage.write_bytes(path, (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode())
