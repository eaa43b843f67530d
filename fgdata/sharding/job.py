"""``fgdata shard images|videos|prompts`` on the job core: stream the inputs in work units, write, finalize.

The inputs (a folder walk, manifest rows, prompt lines) are read as a stream and cut into work units
(:mod:`fgdata.jobs.units`); each unit writes its shards under names fixed by the unit and leaves a marker. The
executor is chosen here: one process with a pool of ``--workers`` (the default), torchrun ranks (unit ``u``
belongs to rank ``u mod WORLD_SIZE``; rank 0 waits for every marker, bounded by ``--wait-timeout``, then
finalizes) or Ray (each unit a task; the driver finalizes). All give the same bytes.

Side files beside the shards (all written atomically, local or s3://):

- ``shard_job.json``: the job record: the options that change bytes (:func:`byte_options`). A resumed job
  must match it, so a rerun never mixes two option sets; a mismatch names the option;
- ``shard_count.json`` and ``<shard>.idx.json``: the counts (assembled from the unit markers) and each shard's
  offset index;
- ``failures.json``: the one failure report (:mod:`fgdata.jobs.report`), plus ``samples``,
  ``failed_by_reason``, ``warnings`` (inputs written without a part, e.g. a caption that cannot be read) and
  ``skipped`` (files below SRC that are not inputs, :class:`fgdata.sources.folder.Skipped`); each failure and
  warning also carries ``index``, the item's position in source order;
- ``shard_stats.json`` (URL jobs, and jobs that leave inputs out: ``--where``, ``--keep-top``, source shards):
  successes, failures and filtered inputs by reason, per shard (:mod:`fgdata.jobs.stats`).

Keys come from the item index, so every executor gives the same samples in the same order.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from array import array
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import chain, islice
from typing import Any, TypedDict

from fgdata import storage
from fgdata.errors import FgdataError, OptionError
from fgdata.jobs import dest as destmod
from fgdata.jobs import outputs
from fgdata.jobs.driver import Context, JobDefinition, RunSettings, executor_of, markers_of, run_job
from fgdata.jobs.executor import Executor, Ray, run_units
from fgdata.jobs.local import ordered_map, threaded_map
from fgdata.jobs.options import (FLATTEN, RUNTIME, WHEN_SET, JobRecord, JsonValue, byte_options, check_record,
                                 fingerprint)
from fgdata.jobs.provenance import write_provenance
from fgdata.jobs.ranks import owner, run_launch
from fgdata.jobs.report import Failure, ReportFields, category
from fgdata.jobs.signals import critical
from fgdata.jobs.summary import JobSummary, payload_of
from fgdata.jobs.units import (
    Entry,
    Marker,
    Plan,
    ShardDone,
    Totals,
    Unit,
    marker_path,
    plan_units,
    read_unit,
    shard_name,
    slots_per_unit,
    start_unit,
    sweep,
    unit_stage,
)
from fgdata.producers.media import Outcome, ShardOptions, mixed_format_warning, source_shards_open, transform
from fgdata.progress import Notify, ProgressFn
from fgdata.sharding.input_diff import InputDiff
from fgdata.shards import ShardWriter, iter_samples
from fgdata.shards.metadata import FGDATA_FIELD
from fgdata.sources.folder import Skipped, WorkItem
from fgdata.sources.selection import Selector
from fgdata.sources.shards import SHARD_KEY_FIELD
from fgdata.sources.stamps import InputStamps
from fgdata.storage.http import DownloadOptions, configure, read_environment, retryable, stop_fetching

JOB_FILE = "shard_job.json"
RECORD_VERSION = 3
#: Imported once in the forkserver, so pool workers start with the decoders loaded (video: PyAV on first use).
PRELOAD = ("fgdata.sharding.job", "fgdata.media.image")

#: URL jobs: outcomes a fetch thread may finish past the oldest one still awaited (memory: those are held).
URLS_AHEAD_PER_THREAD = 64


@dataclass(frozen=True)
class ShardJob:
    """What a shard job writes; the CLI builds one from its flags (how it runs: :class:`fgdata.jobs.driver.RunSettings`).
    Fields marked ``RUNTIME`` do not change the output bytes; every other field is part of the job record
    (:func:`fgdata.jobs.options.byte_options`)."""

    src: str = field(metadata=RUNTIME)
    dest: str = field(metadata=RUNTIME)
    options: ShardOptions = field(metadata=FLATTEN)
    path_column: str = "path"
    caption_column: str = "caption"
    maxcount: int = 1000
    maxsize: int | None = None
    shuffle_seed: int | None = None  # shuffles the inputs within each work unit
    unit_size: int | None = None  # inputs per work unit (default: maxcount)
    follow_symlinks: bool = False  # read links that point outside a source folder (they are refused otherwise)
    # a manifest read from s3:// or http(s):// may name local files (refused otherwise); a rerun that changes it
    # rewrites the units holding such rows (their stamps change), so it stays out of the job record
    allow_local_paths: bool = field(default=False, metadata=RUNTIME)
    download: DownloadOptions | None = field(default=None, metadata=RUNTIME)  # http(s) inputs (see with_download)
    retry_failed: bool = field(default=False, metadata=RUNTIME)  # redo units with retryable failures
    where: str | None = field(default=None, metadata=WHEN_SET)  # --where: manifest rows that pass
    keep_top: float | None = field(default=None, metadata=WHEN_SET)  # --keep-top F --by FIELD
    by: str | None = field(default=None, metadata=WHEN_SET)
    media_column: str | None = field(default=None, metadata=WHEN_SET)  # --image-column / --video-column
    rekey: bool = field(default=False, metadata=WHEN_SET)  # shard sources: keys from positions, not kept

    @property
    def command(self) -> str:
        return f"shard {self.options.kind}"

    @property
    def units_of(self) -> int:
        return self.unit_size or self.maxcount

    @property
    def slots(self) -> int:
        clips = self.options.kind == "videos" and (self.options.clip_seconds is not None or self.options.scenes is not None)
        one = self.maxsize is None and not clips
        return slots_per_unit(self.units_of, self.maxcount, one)


# -- inputs --------------------------------------------------------------------------------------------------


def selector_of(job: ShardJob, shards: list[str] | None) -> Selector | None:
    """The job's row selection (``--where``, ``--keep-top``), parsed and checked; None without one. ``shards``:
    the job's source shards (:func:`shard_source`), whose failed downloads are always filtered."""
    from fgdata.sources.manifest import is_manifest, text_cells
    from fgdata.sources.selection import Selection

    selection = Selection(where=job.where, keep_top=job.keep_top, by=job.by)
    if shards is not None:
        return Selector(selection, (SHARD_KEY_FIELD, "txt"), False)
    if not selection:
        return None
    selection.check()
    table = _table(job)
    if table is not None:
        return Selector(selection, (table[1], job.caption_column), False)
    if not is_manifest(job.src):
        raise OptionError("--where and --keep-top select the rows of a manifest (.csv, .jsonl, .parquet), a "
                          f"Parquet/Arrow dataset or existing shards: {job.src} is none of them")
    return Selector(selection, (job.path_column, job.caption_column), text_cells(job.src))


