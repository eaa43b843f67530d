"""Which shards a path names: a folder, one shard, several shards or a brace pattern, local or s3://.

Every command that reads shards resolves its arguments here, so ``count-shards``, ``inspect``,
``verify``, the loaders and ``report`` accept the same forms and fail with the same messages.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from fgdata import storage
from fgdata.errors import ShardError
from fgdata.shards.reader import discover_shards

EXPECTED = "expected a folder of .tar shards, a .tar shard, or a brace pattern like data/{00000..00099}.tar"
_GROUP = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_MAX_EXPANSION = 10_000_000


@dataclass
class ShardSet:
    """Resolved shards in order, with what the listings said about them.

    A *dataset* is the shards of one folder (or prefix): fgdata numbers keys per dataset and
    keeps one ``shard_count.json`` per folder, so keys, counts and shard names are unique only
    within a folder. A folder is one dataset however it is spelled (``a``, ``./a``, a symlink to
    it): folders are compared by :func:`fgdata.storage.same_file_key`, and named by their first
    spelling. ``whole`` holds (in that compared form) the folders that were given whole: their
    side files then describe exactly their shards. ``sizes`` holds the byte size of every shard
    whose listing gave one; ``repeated`` the shards named again, however spelled (each is read once).
    :func:`resolve_shards` fills it; it is not changed afterwards (the groupings are cached).
    """

    shards: list[str]
    sizes: dict[str, int] = field(default_factory=dict)
    whole: set[str] = field(default_factory=set)
    repeated: list[str] = field(default_factory=list)

    @functools.cached_property
    def datasets(self) -> dict[str, list[str]]:
        """Folder (as first spelled) -> its selected shards, in first-seen order."""
        names: dict[str, str] = {}  # compared form -> first spelling
        out: dict[str, list[str]] = {}
        for shard in self.shards:
            folder = names.setdefault(folder_key(shard), storage.parent(shard))
            out.setdefault(folder, []).append(shard)
        return out

    @functools.cached_property
    def folders(self) -> list[str]:
        """The folders holding the shards, in first-seen order (one dataset each; where their side files live)."""
        return list(self.datasets)

    @functools.cached_property
    def _folder_of(self) -> dict[str, str]:
        return {shard: folder for folder, shards in self.datasets.items() for shard in shards}

    def folder_of(self, shard: str) -> str:
        """The dataset (folder, as first spelled) a selected shard belongs to."""
        return self._folder_of[shard]

    def given_whole(self, shard: str) -> bool:
        """True when the shard's folder was given whole (its side files must list exactly its shards)."""
        return folder_key(shard) in self.whole

    def label(self, shard: str) -> str:
        """How a table row or message names a shard: its basename for one dataset, else its path."""
        return storage.basename(shard) if len(self.folders) <= 1 else shard

    def repeated_note(self) -> str | None:
        """One line saying that shards were named twice (and are read once), or None."""
        if not self.repeated:
            return None
        return (f"{len(self.repeated):,} shard(s) named more than once (e.g. {self.repeated[0]}, perhaps "
                "spelled another way or through a symlink): each is read once")


def folder_key(shard: str) -> str:
    """A shard's folder in the form compared across spellings (absolute, symlinks resolved; a URL normalised)."""
    return storage.parent(storage.same_file_key(shard))


def is_shard_name(path: str) -> bool:
    return path.lower().endswith(".tar")


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{a,b}`` alternatives and ``{00000..00099}`` ranges (zero padding kept), as webdataset does."""
    match = _GROUP.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    rng = _RANGE.match(body)
    if rng:
        lo, hi = rng.groups()
        a, b = int(lo), int(hi)
        if abs(b - a) >= _MAX_EXPANSION:
            raise ShardError(f"{pattern}: the range {{{body}}} names more than {_MAX_EXPANSION:,} shards")
        width = max(len(lo), len(hi)) if (lo.lstrip("-").startswith("0") or hi.lstrip("-").startswith("0")) else 0
        step = 1 if b >= a else -1
        choices = [str(n).zfill(width) for n in range(a, b + step, step)]
    elif "," in body:
        choices = body.split(",")
    else:
        raise ShardError(f"{pattern}: {{{body}}} is neither a range like {{00000..00099}} nor a list like {{a,b}}")
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [out for choice in choices for out in expand_braces(head + choice + tail)]


def _is_pattern(path: str) -> bool:
    return _GROUP.search(path) is not None


def _listing(folder: str, cache: dict[str, dict[str, int]]) -> dict[str, int]:
    """path -> size of the files directly in a local folder or s3 prefix (one listing per folder)."""
    if folder not in cache:
        cache[folder] = {i.path: i.size for i in storage.list_dir(folder)} if storage.is_dir(folder) else {}
    return cache[folder]


def _one(path: str, out: ShardSet, listings: dict[str, dict[str, int]]) -> None:
    """Add the shards ``path`` names to ``out`` (a whole folder also to ``out.whole``)."""
    if _is_pattern(path):
        names = expand_braces(path)
        for name in names:
            if not is_shard_name(name):
                raise ShardError(f"{path}: the pattern names {name}, not a .tar shard; {EXPECTED}")
            sizes = _listing(storage.parent(name), listings)
            if name not in sizes:
                if storage.is_dir(name):
                    raise ShardError(f"{name} (from the pattern {path}) is a folder, not a .tar shard")
                raise ShardError(f"{name} (from the pattern {path}): shard not found")
            out.shards.append(name)
            out.sizes[name] = sizes[name]
        return
    if storage.is_dir(path):  # a folder, or an s3 prefix with objects below it
        shards = discover_shards(path)
        if not shards:
            raise ShardError(f"{path} is a folder without .tar shards; {EXPECTED}")
        out.shards.extend(shards)
        out.whole.add(folder_key(shards[0]))
        wanted = set(shards)
        out.sizes.update((p, n) for p, n in _listing(path, listings).items() if p in wanted)
        return
    if is_shard_name(path):
        sizes = _listing(storage.parent(path), listings)  # one listing serves every shard of a folder
        if path in sizes:
            out.shards.append(path)
            out.sizes[path] = sizes[path]
            return
    elif storage.stat(path) is not None:
        raise ShardError(f"{path} is a file, not a .tar shard; {EXPECTED}")
    if os.path.lexists(path):
        raise ShardError(f"{path} is neither a file nor a folder; {EXPECTED}")
    raise ShardError(f"{path}: not found; {EXPECTED}")


def resolve_shards(paths: str | Sequence[str]) -> ShardSet:
    """The shards named by one path or several, in the order given (each shard once, however spelled).

    A folder or s3 prefix contributes its ``.tar`` shards in shard order; a ``.tar`` file or
    object itself; a brace pattern every shard it expands to, each of which must exist.
    Raises ShardError naming the path and what was expected.
    """
    items = [paths] if isinstance(paths, str) else list(paths)
    if not items:
        raise ShardError(f"no shards given; {EXPECTED}")
    out = ShardSet([])
    listings: dict[str, dict[str, int]] = {}
    for item in items:
        _one(item, out, listings)
    first: dict[str, str] = {}  # compared form -> first spelling
    for shard in out.shards:
        key = storage.same_file_key(shard)
        if key in first:
            out.repeated.append(shard)
        else:
            first[key] = shard
    out.shards = list(first.values())
    return out
