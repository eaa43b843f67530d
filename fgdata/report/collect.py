"""One pass over a dataset's shards, gathering what the report shows.

Every sample's tar headers, ``json`` and caption members are read (they are small); the
bigger members are touched only when needed: image sizes and video facts come from
fgdata's own json metadata when it is there, else from the member's header (images) or a
probe (videos), and those decodes, like the tensor summaries and the contact-sheet tiles,
are bounded by a budget spread evenly over the dataset. Shards are independent, so they
are read on the pool the caller hands down (the CLI's: the job core's processes) and merged in
shard order: the result does not depend on the number of workers.

Memory stays bounded per member: no member is loaded whole past the limit ``fgdata inspect``
keeps (:data:`fgdata.verify.inspect.MEMBER_LIMIT`; an image over it is sized from its first
bytes, anything else is counted as not loaded), and captions are counted, never split into lists.
"""

from __future__ import annotations

import json
import re
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.media.preview import CAPTION_EXTS, Tile, thumbnail, tile_caption
from fgdata.shards.metadata import fgdata_fields
from fgdata.verify.inspect import HEAD_BYTES, MEMBER_LIMIT
from fgdata.workers import OrderedMap, serial_map

if TYPE_CHECKING:
    from fgdata.shards import ShardSet
    from fgdata.verify.shard import ShardResult

#: json fields that describe the media (shown in the image and video sections, not as numeric fields).
MEDIA_FIELDS = frozenset({"width", "height", "duration", "fps", "frame_count", "rotation", "audio_sample_rate",
                          "audio_channels", "original_width", "original_height"})
_HEADER_BYTES = 1 << 16  # enough for an image's size in its header, nearly always
_EXAMPLES = 5  # example keys kept per kind of problem
_MAX_FIELDS = 64  # numeric json fields tracked at most (the most frequent are shown)
NEAR = 6  # samples shown on each side of a threshold the user passes


@dataclass
class Problem:
    """One kind of problem with how many samples or shards it affects and a few examples."""

    kind: str
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, example: str, n: int = 1) -> None:
        self.count += n
        if len(self.examples) < _EXAMPLES:
            self.examples.append(example)

    def merge(self, other: Problem) -> None:
        self.count += other.count
        self.examples.extend(other.examples[: _EXAMPLES - len(self.examples)])


@dataclass(frozen=True)
class Near:
    """A sample whose field is close to a threshold: how far from it, where it is, and its value."""

    distance: float
    path: str
    shard: str
    key: str
    value: float


def _closest(candidates: list[Near], n: int) -> list[Near]:
    """The ``n`` nearest, ties in reading order (the sort is stable): the same picks for any worker count."""
    return sorted(candidates, key=lambda c: c.distance)[:n]


