"""``fgdata shard images|videos|prompts`` on the job core: list inputs, order them, run an executor, report.

Side files beside the shards (all written atomically, local or s3://):

- ``shard_job.json``: the job record: the options that change bytes (transform options, shard
  limits, order, Ray unit size) and a hash of the input list. A resumed job must match it, so a
  rerun never mixes two option sets; a mismatch names the option;
- ``shard_count.json`` and ``<shard>.idx.json``: written by ShardWriter as each shard closes;
- ``failures.json``: the one failure report (:mod:`fgdata.jobs.report`), plus ``samples``,
  ``failed_by_reason``, ``warnings`` (inputs written without a part, e.g. a caption that cannot be read) and
  ``skipped`` (files below SRC that are not inputs, :class:`fgdata.sources.folder.Skipped`); each failure and
  warning also carries ``index``, the item's position in source order.

Executors: ``local`` streams every input through one ShardWriter (a process pool transforms,
results are written in input order). ``ray`` and torchrun ranks split the positions into units
of ``unit_size`` inputs; each unit writes its own shards under ``DST/.fgdata/units/NNNNN/``, then
one process (the Ray driver, or rank 0) moves them into one numbering (see :func:`_plan` and
:func:`_merge`), so both give the same bytes for the same unit size. Under torchrun, unit ``u``
belongs to rank ``u mod WORLD_SIZE``, which leaves ``units/NNNNN.json`` (its result) once the unit
is complete; rank 0 waits for all of them (bounded, ``--wait-timeout``) before it merges; with ``--no-resume``
only those of this launch count (:func:`fgdata.jobs.ranks.run_launch`). Keys come
from the item index, so every executor gives the same samples in the same order; only the shard
boundaries can differ between the stream and the units.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

from fgdata import storage
from fgdata.errors import FgdataError, OptionError
from fgdata.jobs import dest as destmod
from fgdata.jobs.local import ordered_map
from fgdata.jobs.options import check_same, fingerprint, options_record
from fgdata.jobs import testhook
from fgdata.jobs.ranks import dist_env, owner, run_launch, this_launch, wait_for
from fgdata.jobs.report import FAILURES_FILE, by_category, write_failures
from fgdata.jobs.signals import Interrupted, critical, stop_on_signals
from fgdata.producers.media import ClipTally, Outcome, ShardOptions, mixed_format_warning, transform, transform_batch
from fgdata.shards import Failure, ShardRecord, ShardWriter, WriteSummary, load_index, write_shard_counts
from fgdata.shards.metadata import FGDATA_FIELD
from fgdata.shards.index import COUNT_FILE, index_path, parse_index, write_index
from fgdata.sources.folder import Listing, WorkItem, sample_key
from fgdata.sources.stamps import InputStamps
from fgdata.storage.http import DownloadOptions

JOB_FILE = "shard_job.json"
PATTERN = "%05d.tar"
UNITS = ".fgdata/units"
PLAN = "merge.json"
#: Imported once in the forkserver, so pool workers start with the decoders loaded (video: PyAV on first use).
PRELOAD = ("fgdata.jobs.shard", "fgdata.media.image")

#: URL jobs: URLs per fetch thread in one worker batch (memory: a batch's bodies are held until it returns).
URLS_PER_THREAD = 16
#: ``progress(inputs_done, bytes_read)``: increments, called after each input is written or failed.
ProgressFn = Callable[[int, int], None]
Notify = Callable[[str], None]


@dataclass(frozen=True)
class ShardJob:
    """Everything a shard job needs; the CLI builds one from its flags."""

    src: str
    dest: str
    options: ShardOptions
    path_column: str = "path"
    caption_column: str = "caption"
    maxcount: int = 1000
    maxsize: int | None = None
    workers: int = 1
    resume: bool = True
    overwrite: bool = False
    shuffle_seed: int | None = None
    engine: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    unit_size: int | None = None  # ray and torchrun: inputs per work unit (default: maxcount)
    follow_symlinks: bool = False  # read links that point outside a source folder (they are refused otherwise)
    wait_timeout: float | None = None  # torchrun: seconds rank 0 waits for the other ranks' units
    download: DownloadOptions | None = None  # how http(s) inputs are fetched (default settings when None)
    retry_failed: bool = False  # fetch again the inputs of complete shards that failed for a retryable reason

    @property
    def command(self) -> str:
        return f"shard {self.options.kind}"


@dataclass
class JobReport:
    seen: int
    written: int
    failed: int
    samples: int
    failed_by_reason: dict[str, int]
    shards: list[str]
    counts: dict[str, int]
    failures_path: str | None  # None: a torchrun rank's share (rank 0 writes the job's report)
    resumed: int = 0  # inputs already covered by complete shards when the job started
    nbytes: int = 0  # input bytes read in this run
    normalised: dict[str, int] = field(default_factory=dict)  # images changed to display as a viewer does, by change (this run)
    failures: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)  # inputs written without a part (a caption)
    skipped: list[dict[str, Any]] = field(default_factory=list)  # files below SRC that are not inputs
    clips: ClipTally | None = None  # --clip-seconds: the clips written in this run
    rank: int = 0
    world: int = 1
    whole_job: bool = True  # False: only this torchrun rank's share; the rank that finishes reports the job
    changed: list[str] = field(default_factory=list)  # inputs replaced since the earlier run (their names)
    rewritten: list[str] = field(default_factory=list)  # shards of the earlier run written again for them
    stats_path: str | None = None  # URL jobs: shard_stats.json (per-shard successes and failures by reason)
    retried: int = 0  # --retry-failed: inputs of complete shards fetched again for a retryable failure
    recovered: int = 0  # of those, the ones written now


def load_items(job: ShardJob) -> Listing:
    """The job's inputs in source order (a folder listing, manifest rows or prompt lines), and what a folder
    holds besides them."""
    from fgdata.media import VIDEO_EXTS
    from fgdata.media.image import SourceImageExtensions, missing_decoder
    from fgdata.sources.folder import list_folder
    from fgdata.sources.manifest import is_manifest, read_manifest, read_prompts

    if job.options.kind == "prompts":
        return Listing(read_prompts(job.src, job.caption_column), [])
    if is_manifest(job.src):
        return Listing(read_manifest(job.src, job.path_column, job.caption_column), [])
    if not storage.exists(job.src):
        raise FgdataError(f"{job.src}: no such folder or manifest")
    if not storage.is_dir(job.src):
        raise FgdataError(f"{job.src}: is a file; expected a folder or a manifest (.csv, .jsonl, .parquet)")
    if job.options.kind == "images":
        return list_folder(job.src, SourceImageExtensions(), job.follow_symlinks, missing_decoder)
    return list_folder(job.src, VIDEO_EXTS, job.follow_symlinks)


def with_download(job: ShardJob, items: Sequence[WorkItem]) -> ShardJob:
    """The job with its download settings in its transform options when any input is an http(s) URL
    (they then belong to the job record); other jobs keep their options, and their record, unchanged."""
    if job.options.kind == "prompts" or not any(i.path and i.path.startswith(("http://", "https://")) for i in items):
        return job
    return replace(job, options=replace(job.options, download=job.download or DownloadOptions()))


def _batches(tasks: Iterable[tuple[int, WorkItem]], size: int) -> Iterator[list[tuple[int, WorkItem]]]:
    batch: list[tuple[int, WorkItem]] = []
    for task in tasks:
        batch.append(task)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _outcomes(tasks: Iterable[tuple[int, WorkItem]], options: ShardOptions, workers: int,
              chunksize: int) -> Iterator[Outcome]:
    """Every task's outcome in input order. URL jobs send batches to the workers, each fetched by a thread
    pool inside its worker (network waits overlap; decoding spreads over the processes). A batch ends with its
    slowest URL, so it holds many URLs per thread: one dead URL (a full timeout) then costs a fraction of a batch."""
    if options.download is None:
        yield from ordered_map(partial(_transform_at, options=options), tasks, workers, chunksize, preload=PRELOAD)
        return
    batches = _batches(tasks, URLS_PER_THREAD * options.download.threads)
    for batch in ordered_map(partial(transform_batch, options=options), batches, workers, 1, preload=PRELOAD):
        yield from batch


def input_order(n: int, seed: int | None) -> list[int]:
    """Positions -> item indices: source order, or a seeded shuffle (Python's ``random``, stable across versions)."""
    order = list(range(n))
    if seed is not None:
        random.Random(seed).shuffle(order)
    return order


def byte_options(job: ShardJob, units: bool) -> dict[str, Any]:
    """Every option that changes the output bytes (the resume fingerprint); ``units``: Ray or torchrun ranks.

    Ray and torchrun write the same bytes for the same unit size, so the record says "units" for both
    and a job started on one can be finished on the other.
    """
    return {
        **options_record(job.options),
        "path_column": job.path_column,
        "caption_column": job.caption_column,
        "maxcount": job.maxcount,
        "maxsize": job.maxsize,
        "shuffle_seed": job.shuffle_seed,
        "engine": "units" if units else "local",
        "unit_size": (job.unit_size or job.maxcount) if units else None,
        "follow_symlinks": job.follow_symlinks,
    }


def _inputs_digest(items: list[WorkItem]) -> str:
    return hashlib.sha256("\n".join(f"{i.name}\t{i.path}" for i in items).encode()).hexdigest()


_LAYOUTS = {"local": "as one stream (--engine local in one process)",
            "units": "in work units (--engine ray, or torchrun ranks)"}


def _check_record(job: ShardJob, items: list[WorkItem], units: bool, write: bool = True) -> None:
    """Refuse to resume another job's shards; then (re)write the record (``write``: the one process that does)."""
    path = storage.join(job.dest, JOB_FILE)
    options = byte_options(job, units)
    record = {"format": "fgdata.shard-job", "version": 2, "command": job.command, "options": options,
              "inputs": len(items), "inputs_sha256": _inputs_digest(items)}
    if job.resume and storage.exists(path):
        try:
            old = json.loads(storage.read_bytes(path))
        except ValueError:
            old = {}
        before = (old.get("options") or {}).get("engine")
        if before in _LAYOUTS and before != options["engine"]:
            raise FgdataError(f"{job.dest}: an earlier run wrote it {_LAYOUTS[before]}, this one writes it "
                              f"{_LAYOUTS[options['engine']]}, with other shard boundaries; rerun it the same way, "
                              "or with --no-resume to start over")
        check_same(job.dest, old.get("options") or {}, options)
        if (old.get("inputs"), old.get("inputs_sha256")) != (record["inputs"], record["inputs_sha256"]):
            raise FgdataError(f"{job.dest}: the inputs changed since the earlier run ({old.get('inputs')} then, "
                              f"{len(items)} now); rerun with the same inputs, or with --no-resume to start over")
    if write:
        storage.write_bytes(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())


def _start_over(job: ShardJob, notify: Notify | None, units: bool = True) -> None:
    """``--no-resume`` or ``--overwrite``: remove the earlier run's outputs, saying what goes (``units``: the work
    units too)."""
    destmod.remove_files(job.dest, destmod.own_outputs(job.dest), "--overwrite" if job.overwrite else "--no-resume",
                         notify)
    if units:
        storage.remove_tree(storage.join(job.dest, UNITS))
    else:
        storage.remove(storage.join(job.dest, UNITS, PLAN))


def run_shard_job(job: ShardJob, progress: ProgressFn | None = None, on_start: Callable[[int], None] | None = None,
                  notify: Notify | None = None) -> JobReport:
    """Run a shard job on its executor and return the report (also written to ``DST/failures.json``).

    ``on_start(total_inputs)`` is called once the inputs are listed (under torchrun: this rank's
    share); ``progress(inputs, bytes)`` after each input (increments); ``notify(line)`` before
    anything is deleted. SIGINT/SIGTERM raise :class:`~fgdata.jobs.signals.Interrupted` with the
    inputs done so far. Under torchrun (``WORLD_SIZE`` > 1) each rank runs its own work units and
    returns its share's report; rank 0 merges and returns the job's.
    """
    if job.maxcount < 1:
        raise OptionError("--maxcount must be at least 1")
    if job.workers < 1:
        raise OptionError("--workers must be at least 1")
    if job.engine not in ("local", "ray"):
        raise OptionError(f"--engine must be 'local' or 'ray', not {job.engine!r}")
    rank, world = dist_env()
    if job.retry_failed and (job.engine == "ray" or world > 1 or not job.resume or job.overwrite):
        raise OptionError("--retry-failed continues an earlier run as one stream: not with --engine ray, torchrun, "
                          "--no-resume or --overwrite")
    if job.options.dedupe and (job.engine == "ray" or world > 1):
        raise FgdataError("--dedupe compares every input with all before it: run it as one stream "
                          "(--engine local, not under torchrun)")
    if world > 1 and (job.engine == "ray" or job.options.kind == "prompts"):
        what = "--engine ray starts its own workers" if job.engine == "ray" else "shard prompts runs in one process"
        raise FgdataError(f"{what}: launch it once, not under torchrun (WORLD_SIZE={world})")
    listing = load_items(job)
    items = listing.items
    job = with_download(job, items)
    order = input_order(len(items), job.shuffle_seed)
    stamps = InputStamps(items)
    warning = mixed_format_warning(items, job.options)
    if warning and notify and rank == 0:
        notify(warning)
    removes = job.overwrite and rank == 0
    refuse = None if removes else partial(destmod.check_foreign, job.dest)  # before .fgdata/ is created
    with stop_on_signals(), destmod.claimed(job.dest, destmod.rank_lock(rank), refuse):
        before = destmod.shard_versions(job.dest)
        # Only rank 0 removes: another rank meeting foreign files before rank 0 removed them stops (safe).
        destmod.check_foreign(job.dest, overwrite=removes, notify=notify)
        if job.overwrite:  # then fgdata's own outputs go too, whatever options made them
            job = replace(job, resume=False)
        report = _said(_run_claimed(job, (listing, stamps), order, (rank, world), (progress, on_start, notify)),
                       notify)
        if report.whole_job:
            destmod.drop_stale_indexes(job.dest, before, notify)
        return report


def _run_claimed(job: ShardJob, inputs: tuple[Listing, InputStamps], order: list[int], where: tuple[int, int],
                 calls: tuple[ProgressFn | None, Callable[[int], None] | None, Notify | None]) -> JobReport:
    """:func:`run_shard_job` once DST is held and checked: ``where`` is (rank, world); ``calls`` the callbacks."""
    listing, stamps = inputs
    items = listing.items
    rank, world = where
    progress, on_start, notify = calls
    if world > 1:
        return _run_ranks(job, inputs, order, rank, world, progress, on_start, notify)
    if not job.resume:
        _start_over(job, notify)
    _check_record(job, items, units=job.engine == "ray")
    if on_start:
        on_start(len(items))
    if job.engine == "ray":
        return _run_ray(job, inputs, order, progress)
    writer = ShardWriter(job.dest, pattern=PATTERN, maxcount=job.maxcount, maxsize=job.maxsize,
                         stage=storage.staging_dir(job.dest), stamps=lambda p: stamps[order[p]])
    try:
        result = write_range(writer, items, order, (0, len(items)), job.options, job.workers, progress,
                             retry_failed=job.retry_failed)
        summary = writer.close()  # the last shard may still be staged when a stop comes
    except Interrupted as stop:
        writer.abort()
        stop.done = writer.inputs_done
        raise
    except BaseException:
        writer.abort()
        raise
    report = _report(job, order, listing, result.written, summary, result.resumed, result.nbytes,
                     clips=result.clips)
    report.changed, report.rewritten = result.changed, result.rewritten
    report.normalised = dict(sorted(result.normalised.items()))
    still = {f.input for f in summary.failures}
    report.retried, report.recovered = len(result.retried), sum(p not in still for p in result.retried)
    return report


def _said(report: JobReport, notify: Notify | None) -> JobReport:
    """Say which inputs changed since the earlier run and which shards were written again for them."""
    if notify and report.changed:
        more = f" and {len(report.changed) - 5} more" if len(report.changed) > 5 else ""
        notify(f"{len(report.changed)} input(s) changed since the earlier run ({', '.join(report.changed[:5])}{more}): "
               f"wrote {len(report.rewritten)} shard(s) again ({', '.join(report.rewritten[:5])}"
               f"{' and more' if len(report.rewritten) > 5 else ''})")
    return report


def _report_entries(order: Sequence[int], failures: list[Failure]) -> list[dict[str, Any]]:
    """Failures (or warnings) as report entries, in input order, each with its item's source index."""
    return [{"input": f.name, "reason": f.reason, "index": order[f.input] if f.input is not None else None}
            for f in sorted(failures, key=lambda f: -1 if f.input is None else f.input)]


def _report(job: ShardJob, order: list[int], listing: Listing, written: int, summary: WriteSummary, resumed: int,
            nbytes: int, *, clips: ClipTally | None) -> JobReport:
    entries = _report_entries(order, summary.failures)
    warnings = _report_entries(order, summary.warnings)
    skipped = [s.to_json() for s in listing.skipped]
    reasons = by_category(entries)
    path = storage.join(job.dest, FAILURES_FILE)
    counts = summary.counts
    samples = sum(counts.values())
    write_failures(path, job.command, len(listing.items), written, entries,
                   {"samples": samples, "failed_by_reason": reasons, "warnings": warnings, "skipped": skipped})
    stats = None
    if job.options.download is not None:  # URL jobs: successes and failures by reason, per shard
        from fgdata.jobs.stats import STATS_FILE, write_stats

        write_stats(job.dest, counts, summary.failures, written)
        stats = storage.join(job.dest, STATS_FILE)
    shards = [storage.join(job.dest, name) for name in counts]
    return JobReport(seen=len(listing.items), written=written, failed=len(entries), samples=samples,
                     failed_by_reason=reasons, shards=shards, counts=counts, failures_path=path, resumed=resumed,
                     nbytes=nbytes, failures=entries, warnings=warnings, skipped=skipped, clips=clips,
                     stats_path=stats)


# -- the local executor's loop -------------------------------------------------------------------------


def _transform_at(task: tuple[int, WorkItem], options: ShardOptions) -> Outcome:
    return transform(task[0], task[1], options)


def _keys_in_complete_shards(writer: ShardWriter, prefix: str) -> set[str]:
    """Keys starting with ``prefix`` in the last complete shards (the clips of a half-written video)."""
    keys: set[str] = set()
    for n in range(writer.resume_point.shards - 1, -1, -1):
        scan = load_index(storage.join(writer.dest, writer.pattern % n))
        if scan is None:
            break
        keys.update(s.key for s in scan.samples if s.key.startswith(prefix))
        if not scan.samples or not scan.samples[0].key.startswith(prefix):
            break
    return keys


def _digest(members: dict[str, bytes]) -> str:
    return json.loads(members["json"])[FGDATA_FIELD]["sha256"]


def _digests_in_complete_shards(writer: ShardWriter) -> dict[str, str]:
    """``--dedupe`` on resume: the input hash -> first sample key of every sample already in complete shards."""
    from fgdata.shards import iter_samples

    firsts: dict[str, str] = {}
    for n in range(writer.resume_point.shards):
        for sample in iter_samples(storage.join(writer.dest, writer.pattern % n)):
            firsts.setdefault(_digest(sample.members), sample.key)
    return firsts


@dataclass
class RangeResult:
    written: int  # inputs in the range that produced samples (resumed ones included)
    nbytes: int  # input bytes read in this run
    clips: ClipTally | None  # --clip-seconds: the clips written in this run
    resumed: int = 0  # inputs in the range that were not read again (in complete shards kept as they were)
    changed: list[str] = field(default_factory=list)  # inputs replaced since the earlier run (their names)
    rewritten: list[str] = field(default_factory=list)  # complete shards of the earlier run written again
    normalised: Counter[str] = field(default_factory=Counter)  # images normalised in this run, by change
    retried: list[int] = field(default_factory=list)  # --retry-failed: positions of retryable failures fetched again

    def add(self, other: "RangeResult") -> None:
        self.written += other.written
        self.nbytes += other.nbytes
        if self.clips is not None and other.clips is not None:
            self.clips.merge(other.clips.to_json())
        self.normalised.update(other.normalised)


def _clip_tally(options: ShardOptions) -> ClipTally | None:
    return ClipTally(options.clip_seconds) if options.clip_seconds is not None else None


def _holds(key: str, item: WorkItem) -> bool:
    """Whether sample ``key`` comes from ``item`` (itself, or one of its clips)."""
    own = sample_key(item.index)
    return key == own or key.startswith(own + "_")


def _changed_shards(records: Sequence[ShardRecord], items: Sequence[WorkItem], order: Sequence[int]) -> list[int]:
    """The complete shards holding an input that changed; a shard that ends inside a video (its last clips come
    from the input the next shard starts with) holds that input too."""
    changed = {p for r in records for p in r.changed}
    return [n for n, r in enumerate(records) if r.changed or (
        r.input_end in changed and r.input_end < len(order) and _holds(r.last_key, items[order[r.input_end]]))]


def _retryable_failures(writer: ShardWriter) -> tuple[list[ShardRecord], list[int]]:
    """``--retry-failed``: the complete shards with the positions of their retryable failures (timeouts, dropped
    connections, 429, 5xx) counted as changed inputs, and those positions."""
    from fgdata.storage.http import retryable

    point = writer.resume_point
    again = sorted(f.input for f in point.failures if f.input is not None and f.input < point.next_input
                   and retryable(f.reason))
    records = [replace(r, changed=sorted({*r.changed, *(p for p in again if r.input_start <= p < r.input_end)}))
               for r in point.records]
    return records, again


def write_range(writer: ShardWriter, items: Sequence[WorkItem], order: Sequence[int], span: tuple[int, int],
                options: ShardOptions, workers: int = 1, progress: ProgressFn | None = None,
                retry_failed: bool = False) -> RangeResult:
    """Transform positions ``span = (first, stop)`` (``order[p]`` is the item at position p) and write them.

    Resume: ``writer.resume_point.next_input`` says where to continue. When inputs of complete shards changed
    since they were written (:attr:`fgdata.shards.ShardRecord.changed`), the writer goes back to the first such
    shard and writes it again; each time the rewritten shards end where the earlier ones did (same shard number
    and input, and the next earlier shard's first sample would not fit: the boundary a fresh run draws), the
    unchanged shards that follow are kept as they are, up to the next changed one. A change that moves a
    boundary (an input that failed now gives a sample) rewrites the shards after it, as a fresh run would.

    ``retry_failed``: inputs that failed for a retryable reason count as changed, so the output ends as a fresh
    run in which they succeeded (or failed again) would.
    """
    records = list(writer.resume_point.records)
    changed = sorted({p for r in records for p in r.changed})
    retried: list[int] = []
    if retry_failed:
        records, retried = _retryable_failures(writer)
    rewrite = _changed_shards(records, items, order)
    if not rewrite:
        result = _write_span(writer, items, order, span, options, workers, progress)
        result.resumed = max(0, writer.resume_point.next_input - span[0])
        return result
    writer.rewind(rewrite[0])
    total = _write_span(writer, items, order, (span[0], records[rewrite[0]].input_end), options, workers, progress)
    total.resumed = max(0, writer.resume_point.next_input - span[0])
    kept: set[int] = set(range(rewrite[0]))
    n, pos = rewrite[0], records[rewrite[0]].input_end  # the last shard written again; inputs done so far
    while n + 1 < len(records):
        after = next((m for m in rewrite if m > n), len(records))  # the next changed shard (or the end)
        if after > n + 1:  # unchanged shards follow: keep them if the rewritten ones end where they did
            nxt = records[n + 1]
            if _holds(records[n].last_key, items[order[nxt.input_start]]) or not writer.lines_up(nxt):
                break  # the boundaries moved: every later shard is written again
            taken = writer.adopt(after)
            if not taken:
                break
            kept.update(range(n + 1, n + 1 + len(taken)))
            pos = taken[-1].input_end
            failed = sum(1 for f in writer.resume_point.failures
                         if f.input is not None and nxt.input_start <= f.input < pos)
            total.written += (pos - nxt.input_start) - failed
            total.resumed += pos - nxt.input_start
            if progress:
                progress(pos - nxt.input_start, 0)
            if len(taken) < after - n - 1 or after == len(records):
                break  # the end, or an earlier shard went missing: write on from here
        n = after
        total.add(_write_span(writer, items, order, (pos, records[n].input_end), options, workers, progress))
        pos = records[n].input_end
    total.add(_write_span(writer, items, order, (pos, span[1]), options, workers, progress))
    total.changed = [items[order[p]].name for p in changed]
    total.retried = retried
    total.rewritten = [r.name for m, r in enumerate(records) if m not in kept]
    return total


def _write_span(writer: ShardWriter, items: Sequence[WorkItem], order: Sequence[int], span: tuple[int, int],
                options: ShardOptions, workers: int = 1, progress: ProgressFn | None = None) -> RangeResult:
    """:func:`write_range` without looking back: continue at ``writer.resume_point.next_input``.

    Clips of one video can straddle a shard boundary; their non-final clips are written with
    ``input_pos = position - 1`` so a shard that closes mid-video does not mark that video done, and
    on resume the clips already in complete shards are skipped by key.
    """
    first, stop = span
    point = writer.resume_point
    start = max(first, point.next_input)
    resumed_failures = sum(1 for f in point.failures if f.input is not None and first <= f.input < start)
    written = (start - first) - resumed_failures
    if progress and start > first:
        progress(start - first, 0)
    skip: set[str] = set()
    if options.clip_seconds is not None and start < stop and point.shards:
        skip = _keys_in_complete_shards(writer, sample_key(items[order[start]].index) + "_")
    nbytes = 0
    clips = _clip_tally(options)
    firsts = _digests_in_complete_shards(writer) if options.dedupe else None
    normalised: Counter[str] = Counter()
    tasks = ((p, items[order[p]]) for p in range(start, stop))
    # Images go to workers in chunks (less pickling per image), small enough that the last chunks
    # spread evenly over the workers; each video is one task.
    chunksize = 1 if options.kind == "videos" else max(1, min(16, (stop - start) // (8 * max(1, workers))))
    for out in _outcomes(tasks, options, workers, chunksize):
        if firsts is not None and out.reason is None:
            key = out.samples[0][0]
            kept = firsts.setdefault(_digest(out.samples[0][1]), key)
            if kept != key:
                out.reason = f"duplicate: same bytes as {kept}"
        if out.reason is not None:
            writer.fail(out.position, out.name, out.reason)
        else:
            last = len(out.samples) - 1
            for j, (key, members) in enumerate(out.samples):
                if key not in skip:
                    writer.write(key, members, input_pos=out.position if j == last else out.position - 1)
                    if clips is not None and out.clips:
                        clips.add(*out.clips[j])
            written += 1
            normalised.update(out.normalised)
            for reason in out.warnings:
                writer.warn(out.position, out.name, reason)
        nbytes += out.nbytes
        if progress:
            progress(1, out.nbytes)
    return RangeResult(written=written, nbytes=nbytes, clips=clips, normalised=normalised)


# -- work units (Ray and torchrun) and their merge ----------------------------------------------------


def _units(job: ShardJob, n: int) -> list[dict[str, Any]]:
    """The work units: positions ``span`` and the folder ``dest`` each writes, the same on every executor."""
    unit = job.unit_size or job.maxcount
    staging = storage.join(job.dest, UNITS)
    return [{"span": (first, min(first + unit, n)), "dest": storage.join(staging, "%05d" % u)}
            for u, first in enumerate(range(0, n, unit))]


def _run_unit(items: tuple[Sequence[WorkItem], InputStamps], order: Sequence[int], span: tuple[int, int], dest: str,
              job: ShardJob, workers: int = 1, progress: ProgressFn | None = None) -> dict[str, Any]:
    """One work unit (a Ray task, or a torchrun rank's): positions ``span`` of ``items`` (the inputs and their
    stamps) into shards under ``dest``; resumable, idempotent. Returns its result (plain JSON data, what
    :func:`_plan` needs)."""
    inputs, stamps = items
    writer = ShardWriter(dest, pattern=PATTERN, maxcount=job.maxcount, maxsize=job.maxsize,
                         stage=storage.staging_dir(dest), stamps=lambda p: stamps[order[p]], first_input=span[0])
    try:
        result = write_range(writer, inputs, order, span, job.options, workers, progress)
        summary = writer.close()
    except BaseException:
        writer.abort()
        raise
    first, stop = span
    return {
        "changed": result.changed,
        "rewritten": result.rewritten,
        "dest": dest,
        "shards": [storage.basename(s) for s in summary.shards],
        "counts": summary.counts,
        "failures": [f.to_json() for f in summary.failures],
        "warnings": [f.to_json() for f in summary.warnings],
        "written": result.written,
        "nbytes": result.nbytes,
        "clips": _json_or_none(result.clips),
        "normalised": dict(sorted(result.normalised.items())),
        "inputs": stop - first,
        "resumed": result.resumed,
    }


def _plan(job: ShardJob, units: Sequence[dict[str, Any]], results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The merge plan from every unit's result, in unit order: which unit shard becomes which final shard."""
    moves: list[list[str]] = []
    counts: dict[str, int] = {}
    failures: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    changed: list[str] = []
    rewritten: list[str] = []
    for unit, r in zip(units, results, strict=True):
        for name in r["shards"]:
            final = PATTERN % len(moves)
            moves.append([storage.join(unit["dest"], name), storage.join(job.dest, final)])
            counts[final] = r["counts"][name]
            if name in r.get("rewritten", ()):
                rewritten.append(final)
        failures += r["failures"]
        warnings += r.get("warnings", [])  # units an earlier version finished have none
        changed += r.get("changed", [])
    return {"moves": moves, "counts": counts, "failures": failures, "warnings": warnings, "changed": changed,
            "rewritten": rewritten,
            "written": sum(r["written"] for r in results), "resumed": sum(r["resumed"] for r in results),
            "nbytes": sum(r["nbytes"] for r in results),
            "clips": _json_or_none(_units_clips(job, [r.get("clips") for r in results])),
            "normalised": dict(sorted(sum((Counter(r.get("normalised", {})) for r in results), Counter()).items()))}


def _json_or_none(clips: ClipTally | None) -> dict[str, Any] | None:
    return clips.to_json() if clips is not None else None


def _units_clips(job: ShardJob, tallies: Sequence[dict[str, Any] | None]) -> ClipTally | None:
    """Work units' clip tallies (their JSON form; None: none in this run) as one; None when the job cuts no clips."""
    total = _clip_tally(job.options)
    if total is not None:
        for tally in tallies:
            if tally:
                total.merge(tally)
    return total


def _merge(dest: str, plan: dict[str, Any]) -> None:
    """Apply a merge plan: unit shards into one numbering. Idempotent, so an interrupted merge reruns."""
    for src, dst in plan["moves"]:
        with critical():
            if storage.exists(src):
                scan, record = parse_index(src, storage.read_bytes(index_path(src)))
                scan.shard = dst
                write_index(scan, dst, record)
                storage.move(src, dst)
            storage.remove(index_path(src))
    write_shard_counts(storage.join(dest, COUNT_FILE), plan["counts"])
    storage.remove_tree(storage.join(dest, UNITS))


def _merged_report(job: ShardJob, order: list[int], listing: Listing, plan: dict[str, Any]) -> JobReport:
    """Write the plan (so a merge killed half-way finishes on the next run), merge, and report the job."""
    plan_path = storage.join(job.dest, UNITS, PLAN)
    if not storage.exists(plan_path):
        storage.write_bytes(plan_path, json.dumps(plan).encode())
    _merge(job.dest, plan)

    def failures(key: str) -> list[Failure]:
        return [Failure(f["input"], f["name"], f["reason"]) for f in plan.get(key, [])]

    summary = WriteSummary(shards=[], samples=sum(plan["counts"].values()), failures=failures("failures"),
                           counts=plan["counts"], warnings=failures("warnings"))
    report = _report(job, order, listing, plan["written"], summary, plan["resumed"], plan["nbytes"],
                     clips=_units_clips(job, [plan.get("clips")]))
    report.changed, report.rewritten = plan.get("changed", []), plan.get("rewritten", [])
    report.normalised = plan.get("normalised", {})
    return report


def _saved_plan(job: ShardJob) -> dict[str, Any] | None:
    """The plan of a merge that was stopped half-way, if any."""
    path = storage.join(job.dest, UNITS, PLAN)
    return json.loads(storage.read_bytes(path)) if storage.exists(path) else None


def _run_ray(job: ShardJob, inputs: tuple[Listing, InputStamps], order: list[int],
             progress: ProgressFn | None) -> JobReport:
    from fgdata.jobs.ray_executor import run_units

    items = (inputs[0].items, inputs[1])
    plan = _saved_plan(job)
    if plan is None:
        units = _units(job, len(items[0]))

        finished = [0]  # inputs of the units done so far: what a stop reports

        def done(_i: int, r: dict[str, Any]) -> None:
            finished[0] += r["inputs"]
            if progress:
                progress(r["inputs"], r["nbytes"])

        try:
            results = run_units(_run_unit, units, address=job.ray_address, on_done=done,
                                shared={"items": items, "order": order, "job": job})
        except Interrupted as stop:
            stop.done = finished[0]
            raise
        plan = _plan(job, units, results)
    return _merged_report(job, order, inputs[0], plan)


# -- torchrun ranks ----------------------------------------------------------------------------------------


def _unit_marker(job: ShardJob, u: int) -> str:
    return storage.join(job.dest, UNITS, "%05d.json" % u)


def _read_marker(path: str, fp: str, launch: str | None) -> dict[str, Any] | None:
    """A unit's result, if its marker exists, was written with these options and counts in this run
    (``launch``: see :func:`fgdata.jobs.ranks.run_launch`); a torn one reads as absent."""
    try:
        doc = json.loads(storage.read_bytes(path))
    except Exception:  # noqa: BLE001 - missing or torn: not done
        return None
    return doc if isinstance(doc, dict) and doc.get("fingerprint") == fp and this_launch(doc, launch) else None


def _run_ranks(job: ShardJob, inputs: tuple[Listing, InputStamps], order: list[int], rank: int, world: int,
               progress: ProgressFn | None, on_start: Callable[[int], None] | None,
               notify: Notify | None) -> JobReport:
    """This rank's work units (unit u belongs to rank ``u mod world``), each leaving its result as a marker;
    rank 0 then waits for every marker, builds the same plan as the Ray driver and merges.

    A rank never touches a unit whose marker exists (rank 0 may be merging it); ``--no-resume`` makes each
    rank drop its own units and markers, and rank 0 the earlier outputs and an unfinished plan; markers then
    carry this launch's id and rank 0 merges only those, so it never takes a marker another rank has not
    removed yet for a finished unit.
    """
    listing, stamps = inputs
    items = (listing.items, stamps)
    units = _units(job, len(items[0]))
    mine = [u for u in range(len(units)) if owner(u, world) == rank]
    fp = fingerprint(byte_options(job, units=True))
    launch = run_launch(job.resume, job.wait_timeout)
    if not job.resume:
        testhook.hold("no-resume", rank)
        if rank == 0:
            _start_over(job, notify, units=False)
        for u in mine:
            storage.remove(_unit_marker(job, u))
            storage.remove_tree(units[u]["dest"])
    _check_record(job, items[0], units=True, write=rank == 0)
    plan = _saved_plan(job) if job.resume else None  # with --no-resume rank 0 has removed it
    share: list[dict[str, Any]] = []
    try:
        if plan is None:  # else a merge was stopped half-way: every unit is done, rank 0 finishes the merge
            _run_share(job, items, order, [(u, units[u]) for u in mine], (fp, launch), share, progress, on_start)
            if rank == 0:
                # this rank's own results carry this run's figures (inputs resumed, bytes read)
                results = _gather(job, len(units), world, (fp, launch), dict(zip(mine, share, strict=True)), notify)
                plan = _plan(job, units, results)
    except Interrupted as stop:
        stop.done = sum(r["inputs"] for r in share)
        raise
    if rank != 0:
        return _share_report(job, order, rank, world, share)
    assert plan is not None  # rank 0 built it, or found the one of a merge stopped half-way
    report = _merged_report(job, order, listing, plan)
    report.world = world
    return report


def _gather(job: ShardJob, n: int, world: int, stamp: tuple[str, str | None], results: dict[int, dict[str, Any]],
            log: Notify | None) -> list[dict[str, Any]]:
    """Every unit's result in unit order: ``results`` plus the other ranks' markers (of ``stamp``: fingerprint
    and launch), waited for (bounded)."""

    def missing() -> list[str]:
        for u in range(n):
            if u not in results:
                found = _read_marker(_unit_marker(job, u), *stamp)
                if found is not None:
                    results[u] = found
        return ["unit %05d (rank %d)" % (u, owner(u, world)) for u in range(n) if u not in results]

    wait_for(missing, f"{job.dest}: work units of other ranks", job.wait_timeout, log=log)
    return [results[u] for u in range(n)]


def _run_share(job: ShardJob, items: tuple[list[WorkItem], InputStamps], order: list[int],
               mine: list[tuple[int, dict[str, Any]]], stamp: tuple[str, str | None], share: list[dict[str, Any]],
               progress: ProgressFn | None, on_start: Callable[[int], None] | None) -> None:
    """Run this rank's units (skipping those whose marker of ``stamp`` exists), appending each result to
    ``share``; each new marker carries ``stamp`` (fingerprint, launch)."""
    fp, launch = stamp
    if on_start:
        on_start(sum(unit["span"][1] - unit["span"][0] for _, unit in mine))
    for u, unit in mine:
        result = _read_marker(_unit_marker(job, u), fp, launch)
        if result is not None:
            result = {**result, "resumed": result["inputs"], "nbytes": 0, "clips": None,
                      "normalised": {}}  # none in this run
            if progress:
                progress(result["inputs"], 0)
        else:
            result = _run_unit(items, order, unit["span"], unit["dest"], job, job.workers, progress)
            storage.write_bytes(_unit_marker(job, u), json.dumps({**result, "fingerprint": fp, "launch": launch}).encode())
        share.append(result)


def _share_report(job: ShardJob, order: list[int], rank: int, world: int,
                  share: list[dict[str, Any]]) -> JobReport:
    """What a rank other than 0 did (its units only); it writes no report file, rank 0 writes the job's."""
    def entries(key: str) -> list[dict[str, Any]]:
        return [{"input": f["name"], "reason": f["reason"], "index": order[f["input"]] if f["input"] is not None
                 else None} for r in share for f in r.get(key, [])]

    failures = entries("failures")
    written = sum(r["written"] for r in share)
    clips = _units_clips(job, [r.get("clips") for r in share])
    return JobReport(seen=written + len(failures), written=written, failed=len(failures),
                     samples=sum(sum(r["counts"].values()) for r in share), failed_by_reason=by_category(failures),
                     shards=[], counts={}, failures_path=None, resumed=sum(r["resumed"] for r in share),
                     nbytes=sum(r["nbytes"] for r in share), failures=failures, warnings=entries("warnings"),
                     rank=rank, world=world, clips=clips, whole_job=False)


def quickstart_videos(outdir: str | os.PathLike[str]) -> dict[str, Any]:
    """Shard the bundled clip (video + audio + caption) into ``outdir/video_shards``; return paths and counts."""
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples" / "data"
    out = Path(outdir)
    src = out / "video-src"
    src.mkdir(parents=True, exist_ok=True)
    for name in ("bigbuckbunny.mp4", "bigbuckbunny.txt"):
        shutil.copyfile(examples / name, src / name)
    dest = out / "video_shards"
    report = run_shard_job(ShardJob(src=str(src), dest=str(dest), options=ShardOptions(kind="videos")))
    return {"shards": report.shards, "samples": report.samples, "seen": report.seen, "written": report.written,
            "failed": report.failed, "counts": str(dest / "shard_count.json"), "failures": report.failures_path}
