"""Preparing dataset zips on the job core: decode and transform inputs in a process pool, write EDM zips in order.

Task model: one block of input positions per task (the zip member range it adds). Workers receive ranges
instead of data and return PNG bytes in order. A side log records, per input position, conversions and
failures; with it a killed run resumes at the exact input after the last complete member and reports every
input as written or failed. The job holds the lock of the zip's folder, runs under the signal handling of
:mod:`fgdata.jobs.signals` (a stop keeps the partial zip for the rerun) and writes the one failure report,
``failures.json``, beside the zip.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fgdata.errors import FgdataError
from fgdata.jobs.dest import Notify, claimed, remove_files
from fgdata.jobs.local import ordered_map
from fgdata.jobs.outputs import output_done
from fgdata.jobs.report import FAILURES_FILE, write_failures
from fgdata.jobs.summary import OutputSummary
from fgdata.jobs.signals import Interrupted, stop_on_signals
from fgdata.prepare.options import Fingerprint
from fgdata.jobs.report import Failure
from fgdata.prepare.zipwriter import (Converted, EdmZipWriter, Provenance, ZipState, dataset_json_bytes,
                                      member_name, open_nofollow, provenance_path, partial_paths, read_partial_state,
                                      validate_zip)
from fgdata.workers import default_workers

#: One input's outcome: a member per target (None when it failed) and a note (source mode or failure reason).
Result = tuple[list[bytes] | None, str | None]
Work = Callable[[tuple[int, int]], list[Result]]
#: progress(phase, done, total) - rendered by the CLI, ignored by library callers that pass None.
ProgressFn = Callable[[str, int, int], None]


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
class LogEntry:
    """One line of the side log ``<zip>.partial.log``: input ``i`` failed (``failed``: why) or was converted
    (``mode``: its source mode)."""

    i: int
    input: str
    failed: str | None = None
    mode: str | None = None

    def to_line(self) -> str:
        note = {"failed": self.failed} if self.failed is not None else {"mode": self.mode}
        return json.dumps({"i": self.i, "input": self.input, **note}) + "\n"

    @classmethod
    def parse(cls, line: str) -> LogEntry | None:
        """The entry on ``line``; None when it is torn or foreign."""
        try:
            doc = json.loads(line)
            failed, mode = doc.get("failed"), doc.get("mode")
            if (failed is None) == (mode is None):
                return None
            return cls(int(doc["i"]), str(doc["input"]), None if failed is None else str(failed),
                       None if mode is None else str(mode))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def _read_log(path: Path) -> dict[int, LogEntry]:
    """The log's entries by input position, up to its first torn line (the last one of a killed run)."""
    entries: dict[int, LogEntry] = {}
    if path.exists():
        with open_nofollow(path, "r") as fh:
            text = fh.read()
        for line in text.splitlines():
            entry = LogEntry.parse(line)
            if entry is None:
                break
            entries[entry.i] = entry
    return entries


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
    phase: str = "convert"
    initializer: Callable[..., None] | None = None
    initargs: tuple = ()


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


def kept_summary(dest: Path, written: int, failures: tuple[Failure, ...],
                 converted: tuple[Converted, ...] = ()) -> ZipSummary:
    """The summary of a zip kept as an earlier run left it (the counts its provenance records)."""
    report = dest.parent / FAILURES_FILE
    return ZipSummary(path=str(dest), seen=written + len(failures), written=written, failed=len(failures),
                      failures_path=str(report) if report.is_file() else None, kept=True, converted=converted)


@dataclass(frozen=True)
class ZipRun:
    """How a prepare job runs, never part of its fingerprint: processes (None: every core the process may use),
    resume, overwrite and the callbacks for progress and for notes (files removed, waits for other ranks)."""

    workers: int | None = None
    resume: bool = True
    overwrite: bool = False
    progress: ProgressFn | None = None
    notify: Notify | None = None


def build_zips(job: ZipJob, run: ZipRun) -> list[ZipSummary]:
    """Write every target zip from inputs ``0..n_inputs-1``; ``work`` returns one member per target per input.

    Complete outputs of the same job are kept (validated, not merely present) and unfinished ones resumed,
    unless ``run.resume`` is False; existing outputs fgdata did not write are refused unless ``run.overwrite`` (see
    :func:`check_output`). Returns one summary per target. SIGINT/SIGTERM raise :class:`~fgdata.jobs.signals.Interrupted` with the
    inputs done; the partial zip stays for the rerun.
    """
    folder = job.targets[0].dest.parent
    folder.mkdir(parents=True, exist_ok=True)
    with stop_on_signals(), claimed(str(folder)):
        return _build(job, run)