def _media_exts(job: ShardJob) -> frozenset[str]:
    from fgdata.media import IMAGE_EXTS, VIDEO_EXTS

    return IMAGE_EXTS if job.options.kind == "images" else VIDEO_EXTS


def shard_source(job: ShardJob) -> list[str] | None:
    """A shard source's shards (:mod:`fgdata.sources.shards`), or None."""
    from fgdata.sources.shards import shard_list

    return shard_list(job.src, _media_exts(job)) if job.options.kind != "prompts" else None


def _table(job: ShardJob) -> tuple[list[str], str] | None:
    """A media table source's files and media column (:mod:`fgdata.sources.tables`), or None."""
    from fgdata.sources.tables import media_column, table_files

    if job.options.kind == "prompts":
        return None
    files = table_files(job.src, explicit=job.media_column is not None)
    return (files, media_column(job.src, job.options.kind, job.media_column)) if files is not None else None


def _fetch_src_with(download: DownloadOptions | None) -> None:
    """SRC's own fetches over http(s) (a manifest, a list, shards) follow the job's network settings (the
    private-network policy, proxies), without the per-input body limit."""
    if download is not None:
        configure(replace(download, max_bytes=None))
        read_environment()


def stream_items(job: ShardJob, skipped: list[Skipped], selector: Selector | None = None,
                 shards: list[str] | None = None) -> Iterator[WorkItem]:
    """The job's inputs in source order, as a stream (a folder walk, manifest rows or prompt lines); a folder's
    files that are not inputs are appended to ``skipped`` as the walk meets them; a ``selector`` leaves out the
    rows it filters (``--keep-top``: after its first pass over the manifest). A DST inside the folder is left out
    of the walk: its shards are not inputs. ``shards``: the source shards when the caller has listed them."""
    from fgdata.media import VIDEO_EXTS
    from fgdata.media.image import SourceImageExtensions, missing_decoder
    from fgdata.sources.folder import walk_folder
    from fgdata.sources.manifest import is_manifest, iter_manifest, iter_prompts
    from fgdata.sources.shards import iter_shard_items
    from fgdata.sources.tables import iter_table

    web = ("http://", "https://")
    if job.src.startswith(web):
        _fetch_src_with(job.download)
    shards = shards if shards is not None else shard_source(job)
    if shards and any(s.startswith(web) for s in shards):  # a local list of shards on the web
        _fetch_src_with(job.download)
    table = _table(job) if shards is None else None
    flag = "--image-column" if job.options.kind == "images" else "--video-column"

    def rows(filtered: Counter[str]) -> Iterator[WorkItem]:
        if job.options.kind == "prompts":
            return iter_prompts(job.src, job.caption_column)
        if shards is not None:
            return iter_shard_items(shards, _media_exts(job), job.rekey, filtered)
        if table is not None:
            return iter_table(table[0], table[1], job.caption_column, flag)
        return iter_manifest(job.src, job.path_column, job.caption_column, job.allow_local_paths)

    if selector is not None:
        selector.plan(rows(Counter()))  # the first pass counts nothing: the second one does
        return selector(rows(selector.filtered))
    if job.options.kind == "prompts" or table is not None or is_manifest(job.src):
        return rows(Counter())
    if not storage.exists(job.src):
        raise FgdataError(f"{job.src}: no such folder or manifest")
    if not storage.is_dir(job.src):
        raise FgdataError(f"{job.src}: is a file; expected a folder or a manifest (.csv, .jsonl, .parquet)")
    exts = SourceImageExtensions() if job.options.kind == "images" else VIDEO_EXTS
    return walk_folder(job.src, exts, job.follow_symlinks, missing_decoder, skipped, leave_out=job.dest)