@dataclass
class Stats:
    """Everything the report needs; one per shard, then merged into one for the dataset."""

    shards: list[dict[str, Any]] = field(default_factory=list)  # {"shard", "path", "dataset", "samples", ...}
    ext_sets: Counter[str] = field(default_factory=Counter)
    ext_examples: dict[str, str] = field(default_factory=dict)  # ext set -> one example key
    ext_counts: Counter[str] = field(default_factory=Counter)
    ext_bytes: Counter[str] = field(default_factory=Counter)
    image_w: array = field(default_factory=lambda: array("i"))
    image_h: array = field(default_factory=lambda: array("i"))
    image_members: int = 0
    image_sizes_from_json: int = 0
    video_members: int = 0
    video_duration: array = field(default_factory=lambda: array("d"))
    video_fps: array = field(default_factory=lambda: array("d"))
    video_frames: array = field(default_factory=lambda: array("i"))
    video_res: Counter[str] = field(default_factory=Counter)
    video_audio: int = 0
    video_facts_from_json: int = 0
    captions: int = 0
    caption_words: array = field(default_factory=lambda: array("i"))
    caption_chars: array = field(default_factory=lambda: array("i"))
    first_words: Counter[str] = field(default_factory=Counter)
    json_members: int = 0
    not_loaded: Counter[str] = field(default_factory=Counter)  # ext -> members over the per-member limit
    numeric: dict[str, array] = field(default_factory=dict)
    non_numeric: Counter[str] = field(default_factory=Counter)  # field present with a non-numeric value
    tensors: Counter[str] = field(default_factory=Counter)  # "latent.pth float32[4,32,32]" -> samples
    clip_seconds: array = field(default_factory=lambda: array("d"))  # clip_end_s - clip_start_s (split scenes)
    #: field -> ("above", "below") -> the samples nearest a threshold the user passed, kept or dropped by the filter
    near: dict[str, dict[str, list[Near]]] = field(default_factory=dict)
    near_tiles: dict[str, dict[str, list[Tile]]] = field(default_factory=dict)  # the same, as contact-sheet tiles
    decoded: int = 0
    tiles: list[Tile] = field(default_factory=list)
    problems: dict[str, Problem] = field(default_factory=dict)
    checks: list[ShardResult] = field(default_factory=list)  # verify's check of each shard (keys, structure)

    @property
    def samples(self) -> int:
        return sum(s["samples"] for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s["bytes"] for s in self.shards)

    def problem(self, kind: str, example: str, n: int = 1) -> None:
        self.problems.setdefault(kind, Problem(kind)).add(example, n)

    def merge(self, other: Stats) -> None:
        """Add another shard's statistics (call in shard order)."""
        self.shards += other.shards
        for name in ("ext_sets", "ext_counts", "ext_bytes", "video_res", "first_words", "non_numeric", "tensors",
                     "not_loaded"):
            getattr(self, name).update(getattr(other, name))
        for k, v in other.ext_examples.items():
            self.ext_examples.setdefault(k, v)
        for name in ("image_w", "image_h", "video_duration", "video_fps", "video_frames", "caption_words",
                     "caption_chars", "clip_seconds"):
            getattr(self, name).extend(getattr(other, name))
        for name in ("image_members", "image_sizes_from_json", "video_members", "video_audio",
                     "video_facts_from_json", "captions", "json_members", "decoded"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for k, values in other.numeric.items():
            if k in self.numeric:
                self.numeric[k].extend(values)
            elif len(self.numeric) < _MAX_FIELDS:
                self.numeric[k] = array("d", values)
        for name, sides in other.near.items():
            mine = self.near.setdefault(name, {"above": [], "below": []})
            for side, found in sides.items():
                mine[side] = _closest(mine[side] + found, NEAR)
        self.tiles += other.tiles
        self.checks += other.checks
        for kind, p in other.problems.items():
            self.problems.setdefault(kind, Problem(kind)).merge(p)


# -- reading one shard ---------------------------------------------------------


@dataclass
class _Entry:
    """A sample as the collector sees it: member sizes, and a way to read a member (or its first bytes)."""

    key: str
    sizes: dict[str, int]
    read_at: Callable[[str, int | None], bytes | None]  # None: a streamed member over the limit, never loaded
    refused: set[str] = field(default_factory=set)  # members asked for whole but over the limit

    def read(self, ext: str, limit: int | None) -> bytes | None:
        """The member, or its first ``limit`` bytes; None for a whole member over :data:`MEMBER_LIMIT`."""
        if limit is None and self.sizes[ext] > MEMBER_LIMIT:
            self.refused.add(ext)
            return None
        return self.read_at(ext, limit)


def _open(path: str, stats: Stats) -> tuple[int | None, Iterator[_Entry]]:
    """The shard's sample count when known before reading (a local header scan, an index on s3://), and its
    samples: positioned reads of the members needed locally, one streamed pass on s3://."""
    from fgdata.shards import ShardFile, load_index, scan_shard
    from fgdata.shards.scan import TarDamage, group_samples, iter_members

    name = stats.shards[-1]["shard"]
    row = stats.shards[-1]
    if not storage.random_access(path):
        index = load_index(path, expected_size=row["bytes"])

        def stream() -> Iterator[_Entry]:
            count = 0
            try:
                with storage.open_read(path) as f:  # members over the limit are skipped, as inspect does
                    members = iter_members(f, seekable=False, with_data=True, max_data=MEMBER_LIMIT)
                    for sample, data in group_samples(members, []):
                        count += 1

                        def read(ext: str, limit: int | None, data: dict[str, bytes] = data) -> bytes | None:
                            if ext not in data:
                                return None
                            return data[ext] if limit is None else data[ext][:limit]

                        yield _Entry(sample.key, {e: size for e, (_, size) in sample.members.items()}, read)
            except TarDamage as exc:
                stats.problem("damaged shard", f"{name}: {exc} (after {count} samples)")
                row["damage"] = str(exc)
            row["samples"] = count

        return (len(index.samples) if index is not None else None), stream()
    scan = scan_shard(path)
    row["samples"] = len(scan.samples)
    if scan.damage:
        row["damage"] = scan.damage
        stats.problem("damaged shard", f"{name}: {scan.damage} (after {len(scan.samples)} samples)")

    def local() -> Iterator[_Entry]:
        if not scan.samples:
            return
        with ShardFile(path, scan=scan) as sf:
            for entry in scan.samples:

                def read(ext: str, limit: int | None, members: dict = entry.members) -> bytes:
                    off, size = members[ext]
                    return sf.read_range(off, off + (size if limit is None else min(size, limit)))

                yield _Entry(entry.key, {e: size for e, (_, size) in entry.members.items()}, read)

    return len(scan.samples), local()


def _spread(total: int, parts: int, i: int) -> int:
    """Part ``i`` of ``total`` items split as evenly as possible over ``parts``."""
    return (i + 1) * total // parts - i * total // parts


def _picks(n: int, k: int) -> set[int]:
    """``k`` indices spread evenly over ``range(n)`` (centred in their strides)."""
    k = min(k, n)
    return {(2 * j + 1) * n // (2 * k) for j in range(k)} if k else set()


def _json(entry: _Entry, stats: Stats, name: str) -> dict[str, Any] | None:
    ext = "json" if "json" in entry.sizes else "json.gz" if "json.gz" in entry.sizes else None
    if ext is None:
        return None
    stats.json_members += 1
    from fgdata.media.decode import InflateLimitError, unwrap_gz

    try:
        data = entry.read(ext, None)
        if data is None:
            return None
        doc = json.loads(unwrap_gz(ext, data)[1])
    except InflateLimitError as exc:
        stats.problem("member too large", f"{name} {entry.key}.{ext}: {exc}")
        return None
    except (ValueError, UnicodeDecodeError, RecursionError, FgdataError):
        stats.problem("invalid json", f"{name} {entry.key}")
        return None
    return doc if isinstance(doc, dict) else None


def _clip_seconds(doc: dict[str, Any], stats: Stats) -> None:
    """A clip's length from the fields ``shard videos --split scenes`` writes (docs/FORMATS.md)."""
    start, end = doc.get("clip_start_s"), doc.get("clip_end_s")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) and v == v for v in (start, end)):
        stats.clip_seconds.append(float(end) - float(start))  # type: ignore[arg-type]


