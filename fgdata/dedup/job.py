"""The ``fgdata dedup`` job: hash every sample of every shard (one work unit per shard, in parallel on the
executor), then find duplicates across all the datasets at once and write them as an ignore index.

It runs through the job core's one driver (:func:`fgdata.jobs.driver.run_job`) with the work folder
``.<OUTPUT>.fgdata-dedup/`` beside the index as its DST: unit ``u`` (the ``u``-th shard) writes its hashes to
``<work>/NNNNNN.npz`` atomically, then its marker; the marker's inputs are the shard's path and size, its options
the hashing options, so a rerun (after SIGKILL too) hashes only the shards without a kept marker, and a changed
shard or option is hashed again. The search reads the units in input order, so the result never depends on which
units an earlier run finished. The folder is removed once the index is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fgdata import storage
from fgdata.errors import DamagedShardError, FgdataError, OptionError
from fgdata.jobs.driver import Context, JobDefinition, RunSettings
from fgdata.jobs.executor import Executor
from fgdata.jobs.options import JsonValue
from fgdata.jobs.report import ReportFields
from fgdata.jobs.summary import JobSummary
from fgdata.jobs.units import Entry, Marker, Totals, marker_path

METHODS = ("sha256", "phash", "pdq", "embedding")
# Most differing bits of a copy, by method: phash's measured on the near-duplicate set (README); PDQ's is
# ThreatExchange's published match threshold.
DEFAULT_DISTANCE = {"phash64": 10, "phash256": 40, "pdq": 31}
COMMAND = "dedup"


@dataclass(frozen=True)
class DedupOptions:
    """What ``fgdata dedup`` hashes and how it decides."""

    by: str = "phash"
    bits: int | None = None  # phash only; None: 64
    max_distance: int | None = None  # None: DEFAULT_DISTANCE[method]
    pixels: bool = False
    member: str | None = None  # None: the first image member (the first .npy one for --by embedding)
    keep: str = "first"
    eps: float = 0.01
    clusters: int | None = None  # None: one per 1,000 embeddings

    def method(self) -> str:
        """The ``method`` each record names."""
        if self.by == "phash":
            return f"phash{self.hash_bits()}"
        if self.by == "sha256":
            return "sha256-pixels" if self.pixels else "sha256"
        return "pdq" if self.by == "pdq" else "semdedup"

    def hash_bits(self) -> int:
        """The length of each perceptual hash: ``--bits`` for phash (64 unless given), 256 for PDQ."""
        return 256 if self.by == "pdq" else self.bits or 64

    def distance(self) -> int:
        return DEFAULT_DISTANCE.get(self.method(), 0) if self.max_distance is None else self.max_distance

    def keep_field(self) -> str | None:
        """The json field of ``--keep highest:FIELD`` (None for ``first``)."""
        if self.keep == "first":
            return None
        if self.keep.startswith("highest:") and self.keep[len("highest:"):].strip():
            return self.keep[len("highest:"):].strip()
        raise OptionError(f"--keep {self.keep}: expected first or highest:FIELD")

    def check(self) -> None:
        if self.by not in METHODS:
            raise OptionError(f"--by {self.by}: expected one of {', '.join(METHODS)}")
        if self.bits is not None and (self.by != "phash" or self.bits not in (64, 256)):
            raise OptionError(f"--bits {self.bits}: expected 64 or 256, with --by phash (pdq is 256 bits)")
        if not 0 <= self.distance() < self.hash_bits():
            raise OptionError(f"--max-distance {self.max_distance}: expected 0 to {self.hash_bits() - 1}")
        if not 0 <= self.eps < 1:
            raise OptionError(f"--eps {self.eps}: expected 0 <= eps < 1")
        self.keep_field()


@dataclass
class DedupResult:
    """What a run did: the whole job, or under torchrun a rank's share (``rank`` > 0: its hashing only; rank 0
    finds the duplicates and writes the index, so ``dropped`` is 0 and ``failures`` empty there)."""

    seen: int
    hashed: int
    failed: int
    dropped: int
    failures: list[dict[str, Any]]
    output: str
    failures_file: str
    resumed: int
    rank: int = 0
    world: int = 1


def _pick_member(members: dict[str, bytes], opts: DedupOptions) -> str | None:
    from fgdata.media.image import source_image_extensions

    if opts.member is not None:
        return opts.member if opts.member in members else None
    if opts.by == "embedding":
        return next((e for e in members if e.endswith("npy")), None)
    images = source_image_extensions()
    return next((e for e in members if e.lower() in images), None)


def _field_value(members: dict[str, bytes], field: str | None) -> float:
    """The sample's flat json ``field`` as a number; NaN (kept last) when absent or not a number."""
    if field is None or "json" not in members:
        return math.nan
    try:
        value = json.loads(members["json"]).get(field)
    except (ValueError, AttributeError):
        return math.nan
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _hash_member(ext: str, data: bytes, opts: DedupOptions) -> np.ndarray:
    from fgdata.dedup import hashes
    from fgdata.media.decode import unwrap_gz
    from fgdata.media.image import open_image

    if opts.by == "embedding":
        ext, data = unwrap_gz(ext, data)
        try:
            vector = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise FgdataError(f"npy: {exc}") from exc
        if vector.dtype.kind not in "fiu" or vector.size == 0:
            raise FgdataError(f"npy: expected a numeric embedding, got {vector.dtype} {vector.shape}")
        return vector.astype(np.float32).reshape(-1)
    if opts.by == "sha256" and not opts.pixels:
        return hashes.digest_words(hashes.sha256_bytes(data))
    im = open_image(data)
    try:
        im.load()
    except (OSError, ValueError, SyntaxError) as exc:
        raise FgdataError(f"image-decode: cannot decode image: {exc}") from exc
    if opts.by == "sha256":
        return hashes.digest_words(hashes.sha256_pixels(im))
    if opts.by == "pdq":
        return hashes.pdq(im)[0]
    return hashes.phash(im, opts.hash_bits())