def with_download(job: ShardJob, head: list[WorkItem]) -> ShardJob:
    """The job with its download settings in its transform options when an input of the first unit (``head``)
    is an http(s) URL (they then belong to the job record); other jobs keep their options, and their record."""
    if job.options.kind == "prompts" or not any(i.path and i.data is None and i.path.startswith(("http://", "https://"))
                                                for i in head):  # (a sample of a shard read over http is no URL)
        return job
    download = job.download or DownloadOptions()
    # the environment's opt-out as this process sees it: a worker may have started before it was set
    download = replace(download, allow_private_network=download.private_allowed)
    return replace(job, options=replace(job.options, download=download))


def _stamps(items: Sequence[WorkItem]) -> list[str]:
    stamps = InputStamps(items)
    return [stamps[i] for i in range(len(items))]


def _with_filtered(unit: Unit[WorkItem]) -> Unit[WorkItem]:
    """The unit with the inputs left out that travel with its items in its inputs' fingerprint: its marker
    records them, so a rerun where they changed (rows appended that do not pass) writes the unit again. A unit
    without any keeps the fingerprint of its inputs alone."""
    import hashlib

    if not any(i.filtered for i in unit.items):
        return unit
    left_out = json.dumps([i.filtered for i in unit.items], sort_keys=True)
    return replace(unit, inputs=hashlib.sha256(f"{unit.inputs}\n{left_out}".encode()).hexdigest()[:32])


# -- the job record ------------------------------------------------------------------------------------------


def _check_record(job: ShardJob, resume: bool, write: bool = True) -> None:
    """Refuse to resume another job's shards, or shards of an earlier fgdata layout; then (re)write the record
    (``write``: the one process that does)."""
    options = {**byte_options(replace(job, unit_size=job.units_of)), "slots": job.slots}
    record: JobRecord = {"format": "fgdata.shard-job", "version": RECORD_VERSION, "command": job.command, "options": options}
    check_record(storage.join(job.dest, JOB_FILE), job.dest, record, resume, write,
                 "written by an earlier fgdata version (one numbering, no work units); "
                 "rerun with --overwrite to write it again")


def _options_fingerprint(job: ShardJob) -> str:
    return fingerprint({**byte_options(replace(job, unit_size=job.units_of)), "slots": job.slots})


# -- one unit's sink -----------------------------------------------------------------------------------------


class ClipDoc(TypedDict):
    """A :class:`ClipTally` as a marker's payload and the summary write it."""

    asked_seconds: float
    written: int
    longer_than_asked: int
    longest_seconds: float


@dataclass
class ClipTally:
    """The clips a ``--clip-seconds`` job wrote in one run, and how many came out longer than asked (cut at
    keyframes, a clip runs to the first keyframe at least ``clip_seconds`` on: sparse keyframes make long clips)."""

    asked: float
    written: int = 0
    longer: int = 0  # longer than asked by more than one frame
    longest: float = 0.0

    def add(self, length: float, longer: bool) -> None:
        self.written += 1
        self.longer += longer
        self.longest = max(self.longest, length)

    def merge(self, other: ClipTally) -> None:
        """Add another tally (a work unit's)."""
        self.written += other.written
        self.longer += other.longer
        self.longest = max(self.longest, other.longest)

    def to_json(self) -> ClipDoc:
        return {"asked_seconds": self.asked, "written": self.written, "longer_than_asked": self.longer,
                "longest_seconds": round(self.longest, 3)}

    @classmethod
    def from_json(cls, doc: ClipDoc) -> ClipTally:
        return cls(float(doc["asked_seconds"]), int(doc["written"]), int(doc["longer_than_asked"]),
                   float(doc["longest_seconds"]))