def _near(doc: dict[str, Any], thresholds: dict[str, float], where: tuple[str, str, str], stats: Stats) -> None:
    """Keep the sample among the nearest to each threshold on its side: at or above it is what the loaders'
    ``score`` filter keeps (its own rule), below is what it drops."""
    from fgdata.catalog import score_verdict

    for name, t in thresholds.items():
        v = doc.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            continue
        side = "above" if score_verdict(v, name, t) is None else "below"
        sides = stats.near.setdefault(name, {"above": [], "below": []})
        sides[side].append(Near(abs(float(v) - t), *where, float(v)))
        if len(sides[side]) > 4 * NEAR:
            sides[side] = _closest(sides[side], NEAR)


def _numeric_fields(doc: dict[str, Any], stats: Stats, wanted: dict[str, float]) -> None:
    """Collect the numeric fields; the media's own (width, fps...) only when the user passed a threshold on one."""
    for k, v in doc.items():
        if k in MEDIA_FIELDS and k not in wanted:
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if v != v:  # NaN: the score filter drops it like a non-numeric value
                stats.non_numeric[k] += 1
                continue
            if k not in stats.numeric:
                if len(stats.numeric) >= _MAX_FIELDS and k not in wanted:
                    continue
                stats.numeric[k] = array("d")
            stats.numeric[k].append(float(v))
        elif k in stats.numeric or k in wanted:
            stats.non_numeric[k] += 1


_WORD = re.compile(r"\S+")


def _caption(entry: _Entry, stats: Stats, name: str) -> str | None:
    """Count the caption's words and characters without splitting it into a list (a caption can be megabytes)."""
    ext = next((e for e in CAPTION_EXTS if e in entry.sizes), None)
    if ext is None:
        return None
    data = entry.read(ext, None)
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        stats.problem("caption not UTF-8", f"{name} {entry.key}.{ext}")
        return None
    del data
    first = _WORD.search(text)
    stats.captions += 1
    stats.caption_words.append(sum(1 for _ in _WORD.finditer(text)))
    end = len(text)
    while end and text[end - 1].isspace():
        end -= 1
    stats.caption_chars.append(end - first.start() if first else 0)
    if first:
        word = first.group()
        stats.first_words[word.strip(".,:;!?\"'()[]").lower() or word] += 1
    return text


