"""What is inside a shard: counts, extension sets, bytes per extension, decoded summaries.

Local shards are read header-only for the statistics and then only the members shown are
read, one at a time; s3:// shards are streamed once, one sample in memory at a time. A member
over :data:`MEMBER_LIMIT` bytes is never loaded whole: an image or ``.npy`` is summarised from
its first :data:`HEAD_BYTES`, anything else by its size.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.shards.reader import ShardFile
from fgdata.shards.scan import SampleEntry, TarDamage, group_samples, iter_members, scan_shard

if TYPE_CHECKING:
    from fgdata.media.preview import Tile

MEMBER_LIMIT = 64 << 20
HEAD_BYTES = 1 << 20


@dataclass
class ShardReport:
    shard: str
    samples: int
    ext_sets: dict[str, int]  # "jpg,json,txt" -> samples having exactly that set
    bytes_per_ext: dict[str, int]
    shown: list[dict[str, Any]] = field(default_factory=list)  # {"key", "members": {ext: summary}}
    damage: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "samples": self.samples,
            "extension_sets": self.ext_sets,
            "bytes_per_extension": self.bytes_per_ext,
            "samples_shown": self.shown,
            "damage": self.damage,
        }


def _not_loaded(size: int) -> dict[str, Any]:
    return {"bytes": size, "not_loaded": f"over the {MEMBER_LIMIT >> 20} MiB inspect limit"}


def _describe_head(ext: str, head: bytes, size: int) -> dict[str, Any]:
    """A large member's summary from its first bytes: image and .npy headers, else only its size."""
    from fgdata.media.decode import member_kind

    kind = member_kind(ext)
    try:
        if kind == "image":
            from fgdata.media.image import describe_image

            return {**_not_loaded(size), **describe_image(head)}
        if kind == "npy":
            import numpy as np

            buf = io.BytesIO(head)
            version = np.lib.format.read_magic(buf)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(buf)  # the header only, not the payload
            return {**_not_loaded(size), "tensor": {"dtype": str(dtype), "shape": list(shape)}}
    except (FgdataError, OSError, ValueError) as e:
        return {**_not_loaded(size), "error": str(e).splitlines()[0] if str(e) else type(e).__name__}
    return _not_loaded(size)


def _summarise(ext: str, data: bytes) -> dict[str, Any]:
    from fgdata.media.decode import describe_member

    return {"bytes": len(data), **describe_member(ext, data, MEMBER_LIMIT)}


class _Shown:
    """Summaries (and preview tiles, as ``fgdata report`` draws them) of the samples shown, one member at a time."""

    def __init__(self, label: str, preview: bool):
        self.shard = label
        self.preview = preview
        self.samples: list[dict[str, Any]] = []
        self.tiles: list[Tile] = []

    def add(self, key: str, members: Iterator[tuple[str, int, bytes | None, bytes | None]]) -> None:
        """``members`` yields (ext, size, data or None, head or None); data is dropped after use, but for the first
        image or video's thumbnail, which waits for the caption."""
        from fgdata.media.decode import member_kind
        from fgdata.media.preview import CAPTION_EXTS, thumbnail

        out: dict[str, Any] = {}
        thumb: bytes | None = None
        captions: dict[str, str] = {}
        for ext, size, data, head in members:
            if data is not None:
                out[ext] = _summarise(ext, data)
                if self.preview and ext in CAPTION_EXTS:
                    captions[ext] = data.decode("utf-8", "replace")
                elif self.preview and thumb is None and member_kind(ext) in ("image", "video"):
                    thumb = thumbnail(data, member_kind(ext))
            elif head is not None:
                out[ext] = _describe_head(ext, head, size)
            else:
                out[ext] = _not_loaded(size)
        self.samples.append({"key": key, "members": dict(sorted(out.items()))})
        if thumb is not None:
            from fgdata.media.preview import Tile, tile_caption

            caption = next((captions[e] for e in CAPTION_EXTS if e in captions), None)
            self.tiles.append(Tile(key, self.shard, thumb, tile_caption(caption)))


def _local_members(sf: ShardFile, entry: SampleEntry) -> Iterator[tuple[str, int, bytes | None, bytes | None]]:
    for ext, (off, size) in sorted(entry.members.items()):
        if size <= MEMBER_LIMIT:
            yield ext, size, sf.read_range(off, off + size), None
        else:
            yield ext, size, None, sf.read_range(off, off + HEAD_BYTES)


