"""From datatags to the selected shards, their counts and ignored samples.

Everything here runs once, at loader construction, in the main process; the result
is plain data that travels to the workers.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fgdata import storage
from fgdata.errors import FgdataError, StorageError
from fgdata.media.decode import decode_member
from fgdata.shards.ignore import shard_parts
from fgdata.shards.scan import BLOCK
from fgdata.shards import (
    count_one,
    load_ignore_index,
    load_index,
    read_shard_counts,
    scan_shard,
    ShardScan,
    sort_shards,
)

log = logging.getLogger("fgdata.loaders")

PLACEHOLDER_PREFIX = "/path/to/"
# A sample is at least one member, and a member at least its 512-byte header.
MIN_SAMPLE_BYTES = 512
# The bound on a count when a shard's size is unknown.
MAX_COUNT_UNKNOWN_SIZE = 1 << 40
COUNT_FIX = "rewrite the count file with `fgdata count-shards` or `fgdata verify --write-counts`"


class LoaderConfigError(FgdataError, ValueError):
    """A loader keyword is invalid; raised at construction, the message names the keyword."""


@dataclass(frozen=True)
class ShardRef:
    """One selected shard: where it is, its basename, the datatag it came from and its size in bytes (if listed)."""

    path: str
    name: str
    tag: str
    size: int | None = None


def parse_datatags(datatags: Sequence[str] | str) -> list[str]:
    """``WDS:<path>`` tags -> paths; the path is everything after the first colon."""
    if isinstance(datatags, str):
        datatags = [datatags]
    if not datatags:
        raise LoaderConfigError("datatags: at least one 'WDS:<directory or s3:// prefix>' tag is required")
    kinds, paths = set(), []
    for tag in datatags:
        if not isinstance(tag, str) or ":" not in tag:
            raise LoaderConfigError(f"datatags: {tag!r} has no type prefix; write 'WDS:{tag}'")
        kind, _, path = tag.partition(":")
        kinds.add(kind)
        if kind != "WDS":
            raise LoaderConfigError(f"datatags: {tag!r} is not a WDS tag (only 'WDS:' is supported)")
        if path.startswith(PLACEHOLDER_PREFIX):
            raise LoaderConfigError(
                f"datatags: {tag!r} is the preset's placeholder; set cfg.datatags = ['WDS:<your shard directory>']"
            )
        if not storage.is_dir(path):
            raise LoaderConfigError(f"datatags: {path} is not an existing directory")
        paths.append(path)
    if len(kinds) > 1:
        raise LoaderConfigError(f"datatags: mixed tag types {sorted(kinds)}")
    return paths


def select_shards(
    tags: Sequence[str],
    *,
    shard_start: int = 0,
    shard_end: int | None = None,
    shards_per_worker: int | None = None,
    workers_total: int = 1,
) -> tuple[list[ShardRef], list[ShardRef]]:
    """Merge the tags' shards, sort them, slice, then apply ``shards_per_worker``.

    Returns (selected, discovered). ``shard_start``/``shard_end`` are absolute,
    inclusive indices into the sorted list, unlike the reference's relative end.
    ``shards_per_worker = k`` keeps ``k * workers_total`` shards, truncating or
    cycling the list, so k = 1 matches the reference's only behaviour.
    """
    found: list[ShardRef] = []
    for tag in tags:
        found.extend(ShardRef(i.path, i.name, tag, i.size) for i in storage.list_dir(tag, suffix=".tar"))
    if not found:
        raise LoaderConfigError(f"datatags: no .tar shards under {', '.join(tags)}")
    if not all(r.name.split(".", 1)[0].isdigit() for r in found):
        log.error("shard names are not all numeric; sorting them as strings")
    found = sort_shards(found, name=lambda r: r.name)
    end = len(found) - 1 if shard_end is None else shard_end
    if not 0 <= shard_start <= end < len(found):
        raise LoaderConfigError(
            f"shard_start={shard_start}, shard_end={shard_end}: need 0 <= start <= end < {len(found)} "
            "(absolute, inclusive indices into the sorted shard list)"
        )
    selected = found[shard_start : end + 1]
    if shards_per_worker is not None:
        if shards_per_worker < 1:
            raise LoaderConfigError(f"shards_per_worker={shards_per_worker}: must be a positive integer")
        want = shards_per_worker * workers_total
        selected = [selected[i % len(selected)] for i in range(want)]
    return selected, found


class SideFileLookup:
    """Resolve side-file keys (plain basenames or shard paths/URLs) to discovered shards.

    A plain basename is accepted only when it names one shard; when two datatags hold the
    same basename the key must be the shard's path or URL. A path matches however it and the
    datatag spell the folder (relative or absolute, through a symlink): ``fgdata verify`` over
    several folders writes absolute paths, and a relative datatag must still find them. A
    relative path that names no file from here is a qualified name (``a/00000.tar``, as
    ``fgdata dedup`` writes): it names the shard whose path ends with it, so it survives a move.
    """

    def __init__(self, discovered: Sequence[ShardRef]):
        self._discovered = list(discovered)
        self._by_path = {r.path: r for r in discovered}
        self._by_file: dict[str, ShardRef] | None = None  # built on the first path-like key
        self._by_name: dict[str, list[ShardRef]] = {}
        for r in discovered:
            if r not in self._by_name.setdefault(r.name, []):
                self._by_name[r.name].append(r)

    def resolve(self, key: str, what: str) -> ShardRef | None:
        if key in self._by_path:
            return self._by_path[key]
        if storage.basename(key) != key:  # a path or URL
            if self._by_file is None:
                self._by_file = {storage.same_file_key(r.path): r for r in self._discovered}
            found = self._by_file.get(storage.same_file_key(key))
            return found if found is not None or storage.is_absolute(key) else self._by_tail(key, what)
        refs = self._by_name.get(key)
        if not refs:
            return None
        if len({r.path for r in refs}) > 1:
            raise LoaderConfigError(
                f"{what}: {key!r} matches shards in several datatags ({', '.join(sorted({r.tag for r in refs}))}); "
                "use full shard paths or URLs as keys"
            )
        return refs[0]

    def _by_tail(self, key: str, what: str) -> ShardRef | None:
        """The shard a qualified name (``a/00000.tar``, as ``fgdata dedup`` writes) names: the one whose path, as
        spelled or with its links resolved, ends with the name's parts. Two such shards are an error."""
        want = key.split("/")
        if any(p in ("", ".", "..") for p in want):
            return None
        refs = {r.path: r for r in self._by_name.get(want[-1], ())
                if any(shard_parts(spelling)[-len(want):] == want
                       for spelling in (r.path, storage.same_file_key(r.path)))}
        if len(refs) > 1:
            raise LoaderConfigError(
                f"{what}: {key!r} matches several shards ({', '.join(sorted(refs))}); "
                "use full shard paths or URLs as keys"
            )
        return next(iter(refs.values()), None)

    def map(self, mapping: Mapping[str, Any], what: str) -> dict[str, Any]:
        """Re-key ``mapping`` by shard path.

        A basename or qualified name that names no discovered shard is dropped with a warning (the
        reference's rule: a side file may cover more shards than a run selects). An absolute path or
        URL names one shard exactly, so one that matches none is an error: skipping it would silently
        keep samples the file meant to remove.
        """
        out: dict[str, Any] = {}
        unknown, unmatched = [], []
        for key, value in mapping.items():
            ref = self.resolve(key, what)
            if ref is not None:
                out[ref.path] = value
            elif storage.is_absolute(key):
                unmatched.append(key)
            else:
                unknown.append(key)
        if unmatched:
            tags = ", ".join(dict.fromkeys(r.tag for r in self._discovered))
            raise LoaderConfigError(
                f"{what}: {len(unmatched)} shard path(s) are not shards of the datatags ({tags}), e.g. "
                f"{sorted(unmatched)[0]}; pass the datatags the file was written for, or rewrite it with `fgdata verify`"
            )
        if unknown:
            warnings.warn(f"{what}: {len(unknown)} shard name(s) not among the discovered shards, dropped: {sorted(unknown)[:5]}", stacklevel=3)
        return out