@dataclass
class ShardFigures:
    """``shard``'s own figures of its job's summary (:attr:`fgdata.jobs.summary.JobSummary.payload`): input bytes
    read and images normalised (this run), the clips written (this run), warnings, the files below SRC that are not
    inputs, the inputs changed since the earlier run and the shards written again for them, ``--retry-failed``'s
    retried and recovered inputs, ``shard_stats.json`` (URL jobs), and over the whole dataset the inputs written
    without a caption and the image member extensions. A rank's share fills only this run's figures and warnings."""

    nbytes: int = 0
    normalised: dict[str, int] = field(default_factory=dict)
    clips: ClipTally | None = None
    warned: int = 0  # inputs written without a part (a caption), listed in failures.json
    warned_by_reason: dict[str, int] = field(default_factory=dict)
    skipped: list[Failure] = field(default_factory=list)
    inputs: InputDiff | None = None
    rewritten: list[str] = field(default_factory=list)
    retried: int = 0
    recovered: int = 0
    stats_path: str | None = None
    uncaptioned: int = 0
    formats: dict[str, int] = field(default_factory=dict)  # image member -> inputs written with it


def _clip_tally(options: ShardOptions) -> ClipTally | None:
    return ClipTally(options.clip_seconds) if options.clip_seconds is not None else None


def _digest(members: dict[str, bytes]) -> str:
    return json.loads(members["json"])[FGDATA_FIELD]["sha256"]


@dataclass
class ShardPayload:
    """``shard``'s own fields of a unit's marker: input bytes read, images changed to display as a viewer does,
    the clips, inputs written without a caption, and image member extension -> inputs written with it."""

    nbytes: int = 0
    normalised: dict[str, int] = field(default_factory=dict)
    clips: ClipTally | None = None
    uncaptioned: int = 0
    formats: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"nbytes": self.nbytes, "normalised": self.normalised,
                "clips": None if self.clips is None else self.clips.to_json(), "uncaptioned": self.uncaptioned,
                "formats": self.formats}

    @classmethod
    def of(cls, marker: Marker) -> ShardPayload:
        """The payload of a shard unit's marker (as the sink left it, or as read back)."""
        if isinstance(marker.payload, ShardPayload):
            return marker.payload
        doc = marker.payload.to_json() if marker.payload is not None else {}
        clips = doc.get("clips")
        return cls(int(doc.get("nbytes", 0)), dict(doc.get("normalised", {})),
                   None if clips is None else ClipTally.from_json(clips), int(doc.get("uncaptioned", 0)),
                   dict(doc.get("formats", {})))


class UnitSink:
    """One unit's output: its shards (under the unit's names), failures, warnings and figures; :meth:`close`
    leaves its marker."""

    def __init__(self, job: ShardJob, unit: Unit[WorkItem], stamp: tuple[str, str | None], shards_done: list[int]):
        self.job = job
        self.unit = unit
        self.options_fp, self.launch = stamp
        start_unit(job.dest, Plan(unit.number, unit.first, len(unit.items), self.options_fp, unit.inputs, self.launch))
        self._stage = unit_stage(job.dest, unit.number)
        self._shards: list[ShardDone] = []
        self._open_failures: Counter[str] = Counter()
        self._open_filtered: Counter[str] = Counter()
        self.filtered: Counter[str] = Counter()
        self._shards_done = shards_done  # shards this process finished, for the test hook

        self.writer = ShardWriter(job.dest, name=partial(shard_name, unit.number, slots=job.slots),
                                  maxcount=job.maxcount, maxsize=job.maxsize, stage=self._stage, count_file=False,
                                  on_shard=self._shard_in_place, publishing=critical)
        self.failures: list[Entry] = []
        self.warnings: list[Entry] = []
        self.written = 0
        self.nbytes = 0
        self.normalised: Counter[str] = Counter()
        self.uncaptioned = 0
        self.formats: Counter[str] = Counter()
        self.clips = _clip_tally(job.options)

    def _shard_in_place(self, name: str, samples: int, size: int) -> None:
        self._shards.append(ShardDone(name, samples, size, dict(self._open_failures),
                                      dict(sorted(self._open_filtered.items()))))
        self._open_failures.clear()
        self._open_filtered.clear()
        self._shards_done[0] += 1
        outputs.reached(self._shards_done[0])

    def add(self, out: Outcome, firsts: dict[str, str] | None) -> None:
        """Write one input's outcome (``firsts``: ``--dedupe``'s digest -> first key, across the job)."""
        if firsts is not None and out.reason is None:
            key = out.samples[0][0]
            kept = firsts.setdefault(_digest(out.samples[0][1]), key)
            if kept != key:
                out.reason = f"duplicate: same bytes as {kept}"
        if out.reason is not None:
            self.failures.append(Entry(out.name, out.reason, out.index))
            self._open_failures[category(out.reason)] += 1
        else:
            for j, (key, members) in enumerate(out.samples):
                self.writer.write(key, members)
                if self.clips is not None and out.clips:
                    self.clips.add(*out.clips[j])
            self.written += 1
            self.normalised.update(out.normalised)
            self.uncaptioned += not out.captioned
            if out.image_format:
                self.formats[out.image_format] += 1
            self.warnings.extend(Entry(out.name, reason, out.index) for reason in out.warnings)
        self.nbytes += out.nbytes
        left_out = self.unit.items[out.position - self.unit.first].filtered
        if left_out:  # after the input's samples are written: they count for the shard that holds its last one
            self._open_filtered.update(left_out)
            self.filtered.update(left_out)

    def close(self) -> Marker:
        """Close the last shard and leave the unit's marker (its failures and filtered inputs after the last shard
        count for that shard's stats)."""
        self.writer.close()
        if (self._open_failures or self._open_filtered) and self._shards:
            last = self._shards[-1]
            failed = Counter(last.failed_by_reason) + self._open_failures
            filtered = Counter(last.filtered_by_reason) + self._open_filtered
            self._shards[-1] = ShardDone(last.name, last.samples, last.size, dict(failed),
                                         dict(sorted(filtered.items())))
        unit = self.unit
        marker = Marker(unit=unit.number, first=unit.first, count=len(unit.items), options=self.options_fp,
                        inputs=unit.inputs, stamps=list(unit.stamps), names=[i.name for i in unit.items],
                        shards=self._shards, written=self.written, failures=self.failures, warnings=self.warnings,
                        launch=self.launch,
                        payload=ShardPayload(self.nbytes, dict(sorted(self.normalised.items())), self.clips,
                                             self.uncaptioned, dict(sorted(self.formats.items()))),
                        filtered=dict(sorted(self.filtered.items())))
        with critical():
            storage.write_bytes(marker_path(self.job.dest, unit.number), marker.to_bytes())
        shutil.rmtree(self._stage, ignore_errors=True)
        return marker

    def abort(self) -> None:
        self.writer.abort()
        shutil.rmtree(self._stage, ignore_errors=True)