def inspect_shard(path: str, *, limit: int = 5, key: str | None = None, preview: bool = False,
                  shown_before: int = 0, label: str | None = None) -> tuple[ShardReport, list[Tile]]:
    """Summarise a shard; returns the report and, with ``preview``, thumbnails of the samples shown (named by
    ``label``, default the shard's name).

    With ``key`` only that sample is shown; otherwise the first ``limit - shown_before`` samples.
    Raises FgdataError when the file is not a tar at all.
    """
    ext_sets: Counter[str] = Counter()
    bytes_per_ext: Counter[str] = Counter()
    shown = _Shown(label or storage.basename(path), preview)

    def wanted(k: str, i: int) -> bool:
        return k == key if key is not None else shown_before + i < limit

    if not storage.random_access(path):  # streamed front to back; local shards are scanned, then read at offsets
        count, damage = 0, None
        try:
            with storage.open_read(path) as stream:
                for entry, data in group_samples(iter_members(stream, seekable=False, with_data=True, max_data=MEMBER_LIMIT), []):
                    ext_sets[",".join(sorted(entry.members))] += 1
                    for ext, (_, size) in entry.members.items():
                        bytes_per_ext[ext] += size
                    if wanted(entry.key, count):
                        shown.add(entry.key, ((e, n, data.get(e), None) for e, (_, n) in sorted(entry.members.items())))
                    count += 1
        except TarDamage as exc:
            damage = str(exc)
    else:
        scan = scan_shard(path)
        damage, count = scan.damage, len(scan.samples)
        for entry in scan.samples:
            ext_sets[",".join(sorted(entry.members))] += 1
            for ext, (_, size) in entry.members.items():
                bytes_per_ext[ext] += size
        picks = [e for i, e in enumerate(scan.samples) if wanted(e.key, i)]
        if picks:
            with ShardFile(path, scan=scan) as sf:
                for entry in picks:
                    shown.add(entry.key, _local_members(sf, entry))
    if count == 0 and damage is not None:
        raise FgdataError(f"{path}: not a readable tar shard ({damage})")
    report = ShardReport(path, count, dict(ext_sets.most_common()), dict(sorted(bytes_per_ext.items())), shown.samples, damage)
    return report, shown.tiles


def combine(reports: list[ShardReport]) -> ShardReport:
    """Several shards' reports as one: summed counts and bytes, the samples shown in shard order (each naming its
    shard: its name, or its path when they come from several folders), damage left to the shards' own reports.
    ``shard`` says how many shards it covers."""
    from fgdata.shards.select import ShardSet

    selection = ShardSet([r.shard for r in reports])
    ext_sets: Counter[str] = Counter()
    bytes_per_ext: Counter[str] = Counter()
    shown: list[dict[str, Any]] = []
    for r in reports:
        ext_sets.update(r.ext_sets)
        bytes_per_ext.update(r.bytes_per_ext)
        shown += [{"shard": selection.label(r.shard), **s} for s in r.shown]
    return ShardReport(f"{len(reports):,} shards", sum(r.samples for r in reports), dict(ext_sets.most_common()),
                       dict(sorted(bytes_per_ext.items())), shown)


def inspect_shards(paths: str | list[str], *, limit: int = 5, key: str | None = None,
                   preview: bool = False) -> tuple[list[ShardReport], list[Tile]]:
    """:func:`inspect_shard` over every shard ``paths`` names; ``limit`` counts samples shown across them all.

    A ``key`` that is in none of the shards is an error.
    """
    from fgdata.shards.select import resolve_shards

    reports: list[ShardReport] = []
    tiles: list[Tile] = []
    shown = 0
    selection = resolve_shards(paths)
    for shard in selection.shards:
        report, more = inspect_shard(shard, limit=limit, key=key, preview=preview, shown_before=shown,
                                     label=selection.label(shard))
        reports.append(report)
        tiles.extend(more)
        shown += len(report.shown)
    if key is not None and not shown:
        where = reports[0].shard if len(reports) == 1 else f"{len(reports)} shards"
        raise FgdataError(f"{where}: no sample with key {key!r}")
    return reports, tiles


def score_records(shards: list[str]) -> dict[str, dict[str, Any]]:
    """Folder -> what each of its scores is (``FOLDER/scores.json``, written by ``fgdata score``), for the folders
    of ``shards`` that have one."""
    from fgdata.shards.scores import read_meta

    out: dict[str, dict[str, Any]] = {}
    for folder in dict.fromkeys(storage.parent(s) for s in shards):
        meta = read_meta(folder)
        if meta:
            out[folder] = meta
    return out