def _image_size(entry: _Entry, ext: str, doc: dict | None, decode: bool, stats: Stats, name: str) -> None:
    stats.image_members += 1
    own = fgdata_fields(doc)
    if isinstance(own.get("width"), int) and isinstance(own.get("height"), int):
        stats.image_w.append(own["width"])
        stats.image_h.append(own["height"])
        stats.image_sizes_from_json += 1
        return
    if not decode:
        return
    from fgdata.media.image import describe_image

    stats.decoded += 1
    try:
        try:
            facts = describe_image(entry.read(ext, _HEADER_BYTES) or b"")
        except FgdataError:
            # a header beyond the first bytes: the whole image, or its first HEAD_BYTES past the limit (as inspect)
            data = entry.read(ext, None)
            if data is None:
                data = entry.read(ext, HEAD_BYTES)
                if data is None:
                    return
            facts = describe_image(data)
    except FgdataError as exc:
        stats.problem("undecodable image", f"{name} {entry.key}.{ext}: {str(exc).splitlines()[0]}")
        return
    turned = facts.get("orientation", 1) in (5, 6, 7, 8)  # the size a viewer (and the loader) shows
    stats.image_w.append(int(facts["height" if turned else "width"]))
    stats.image_h.append(int(facts["width" if turned else "height"]))


_VIDEO_JSON = ("duration", "fps", "frame_count", "width", "height")


def _video_facts(entry: _Entry, ext: str, doc: dict | None, decode: bool, stats: Stats, name: str) -> None:
    stats.video_members += 1
    own = fgdata_fields(doc)
    if all(isinstance(own.get(k), (int, float)) for k in _VIDEO_JSON) and "audio_codec" in own:
        facts = own
        stats.video_facts_from_json += 1
    elif decode:
        from fgdata.media.video import probe_video

        data = entry.read(ext, None)
        if data is None:
            return
        stats.decoded += 1
        try:
            facts = probe_video(data).to_dict()
        except FgdataError as exc:
            stats.problem("undecodable video", f"{name} {entry.key}.{ext}: {str(exc).splitlines()[0]}")
            return
    else:
        return
    stats.video_duration.append(float(facts["duration"]))
    stats.video_fps.append(float(facts["fps"]))
    stats.video_frames.append(int(facts["frame_count"]))
    stats.video_res[f"{facts['width']}×{facts['height']}"] += 1
    stats.video_audio += bool(facts.get("audio_codec"))


def _tensor(entry: _Entry, ext: str, stats: Stats, name: str) -> None:
    from fgdata.media.decode import describe_member
    from fgdata.formatting import dtype_shape

    data = entry.read(ext, None)
    if data is None:
        return
    stats.decoded += 1
    summary = describe_member(ext, data)
    if "error" in summary:
        stats.problem("undecodable tensor", f"{name} {entry.key}.{ext}: {summary['error']}")
        return
    t = summary.get("tensor")
    if isinstance(t, dict) and "dtype" in t:
        stats.tensors[f"{ext} {dtype_shape(t['dtype'], t['shape'])}"] += 1
    elif isinstance(t, dict):
        parts = [f"{k}: {dtype_shape(v['dtype'], v['shape'])}" for k, v in t.items() if isinstance(v, dict) and "dtype" in v]
        stats.tensors[f"{ext} {{{', '.join(parts)}}}"] += 1
    else:
        stats.tensors[f"{ext} {type(t).__name__}"] += 1


def _tile(entry: _Entry, ext: str, kind: str, caption: str | None, stats: Stats, name: str, size: int) -> None:
    try:
        data = entry.read(ext, None)
    except (FgdataError, OSError, ValueError):
        return
    if data is None:
        return
    png = thumbnail(data, kind, size)
    if png is not None:
        stats.tiles.append(Tile(entry.key, name, png, tile_caption(caption)))


def _score_rows(path: str) -> dict[str, dict[str, Any]]:
    """key -> the score fields of the shard's score file (``fgdata score``); empty without one."""
    from fgdata.shards.scores import numeric_fields, read_scores

    found = read_scores(path)
    return {} if found is None else {k: numeric_fields(r) for k, r in found.rows.items()}


