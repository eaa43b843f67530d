"""Checking one shard: tar structure, the key rule, required members and (optionally) a full decode.

One streaming pass per shard, built on the header scanner's member iterator and
sample grouping (:mod:`fgdata.shards.scan`), so what verify calls a sample is what
every reader calls a sample. A problem is attached either to a *sample* (it goes
to the ignore index) or to the *shard* (damage, a stale index, a wrong count).
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator, Sequence

import numpy as np

from fgdata import storage
from fgdata.errors import FgdataError, ShardError
from fgdata.media.decode import DECODE_LIMIT, inflate_limit
from fgdata.shards.index import index_path, parse_index
from fgdata.shards.keys import split_member_name, validate_key
from fgdata.shards.scan import BLOCK, MemberEntry, SampleEntry, TarDamage, group_samples, iter_members

# Tar type flags that are neither file data nor harmless directories: links and devices.
_DIRECTORY = "5"
END_MARKER = 2 * BLOCK
# ``--decode`` loads a member whole to decode it; larger members (DECODE_LIMIT) are not decoded and are
# reported as a note ("too-large-to-decode"), never as damage. Documented in docs/FORMATS.md.


@dataclass
class Problem:
    """One finding: a reason category (a table column), the sample key if any, and a one-line detail."""

    reason: str
    detail: str
    key: str | None = None

    def to_json(self) -> dict:
        out = {"reason": self.reason, "detail": self.detail}
        if self.key is not None:
            out["key"] = self.key
        return out


@dataclass
class ShardResult:
    """What verify learned about one shard.

    ``samples`` counts every sample the scan found, including one cut by damage;
    ``readable`` those physically present and complete (the count to write).
    ``readable`` is None when the shard could not be read to its end for a reason
    that is not the shard's fault (storage error): its count is then unknown.
    ``notes`` are findings that are not problems (a member too large to decode).
    """

    shard: str
    name: str
    size: int | None
    samples: int = 0
    readable: int | None = 0
    damage: str | None = None
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    image_exts: Counter = field(default_factory=Counter)  # samples per image extension (one format per dataset?)
    key_hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))

    @property
    def sample_problems(self) -> list[Problem]:
        return [p for p in self.problems if p.key is not None]

    @property
    def bad_keys(self) -> list[str]:
        """Keys to ignore, each once, in first-seen order."""
        return list(dict.fromkeys(p.key for p in self.problems if p.key is not None))

    @property
    def by_reason(self) -> Counter:
        return Counter(p.reason for p in self.problems)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {
            "shard": self.shard,
            "name": self.name,
            "size": self.size,
            "samples": self.samples,
            "readable": self.readable,
            "bad_samples": len(self.bad_keys),
            "damage": self.damage,
            "by_reason": dict(sorted(self.by_reason.items())),
            "problems": [p.to_json() for p in self.problems],
            "notes": [p.to_json() for p in self.notes],
        }


def key_hash(key: str) -> int:
    """A 64-bit digest of a key: dataset-wide uniqueness checks keep 8 bytes per sample, not the key."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest(), "little")


class _MemberWatch:
    """Pass members through to the grouping while noting what grouping itself discards.

    Grouping keeps the last payload when an extension repeats and skips non-file
    members; verify reports both, so it watches the raw member stream.
    """

    def __init__(self, members: Iterator[tuple[MemberEntry, bytes | None]]):
        self._members = members
        self.last_end = 0
        self.repeated: dict[str, list[str]] = {}
        self.specials: list[MemberEntry] = []
        self._run_key: str | None = None
        self._run_exts: set[str] = set()

    def __iter__(self) -> Iterator[tuple[MemberEntry, bytes | None]]:
        for entry, data in self._members:
            self.last_end = max(self.last_end, entry.end if entry.is_file else entry.data_offset)
            if not entry.is_file:
                if entry.typeflag != _DIRECTORY:
                    self.specials.append(entry)
                yield entry, data
                continue
            key, ext = split_member_name(entry.name)
            if key == self._run_key:
                if ext in self._run_exts:
                    self.repeated.setdefault(key, []).append(ext)
                self._run_exts.add(ext)
            else:
                self._run_key, self._run_exts = key, {ext}
            yield entry, data


