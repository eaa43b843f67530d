"""``run_job(job, settings)``: the one driver of every writing command.

A command describes its job as a :class:`JobDefinition` and hands it to :func:`run_job`, which owns what every
job does the same way:

1. **Taking DST**: the command's checks before anything is written (:meth:`JobDefinition.start`), then DST's lock
   (:func:`fgdata.jobs.dest.claimed`; an s3:// DST's lease), stop signals (:mod:`fgdata.jobs.signals`) and the
   command's preparation of DST under the lock (:meth:`JobDefinition.prepare`: foreign files, the job record).
2. **Planning**: :meth:`JobDefinition.plan` streams the units (anything with a ``number`` and an ``inputs``
   fingerprint); the driver holds only the units in flight.
3. **Ownership and resume**: unit ``u`` belongs to torchrun rank ``u mod WORLD_SIZE`` (every unit to the one
   process, or to the Ray driver). An owned unit whose marker passes the one rule
   (:func:`fgdata.jobs.units.resumable`, the same inputs, and not one :meth:`JobDefinition.redo` names) is kept as
   it is; every other owned unit is pending.
4. **Running**: :meth:`JobDefinition.execute` runs the pending units on the executor :func:`executor_of` chose
   from the settings (a local pool, Ray) and yields each unit's :class:`~fgdata.jobs.units.Marker` as it ends; its
   producer and sink are the command's (a definition usually calls :func:`fgdata.jobs.executor.run_units`).
5. **Waiting**: torchrun rank 0 waits (bounded by ``wait_timeout``) for every other rank's marker of this run.
6. **Finalize** (the one process that finishes: the only one, the Ray driver, rank 0): every marker is spooled to
   a local file as met (:class:`~fgdata.jobs.units.Spool`), leftovers of dead workers are cleared, what no unit
   claims is swept (:meth:`JobDefinition.sweep`), the job's final files are written from the markers in unit order
   (:meth:`JobDefinition.write_final`: by default ``shard_count.json`` and ``failures.json``,
   :func:`fgdata.jobs.units.finalize`; a command whose outputs are not shards writes its own), then the command
   writes its own side files (:meth:`JobDefinition.finish`).
7. **Summary**: one :class:`~fgdata.jobs.summary.JobSummary` (a rank other than 0: its own share) of what every
   job has, to which the command adds its own figures as the summary's typed ``payload``
   (:meth:`JobDefinition.summarize`).

A definition never imports a pool, a lock or a marker reader of its own; the engine never imports a command.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, Protocol, TypeVar

from fgdata import storage
from fgdata.errors import FgdataError, OptionError
from fgdata.jobs import dest as destmod
from fgdata.jobs import outputs
from fgdata.jobs.executor import Executor, Pool, Ray
from fgdata.jobs.ranks import dist_env, owner
from fgdata.jobs.report import FAILURES_FILE, ReportFields, category
from fgdata.jobs.signals import Interrupted, stop_on_signals
from fgdata.jobs.summary import JobSummary
from fgdata.jobs.units import (
    UNITS_DIR,
    Marker,
    Plan,
    SizeOf,
    Spool,
    Totals,
    drop_markers_from,
    existing_markers,
    finalize,
    is_final,
    is_started,
    listed_sizes,
    read_unit,
    resumable,
    stat_sizes,
    wait_for_units,
)
from fgdata.progress import Notify, ProgressFn

#: A file every :func:`run_job` call appends its command to (one line each), when the environment names one: the
#: test that every writing command runs through the one driver reads it.
CALLS_ENV = "FGDATA_TEST_RUN_JOB_CALLS"


@dataclass(frozen=True)
class RunSettings:
    """How a job runs, for every command (never part of its fingerprint: the outputs' bytes do not depend on it).

    ``engine``: ``local`` (a pool of ``workers`` processes on this machine) or ``ray`` (one Ray task per unit, at
    most ``workers`` at a time where the command asks so, ``num_gpus`` each; ``ray_address`` None: ``RAY_ADDRESS``
    or a private cluster). ``rank``/``world``: torchrun's, from the environment unless given. ``resume``: keep
    the units an earlier run finished; ``overwrite``: remove what DST holds first (a fresh run). ``wait_timeout``:
    rank 0's wait for the other ranks. ``progress(inputs, nbytes)``, ``notify(line)`` (what is deleted or
    redone), ``log(line)`` (per-unit figures), ``on_start(total)`` (once the job reads its inputs; None: not
    known before the stream ends)."""

    engine: str = "local"
    workers: int = 1
    ray_address: str | None = None
    num_gpus: float = 0.0
    resume: bool = True
    overwrite: bool = False
    wait_timeout: float | None = None
    rank: int | None = None
    world: int | None = None
    progress: ProgressFn | None = None
    notify: Notify | None = None
    log: Notify | None = None
    on_start: Callable[[int | None], None] | None = None

    def __post_init__(self) -> None:
        if self.engine not in ("local", "ray"):
            raise OptionError(f"--engine must be 'local' or 'ray', not {self.engine!r}")
        if self.workers < 1:
            raise OptionError("--workers must be at least 1")


class PlannedUnit(Protocol):
    """What the engine needs of a command's unit: its number and its inputs' fingerprint (a marker's ``inputs``)."""

    @property
    def number(self) -> int: ...

    @property
    def inputs(self) -> str: ...


U = TypeVar("U", bound=PlannedUnit)


@dataclass
class Context:
    """One run as the engine sees it, handed to the definition's hooks: where it runs, what DST held, what it
    counted (never the units themselves: their markers are spooled)."""

    settings: RunSettings
    rank: int
    world: int
    stamp: tuple[str, str | None]  # (options fingerprint, launch id) that this run's markers carry
    before: dict[str, tuple[int, str]] = field(default_factory=dict)  # shards DST held when the job started
    present: dict[str, tuple[int, str]] = field(default_factory=dict)  # ...after the command prepared DST
    lease: tuple[str, str] | None = None  # the lease this process holds on DST (name, job), for Ray tasks
    spool: Spool = field(default_factory=Spool)
    units: int = 0  # units planned so far (the job's number of units once the plan ends)
    resumed: int = 0  # inputs of units kept as they were
    done: int = 0  # inputs of units finished or kept: what a stop reports
    fresh: int = 0  # units this process ran
    kept: int = 0  # units this process kept
    restarted: int = 0  # units an earlier run started and did not finish, written again
    expected: dict[int, str] = field(default_factory=dict)  # torchrun: other ranks' units -> inputs fingerprint
    seconds: float = 0.0  # this process's time running units

    @property
    def resume(self) -> bool:
        return self.settings.resume

    @property
    def notify(self) -> Notify | None:
        return self.settings.notify

    def progress(self, inputs: int, nbytes: int = 0) -> None:
        if self.settings.progress:
            self.settings.progress(inputs, nbytes)

    def lease_on(self, lock: destmod.DestLock) -> None:
        self.lease = (storage.basename(lock.lease.url), lock.lease.job) if lock.lease is not None else None


class JobDefinition(ABC, Generic[U]):
    """A command's job: what :func:`run_job` cannot know. Subclasses set ``command`` (``shard images``,
    ``encode latents``: the report's and summary's name) and ``dest``, and may set ``folder`` (its markers'
    folder under DST: :func:`fgdata.jobs.units.units_dir`) and ``stats`` (whether the finalize writes
    ``shard_stats.json``)."""

    command: str
    dest: str
    folder: str = UNITS_DIR
    stats: bool = False
    others: str = "work units of other ranks"  # what rank 0 waits for, in its message ("": DST alone names it)
    relist: bool = True  # list DST again after prepare (False: it removes nothing a kept unit could claim)
    #: Whether DST is the job's own folder, where a file fgdata did not write is refused (``--overwrite``: removed).
    #: False: DST is shared with files of other tools and jobs (a data root); the engine calls none of them foreign
    #: and the definition's ``prepare`` checks the outputs it names itself.
    owns_dest: bool = True

    # -- before and while taking DST
    def start(self, settings: RunSettings, rank: int, world: int) -> None:
        """Checks before DST is touched (options, sources, the first inputs); raise to refuse the job."""

    def kept_inputs(self) -> list[str]:
        """Files in DST that are not foreign though fgdata did not write them (an in-place job's inputs)."""
        return []

    @abstractmethod
    def fingerprint(self) -> str:
        """The fingerprint of the options that change the output bytes (every marker carries it)."""

    def launch(self, settings: RunSettings, world: int) -> str | None:
        """The launch id this run's markers carry (:func:`fgdata.jobs.ranks.run_launch`); None: earlier markers
        count."""
        return None

    def prepare(self, ctx: Context) -> None:
        """Under DST's lock, before any unit: foreign files, ``--no-resume``/``--overwrite``, the job record."""

    # -- planning and resume
    @abstractmethod
    def plan(self) -> Iterator[U]:
        """The units in order, streamed."""

    def unit_state(self, number: int) -> Marker | Plan | None:
        """What unit ``number`` left: its marker, its plan (started, not finished) or None; by default its marker
        file under DST (:func:`fgdata.jobs.units.read_unit`). A command whose outputs record what made them (``score``'s
        score files: the options and inputs they hold) reads them as its markers instead."""
        return read_unit(self.dest, number, self.folder)

    def units_left(self) -> set[int]:
        """The units that may have left something (one listing): by default those with a marker file."""
        return existing_markers(self.dest, self.folder)

    def redo(self, marker: Marker) -> bool:
        """Whether a unit the resume rule keeps is run again all the same (``--retry-failed``)."""
        return False

    def met(self, old: Marker | None, unit: U, ctx: Context, markers: set[int]) -> None:
        """Each owned unit with the earlier run's marker of its number (None: none), before it is judged."""

    def keep(self, marker: Marker, ctx: Context) -> None:
        """An owned unit kept as it is (``marker``: the earlier run's)."""

    def redoing(self, old: Marker | None, unit: U, ctx: Context) -> None:
        """An owned unit about to run (``old``: the earlier run's marker that the resume rule kept, if any)."""

    def planned(self, ctx: Context, markers: set[int]) -> None:
        """The plan ended (``markers``: the units that had a marker when the job started)."""

    def unit_outputs(self, ctx: Context) -> dict[str, tuple[int, str]]:
        """The units' outputs DST holds (name -> (size, version)), listed once after :meth:`prepare`: what the
        resume rule checks a kept unit's marker against. By default its shards; a command whose units write other
        files (``.npz`` moments) lists those."""
        return ctx.present

    # -- running
    def executor(self, settings: RunSettings) -> Executor:
        """Where the units run (by default what the settings name: :func:`executor_of`)."""
        return executor_of(settings)

    @abstractmethod
    def execute(self, pending: Iterator[U], executor: Executor, ctx: Context) -> Iterator[Marker]:
        """Run the pending units (produce on ``executor``, the sink writing each unit's outputs and marker); yield
        each marker as its unit ends. Progress of the inputs is the definition's to report (``ctx.progress``)."""

    def count(self, marker: Marker, ctx: Context, fresh: bool | None) -> None:
        """A marker met: run now by this process (``fresh``), kept (False) or another rank's (None)."""

    def unit_name(self, number: int) -> str:
        """Unit ``number`` in rank 0's wait message."""
        return "unit %06d" % number

    # -- finalize
    def sweep(self, ctx: Context) -> None:
        """Remove what no unit of this job claims (by default the markers of units past the last)."""
        drop_markers_from(self.dest, ctx.units, self.folder)

    def report_fields(self, ctx: Context) -> ReportFields:
        """``failures.json``'s own fields of the command (``skipped``, ``filtered``, ``not_updated``)."""
        return ReportFields()

    def retryable(self, reason: str) -> bool:
        return False

    def write_final(self, ctx: Context) -> Totals:
        """The job's final files, from every marker in unit order (:func:`markers_of`), and its totals: by default
        ``shard_count.json`` and ``failures.json`` (with ``stats`` ``shard_stats.json``) in DST. A command whose
        units' outputs are parts of other files (the sums one reference is made of) writes those instead."""
        return finalize(self.dest, self.command, ctx.spool, self.report_fields(ctx), self.stats,
                        self.retryable)

    def finish(self, ctx: Context, totals: Totals) -> None:
        """The command's own side files, once the counts and the failure report are written."""

    def summarize(self, summary: JobSummary, ctx: Context, totals: Totals | None) -> JobSummary:
        """Complete the summary with the command's figures, set as its ``payload`` (a dataclass of the command's;
        ``totals`` None: a rank's share)."""
        return summary

    def finished(self, summary: JobSummary, ctx: Context) -> None:
        """Last step under DST's lock, on every rank (notices about the run)."""


def executor_of(settings: RunSettings, preload: tuple[str, ...] = ()) -> Executor:
    """The executor the settings name: Ray, else a local pool of ``workers`` (the forkserver imports ``preload``)."""
    if settings.engine == "ray":
        return Ray(address=settings.ray_address, num_gpus=settings.num_gpus)
    return Pool(settings.workers, preload)


def _note_call(command: str) -> None:
    import os

    path = os.environ.get(CALLS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(command + "\n")


def run_job(job: JobDefinition[U], settings: RunSettings | None = None) -> JobSummary:
    """Run ``job`` (see the module docstring); SIGINT/SIGTERM raise :class:`~fgdata.jobs.signals.Interrupted`
    with the inputs done so far. Under torchrun each rank runs its own units and returns its share; rank 0 waits
    for the others and returns the job's."""
    settings = settings or RunSettings()
    _note_call(job.command)
    env_rank, env_world = dist_env()
    rank = env_rank if settings.rank is None else settings.rank
    world = env_world if settings.world is None else settings.world
    if settings.engine == "ray" and world > 1:
        raise FgdataError(f"--engine ray starts its own workers: launch it once, not under torchrun (WORLD_SIZE={world})")
    job.start(settings, rank, world)
    if settings.overwrite:  # a fresh run: fgdata's earlier outputs go, whatever options made them
        from dataclasses import replace

        settings = replace(settings, resume=False)
    removes = settings.overwrite and rank == 0
    refuse = partial(destmod.check_removable if removes else destmod.check_foreign, job.dest, job.kept_inputs()) \
        if job.owns_dest else None
    ctx = Context(settings, rank, world, (job.fingerprint(), job.launch(settings, world)))
    try:
        with stop_on_signals(), destmod.claimed(job.dest, destmod.rank_lock(rank), refuse, world) as lock:
            ctx.lease_on(lock)
            ctx.before = destmod.shard_versions(job.dest, partial(outputs.hold, "dest-listed", rank))
            job.prepare(ctx)
            ctx.present = destmod.shard_versions(job.dest) if job.relist else ctx.before
            if settings.on_start:
                settings.on_start(None)
            started = time.perf_counter()
            try:
                for marker in job.execute(_pending(job, ctx), job.executor(settings), ctx):
                    _add(job, ctx, marker, fresh=True)
            except Interrupted as stop:
                stop.done = ctx.done
                raise
            ctx.seconds = time.perf_counter() - started
            if rank != 0:
                summary = job.summarize(_share(job, ctx), ctx, None)
                job.finished(summary, ctx)
                return summary
            if world > 1:
                _gather(job, ctx)
            # Every unit is in: no rank or Ray worker moves a shard any more, so a temporary left now is a dead one's.
            destmod.clear_leftovers(job.dest)
            job.sweep(ctx)
            totals = job.write_final(ctx)
            job.finish(ctx, totals)
            summary = job.summarize(_whole(job, ctx, totals), ctx, totals)
            job.finished(summary, ctx)
            destmod.drop_stale_indexes(job.dest, ctx.before, settings.notify)
            return summary
    finally:
        ctx.spool.close()


def _add(job: JobDefinition[U], ctx: Context, marker: Marker, fresh: bool | None) -> None:
    ctx.spool.add(marker)
    if fresh is not None:
        ctx.done += marker.count
        ctx.fresh += fresh
        ctx.kept += not fresh
        ctx.resumed += 0 if fresh else marker.count
    job.count(marker, ctx, fresh)


def _pending(job: JobDefinition[U], ctx: Context) -> Iterator[U]:
    """The units this process runs, in order, read as the executor takes them: an owned unit the resume rule
    keeps is counted and spooled here; another rank's unit is remembered by its inputs (what its marker must
    show)."""
    markers = job.units_left() if ctx.resume else set()
    options_fp = ctx.stamp[0]
    size_of: SizeOf = listed_sizes(job.unit_outputs(ctx))
    mine = (lambda _n: True) if ctx.world == 1 else (lambda n: owner(n, ctx.world) == ctx.rank)
    for unit in job.plan():
        ctx.units = unit.number + 1
        if not mine(unit.number):
            ctx.expected[unit.number] = unit.inputs
            continue
        found = job.unit_state(unit.number) if unit.number in markers else None
        if isinstance(found, Plan):
            ctx.restarted += 1
        old = found if isinstance(found, Marker) else None
        job.met(old, unit, ctx, markers)
        if old is not None and not resumable(old, options_fp, size_of):
            old = None
        if old is not None and old.inputs == unit.inputs and not job.redo(old):
            _add(job, ctx, old, fresh=False)
            job.keep(old, ctx)
            ctx.progress(old.count, 0)
            continue
        job.redoing(old, unit, ctx)
        yield unit
    job.planned(ctx, markers)


def _gather(job: JobDefinition[U], ctx: Context) -> None:
    """Rank 0: wait (bounded) for every other rank's unit markers of this run (:func:`is_final`) and spool them."""
    size_of = stat_sizes(job.dest)

    def final(marker: Marker) -> bool:
        return is_final(marker, ctx.stamp, ctx.expected[marker.unit], ctx.resume, size_of, job.redo)

    wait_for_units(job.unit_state, [u for u in range(ctx.units) if u not in ctx.spool],
                   (final, lambda plan: is_started(plan, ctx.stamp, ctx.expected[plan.unit])),
                   partial(_add, job, ctx, fresh=None), ctx.world,
                   f"{job.dest}: {job.others}" if job.others else job.dest,
                   ctx.settings.wait_timeout, ctx.settings.log, name=job.unit_name)


def _share(job: JobDefinition[U], ctx: Context) -> JobSummary:
    """What a rank other than 0 did (its units only); it writes no report file, rank 0 writes the job's."""
    written = failed = samples = 0
    reasons: Counter[str] = Counter()
    filtered: Counter[str] = Counter()
    for marker in ctx.spool.in_order():
        written += marker.written
        failed += len(marker.failures)
        samples += marker.samples
        reasons.update(category(f.reason) for f in marker.failures)
        filtered.update(marker.filtered)
    return JobSummary(command=job.command, path=job.dest, seen=written + failed + sum(filtered.values()),
                      written=written, failed=failed, filtered=sum(filtered.values()),
                      filtered_by_reason=dict(sorted(filtered.items())),
                      samples=samples, failed_by_reason=dict(sorted(reasons.items())), failures_path=None,
                      resumed=ctx.resumed, rank=ctx.rank, world=ctx.world, restarted=ctx.restarted, whole_job=False)


def _whole(job: JobDefinition[U], ctx: Context, totals: Totals) -> JobSummary:
    counts = {s.name: s.samples for m in ctx.spool.in_order() for s in m.shards}
    return JobSummary(command=job.command, path=job.dest, seen=totals.inputs, written=totals.written,
                      failed=totals.failed, samples=totals.samples,
                      failed_by_reason=dict(sorted(totals.failed_by_reason.items())),
                      shards=[storage.join(job.dest, n) for n in counts], counts=counts,
                      failures_path=storage.join(job.dest, FAILURES_FILE), resumed=ctx.resumed,
                      rank=ctx.rank, world=ctx.world, restarted=ctx.restarted)


def markers_of(ctx: Context) -> Iterable[Marker]:
    """Every spooled marker, in unit order (a finish hook reads them again without holding them)."""
    return ctx.spool.in_order()