def collect_shard(path: str, budget: int, tiles: int, label: str | None = None, thumb: int = 192,
                  thresholds: dict[str, float] | None = None) -> Stats:
    """Statistics of one shard; ``budget`` samples get their media decoded, ``tiles`` become thumbnails.
    ``label`` names the shard in rows and examples (its path when several datasets are read; default its name);
    the samples nearest each of ``thresholds`` (field -> value) are noted on either side."""
    from fgdata.media.decode import member_kind

    stats = Stats()
    name = label or storage.basename(path)
    stats.shards.append({"shard": name, "path": path, "samples": 0, "bytes": 0, "damage": None, "image_exts": {}})
    try:
        size = storage.size(path)
    except FgdataError as exc:
        stats.shards[-1]["damage"] = str(exc).splitlines()[0]
        stats.problem("unreadable shard", f"{name}: {stats.shards[-1]['damage']}")
        return stats
    stats.shards[-1]["bytes"] = size
    try:
        scores = _score_rows(path)
        known, entries = _open(path, stats)
        decode_at = _picks(known, budget) if known is not None else set(range(budget))
        tile_at = _picks(known, tiles) if known is not None else set(range(tiles))
        for i, entry in enumerate(entries):
            exts = ",".join(sorted(entry.sizes))
            stats.ext_sets[exts] += 1
            stats.ext_examples.setdefault(exts, f"{name} {entry.key}")
            stats.ext_counts.update(entry.sizes.keys())
            images = stats.shards[-1]["image_exts"]  # per shard, so the one-format rule is judged per dataset
            for ext in entry.sizes:
                if member_kind(ext) == "image":
                    images[ext] = images.get(ext, 0) + 1
            for ext, n in entry.sizes.items():
                stats.ext_bytes[ext] += n
                if n == 0:
                    stats.problem("empty member", f"{name} {entry.key}.{ext}")
            doc = _json(entry, stats, name)
            if entry.key in scores:  # scores beside the shard read as json fields, as the loaders join them
                doc = {**(doc or {}), **scores[entry.key]}
            if doc is not None:
                _numeric_fields(doc, stats, thresholds or {})
                _clip_seconds(doc, stats)
                _near(doc, thresholds or {}, (path, name, entry.key), stats)
            caption = _caption(entry, stats, name)
            decode = i in decode_at
            media = None
            for ext in sorted(entry.sizes):
                kind = member_kind(ext)
                if kind == "image":
                    _image_size(entry, ext, doc, decode, stats, name)
                elif kind == "video":
                    _video_facts(entry, ext, doc, decode, stats, name)
                elif kind in ("pth", "npy", "npz") and decode:
                    _tensor(entry, ext, stats, name)
                else:
                    continue
                media = media or ((ext, kind) if kind in ("image", "video") else None)
            if media and i in tile_at:
                _tile(entry, media[0], media[1], caption, stats, name, thumb)
            stats.not_loaded.update(entry.refused)
    except FgdataError as exc:
        stats.shards[-1]["damage"] = str(exc).splitlines()[0]
        stats.problem("unreadable shard", f"{name}: {stats.shards[-1]['damage']}")
        return stats
    from fgdata.verify.shard import check_shard

    stats.checks.append(check_shard(path, size=size))  # its findings are added once the dataset is checked
    return stats


# Verify's findings that the pass above already reports in its own words ("damaged shard", "unreadable shard").
_DAMAGE = frozenset({"corrupt", "not-a-tar", "truncated", "unreadable"})


def _structure(stats: Stats, selection: ShardSet) -> None:
    """Every structural problem ``fgdata verify`` finds (keys, also across a dataset's shards; links and devices;
    a missing end of archive; an empty shard; a stale index; a count file that disagrees), by verify's own
    checks, each dataset (folder) on its own: the two commands cannot disagree."""
    from fgdata.verify.dataset import VerifyReport, check_datasets
    from fgdata.verify.shard import ShardResult

    checked = {r.shard for r in stats.checks}
    unread = [ShardResult(row["path"], storage.basename(row["path"]), None, readable=None)  # count unknown
              for row in stats.shards if row["path"] not in checked]
    report = VerifyReport(" ".join(selection.folders), stats.checks + unread, selection=selection)
    check_datasets(report)
    for result in stats.checks:
        name = selection.label(result.shard)
        for p in result.problems:
            if p.reason in _DAMAGE and (result.damage is not None or p.reason != "truncated"):
                continue
            stats.problem(p.reason, f"{name} {p.key}: {p.detail}" if p.key is not None else f"{name}: {p.detail}")
    for p in report.problems:
        stats.problem(p.reason, p.detail)