def _damage_reason(message: str, samples: int) -> str:
    if samples == 0 and message.endswith("at byte 0"):
        return "not-a-tar"
    return "truncated" if "truncated" in message else "corrupt"


def _check_members(members: dict[str, bytes]) -> list[tuple[str, str]]:
    """(reason, extension) for every member that does not decode by its extension."""
    from fgdata.media.decode import check_member

    bad = []
    for ext, data in sorted(members.items()):
        try:
            reason = check_member(ext, data)
        except Exception as exc:  # noqa: BLE001 - a decoder bug on one member must not stop verify
            reason = f"decode-{type(exc).__name__}"
        if reason:
            bad.append((reason, ext))
    return bad


def _too_large(entry: SampleEntry, data: dict[str, bytes]) -> list[Problem]:
    """Notes for members that were not loaded because they exceed the decode limit."""
    return [
        Problem("too-large-to-decode", f".{ext} is {size:,} bytes, above the {DECODE_LIMIT:,}-byte decode limit; not decoded", entry.key)
        for ext, (_, size) in sorted(entry.members.items()) if size > DECODE_LIMIT and ext not in data and _decodable(ext)
    ]


def _decodable(ext: str) -> bool:
    """Whether ``--decode`` has anything to check in a member (opaque bytes have not)."""
    from fgdata.media.decode import member_kind

    return member_kind(ext) != "bytes" or ext.lower().endswith("gz")


def _is_image(ext: str) -> bool:
    from fgdata.media.decode import member_kind

    return member_kind(ext) == "image"


def _check_sample(entry: SampleEntry, data: dict[str, bytes], require: Sequence[str], decode: bool) -> list[Problem]:
    key = entry.key
    found: list[Problem] = []
    try:
        validate_key(key)
    except ShardError as exc:
        found.append(Problem("bad-key", str(exc), key))
    if "" in entry.members:
        found.append(Problem("bad-key", f"member {key!r} has no extension", key))
    missing = [ext for ext in require if ext not in entry.members]
    if missing:
        found.append(Problem("missing-member", "missing " + ", ".join(f".{e}" for e in missing), key))
    if decode:
        for reason, ext in _check_members(data):
            detail = (f".{ext} inflates past the {inflate_limit(ext):,}-byte limit for its kind" if reason == "gzip-too-large"
                      else f".{ext} does not decode")
            found.append(Problem(reason, detail, key))
    return found


def _compare_index(result: ShardResult, entries: list[SampleEntry], damaged: bool) -> None:
    """Check the shard's offset index, if it has one, against what the scan found."""
    path = index_path(result.shard)
    try:
        if not storage.exists(path):
            return
        raw = storage.read_bytes(path)
    except FgdataError as exc:
        result.problems.append(Problem("index-unreadable", str(exc).splitlines()[0]))
        return
    try:
        scan, _ = parse_index(result.shard, raw)
    except ShardError as exc:
        result.problems.append(Problem("index-invalid", str(exc)))
        return
    if result.size is not None and scan.size != result.size:
        result.problems.append(Problem("index-stale", f"index says {scan.size} bytes, shard has {result.size}"))
        return
    if damaged:
        return  # the damage is the finding; a size-matched index of a damaged shard is moot
    ours = [(s.key, s.start, s.end, s.members) for s in entries]
    theirs = [(s.key, s.start, s.end, s.members) for s in scan.samples]
    if ours != theirs:
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        result.problems.append(
            Problem("index-mismatch", f"index lists {len(theirs)} samples, shard has {len(ours)}; first difference at sample {first}")
        )