# -- executors ---------------------------------------------------------------------------------------------


def _transform_at(task: tuple[int, WorkItem], options: ShardOptions) -> Outcome:
    return transform(task[0], task[1], options)


def _outcomes(tasks: Iterable[tuple[int, WorkItem]], options: ShardOptions, workers: int,
              chunksize: int) -> Iterator[Outcome]:
    """Every task's outcome in input order. Local files go to ``workers`` processes in chunks. URLs are fetched
    (and decoded) by ``--fetch-threads`` threads of this process without pauses: a slow URL holds its own thread
    while the others go on (a local URL job gives each worker process whole units: see :func:`_run`)."""
    if options.download is None:
        yield from ordered_map(partial(_transform_at, options=options), tasks, workers, chunksize, preload=PRELOAD)
        return
    threads = options.download.threads
    stop_fetching(False)
    try:
        yield from threaded_map(partial(_transform_at, options=options), tasks, threads,
                                URLS_AHEAD_PER_THREAD * threads)
    except BaseException:  # a stop signal or an error: the threads end without new tries
        stop_fetching()
        raise


def _run_stream(job: ShardJob, units: Iterable[Unit[WorkItem]], stamp: tuple[str, str | None], workers: int,
                firsts: dict[str, str] | None, progress: ProgressFn | None) -> Iterator[Marker]:
    """Run units in this process, their inputs transformed by a pool of ``workers`` across unit boundaries
    (the pool never waits for a unit to close); yields each unit's marker in unit order."""
    started: deque[Unit[WorkItem]] = deque()

    def tasks() -> Iterator[tuple[int, WorkItem]]:
        for unit in units:
            started.append(unit)
            yield from zip(unit.positions, unit.items)

    # Images go to workers in chunks (less pickling per image), small enough that the last chunks
    # spread evenly over the workers; each video is one task.
    workers = max(1, workers)
    chunksize = 1 if job.options.kind == "videos" else max(1, min(16, job.units_of // (8 * workers)))
    shards_done = [0]
    sink: UnitSink | None = None
    try:
        for out in _outcomes(tasks(), job.options, workers, chunksize):
            if sink is None:
                sink = UnitSink(job, started[0], stamp, shards_done)
            sink.add(out, firsts)
            if progress:
                progress(1, out.nbytes)
            if out.position == sink.unit.positions[-1]:
                yield sink.close()
                started.popleft()
                sink = None
    except BaseException:
        if sink is not None:
            sink.abort()
        raise


@dataclass(frozen=True)
class UnitRun:
    """What every unit run in its own process needs: the job, the run's stamp and the driver's lease."""

    job: ShardJob
    stamp: tuple[str, str | None]
    lease: tuple[str, str] | None


def run_unit(run: UnitRun, unit: Unit[WorkItem]) -> Marker:
    """One unit in one process (a Ray task, under the driver's ``lease`` on shared storage; a URL job's local
    worker): the same outputs as :func:`_run_stream` gives it."""
    from fgdata.jobs.lease import following

    with following(run.job.dest, *run.lease) if run.lease else contextlib.nullcontext(), source_shards_open():
        return next(_run_stream(run.job, [unit], run.stamp, 1, None, None))


@dataclass(frozen=True)
class ShardReport(ReportFields):
    """``failures.json``'s fields of ``shard``: what SRC held that is not an input (``skipped``), and the row
    selection's outcome (``filtered``, ``filtered_by_reason``, ``selection``; empty without one)."""

    skipped: list[Skipped]
    selection: dict[str, Any]
    downloads: bool  # the inputs are URLs (``shard_stats.json`` says so: ``fgdata report`` shows a download section)

    @property
    def filtered(self) -> int:
        return int(self.selection.get("filtered", 0))

    @property
    def filtered_by_reason(self) -> dict[str, int] | None:
        return dict(self.selection["filtered_by_reason"]) if self.selection else None

    def to_json(self) -> dict[str, JsonValue]:
        return {"skipped": [s.to_json() for s in self.skipped], **self.selection}

    def stats_fields(self) -> dict[str, JsonValue]:
        return {"downloads": self.downloads}


# -- the job definition --------------------------------------------------------------------------------------


class ShardDefinition(JobDefinition[Unit[WorkItem]]):
    """``fgdata shard images|videos|prompts`` for :func:`fgdata.jobs.driver.run_job`: its units (the inputs cut
    as they stream), its producer (the media transform) and sink (one unit's shards), its side files and figures.
    It counts what the driver does not (never the units themselves)."""

    relist = False  # preparing DST removes nothing a kept unit could claim

    def __init__(self, job: ShardJob):
        self.job = job
        self.command = job.command
        self.dest = job.dest
        self.settings = RunSettings()
        self.skipped: list[Skipped] = []
        self.selector: Selector | None = None
        self.items: Iterable[WorkItem] = ()
        self.whole_units = False  # local source shards: each unit to one worker, which writes its shards
        self.firsts: dict[str, str] | None = None
        self.shards_of = array("I")  # per unit: its shards (for the sweep)
        self.nbytes = 0
        self.normalised: Counter[str] = Counter()
        self.clips = _clip_tally(job.options)
        self.diff = InputDiff()
        self.rewritten: list[str] = []
        self.retried: dict[int, set[int | None]] = {}  # unit -> indices of retryable failures
        self.recovered = 0

    def start(self, settings: RunSettings, rank: int, world: int) -> None:
        job = self.job
        if job.maxcount < 1:
            raise OptionError("--maxcount must be at least 1")
        if job.unit_size is not None and job.unit_size < 1:
            raise OptionError("--unit-size must be at least 1")
        if job.retry_failed and (not settings.resume or settings.overwrite):
            raise OptionError("--retry-failed continues an earlier run: not with --no-resume or --overwrite")
        if job.options.dedupe and (settings.engine == "ray" or world > 1):
            raise FgdataError("--dedupe compares every input with all before it: run it as one stream "
                              "(--engine local, not under torchrun)")
        if world > 1 and job.options.kind == "prompts":
            raise FgdataError(f"shard prompts runs in one process: launch it once, not under torchrun (WORLD_SIZE={world})")
        destmod.check_sources(job.dest, [job.src])
        shards = shard_source(job)
        # (remote shards' media are read by this process, inline: a unit in flight would hold them all)
        self.whole_units = shards is not None and not any(storage.is_url(s) for s in shards)
        self.selector = selector_of(job, shards)
        stream = stream_items(job, self.skipped, self.selector, shards)
        head = list(islice(stream, job.units_of))  # the first unit: it decides whether the inputs are URLs
        if not head and self.selector is not None:
            filtered = self.selector.filtered
            raise FgdataError(f"{job.src}: no row is selected ({sum(filtered.values())} filtered: "
                              f"{', '.join(f'{r} {n}' for r, n in sorted(filtered.items()))})")
        if not head:
            raise FgdataError(f"{job.src}: no inputs")
        self.job = with_download(job, head)
        self.items = chain(head, stream)
        self.stats = self.job.options.download is not None or self.selector is not None
        self.firsts = {} if job.options.dedupe else None
        self.settings = settings

    def fingerprint(self) -> str:
        return _options_fingerprint(self.job)

    def launch(self, settings: RunSettings, world: int) -> str | None:
        # Markers of this run carry a launch id when rank 0 could not tell them from an earlier run's otherwise:
        # --no-resume (every unit is redone) and --retry-failed (a unit with a retryable failure is redone).
        redo_all = not settings.resume or self.job.retry_failed
        return run_launch(not redo_all, settings.wait_timeout) if world > 1 else None

    def prepare(self, ctx: Context) -> None:
        job, notify = self.job, ctx.notify
        # Only rank 0 removes: another rank meeting foreign files before rank 0 removed them stops (safe).
        destmod.check_foreign(job.dest, overwrite=ctx.settings.overwrite and ctx.rank == 0, notify=notify)
        if not ctx.resume and ctx.world == 1:
            destmod.remove_files(job.dest, destmod.own_outputs(job.dest),
                                 "--overwrite" if ctx.settings.overwrite else "--no-resume", notify)
            storage.remove_tree(storage.join(job.dest, ".fgdata", "units"))
        elif not ctx.resume:  # every rank rewrites its own units; rank 0 removes what is left over once all are in
            outputs.redoing(ctx.rank)
        _check_record(job, ctx.resume, write=ctx.rank == 0)
        if ctx.world > 1 and not ctx.resume and ctx.rank == 0 and notify:
            notify(f"--no-resume: writing every work unit of {job.dest} again")

    def plan(self) -> Iterator[Unit[WorkItem]]:
        return map(_with_filtered, plan_units(self.items, self.job.units_of, self.job.shuffle_seed, _stamps))

    def redo(self, marker: Marker) -> bool:
        """``--retry-failed``: a unit with a retryable failure is run again by its owner."""
        return self.job.retry_failed and any(retryable(f.reason) for f in marker.failures)

    def met(self, old: Marker | None, unit: Unit[WorkItem], ctx: Context, markers: set[int]) -> None:
        compared = old if old is not None and old.options == ctx.stamp[0] else None
        if markers and (compared is None or compared.inputs != unit.inputs):
            self.diff.compare(compared, unit, appended=unit.number > max(markers))

    def keep(self, marker: Marker, ctx: Context) -> None:
        if self.firsts is not None:
            for name in (s.name for s in marker.shards):
                for sample in iter_samples(storage.join(self.dest, name)):
                    self.firsts.setdefault(_digest(sample.members), sample.key)

    def redoing(self, old: Marker | None, unit: Unit[WorkItem], ctx: Context) -> None:
        if old is not None and old.inputs != unit.inputs:
            self.rewritten += [s.name for s in old.shards]
        elif old is not None:  # --retry-failed
            self.retried[unit.number] = {f.index for f in old.failures if retryable(f.reason)}

    def planned(self, ctx: Context, markers: set[int]) -> None:
        if markers:  # the earlier run's units beyond this run's last one hold inputs removed (or moved up)
            tail = (read_unit(self.dest, n) for n in sorted(markers)
                    if n >= ctx.units and owner(n, ctx.world) == ctx.rank)
            self.diff.end(m for m in tail if isinstance(m, Marker) and m.options == ctx.stamp[0])

    def executor(self, settings: RunSettings) -> Executor:
        return executor_of(settings, PRELOAD)

    def execute(self, pending: Iterator[Unit[WorkItem]], executor: Executor, ctx: Context) -> Iterator[Marker]:
        """A local job's inputs go to a pool across unit boundaries; a URL job's local workers (fetching with their
        own threads across a unit), local source shards' workers and Ray take each unit as one task that writes the
        unit's shards itself. (Re-sharding is mostly moving bytes: written by the driver, every sample's media
        would cross the pipe back and be written by one process; such a unit holds its media by reference.)"""
        job = self.job
        workers = ctx.settings.workers
        by_units = (job.options.download is not None or self.whole_units) and workers > 1 and self.firsts is None
        if isinstance(executor, Ray) or by_units:
            for marker in run_units(run_unit, pending, executor, UnitRun(job, ctx.stamp, ctx.lease)):
                ctx.progress(marker.count, ShardPayload.of(marker).nbytes)
                yield marker
            return
        with source_shards_open():  # (read in this process with --workers 1)
            yield from _run_stream(job, pending, ctx.stamp, workers, self.firsts, ctx.settings.progress)

    def count(self, marker: Marker, ctx: Context, fresh: bool | None) -> None:
        while len(self.shards_of) <= marker.unit:
            self.shards_of.append(0)
        self.shards_of[marker.unit] = len(marker.shards)
        if fresh is False:
            return
        payload = ShardPayload.of(marker)
        self.nbytes += payload.nbytes  # this run's
        self.normalised.update(payload.normalised)
        if self.clips is not None and payload.clips:
            self.clips.merge(payload.clips)
        again = self.retried.get(marker.unit)
        if again:
            still = {f.index for f in marker.failures}
            self.recovered += sum(i not in still for i in again)

    def claims(self, name: str) -> bool:
        unit, j = divmod(int(name[:-4]), self.job.slots)
        return unit < len(self.shards_of) and j < self.shards_of[unit]

    def sweep(self, ctx: Context) -> None:
        sweep(self.dest, self.claims, ctx.units, ctx.notify)

    def report_fields(self, ctx: Context) -> ShardReport:
        return ShardReport(sorted(self.skipped, key=lambda s: s.name),
                           self.selector.report() if self.selector is not None else {},
                           self.job.options.download is not None)

    def retryable(self, reason: str) -> bool:
        return retryable(reason)

    def finish(self, ctx: Context, totals: Totals) -> None:
        if self.selector is not None:  # the selection's outcome (--keep-top's threshold and count) in the provenance
            fields = self.selector.report()
            write_provenance(self.dest, self.command, {key: fields[key] for key in ("filtered", "filtered_by_reason",
                                                                                    "selection") if key in fields})

    def summarize(self, summary: JobSummary, ctx: Context, totals: Totals | None) -> JobSummary:
        figures = ShardFigures(nbytes=self.nbytes, clips=self.clips)
        summary.payload = figures
        if totals is None:  # a rank's share: its own units' warnings
            figures.warned = sum(len(m.warnings) for m in markers_of(ctx))
            return summary
        from fgdata.jobs.stats import STATS_FILE

        fields = self.selector.report() if self.selector is not None else {}
        summary.seen += fields.get("filtered", 0)
        summary.filtered = fields.get("filtered", 0)
        summary.filtered_by_reason = fields.get("filtered_by_reason", {})
        summary.selection = fields.get("selection")
        figures.warned, figures.warned_by_reason = totals.warned, dict(sorted(totals.warned_by_reason.items()))
        figures.normalised = dict(sorted(self.normalised.items()))
        figures.skipped = [Failure(s.name, s.reason) for s in sorted(self.skipped, key=lambda s: s.name)]
        figures.inputs, figures.rewritten = self.diff, self.rewritten
        figures.stats_path = storage.join(self.dest, STATS_FILE) if self.stats else None
        figures.retried, figures.recovered = sum(len(v) for v in self.retried.values()), self.recovered
        uncaptioned, formats = 0, Counter[str]()  # over the whole dataset, in unit order
        for marker in markers_of(ctx):
            payload = ShardPayload.of(marker)
            uncaptioned += payload.uncaptioned
            formats.update(payload.formats)
        figures.uncaptioned = uncaptioned if self.job.options.kind != "prompts" else 0
        figures.formats = dict(formats.most_common())
        return summary

    def finished(self, summary: JobSummary, ctx: Context) -> None:
        notify = ctx.notify
        if summary.restarted and notify:  # each rank of its own units
            notify(f"{summary.restarted} work unit(s) an earlier run stopped half-way were written again from their "
                   "start")
        if summary.whole_job:
            figures = payload_of(summary, ShardFigures)
            _said(figures, notify)
            warning = mixed_format_warning(Counter(figures.formats), self.job.options)
            if warning and notify:
                notify(warning)


def run_shard(job: ShardJob, settings: RunSettings | None = None) -> JobSummary:
    """Shard ``job`` through the one driver (:func:`fgdata.jobs.driver.run_job`)."""
    return run_job(ShardDefinition(job), settings)


def _said(figures: ShardFigures, notify: Notify | None) -> None:
    """Say which inputs were added, removed or replaced since the earlier run and which shards were written again
    for them."""
    diff = figures.inputs
    told = [] if diff is None else [
        f"{n.count} input(s) {what} ({', '.join(n.names)}{' and more' if n.count > len(n.names) else ''})"
        for what, n in (("added", diff.added), ("removed", diff.removed), ("changed", diff.changed)) if n.count]
    if notify and (told or figures.rewritten):
        what = '; '.join(told) or "inputs moved, or the inputs left out beside them changed"
        notify(f"since the earlier run: {what}: wrote {len(figures.rewritten)} shard(s) "
               f"again ({', '.join(figures.rewritten[:5])}{' and more' if len(figures.rewritten) > 5 else ''})")


def quickstart_videos(outdir: str | os.PathLike[str]) -> dict[str, Any]:
    """Shard the bundled clip (video + audio + caption) into ``outdir/video_shards``; return paths and counts."""
    from pathlib import Path

    from fgdata.catalog import SAMPLE_DATA

    out = Path(outdir)
    src = out / "video-src"
    src.mkdir(parents=True, exist_ok=True)
    for name in ("bigbuckbunny.mp4", "bigbuckbunny.txt"):
        shutil.copy2(SAMPLE_DATA / name, src / name)  # its time too, as the class tree: the same stamps
    dest = out / "video_shards"
    report = run_shard(ShardJob(src=str(src), dest=str(dest), options=ShardOptions(kind="videos")))
    return {"shards": report.shards, "samples": report.samples, "seen": report.seen, "written": report.written,
            "failed": report.failed, "counts": str(dest / "shard_count.json"), "failures": report.failures_path}