# -- the dataset ---------------------------------------------------------------


def _collect_job(job: tuple[str, int, int, str, dict[str, float]]) -> Stats:
    """:func:`collect_shard` on one ``(path, budget, tiles, label, thresholds)``: module-level, so a pool worker
    can run it."""
    path, budget, tiles, label, thresholds = job
    return collect_shard(path, budget, tiles, label, thresholds=thresholds)


def _near_job(job: tuple[str, str, frozenset[str]]) -> list[Tile]:
    """Contact-sheet tiles of the samples ``keys`` names in one shard, in reading order: the shard's second read,
    for the few samples nearest a threshold."""
    from fgdata.media.decode import member_kind

    path, name, keys = job
    scratch = Stats()  # the first pass counted and checked everything; this one only draws
    scratch.shards.append({"shard": name, "path": path, "samples": 0, "bytes": storage.size(path), "damage": None})
    try:
        for entry in _open(path, scratch)[1]:
            if entry.key not in keys:
                continue
            media = next(((e, k) for e in sorted(entry.sizes) if (k := member_kind(e)) in ("image", "video")), None)
            if media is not None:
                _tile(entry, media[0], media[1], _caption(entry, scratch, name), scratch, name, 192)
    except FgdataError:  # changed since the first pass, which found and reported what it could read
        pass
    return scratch.tiles


def _near_tiles(stats: Stats, pool: OrderedMap) -> None:
    """Thumbnails of the samples nearest each threshold, read again from only the shards that hold them; each
    tile's caption starts with the field's value."""
    from dataclasses import replace

    from fgdata.formatting import number

    wanted: dict[str, set[str]] = {}  # path -> keys
    labels: dict[str, str] = {}
    for sides in stats.near.values():
        for picks in sides.values():
            for n in picks:
                wanted.setdefault(n.path, set()).add(n.key)
                labels[n.path] = n.shard
    order = {row["path"]: i for i, row in enumerate(stats.shards)}
    paths = sorted(wanted, key=order.__getitem__)
    found: dict[tuple[str, str], Tile] = {}
    for path, drawn in zip(paths, pool(_near_job, [(p, labels[p], frozenset(wanted[p])) for p in paths])):
        found.update({(path, t.key): t for t in drawn})
    for name, sides in stats.near.items():
        stats.near_tiles[name] = {
            side: [replace(t, caption=f"{name} {number(n.value)} · {t.caption}")
                   for n in picks if (t := found.get((n.path, n.key))) is not None]
            for side, picks in sides.items()}


def collect(shards: list[str] | ShardSet, *, sample: int = 1000, tiles: int = 24, pool: OrderedMap = serial_map,
            thresholds: dict[str, float] | None = None, progress: Callable[[str], None] | None = None) -> Stats:
    """Statistics of all ``shards`` (in order); ``sample`` bounds decoded members, ``tiles`` the contact sheet.
    ``pool`` reads the shards (the CLI hands down the job core's process pool; default: one at a time here).
    For each of ``thresholds`` (field -> value) the :data:`NEAR` samples nearest it on each side are drawn too.

    The figures are of all shards together; each folder is its own dataset for the checks (keys unique within
    it, its own count file), and with several folders every row and example names its shard by path.
    """
    from fgdata.shards import ShardSet

    selection = shards if isinstance(shards, ShardSet) else ShardSet(list(shards))
    paths = selection.shards
    if not paths:
        raise FgdataError("no shards to report on")
    jobs = [(path, _spread(sample, len(paths), i), _spread(tiles, len(paths), i), selection.label(path),
             dict(thresholds or {})) for i, path in enumerate(paths)]
    total = Stats()
    for path, stats in zip(paths, pool(_collect_job, jobs)):
        total.merge(stats)
        if progress:
            progress(path)
    for row in total.shards:
        row["dataset"] = selection.folder_of(row["path"])
    _structure(total, selection)
    if total.near:
        _near_tiles(total, pool)
    return total
