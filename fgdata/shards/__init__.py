"""The WebDataset tar format: key rule, writer, reader, header scanner, index, counts, ignore index."""

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
from fgdata.shards.select import ShardSet, expand_braces, resolve_shards
from fgdata.shards.scan import MemberEntry, SampleEntry, ShardScan, TarDamage, iter_members, scan_fileobj, scan_shard
from fgdata.shards.writer import Failure, ResumePoint, ShardWriter, WriteSummary

__all__ = [
    "COUNT_FILE", "INDEX_SUFFIX", "CountFileUpdate", "Failure", "MemberEntry", "ResumePoint", "Sample", "SampleEntry", "ShardCount",
    "ShardFile", "ShardScan", "ShardSet", "ShardWriter", "TarDamage", "WriteSummary", "count_one", "count_shards",
    "discover_shards", "expand_braces", "index_path", "iter_members", "iter_samples", "load_ignore_index", "load_index",
    "read_shard_counts", "require_shards", "resolve_shards", "scan_fileobj", "scan_shard", "sort_shards", "split_member_name",
    "validate_extension", "validate_key", "write_counts", "write_ignore_index", "write_index", "write_shard_counts",
]