def _scan(ref: ShardRef, cache_path: str | None):
    """Entries of a shard, to place its ignored keys: a local shard's index when it matches the shard, else a header
    scan. A remote shard is scanned from its cached copy (the workers read that copy): without ranged reads its index
    is checked at the first sample only (docs/FORMATS.md), too little to trust it with positions."""
    scan = load_index(ref.path, expected_size=ref.size) if storage.random_access(ref.path) else None
    if scan is None:
        scan = scan_shard(storage.fetch_to_cache(ref.path, cache_path))
    return scan


@dataclass
class Dataset:
    """The resolved dataset: selected shards, their counts and ignored samples."""

    shards: list[ShardRef]
    counts: list[int] | None
    ignored_keys: list[frozenset[str]]
    ignored_indices: list[tuple[int, ...]] = field(default_factory=list)
    # Shard path -> count, for the shards whose count came from ``count_file`` (checked when a shard is opened).
    listed: dict[str, int] = field(default_factory=dict)
    count_file: str | None = None
    # Shard path -> its header scan, for the shards counted by scanning (no usable offset index).
    scans: dict[str, ShardScan] = field(default_factory=dict)

    def count_source(self, ref: ShardRef) -> str | None:
        """The count file a shard's count came from, None when the loader counted it."""
        return self.count_file if ref.path in self.listed else None