@dataclass(frozen=True)
class HashCall:
    """One unit's work: hash the ``number``-th unit's ``shard`` into the file ``path``."""

    number: int
    shard: str
    path: str


def hash_shard(opts: DedupOptions, call: HashCall) -> tuple[int, int, list[dict[str, Any]]]:
    """Unit ``call.number``'s work: hash every sample of ``call.shard`` and write keys, hashes, keep-field values
    and failures to ``call.path`` (atomically). Returns the unit's number, the samples hashed and the failures."""
    number, shard, path = call.number, call.shard, call.path
    keys: list[str] = []
    values: list[np.ndarray] = []
    scores: list[float] = []
    failures: list[dict[str, Any]] = []
    field = opts.keep_field()
    from fgdata.shards import iter_samples

    try:
        for sample in iter_samples(shard):
            ext = _pick_member(sample.members, opts)
            where = f"{shard}#{sample.key}"
            if ext is None:
                wanted = opts.member or ("a .npy member" if opts.by == "embedding" else "an image member")
                failures.append({"input": where, "reason": f"member: no {wanted}"})
                continue
            try:
                vector = _hash_member(ext, sample.members[ext], opts)
            except FgdataError as exc:
                reason = str(exc) if ":" in str(exc).split(" ", 1)[0] else f"decode: {exc}"
                failures.append({"input": where, "reason": reason})
                continue
            keys.append(sample.key)
            values.append(vector)
            scores.append(_field_value(sample.members, field))
    except DamagedShardError as exc:
        failures.append({"input": shard, "reason": f"shard: {exc}"})
    except (FgdataError, OSError) as exc:
        failures.append({"input": shard, "reason": f"read: {exc}"})
    dims = {len(v) for v in values}
    if len(dims) > 1:
        raise FgdataError(f"{shard}: embeddings of different lengths {sorted(dims)}")
    table = np.stack(values) if values else np.zeros((0, 4 if opts.by == "sha256" else opts.hash_bits() // 64))
    buf = io.BytesIO()
    np.savez(buf, keys=np.array(keys, dtype=str), values=table, scores=np.array(scores, dtype=np.float64),
             failures=np.array(json.dumps(failures)))
    storage.write_bytes(path, buf.getvalue())
    return number, len(keys), failures


def _work_dir(output: str) -> str:
    return storage.join(storage.parent(output), f".{storage.basename(output)}.fgdata-dedup")


def _drops(values: np.ndarray, scores: np.ndarray, opts: DedupOptions) -> Any:
    from fgdata.dedup.index import keep_greedy, priority_order

    order = priority_order(len(values), scores if opts.keep_field() else None)
    if opts.by == "embedding":
        from fgdata.dedup.semantic import semdedup

        clusters = opts.clusters or max(1, len(values) // 1000)
        return semdedup(values, opts.eps, order, clusters)
    return keep_greedy(values.astype(np.uint64), 0 if opts.by == "sha256" else opts.distance(), order)


@dataclass(frozen=True)
class ShardUnit:
    """One unit: the ``number``-th shard, and its inputs' fingerprint (its path and size)."""

    number: int
    inputs: str
    shard: str


def _hashes_name(number: int) -> str:
    return f"{number:06d}.npz"


class DedupJob(JobDefinition[ShardUnit]):
    """The job definition: DST is the work folder; the units' hash files are its own, and the ignore index and
    its failure report are written beside it once every unit is in."""

    command = COMMAND

    def __init__(self, paths: list[str], output: str, opts: DedupOptions):
        from fgdata.shards import resolve_shards

        self.paths, self.output, self.opts = paths, output, opts
        self.selection = resolve_shards(paths)
        self.dest = _work_dir(output)
        self.result: DedupResult | None = None
        self.kept_units = 0

    def kept_inputs(self) -> list[str]:
        """An earlier run's hash files are fgdata's own, not foreign (a run over more shards left more of them)."""
        if not storage.is_dir(self.dest):
            return []
        return [i.name for i in storage.list_dir(self.dest, ".npz") if re.fullmatch(r"\d{6}\.npz", i.name)]

    def fingerprint(self) -> str:
        what = [self.opts.by, self.opts.hash_bits(), self.opts.pixels, self.opts.member, self.opts.keep_field()]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:24]

    def plan(self) -> Iterator[ShardUnit]:
        for number, shard in enumerate(self.selection.shards):
            what = [storage.absolute(shard), self.selection.sizes.get(shard)]
            yield ShardUnit(number, hashlib.sha256(json.dumps(what).encode()).hexdigest()[:24], shard)

    def execute(self, pending: Iterator[ShardUnit], executor: Executor, ctx: Context) -> Iterator[Marker]:
        from fgdata.jobs import outputs
        from fgdata.jobs.executor import run_units

        units: dict[int, ShardUnit] = {}

        def calls() -> Iterator[HashCall]:
            for unit in pending:
                units[unit.number] = unit
                yield HashCall(unit.number, unit.shard, storage.join(self.dest, _hashes_name(unit.number)))

        for done, (number, hashed, failures) in enumerate(run_units(hash_shard, calls(), executor, self.opts), 1):
            unit = units.pop(number)
            marker = Marker(unit=unit.number, first=unit.number, count=hashed + len(failures), options=ctx.stamp[0],
                            inputs=unit.inputs, stamps=[], names=[unit.shard], shards=[], written=hashed,
                            failures=[Entry(f["input"], f["reason"], None) for f in failures], warnings=[],
                            launch=ctx.stamp[1])
            storage.write_bytes(marker_path(self.dest, unit.number, self.folder), marker.to_bytes())
            ctx.progress(marker.count, 0)
            yield marker
            outputs.reached(done)

    def summarize(self, summary: JobSummary, ctx: Context, totals: Totals | None) -> JobSummary:
        self.kept_units = ctx.kept  # a rank's share reports the units it found done
        return summary

    def finish(self, ctx: Context, totals: Totals) -> None:
        self.result = _search(self.paths, self.output, self.opts, self.dest, self.selection.shards, ctx.kept)


@dataclass(frozen=True)
class DedupReport(ReportFields):
    """The ignore index's failure report's own fields: how near-duplicates were found, and how many were dropped
    and kept."""

    method: str
    dropped: int
    kept: int

    def to_json(self) -> dict[str, JsonValue]:
        return {"method": self.method, "dropped": self.dropped, "kept": self.kept}


def _search(paths: list[str], output: str, opts: DedupOptions, work: str, shards: list[str],
            resumed: int) -> DedupResult:
    """Read every unit's hashes in input order, find the duplicates and write the ignore index and its failure
    report."""
    from fgdata.jobs.report import write_failures
    from fgdata.shards.ignore import write_ignore_records

    from fgdata.shards.ignore import qualified_names

    keys: list[tuple[str, str]] = []
    tables, scores, failures = [], [], []
    names = qualified_names(shards)
    for number, shard in enumerate(shards):
        with np.load(io.BytesIO(storage.read_bytes(storage.join(work, _hashes_name(number)))),
                     allow_pickle=False) as unit:
            keys.extend((names[shard], str(k)) for k in unit["keys"])
            tables.append(unit["values"])
            scores.append(unit["scores"])
            failures.extend(json.loads(str(unit["failures"])))
    dims = {t.shape[1] for t in tables if len(t)}
    if len(dims) > 1:
        raise FgdataError(f"{', '.join(paths)}: embeddings of different lengths {sorted(dims)}")
    values = np.concatenate([t for t in tables if len(t)]) if keys else np.zeros((0, 1))
    drops = _drops(values, np.concatenate(scores), opts) if keys else None
    records: dict[str, dict[str, dict[str, Any]]] = {}
    method = opts.method()
    if drops is not None:
        for i, j, d in zip(drops.index.tolist(), drops.dup_of.tolist(), drops.distance.tolist()):
            shard, key = keys[i]
            records.setdefault(shard, {})[key] = {"dup_of": {"shard": keys[j][0], "key": keys[j][1]},
                                                  "method": method,
                                                  "distance": round(d, 6) if isinstance(d, float) else d}
    write_ignore_records(output, records)
    failures_file = f"{output}.failures.json"
    dropped = 0 if drops is None else len(drops.index)
    write_failures(failures_file, COMMAND, len(keys) + len(failures), len(keys), failures,
                   DedupReport(method, dropped, len(keys) - dropped))
    return DedupResult(len(keys) + len(failures), len(keys), len(failures), dropped, failures, output, failures_file,
                       resumed)


def run_dedup(paths: list[str], output: str, opts: DedupOptions, run: RunSettings | None = None) -> DedupResult:
    """Hash the shards ``paths`` name (several datasets at once) on the executor ``run`` names (local processes,
    Ray, or torchrun ranks sharing the shards), find duplicates and write the ignore index ``output`` and
    ``<output>.failures.json`` (rank 0, once every rank's hashes are in). Nothing in the datasets changes."""
    from fgdata.jobs.driver import run_job

    opts.check()
    job = DedupJob(paths, output, opts)
    summary = run_job(job, run or RunSettings())
    if job.result is None:  # a torchrun rank other than 0: its share of the hashing
        return DedupResult(seen=summary.seen, hashed=summary.written, failed=summary.failed, dropped=0, failures=[],
                           output=output, failures_file=f"{output}.failures.json", resumed=job.kept_units,
                           rank=summary.rank, world=summary.world)
    storage.remove_tree(job.dest)
    job.result.rank, job.result.world = summary.rank, summary.world
    return job.result