def _build(job: ZipJob, run: ZipRun) -> list[ZipSummary]:
    targets, n_inputs, fingerprint = job.targets, job.n_inputs, job.fingerprint
    resume, progress = run.resume and not run.overwrite, run.progress
    states = [ZipState(fingerprint.record(transform=t.transform, dest=t.dest.name)) for t in targets]
    outputs = [check_output(t.dest, fingerprint, _damaged(t), resume=resume, overwrite=run.overwrite,
                            transform=t.transform) for t in targets]
    if all(o.kept is not None for o in outputs):
        return [kept_summary(o.dest, o.kept.written or 0, o.kept.failures, o.kept.converted) for o in outputs
                if o.kept is not None]
    partials = [check_partial(t.dest, fingerprint, resume=resume, overwrite=run.overwrite, transform=t.transform,
                              dest=t.dest.name)
                for t in targets]
    clear(outputs + partials, run.notify)
    writers = [EdmZipWriter(t.dest, st) for t, st in zip(targets, states)]
    log_path = targets[0].dest.with_name(targets[0].dest.name + ".partial.log")
    done = 0
    try:
        stems = [(t.stem, t.ext) for t in targets]
        log = _read_log(log_path) if all(w.count for w in writers) else {}
        # Walk inputs to map each writer's member count back to an input position.
        kept = min(w.keep_valid_prefix(_namer(s)) for w, s in zip(writers, stems))
        written_inputs: list[int] = []
        pos = 0
        while len(written_inputs) < kept and pos < n_inputs:
            entry = log.get(pos)
            if entry is None or entry.failed is None:
                written_inputs.append(pos)
            pos += 1
        kept = len(written_inputs)
        for w, s in zip(writers, stems):
            w.keep_valid_prefix(_namer(s), limit=kept)
        start = pos
        log = {i: e for i, e in log.items() if i < start}
        with open_nofollow(log_path, "w") as fh:
            fh.writelines(e.to_line() for e in log.values())
        ranges = [(a, min(a + job.block, n_inputs)) for a in range(start, n_inputs, job.block)]
        began, done = time.monotonic(), start
        phase = job.phase
        if progress:
            progress(phase, done, n_inputs)
        with open_nofollow(log_path, "a") as logfh:
            results_in_order = ordered_map(job.work, ranges, (run.workers or default_workers()) if len(ranges) > 1 else 1,
                                           initializer=job.initializer, initargs=job.initargs)
            for (a, _b), results in zip(ranges, results_in_order):
                for j, (members, note) in enumerate(results, start=a):
                    if members is None or note is not None:
                        entry = (LogEntry(j, job.describe(j), failed=str(note)) if members is None
                                 else LogEntry(j, job.describe(j), mode=note))
                        log[j] = entry
                        logfh.write(entry.to_line())
                        logfh.flush()
                    if members is None:
                        continue
                    index = len(written_inputs)
                    for w, (stem, ext), data in zip(writers, stems, members):
                        w.add(member_name(index, stem, ext), data)
                    written_inputs.append(j)
                done += len(results)
                for w in writers:
                    w.flush()  # the block's members are complete on disk before the test hook may pause here
                if progress:
                    progress(phase, done, n_inputs)
                output_done()
        seconds = time.monotonic() - began
        failures = [Failure(e.input, e.failed).to_json() for e in log.values() if e.failed is not None]
        converted = tuple(Converted(e.input, e.mode) for e in log.values() if e.mode is not None)
        summaries = []
        report = targets[0].dest.parent / FAILURES_FILE
        for t, w in zip(targets, writers):
            labels: list[list[str | int | None]] | None = [
                [member_name(k, t.stem, t.ext), t.labels[j]] for k, j in enumerate(written_inputs)]
            if labels is not None and any(label is None for _, label in labels):
                labels = None
            info = {**fingerprint.record(transform=t.transform), **t.extra, "inputs": n_inputs,
                    "written": len(written_inputs), "failed": len(failures), "failures": failures,
                    "converted_modes": [c.to_json() for c in converted]}
            w.finish(dataset_json_bytes(labels), info)
            summaries.append(ZipSummary(path=str(t.dest), seen=n_inputs, written=len(written_inputs),
                                        failed=len(failures), failures_path=str(report), seconds=seconds,
                                        converted=converted))
        write_failures(str(report), job.command, n_inputs, len(written_inputs), failures,
                       {"outputs": [t.dest.name for t in targets]})
        log_path.unlink(missing_ok=True)
        return summaries
    except Interrupted as stop:
        stop.done = done
        raise
    finally:
        for w in writers:
            w.close()


def _damaged(target: ZipTarget) -> Callable[[Provenance], str | None]:
    """Why a zip whose provenance matches is not the complete output it describes (None: it is)."""
    return lambda info: validate_zip(target.dest, -1 if info.written is None else info.written, target.stem,
                                     target.ext)