def count_mismatch(ref: ShardRef, real: int, promised: int, count_file: str | None) -> str:
    """What a loader says when a shard does not hold the samples its count (from ``count_file``, if any) promised."""
    where = f"shard_count_file {count_file}" if count_file else "the count taken when the loader was built"
    return f"{ref.path}: the shard holds {real} samples, but {where} says {promised}"


def checked_count(value: Any, ref: ShardRef, count_file: str) -> int:
    """A count from a count file: a non-negative integer (not a boolean) that the shard's size can hold."""
    limit = ref.size // MIN_SAMPLE_BYTES if ref.size is not None else MAX_COUNT_UNKNOWN_SIZE
    if type(value) is not int or not 0 <= value <= limit:
        bound = f"the {ref.size}-byte shard holds at most {limit}" if ref.size is not None else f"counts stay below {limit}"
        raise LoaderConfigError(
            f"shard_count_file {count_file}: count {value!r} for {ref.name} is not a sample count "
            f"(a non-negative integer; {bound}); {COUNT_FIX}"
        )
    return value


def resolve_dataset(
    tags: Sequence[str],
    *,
    need_counts: bool,
    shard_start: int = 0,
    shard_end: int | None = None,
    shards_per_worker: int | None = None,
    workers_total: int = 1,
    shard_count_file: str | None = None,
    ignore_index_paths: Sequence[str] | str | None = None,
    cache_path: str | None = None,
) -> Dataset:
    """Select shards and, when ``need_counts`` (deterministic mode), count them and locate ignored samples.

    Counts come from ``shard_count_file`` when it lists a shard; other shards are
    counted from their offset index or a header scan, so the count file only
    saves time. A count file must hold physical counts: ignored samples
    are subtracted here, by locating their keys.
    """
    selected, discovered = select_shards(
        tags, shard_start=shard_start, shard_end=shard_end, shards_per_worker=shards_per_worker, workers_total=workers_total
    )
    lookup = SideFileLookup(discovered)
    ignore_raw = load_ignore_index(ignore_index_paths if ignore_index_paths is None or isinstance(ignore_index_paths, str) else list(ignore_index_paths))
    ignored_by_path = lookup.map(ignore_raw, "ignore_index_paths")
    ignored_keys = [frozenset(ignored_by_path.get(r.path, ())) for r in selected]
    given: dict[str, int] = {}
    if shard_count_file is not None:
        raw = lookup.map(read_shard_counts(shard_count_file), "shard_count_file")
        refs = {r.path: r for r in discovered}
        given = {path: checked_count(value, refs[path], shard_count_file) for path, value in raw.items()}
    if not need_counts:
        return Dataset(selected, None, ignored_keys, listed=given, count_file=shard_count_file)

    counts: dict[str, int] = {}
    # Header scans made here (shards without a usable index) go to the workers, which would
    # otherwise each scan the shard again.
    scans: dict[str, ShardScan] = {}
    missing = [r for r in dict.fromkeys(selected) if r.path not in given]
    if shard_count_file is not None and missing:
        warnings.warn(f"shard_count_file {shard_count_file} lacks {len(missing)} selected shard(s); counting them", stacklevel=3)
    for r in dict.fromkeys(selected):
        if r.path in given:
            counts[r.path] = given[r.path]
            # A shard counted 0 is never opened, so its samples would vanish without a word: check it now.
            if given[r.path] == 0 and (real := count_one(r.path, size=r.size, use_index=True).samples):
                raise LoaderConfigError(f"{count_mismatch(r, real, 0, shard_count_file)}; {COUNT_FIX}")
        else:
            scan = load_index(r.path, expected_size=r.size)
            if scan is None:
                try:
                    # Headers only: the workers read the payloads later, so a read-ahead would read them twice.
                    scan = scans[r.path] = scan_shard(r.path, read_ahead=BLOCK)
                except OSError as exc:
                    raise StorageError(f"{r.path}: {exc.strerror or exc}") from None
                # A StorageError (a stall, a refused connection, a vanished file) propagates: a count that
                # depends on the weather would move every later position.
            if scan.damage:
                warnings.warn(f"{r.path}: damaged ({scan.damage}); using its {len(scan)} readable samples", stacklevel=3)
            counts[r.path] = len(scan)

    indices: dict[str, tuple[int, ...]] = {}
    for r in dict.fromkeys(selected):
        keys = ignored_by_path.get(r.path)
        if not keys:
            continue
        entries = (scans.get(r.path) or _scan(r, cache_path)).samples[: counts[r.path]]
        where = {e.key: i for i, e in enumerate(entries)}
        absent = sorted(k for k in keys if k not in where)
        if absent:
            warnings.warn(f"ignore index: {len(absent)} key(s) not found in {r.path}: {absent[:5]}", stacklevel=3)
        indices[r.path] = tuple(sorted(where[k] for k in keys if k in where))

    shard_counts = [counts[r.path] for r in selected]
    ignored_indices = [indices.get(r.path, ()) for r in selected]
    kept = sum(c - len(i) for c, i in zip(shard_counts, ignored_indices))
    if kept <= 0:
        raise LoaderConfigError(f"datatags: the selected shards hold no samples after the ignore index ({', '.join(tags)})")
    return Dataset(selected, shard_counts, ignored_keys, ignored_indices, listed=given, count_file=shard_count_file, scans=scans)