def _scan(result: ShardResult, f: BinaryIO, seekable: bool, total: int | None, require: Sequence[str], decode: bool,
          entries: list[SampleEntry], hashes: list[int]) -> None:
    wanted = (lambda name: _decodable(split_member_name(name)[1])) if decode else False
    watch = _MemberWatch(iter_members(f, seekable=seekable, total=total, with_data=wanted, max_data=DECODE_LIMIT))
    seen: dict[str, set[str]] = {}
    try:
        for entry, data in group_samples(iter(watch), []):
            entries.append(entry)
            hashes.append(key_hash(entry.key))
            exts = set(entry.members)
            result.image_exts.update(e for e in exts if _is_image(e))
            if entry.key in seen:
                reason = "not-adjacent" if not (seen[entry.key] & exts) else "duplicate-key"
                what = "members of one sample are not adjacent" if reason == "not-adjacent" else "key appears twice in the shard"
                result.problems.append(Problem(reason, what, entry.key))
                seen[entry.key] |= exts
            else:
                seen[entry.key] = exts
            result.problems.extend(_check_sample(entry, data, require, decode))
            if decode:
                result.notes.extend(_too_large(entry, data))
    except TarDamage as exc:
        result.damage = str(exc)
        reason = _damage_reason(result.damage, len(entries))
        cut = f"; sample {split_member_name(exc.member)[0]!r} is incomplete" if exc.member else ""
        result.problems.append(Problem(reason, f"{result.damage}{cut} ({len(entries)} readable samples before it)"))
        if exc.member is None and entries:
            # A damaged header hides which member it was: the open sample may have lost members after it.
            result.problems.append(Problem(reason, "last sample before the damage may be incomplete", entries[-1].key))
        result.samples = len(entries) + (1 if exc.member else 0)
    else:
        result.samples = len(entries)
    for key, repeated in watch.repeated.items():
        result.problems.append(Problem("repeated-ext", "extension " + ", ".join(f".{e}" for e in repeated) + " repeats", key))
    keys = set(seen)
    for special in watch.specials:
        key = split_member_name(special.name)[0]
        detail = f"member {special.name!r} is a link or special file (type {special.typeflag!r})"
        result.problems.append(Problem("link-member", detail, key if key in keys else None))
    if result.damage is None:
        if not entries:
            result.problems.append(Problem("empty-shard", "no samples"))
        elif total is not None and total < watch.last_end + END_MARKER:
            last = entries[-1].key
            result.problems.append(Problem("truncated", "no end-of-archive marker: the shard was cut at a member boundary"))
            result.problems.append(Problem("truncated", "last sample before the cut may be incomplete", last))


def check_shard(path: str, *, size: int | None = None, decode: bool = False, require: Sequence[str] = ()) -> ShardResult:
    """Verify one local or s3:// shard; never raises for bad data or unreachable storage.

    ``size`` (from a listing) lets a streamed s3 shard be checked for its end marker.
    """
    result = ShardResult(path, storage.basename(path), size)
    entries: list[SampleEntry] = []
    hashes: list[int] = []
    try:
        with storage.open_read(path, buffering=0) as f:
            seekable = f.seekable()
            if seekable:
                result.size = f.seek(0, os.SEEK_END)
                f.seek(0)
            _scan(result, f, seekable, result.size, require, decode, entries, hashes)
    except FgdataError as exc:
        # Storage failed (an endpoint died mid-stream, a file vanished): the shard's
        # content is unknown, not bad. No count for it; its sample findings stand.
        result.readable = None
        result.damage = str(exc).splitlines()[0]
        result.problems = [p for p in result.problems if p.key is not None and p.reason != "truncated"]
        result.problems.append(Problem("unreadable", result.damage))
        result.key_hashes = np.asarray(hashes, dtype=np.uint64)
        return result
    result.readable = len(entries)
    result.key_hashes = np.asarray(hashes, dtype=np.uint64)
    _compare_index(result, entries, result.damage is not None)
    return result
