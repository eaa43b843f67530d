"""The WebDataset tar format: key rule, writer, reader, header scanner, index, counts, ignore index.

Names are imported from their modules on first use, so a command that only counts does not
pay for the writer's imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_MODULES = {
    "counting": ("CountFileUpdate", "ShardCount", "count_one", "count_shards", "write_counts"),
    "ignore": ("load_ignore_index", "write_ignore_index"),
    "index": ("COUNT_FILE", "INDEX_SUFFIX", "index_path", "load_index", "read_shard_counts", "write_index",
              "write_shard_counts"),
    "keys": ("sort_shards", "split_member_name", "validate_extension", "validate_key"),
    "reader": ("Sample", "ShardFile", "discover_shards", "iter_samples", "require_shards"),
    "select": ("ShardSet", "expand_braces", "resolve_shards"),
    "scan": ("MemberEntry", "SampleEntry", "ShardScan", "TarDamage", "iter_members", "scan_fileobj", "scan_shard"),
    "writer": ("ShardWriter", "WriteSummary"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}
__all__ = [
    "COUNT_FILE", "INDEX_SUFFIX", "CountFileUpdate", "MemberEntry", "Sample", "SampleEntry",
    "ShardCount", "ShardFile", "ShardScan", "ShardSet", "ShardWriter", "TarDamage", "WriteSummary",
    "count_one", "count_shards", "discover_shards", "expand_braces", "index_path", "iter_members", "iter_samples",
    "load_ignore_index", "load_index", "read_shard_counts", "require_shards", "resolve_shards", "scan_fileobj",
    "scan_shard", "sort_shards", "split_member_name", "validate_extension", "validate_key", "write_counts",
    "write_ignore_index", "write_index", "write_shard_counts",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from fgdata.shards.counting import CountFileUpdate, ShardCount, count_one, count_shards, write_counts
    from fgdata.shards.ignore import load_ignore_index, write_ignore_index
    from fgdata.shards.index import (
        COUNT_FILE,
        INDEX_SUFFIX,
        index_path,
        load_index,
        read_shard_counts,
        write_index,
        write_shard_counts,
    )
    from fgdata.shards.keys import sort_shards, split_member_name, validate_extension, validate_key
    from fgdata.shards.reader import Sample, ShardFile, discover_shards, iter_samples, require_shards
    from fgdata.shards.scan import MemberEntry, SampleEntry, ShardScan, TarDamage, iter_members, scan_fileobj, scan_shard
    from fgdata.shards.select import ShardSet, expand_braces, resolve_shards
    from fgdata.shards.writer import ShardWriter, WriteSummary
