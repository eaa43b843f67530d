"""Shard-to-shard jobs (``encode latents|text``, ``kd pairs|paths``) on the job core's units.

Task model: task i (one input shard, or one chunk of a prompt file) is work unit i
(:mod:`fgdata.jobs.units`): it makes one output shard that keeps the input shard's name. Under torchrun it
belongs to rank ``i mod world`` (:mod:`fgdata.jobs.ranks`): no two ranks ever write the same file, and any
world size gives the same samples. Under ``--engine ray`` the driver keeps what the resume rule keeps and
submits every other task as its own Ray task (:func:`run_unit`, at most ``--workers`` at a time), so a slow
shard holds one worker, not a rank's share; a worker process keeps the job it first received, so its model
loads once per process, not once per task (:func:`_kept_job`). Ranks meet through files only: each
finished task leaves a :class:`~fgdata.jobs.units.Marker` in ``DST/.fgdata/<key>/units/NNNNNN.json`` (``key``:
``latents``, ``text``, ``kd-pairs``, ``kd-paths``; a folder per command, since ``encode text --into DST``
writes into a folder another command's markers describe). A rerun keeps a task by the unit rule
(:func:`fgdata.jobs.units.resumable`: same options and input, its shard in DST with the size the marker
records) and redoes any other; the job record ``DST/.fgdata/<key>/job.json`` holds the options that change
bytes, and a rerun with other options is refused, naming the option. The finishing process (the only one,
the Ray driver, or torchrun rank 0 after waiting for every marker, bounded by ``--wait-timeout``) streams
``shard_count.json`` and ``failures.json`` from the markers (:func:`fgdata.jobs.units.finalize`), then
writes ``provenance.json``. With ``--no-resume`` under torchrun the markers carry the launch id and only
this launch's count (:func:`fgdata.jobs.ranks.run_launch`).

Each shard is built by :class:`fgdata.shards.ShardWriter` in the unit's private work folder, then moved (or
uploaded) onto its final name, so a killed job never leaves a partial shard under a real name.

**In place** (the output folder is the input folder): a sample the producer cannot process keeps every
member it had. It is written back unchanged and reported as *not updated* (a failure with
``"kept": true``); a damaged input shard is left exactly as it was. Nothing is ever removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from fgdata import __version__, storage
from fgdata.errors import FgdataError
from fgdata.jobs import dest as destmod
from fgdata.jobs import outputs
from fgdata.jobs.driver import Context, JobDefinition, RunSettings
from fgdata.jobs.executor import Executor, Pool, Ray, run_units
from fgdata.jobs.options import JobRecord, JsonValue, byte_options, check_record, fingerprint
from fgdata.jobs.provenance import PROVENANCE_FILE, write_provenance
from fgdata.jobs.ranks import owner, run_launch
from fgdata.jobs.report import FAILURES_FILE, ReportFields, clean_reason
from fgdata.jobs.signals import critical
from fgdata.jobs.summary import JobSummary
from fgdata.jobs.units import (
    Entry,
    Marker,
    Plan,
    ShardDone,
    Totals,
    listed_sizes,
    marker_path,
    read_marker,
    start_unit,
    unit_stage,
    units_dir,
)
from fgdata.shards import COUNT_FILE, ShardWriter, load_index

STATE_DIR = destmod.STATE_DIR
RECORD_FILE = "job.json"
RECORD_FORMAT = "fgdata.task-job"
RECORD_VERSION = 1
MAX_SAMPLES_PER_SHARD = 2**31 - 1  # one output shard per task, whatever its size
Stamp = tuple[str, str | None]  # (options fingerprint, launch id) that this run's markers carry


@dataclass(frozen=True)
class Task:
    """One output shard: its name, the input shard it comes from (or None), or inline items (prompt files)."""

    name: str
    source: str | None = None
    items: tuple[tuple[str, str], ...] = ()

    @property
    def input(self) -> str:
        return self.source or self.name

    def fingerprint(self) -> str:
        """The task's input, as its marker's ``inputs``: the input shard's name, or a prompt chunk's prompts (not
        the folder it is read from, nor its bytes: an in-place job's input is its own output)."""
        h = hashlib.sha256(f"{self.name}\n".encode())
        for key, text in self.items:
            h.update(f"{key}\t{text}\n".encode("utf-8", "surrogateescape"))
        return h.hexdigest()[:32]


@dataclass
class Result:
    """What a producer says about one input: members to write, or why it failed (``original``: its members)."""

    pos: int
    key: str
    members: dict[str, bytes] | None
    reason: str = ""
    original: dict[str, bytes] | None = None


@dataclass
class TaskJob:
    """What a command hands the core: where, which tasks, the options dataclass and the producer."""

    dest: str
    command: str
    tasks: list[Task]
    options: Any  # a frozen dataclass: the options that change bytes
    produce: Callable[[Task], Iterable[Result]]
    provenance: Callable[[], dict[str, Any]] | None = None
    base: str | None = None  # where the samples come from, for provenance
    in_place: bool = False
    sources: tuple[str | None, ...] = ()  # what the job reads: DST may not be or hold one (in place: be one)

    @property
    def key(self) -> str:
        """The name of the command's state folder and provenance entry: ``latents``, ``text``, ``kd-pairs``."""
        return self.command.removeprefix("encode ").replace(" ", "-")

    @property
    def units(self) -> str:
        return units_dir(self.key)

    @property
    def state(self) -> str:
        return storage.join(self.dest, STATE_DIR, self.key)


@dataclass(frozen=True)
class ModelInfo:
    """What a rank loaded (its producer's provenance record), left in ``.fgdata/<key>/model-info.rank<R>.json``
    so the finishing rank need not load the model again."""

    fingerprint: str
    launch: str | None
    record: dict[str, Any]  # the producer's own description of its model

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), default=str).encode()

    @classmethod
    def parse(cls, data: bytes) -> "ModelInfo | None":
        try:
            doc = json.loads(data)
            return cls(str(doc["fingerprint"]), doc.get("launch"), dict(doc["record"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def _write_task(job: TaskJob, number: int, task: Task, results: Iterable[Result], stamp: Stamp,
                earlier: tuple[list[str], int | None] = ([], None)) -> Marker:
    """Build task ``number``'s output shard from ``results``, move it into place and leave its marker; in place,
    ``earlier`` is the other commands' state folders in DST and the shard's size when the job started."""
    options_fp, launch = stamp
    start_unit(job.dest, Plan(number, 0, None, options_fp, task.fingerprint(), launch), job.units)
    stage = unit_stage(job.dest, number)
    final = storage.join(job.dest, task.name)
    shards: list[ShardDone] = []
    writer = ShardWriter(job.dest, name=lambda _n: task.name, maxcount=MAX_SAMPLES_PER_SHARD, stage=stage,
                         count_file=False, publishing=critical,
                         on_shard=lambda name, samples, size: shards.append(ShardDone(name, samples, size)))
    failures: list[Entry] = []
    written = 0
    untouched = False
    try:
        for r in results:
            if r.members is not None:
                writer.write(r.key, r.members)
                written += 1
                continue
            entry = Entry(f"{task.input}#{r.key}", clean_reason(r.reason), r.pos)
            if job.in_place and r.original is not None:
                writer.write(r.key, r.original)  # kept as it was: not updated, never removed
                entry = replace(entry, kept=True)
            elif job.in_place:
                untouched = True  # a damaged input shard: replacing it would drop what cannot be read
            failures.append(entry)
        if untouched:
            writer.abort()
            failures = [Entry(task.input, "damaged shard: left unchanged; " + failures[-1].reason, None, kept=True)]
            written = 0
            scan = load_index(final)
            shards = [ShardDone(task.name, len(scan.samples), scan.size)] if scan and scan.samples else []
        elif not writer.close().samples and not job.in_place:
            with critical():  # an earlier run's output of this name
                storage.remove(final)
                storage.remove(final + destmod.INDEX_SUFFIX)
    except BaseException:
        writer.abort()
        shutil.rmtree(stage, ignore_errors=True)
        raise
    marker = Marker(unit=number, first=0, count=written + len(failures), options=options_fp,
                    inputs=task.fingerprint(), stamps=[], names=[task.input], shards=shards, written=written,
                    failures=failures, warnings=[], launch=launch)
    with critical():
        storage.write_bytes(marker_path(job.dest, number, job.units), marker.to_bytes())
        keys, grown_from = earlier
        if grown_from is not None and shards and not untouched:
            _follow_in_place(job, keys, number, task.name, grown_from, shards[0].size)
    shutil.rmtree(stage, ignore_errors=True)
    return marker


def _follow_in_place(job: TaskJob, keys: list[str], number: int, name: str, old_size: int, new_size: int) -> None:
    """After an in-place rewrite of shard ``name`` (``encode text L L --into L``), record its new size in the
    markers of the earlier commands whose output it was (their marker records ``old_size``): the shard still
    holds their members, so a rerun of those commands keeps it instead of writing it again. A marker naming
    another size (the shard changed in between) is left as it is."""
    for key in keys:
        other = read_marker(job.dest, number, units_dir(key))  # None: not a command's folder, or no such unit
        if other is None or not any(s.name == name and s.size == old_size for s in other.shards):
            continue
        other.shards = [replace(s, size=new_size) if s.name == name else s for s in other.shards]
        storage.write_bytes(marker_path(job.dest, number, units_dir(key)), other.to_bytes())


def _inputs_kept(job: TaskJob) -> list[str]:
    """Files in DST that are not foreign though fgdata did not write them: an in-place job's inputs."""
    return [t.name for t in job.tasks] if job.in_place else []


def _earlier_markers(job: TaskJob) -> list[str]:
    """Markers of fgdata 0.2 and earlier (``.fgdata/<key>/<shard>.json``, one dict per output shard)."""
    return [n for n in storage.list_names(job.state) if n.endswith(".tar.json")]


def _prepare_dest(job: TaskJob, run: RunSettings, rank: int, mine: list[int]) -> None:
    """Refuse foreign files (every rank checks: outputs appear with their index first, so no rank takes another's
    output for a foreign file) and a DST of an earlier layout, check the job record; ``--no-resume`` drops the
    markers of ``mine`` (this rank's tasks; a Ray driver's: all), saying so. ``--overwrite`` removes the foreign
    files and (rank 0) fgdata's earlier outputs that no task of this job writes again, then redoes every task."""
    destmod.check_foreign(job.dest, keep=_inputs_kept(job), overwrite=run.overwrite and rank == 0, notify=run.notify)
    earlier = _earlier_markers(job)
    if earlier and run.resume:
        raise FgdataError(f"{job.dest}: written by an earlier fgdata version ({len(earlier)} marker(s) in "
                          f".fgdata/{job.key}/); rerun with --no-resume to write it again")
    if rank == 0:
        for name in earlier:
            storage.remove(storage.join(job.state, name))
    if run.overwrite and rank == 0 and not job.in_place:
        rewritten = ({t.name for t in job.tasks} | {t.name + destmod.INDEX_SUFFIX for t in job.tasks}
                     | {COUNT_FILE, FAILURES_FILE, PROVENANCE_FILE})  # written again by this job
        destmod.remove_files(job.dest, destmod.own_outputs(job.dest, keep=rewritten), "--overwrite", run.notify)
    record: JobRecord = {"format": RECORD_FORMAT, "version": RECORD_VERSION, "command": job.command,
                         "options": byte_options(job.options)}
    check_record(storage.join(job.state, RECORD_FILE), job.dest, record, run.resume, rank == 0,
                 "written by an earlier fgdata version; rerun with --no-resume to write it again")
    if not run.resume:
        outputs.redoing(rank)
        if run.notify:
            flag = "--overwrite" if run.overwrite else "--no-resume"
            run.notify(f"{flag}: redoing {len(mine)} output shard(s) in {job.dest} from scratch")
        for number in mine:
            storage.remove(marker_path(job.dest, number, job.units))


def _other_keys(job: TaskJob) -> list[str]:
    """In place: the other commands' state folders in DST, whose markers follow a shard this job grows."""
    return [n for n in storage.list_names(storage.join(job.dest, STATE_DIR)) if n != job.key] if job.in_place else []


def _keep_model_info(job: TaskJob, stamp: Stamp, rank: int, info: dict[str, Any]) -> None:
    """Leave the model's provenance record for the finishing process and for reruns (:func:`_model_info`)."""
    storage.write_bytes(storage.join(job.state, f"model-info.rank{rank}.json"),
                        ModelInfo(stamp[0], stamp[1], info).to_bytes())


def _model_info(job: TaskJob, stamp: Stamp) -> dict[str, Any] | None:
    """The provenance record a rank (of this launch, under ``--no-resume``) left with these options."""
    for name in sorted(storage.list_names(job.state)):
        if name.startswith("model-info.rank") and name.endswith(".json"):
            with contextlib.suppress(FgdataError):
                info = ModelInfo.parse(storage.read_bytes(storage.join(job.state, name)))
                if info and info.fingerprint == stamp[0] and (stamp[1] is None or info.launch == stamp[1]):
                    return info.record
    return None


@dataclass(frozen=True)
class TaskUnit:
    """Task ``number`` as the driver's unit: its marker's ``inputs`` is the task's fingerprint."""

    number: int
    task: Task
    inputs: str


class TaskDefinition(JobDefinition[TaskUnit]):
    """The shard-to-shard commands (``encode``, ``kd``, ``score --into``) for :func:`fgdata.jobs.driver.run_job`:
    one unit per task, run in this process (its producer's model stays loaded) or one Ray task each."""

    others = "output shards of other ranks"

    def __init__(self, job: TaskJob):
        self.job = job
        self.command = job.command
        self.dest = job.dest
        self.folder = job.units
        self.info: dict[str, Any] | None = None  # the loaded model's provenance record
        self.not_updated = 0

    def start(self, settings: RunSettings, rank: int, world: int) -> None:
        job = self.job
        destmod.check_sources(job.dest, job.sources, job.in_place)
        if not job.tasks:
            raise FgdataError(f"nothing to do for {job.dest}: no input shards or prompts")
        names = [t.name for t in job.tasks]
        if len(set(names)) != len(names):
            raise FgdataError(f"{job.dest}: two inputs map to the same output shard name")
        storage.make_dirs(job.dest)

    def kept_inputs(self) -> list[str]:
        return _inputs_kept(self.job)

    def fingerprint(self) -> str:
        return fingerprint(byte_options(self.job.options))

    def launch(self, settings: RunSettings, world: int) -> str | None:
        return run_launch(settings.resume, settings.wait_timeout)

    def prepare(self, ctx: Context) -> None:
        mine = [i for i in range(len(self.job.tasks))
                if ctx.settings.engine == "ray" or owner(i, ctx.world) == ctx.rank]
        _prepare_dest(self.job, ctx.settings, ctx.rank, mine)

    def plan(self) -> Iterator[TaskUnit]:
        return (TaskUnit(number, task, task.fingerprint()) for number, task in enumerate(self.job.tasks))

    def unit_name(self, number: int) -> str:
        return self.job.tasks[number].name

    def executor(self, settings: RunSettings) -> Executor:
        """In this process (its producer's model stays), or at most ``workers`` Ray tasks at a time, each worker
        process keeping its job for every unit it runs (:func:`_kept_job`)."""
        if settings.engine == "ray":
            return Ray(address=settings.ray_address, num_gpus=settings.num_gpus, in_flight=settings.workers,
                       max_calls=0)
        return Pool(1)

    def execute(self, pending: Iterator[TaskUnit], executor: Executor, ctx: Context) -> Iterator[Marker]:
        job = self.job
        others = _other_keys(job)
        calls = (TaskCall(u.number, u.task, listed_sizes(ctx.present)(u.task.name)) for u in pending)
        if isinstance(executor, Ray):  # a run that keeps every task starts no Ray at all
            first = next(calls, None)
            if first is None:
                return
            shared = RayRun(replace(job, tasks=[]), uuid.uuid4().hex, ctx.stamp, ctx.lease, others)
            for marker, record in run_units(run_unit, itertools.chain([first], calls), executor, shared):
                ctx.progress(marker.count, 0)
                yield marker
                outputs.reached(ctx.fresh)
                if self.info is None and record is not None:
                    self.info = record
                    _keep_model_info(job, ctx.stamp, 0, record)
            return
        say = ctx.settings.log or (lambda _msg: None)

        def unit(_: None, call: TaskCall) -> tuple[Task, Marker, float]:
            t0 = time.perf_counter()

            def counted(results: Iterable[Result]) -> Iterator[Result]:
                for r in results:
                    yield r
                    ctx.progress(1, 0)

            marker = _write_task(job, call.number, call.task, counted(job.produce(call.task)), ctx.stamp,
                                 (others, call.grown_from))
            return call.task, marker, time.perf_counter() - t0

        for task, marker, dt in run_units(unit, calls, executor, None):
            yield marker
            say(f"rank {ctx.rank}: {task.name}: {marker.written} written, {len(marker.failures)} failed, "
                f"{marker.written / dt if dt > 0 else 0:.1f} samples/s")
            outputs.reached(ctx.fresh)
        if job.provenance is not None and ctx.fresh:
            self.info = job.provenance()
            _keep_model_info(job, ctx.stamp, ctx.rank, self.info)

    def count(self, marker: Marker, ctx: Context, fresh: bool | None) -> None:
        self.not_updated += sum(f.kept for f in marker.failures)

    def report_fields(self, ctx: Context) -> ReportFields:
        return NotUpdated(self.not_updated) if self.job.in_place else ReportFields()

    def finish(self, ctx: Context, totals: Totals) -> None:
        """``provenance.json``: the model's record (from this process, a rank's note, or loaded now) and the figures."""
        job = self.job
        info = self.info or _model_info(job, ctx.stamp) or (job.provenance() if job.provenance else {})
        in_place = {"not_updated": self.not_updated} if job.in_place else {}
        prov = {**info, "command": job.command, "options": byte_options(job.options), "fingerprint": ctx.stamp[0],
                "fgdata": __version__, "shards": totals.shards, "samples": totals.samples, "written": totals.written,
                "failed": totals.failed, **in_place}
        write_provenance(job.dest, job.key, prov, job.base)

    def summarize(self, summary: JobSummary, ctx: Context, totals: Totals | None) -> JobSummary:
        summary.seconds = ctx.seconds
        summary.payload = TaskFigures(ctx.fresh, ctx.kept, self.not_updated)
        return summary


#: A Ray worker process's job of the latest run, by that run's token: later units of the run in this process
#: use its producer, so the model it loads stays loaded; a unit of another run replaces it (and frees the model).
_kept: tuple[str, TaskJob] | None = None


def _kept_job(token: str, job: TaskJob) -> tuple[TaskJob, bool]:
    """The job this process keeps for run ``token`` (``job``, this unit's own copy, when it is the first unit of
    the run here), and whether it is the first."""
    global _kept
    if _kept is not None and _kept[0] == token:
        return _kept[1], False
    _kept = (token, job)  # the earlier run's producer and its model go now, before this run's model loads
    return job, True


@dataclass(frozen=True)
class TaskFigures:
    """The own figures of a job of tasks (``encode``, ``kd``, ``score --into``) in its summary
    (:attr:`fgdata.jobs.summary.JobSummary.payload`): output shards written by this run and found complete, and (in
    place) the samples written back unchanged, whose failures say "kept"."""

    shards_done: int
    shards_skipped: int
    not_updated: int = 0


@dataclass(frozen=True)
class NotUpdated(ReportFields):
    """``failures.json``'s field of an in-place run: the samples whose shard kept its earlier member."""

    not_updated: int

    def to_json(self) -> dict[str, JsonValue]:
        return {"not_updated": self.not_updated}


@dataclass(frozen=True)
class TaskCall:
    """One unit's work: task ``number``, and the size its output had when it was listed (None: not there)."""

    number: int
    task: Task
    grown_from: int | None


@dataclass(frozen=True)
class RayRun:
    """What every Ray task of a run shares: the job without its task list, the run's ``token`` (one kept job
    per worker process and run), its stamp, the driver's lease and the other keys an in-place task keeps."""

    job: TaskJob
    token: str
    stamp: Stamp
    lease: tuple[str, str] | None
    others: list[str]


def run_unit(run: RayRun, call: TaskCall) -> tuple[Marker, dict[str, Any] | None]:
    """Task ``call.number`` as one Ray task, under the driver's ``lease`` on shared storage (the driver holds DST's
    lock and has checked it); returns its marker and, from the first unit of the run in this process, the
    model's provenance record, so the driver need not load the model."""
    from fgdata.jobs.lease import following

    job, first = _kept_job(run.token, run.job)
    with following(job.dest, *run.lease) if run.lease else contextlib.nullcontext():
        marker = _write_task(job, call.number, call.task, job.produce(call.task), run.stamp,
                             (run.others, call.grown_from))
    return marker, job.provenance() if first and job.provenance else None


def shard_tasks(src: str) -> list[Task]:
    """One task per input shard; the output shard keeps its name."""
    from fgdata.shards import discover_shards

    shards = discover_shards(src)
    if not shards:
        raise FgdataError(f"{src}: no .tar shards found")
    return [Task(storage.basename(p), p) for p in shards]


def same_place(a: str | None, b: str) -> bool:
    """Whether two folders or prefixes are the same place (an in-place update)."""
    return a is not None and storage.within(a, b) == ""
