"""Preparing dataset zips on the job core: decode and transform inputs in a process pool, write EDM zips in order.

**Units.** The inputs are cut into work units of :data:`UNIT_INPUTS` positions, as every writing command's are
(:mod:`fgdata.jobs.units`); the pool works on blocks of a unit (workers receive position ranges, not data, and
return PNG bytes in order). An EDM zip numbers its members without gaps over the inputs written, so a unit's
member names depend on every unit before it: the driver appends the members to ``<zip>.partial`` in input
order, and when a unit's last member is on disk it leaves the unit's typed
:class:`~fgdata.jobs.units.Marker` (written count, failures, and the inputs converted to RGB as warnings whose
reason is the source mode) in ``<folder>/.fgdata/zips/<zip>/units/``. A unit's :class:`~fgdata.jobs.units.Plan`
goes there when its first member is appended.

**Resume.** A rerun keeps the complete members of the partial zip up to the last unit whose marker matches the
options and the unit's inputs, cuts the rest off, and writes on from the next unit: a kill loses at most one
unit's work, and a torn or foreign marker reads as absent (its unit is written again).

**On the job core.** A pass is a :class:`ZipPassJob` that :func:`fgdata.jobs.driver.run_job` runs: the engine
holds the lock of the zip's folder, runs under the signal handling of :mod:`fgdata.jobs.signals` (a stop keeps
the partial zip and the markers for the rerun), keeps the finished units by their markers and counts them.
The zip's folder is a data root that other files share (``owns_dest`` False): the pass checks its own outputs.
Its ``write_final`` is the only step that writes the finished zips, and the one failure report,
``failures.json`` (with ``outputs``), beside them; the markers go once the zips are in place.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.jobs.dest import STATE_DIR, remove_files
from fgdata.jobs.driver import Context, JobDefinition, RunSettings, run_job
from fgdata.jobs.executor import Executor, Pool, run_units
from fgdata.jobs.options import fingerprint as options_fingerprint
from fgdata.jobs.outputs import output_done
from fgdata.jobs.report import FAILURES_FILE, Failure, Outputs, write_failures
from fgdata.jobs.signals import critical
from fgdata.jobs.summary import OutputSummary
from fgdata.jobs.units import Entry, Marker, Plan, Totals, existing_markers, marker_path, read_marker, start_unit
from fgdata.prepare.options import Fingerprint
from fgdata.prepare.zipwriter import (Converted, EdmZipWriter, Provenance, ZipState, dataset_json_bytes,
                                      member_name, partial_paths, provenance_path, read_partial_state,
                                      validate_zip)
from fgdata.progress import Notify

#: One input's outcome: a member per target (None when it failed) and a note (source mode or failure reason).
Result = tuple[list[bytes] | None, str | None]


@dataclass(frozen=True)
class Block:
    """One call of a pass's work: the inputs at positions ``span`` (a..b), and the block's own ``rows`` where the
    pass sends its inputs with the work (CIFAR: each worker gets its blocks' rows, not all 50,000)."""

    span: tuple[int, int]
    rows: Iterable[Any] = ()


#: ``work(None, block)``: the outcome of every input of the block (:func:`fgdata.jobs.executor.run_units`' shape).
Work = Callable[[None, Block], list[Result]]


def _namer(stem_ext: tuple[str, str]) -> Callable[[int], str]:
    """The member name of the i-th input for one target (stem, extension)."""
    return lambda i: member_name(i, *stem_ext)

@dataclass
class ZipTarget:
    """One output zip and the label of every input (None: unlabelled)."""

    dest: Path
    labels: Sequence[int | None]
    transform: str
    stem: str = "img"
    ext: str = "png"
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ZipJob:
    """One prepare pass: the zips it writes, its inputs, the work function (a module-level function) and what a
    rerun must match (the byte options of the command's options dataclass and facts about its inputs)."""

    command: str
    targets: list[ZipTarget]
    n_inputs: int
    work: Work
    fingerprint: Fingerprint
    describe: Callable[[int], str]
    block: int = 64
    initializer: Callable[..., None] | None = None
    initargs: tuple = ()
    rows: Callable[[int, int], Iterable[Any]] | None = None  # the rows a block a..b carries (:class:`Block`)


@dataclass(frozen=True)
class Existing:
    """What an earlier run left at one output: keep it (complete: its provenance), or remove it first (saying
    why), or neither."""

    dest: Path
    kept: Provenance | None = None
    remove: tuple[str, ...] = ()
    why: str = ""


def check_output(dest: Path, expect: Fingerprint, damaged: Callable[[Provenance], str | None], /, *, resume: bool,
                 overwrite: bool, **facts: Any) -> Existing:
    """Decide about an existing output zip before anything is removed (so a refusal removes nothing).

    A zip fgdata wrote with these options (``expect`` with ``facts`` matches its provenance) is kept, or rebuilt with
    ``--no-resume`` or ``--overwrite``; one written with other options is refused naming the option, unless
    ``--no-resume`` or ``--overwrite`` (as ``fgdata shard`` does); a zip without fgdata's provenance is someone
    else's: refused unless ``--overwrite``.
    """
    prov = provenance_path(dest)
    names = tuple(p.name for p in (dest, prov) if p.exists() or p.is_symlink())
    if not (dest.exists() or dest.is_symlink()):
        return Existing(dest, remove=names, why="stale")  # a provenance file whose zip is gone
    info = Provenance.read(dest)
    if info is None:
        if not overwrite:
            raise FgdataError(f"{dest}: exists and was not written by fgdata (no {prov.name}); move it away, "
                              "or pass --overwrite to replace it")
        return Existing(dest, remove=names, why="--overwrite")
    if overwrite or not resume:
        return Existing(dest, remove=names, why="--overwrite" if overwrite else "--no-resume")
    expect.check(str(dest), info.record, **facts)
    broken = damaged(info)
    if broken is not None:
        return Existing(dest, remove=names, why=f"{dest.name} is incomplete ({broken})")
    return Existing(dest, kept=info)


def check_partial(dest: Path, state: Fingerprint, /, *, resume: bool, overwrite: bool = False,
                  **facts: Any) -> Existing:
    """An unfinished earlier run of ``dest``: resumed when its options match; other options are refused naming
    the option unless ``--no-resume`` (then it starts over, saying so)."""
    old = read_partial_state(dest)
    if old is None:
        return Existing(dest)
    if resume:
        state.check(f"{dest} (unfinished)", old.record, **facts)
        return Existing(dest)
    return Existing(dest, remove=tuple(p.name for p in partial_paths(dest)),
                    why="--overwrite" if overwrite else "--no-resume")


def clear(existing: list[Existing], notify: Notify | None) -> None:
    """Remove what :func:`check_output` and :func:`check_partial` decided, saying what goes first."""
    for e in existing:
        remove_files(str(e.dest.parent), list(e.remove), e.why, notify if e.why != "stale" else None)


@dataclass(kw_only=True)
class ZipSummary(OutputSummary):
    """What a prepare pass did to one zip: the counts every writing command reports, and the inputs it
    converted to RGB (listed in the zip's provenance)."""

    converted: tuple[Converted, ...] = ()
    resumed: int = 0  # inputs of the units an earlier run finished, kept as they were


def kept_summary(dest: Path, written: int, failures: tuple[Failure, ...],
                 converted: tuple[Converted, ...] = ()) -> ZipSummary:
    """The summary of a zip kept as an earlier run left it (the counts its provenance records)."""
    report = dest.parent / FAILURES_FILE
    return ZipSummary(path=str(dest), seen=written + len(failures), written=written, failed=len(failures),
                      failures_path=str(report) if report.is_file() else None, kept=True, converted=converted)


#: Inputs per work unit: how much work a kill can lose, and one marker file per this many inputs.
UNIT_INPUTS = 1000


def units_folder(dest: Path) -> str:
    """The markers folder of the job whose first zip is ``dest``, relative to the zip's folder."""
    return f"{STATE_DIR}/zips/{dest.name}/units"


def remove_job_folder(job_dir: Path) -> None:
    """Remove a finished zip job's markers (and parts), and ``.fgdata/zips`` when no other job of the folder is
    unfinished."""
    shutil.rmtree(job_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        job_dir.parent.rmdir()


def build_zips(job: ZipJob, run: RunSettings) -> list[ZipSummary]:
    """Write every target zip from inputs ``0..n_inputs-1``; ``work`` returns one member per target per input.

    Complete outputs of the same job are kept (validated, not merely present) and unfinished ones resumed,
    unless ``run.resume`` is False; existing outputs fgdata did not write are refused unless ``run.overwrite`` (see
    :func:`check_output`). Returns one summary per target. SIGINT/SIGTERM raise :class:`~fgdata.jobs.signals.Interrupted` with the
    inputs done; the partial zip stays for the rerun. One process writes the zips: the pass runs as rank 0 of 1.
    """
    definition = ZipPassJob(job)
    try:
        run_job(definition, replace(run, rank=0, world=1))
    finally:
        definition.close()
    return definition.summaries


@dataclass(frozen=True)
class ZipUnit:
    """Work unit ``number``: inputs ``first .. first + count - 1`` (``inputs``: their positions and names)."""

    number: int
    first: int
    count: int
    inputs: str


@dataclass
class _UnitResult:
    """What the sink gathers for the unit it is appending: its written count, failures and conversions."""

    unit: ZipUnit
    written: int = 0
    failures: list[Entry] = field(default_factory=list)
    converted: list[Entry] = field(default_factory=list)


class ZipPassJob(JobDefinition[ZipUnit]):
    """One pass over the inputs on :func:`~fgdata.jobs.driver.run_job`, appending every target zip's members in
    input order.

    ``prepare`` decides about the outputs (kept, refused, cleared: :func:`check_output`, :func:`check_partial`)
    and cuts the partial zips back to the units an earlier run finished (:func:`_resumed_units`); the engine
    then keeps those units by their markers. ``execute`` converts the other units' blocks on the pool and is the
    in-order sink: :meth:`_append` writes each block's members, :meth:`_end_unit` leaves a unit's marker once
    its last member is on disk. ``write_final`` is the one step that finishes the zips (``dataset.json``,
    provenance), writes ``failures.json`` (with ``outputs``) and removes the markers.
    """

    owns_dest = False  # the data root: other datasets' zips and the sources live there too
    relist = False

    def __init__(self, job: ZipJob):
        self.job = job
        first = job.targets[0].dest
        self.command, self.dest, self.folder = job.command, str(first.parent), units_folder(first)
        self.states = [ZipState(job.fingerprint.record(transform=t.transform, dest=t.dest.name)) for t in job.targets]
        self.options_fp = options_fingerprint({"zips": [st.record for st in self.states]})
        self.stems = [(t.stem, t.ext) for t in job.targets]
        self.kept: list[Existing] = []  # the outputs, when every one is complete already
        self.writers: list[EdmZipWriter] = []
        self.written_inputs: list[int] = []  # positions of the inputs written, in member order
        self.failures: list[Failure] = []
        self.converted: list[Converted] = []
        self.resumed = 0  # inputs of the units an earlier run finished
        self.left = job.n_inputs  # inputs of the units to convert (prepare knows which units are kept)
        self.summaries: list[ZipSummary] = []

    def fingerprint(self) -> str:
        return self.options_fp

    def prepare(self, ctx: Context) -> None:
        """Keep complete outputs, clear what must go, then open the partial zips cut back to the finished units."""
        job, run = self.job, ctx.settings
        resume = run.resume and not run.overwrite
        outputs = [check_output(t.dest, job.fingerprint, _damaged(t), resume=resume, overwrite=run.overwrite,
                                transform=t.transform) for t in job.targets]
        if all(o.kept is not None for o in outputs):
            self.kept = outputs
            return
        partials = [check_partial(t.dest, job.fingerprint, resume=resume, overwrite=run.overwrite,
                                  transform=t.transform, dest=t.dest.name) for t in job.targets]
        clear(outputs + partials, run.notify)
        first = job.targets[0].dest
        first.with_name(first.name + ".partial.log").unlink(missing_ok=True)  # fgdata 0.2's
        self.writers = [EdmZipWriter(t.dest, st) for t, st in zip(job.targets, self.states)]
        kept = _resumed_units(self.writers, self.stems, self.dest, self.folder, self.options_fp, self.unit_inputs)
        self.left = job.n_inputs - sum(m.count for m in kept)

    def unit_inputs(self, u: int) -> str:
        """The fingerprint of unit ``u``'s inputs (positions and names), which a rerun's marker must match."""
        h = hashlib.sha256()
        for j in range(u * UNIT_INPUTS, min((u + 1) * UNIT_INPUTS, self.job.n_inputs)):
            h.update(f"{j}\t{self.job.describe(j)}\n".encode("utf-8", "surrogateescape"))
        return h.hexdigest()[:32]

    def plan(self) -> Iterator[ZipUnit]:
        if self.kept:
            return
        for u, first in enumerate(range(0, self.job.n_inputs, UNIT_INPUTS)):
            yield ZipUnit(u, first, min(UNIT_INPUTS, self.job.n_inputs - first), self.unit_inputs(u))

    def keep(self, marker: Marker, ctx: Context) -> None:
        """A unit an earlier run finished: its members stay in the partial zips, its accounts count."""
        failed = {f.index for f in marker.failures}
        self.written_inputs += [j for j in range(marker.first, marker.first + marker.count) if j not in failed]
        self._account(marker.failures, marker.warnings)
        self.resumed += marker.count

    def _account(self, failures: list[Entry], converted: list[Entry]) -> None:
        self.failures += [Failure(f.input, f.reason) for f in failures]
        self.converted += [Converted(c.input, c.reason) for c in converted]

    def executor(self, settings: RunSettings) -> Executor:
        """A local pool (one process for a single block); the forkserver imports the work's module once."""
        job = self.job
        return Pool(settings.workers if self.left > job.block else 1, preload=(job.work.__module__,),
                    initializer=job.initializer, initargs=job.initargs)

    def execute(self, pending: Iterator[ZipUnit], executor: Executor, ctx: Context) -> Iterator[Marker]:
        """Convert the pending units' blocks on the pool and append them in order, unit after unit."""
        job = self.job
        spans: deque[tuple[ZipUnit, int, int]] = deque()

        def calls() -> Iterator[Block]:
            for unit in pending:
                end = unit.first + unit.count
                for a in range(unit.first, end, job.block):  # blocks never cross a unit's end
                    b = min(a + job.block, end)
                    spans.append((unit, a, b))
                    yield Block((a, b), job.rows(a, b) if job.rows else ())

        if ctx.settings.on_start:
            ctx.settings.on_start(job.n_inputs)
        current: _UnitResult | None = None
        for results in run_units(job.work, calls(), executor, None):
            unit, a, b = spans.popleft()
            if current is None:
                current = _UnitResult(unit)
                start_unit(self.dest, Plan(unit.number, unit.first, unit.count, self.options_fp, unit.inputs),
                           self.folder)
            self._append(current, a, results)
            if b == unit.first + unit.count:
                yield self._end_unit(current)
                current = None
            ctx.progress(len(results), 0)
            output_done()

    def _append(self, unit: _UnitResult, a: int, results: list[Result]) -> None:
        """Append one block's members (inputs ``a..``) to every zip, noting its failures and conversions."""
        for j, (members, note) in enumerate(results, start=a):
            if members is None:
                unit.failures.append(Entry(self.job.describe(j), str(note), j))
                continue
            if note is not None:
                unit.converted.append(Entry(self.job.describe(j), note, j))
            index = len(self.written_inputs)
            for w, (stem, ext), data in zip(self.writers, self.stems, members):
                w.add(member_name(index, stem, ext), data)
            self.written_inputs.append(j)
            unit.written += 1
        for w in self.writers:
            w.flush()  # the block's members are complete on disk before the test hook may pause here

    def _end_unit(self, result: _UnitResult) -> Marker:
        """Leave the marker of a unit whose last member is on disk."""
        unit = result.unit
        marker = Marker(unit=unit.number, first=unit.first, count=unit.count, options=self.options_fp,
                        inputs=unit.inputs, stamps=[], names=[], shards=[],  # members: checked by prepare
                        written=result.written, failures=result.failures, warnings=result.converted)
        with critical():
            storage.write_bytes(marker_path(self.dest, unit.number, self.folder), marker.to_bytes())
        self._account(result.failures, result.converted)
        return marker

    def write_final(self, ctx: Context) -> Totals:
        """The one step that finishes every zip (``dataset.json`` with the labels, provenance), then
        ``failures.json`` and the markers gone; or, when every zip was complete, their provenance's counts."""
        if self.kept:
            self.summaries = [kept_summary(o.dest, o.kept.written or 0, o.kept.failures, o.kept.converted)
                              for o in self.kept if o.kept is not None]
            return Totals()
        job, n_inputs, written = self.job, self.job.n_inputs, len(self.written_inputs)
        failure_docs = [f.to_json() for f in self.failures]
        report = job.targets[0].dest.parent / FAILURES_FILE
        for t, w in zip(job.targets, self.writers):
            labels: list[list[str | int | None]] | None = [
                [member_name(k, t.stem, t.ext), t.labels[j]] for k, j in enumerate(self.written_inputs)]
            if labels is not None and any(label is None for _, label in labels):
                labels = None
            info = {**job.fingerprint.record(transform=t.transform), **t.extra, "inputs": n_inputs,
                    "written": written, "failed": len(self.failures), "failures": failure_docs,
                    "converted_modes": [c.to_json() for c in self.converted]}
            w.finish(dataset_json_bytes(labels), info)
            self.summaries.append(ZipSummary(path=str(t.dest), seen=n_inputs, written=written,
                                             failed=len(self.failures), failures_path=str(report),
                                             seconds=ctx.seconds, converted=tuple(self.converted),
                                             resumed=self.resumed))
        write_failures(str(report), job.command, n_inputs, written, failure_docs,
                       Outputs([t.dest.name for t in job.targets]))
        remove_job_folder(Path(self.dest, self.folder).parent)
        return Totals(inputs=n_inputs, written=written, failed=len(self.failures))

    def close(self) -> None:
        for w in self.writers:
            w.close()


def _resumed_units(writers: list[EdmZipWriter], stems: list[tuple[str, str]], folder: str, units: str,
                   options_fp: str, unit_inputs: Callable[[int], str]) -> list[Marker]:
    """The units an earlier run finished, as far as the partial zips hold them: the markers of units ``0..k-1``
    that match the options and inputs and whose members are all complete on disk. The partial zips are cut
    back to those members, and every later marker or plan goes (its unit is written again)."""
    valid = min(w.keep_valid_prefix(_namer(s)) for w, s in zip(writers, stems))
    earlier = existing_markers(folder, units) if valid else set()
    kept: list[Marker] = []
    members = 0
    while len(kept) in earlier:
        marker = read_marker(folder, len(kept), units)
        if (marker is None or marker.options != options_fp or marker.inputs != unit_inputs(marker.unit)
                or marker.shards or members + marker.written > valid):  # shards: an fgdata 0.3 marker
            break
        kept.append(marker)
        members += marker.written
    for w, s in zip(writers, stems):
        w.keep_valid_prefix(_namer(s), limit=members)
    stale = [u for u in existing_markers(folder, units) if u >= len(kept)]
    remove_files(str(Path(folder, units)), ["%06d.json" % u for u in sorted(stale)], "unfinished units", None)
    return kept


def _damaged(target: ZipTarget) -> Callable[[Provenance], str | None]:
    """Why a zip whose provenance matches is not the complete output it describes (None: it is)."""
    return lambda info: validate_zip(target.dest, -1 if info.written is None else info.written, target.stem,
                                     target.ext)