def files_map_base(first_tag: str) -> str:
    """Relative files_map paths resolve against the tag's parent, or the tag itself when it ends in '/'."""
    if first_tag.endswith("/"):
        return first_tag.rstrip("/") or first_tag
    try:
        return storage.parent(first_tag)
    except FgdataError as exc:
        raise LoaderConfigError(f"files_map: relative paths cannot resolve above {first_tag} ({exc})") from exc


def load_files_map(files_map: Mapping[str, Any] | None, first_tag: str) -> dict[str, np.ndarray]:
    """Load every constant once. A missing file is an error naming the resolved path.

    A value ``{"zeros": shape}`` is the explicit opt-in for a zero constant of that shape.
    """
    out: dict[str, np.ndarray] = {}
    for key, spec in (files_map or {}).items():
        if isinstance(spec, Mapping):
            if set(spec) != {"zeros"}:
                raise LoaderConfigError(f"files_map[{key!r}]: a mapping value must be {{'zeros': shape}}")
            out[key] = np.zeros(tuple(int(d) for d in spec["zeros"]), dtype=np.float32)
            continue
        path = str(spec)
        if path.startswith(PLACEHOLDER_PREFIX):
            raise LoaderConfigError(f"files_map[{key!r}]: {path!r} is a placeholder; set it to your file")
        if storage.is_absolute(path):
            resolved, how = path, "as given"
        else:
            base = files_map_base(first_tag)
            resolved, how = storage.join(base, path), f"relative to {base} (from datatag {first_tag})"
        try:
            data = storage.read_bytes(resolved)
        except (FgdataError, OSError) as exc:
            raise LoaderConfigError(f"files_map[{key!r}]: {resolved} ({how}) cannot be read: {exc}") from exc
        ext = "npz" if resolved.endswith(".npz") else "npy"
        try:
            out[key] = decode_member(ext, data)
        except FgdataError as exc:
            raise LoaderConfigError(f"files_map[{key!r}]: {resolved} is not a plain numpy array ({exc})") from exc
    return out
