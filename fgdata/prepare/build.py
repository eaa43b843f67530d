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
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fgdata.jobs import testhook
from fgdata.jobs.dest import claimed
from fgdata.jobs.local import ordered_map
from fgdata.jobs.report import FAILURES_FILE, write_failures
from fgdata.jobs.signals import Interrupted, stop_on_signals
from fgdata.prepare.zipwriter import (EdmZipWriter, dataset_json_bytes, member_name, open_nofollow, provenance_path,
                                      validate_zip)

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


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def _read_log(path: Path) -> dict[int, dict]:
    entries: dict[int, dict] = {}
    if path.exists():
        with open_nofollow(path, "r") as fh:
            text = fh.read()
        for line in text.splitlines():
            try:
                item = json.loads(line)
                entries[int(item["i"])] = item
            except (ValueError, KeyError, TypeError):
                break  # a torn last line
    return entries


@dataclass(frozen=True)
class ZipJob:
    """One prepare pass: the zips it writes, its inputs and the work function (a module-level function)."""

    command: str
    targets: list[ZipTarget]
    n_inputs: int
    work: Work
    fingerprint: dict
    describe: Callable[[int], str]
    block: int = 64
    phase: str = "convert"
    initializer: Callable[..., None] | None = None
    initargs: tuple = ()


def build_zips(job: ZipJob, *, workers: int, force: bool = False, progress: ProgressFn | None = None) -> list[dict]:
    """Write every target zip from inputs ``0..n_inputs-1``; ``work`` returns one member per target per input.

    Complete outputs are kept unless ``force`` (validated, not merely present). Returns one summary per
    target: path, images written, failures, converted inputs and whether it was skipped. SIGINT/SIGTERM
    raise :class:`~fgdata.jobs.signals.Interrupted` with the inputs done; the partial zip stays for the rerun.
    """
    folder = job.targets[0].dest.parent
    folder.mkdir(parents=True, exist_ok=True)
    with stop_on_signals(), claimed(str(folder)):
        return _build(job, workers, force, progress)


def _build(job: ZipJob, workers: int, force: bool, progress: ProgressFn | None) -> list[dict]:
    targets, n_inputs, fingerprint = job.targets, job.n_inputs, job.fingerprint
    if not force and all(_is_complete(t, fingerprint) for t in targets):
        return [{**_read_provenance(t.dest), "path": str(t.dest), "skipped": True} for t in targets]
    writers = [EdmZipWriter(t.dest, {**fingerprint, "transform": t.transform, "dest": t.dest.name}, resume=not force)
               for t in targets]
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
            if "failed" not in log.get(pos, {}):
                written_inputs.append(pos)
            pos += 1
        kept = len(written_inputs)
        for w, s in zip(writers, stems):
            w.keep_valid_prefix(_namer(s), limit=kept)
        start = pos
        log = {i: e for i, e in log.items() if i < start}
        with open_nofollow(log_path, "w") as fh:
            fh.writelines(json.dumps(e) + "\n" for e in log.values())
        ranges = [(a, min(a + job.block, n_inputs)) for a in range(start, n_inputs, job.block)]
        began, done = time.monotonic(), start
        phase = job.phase
        if progress:
            progress(phase, done, n_inputs)
        blocks = 0
        with open_nofollow(log_path, "a") as logfh:
            results_in_order = ordered_map(job.work, ranges, workers if len(ranges) > 1 else 1,
                                           initializer=job.initializer, initargs=job.initargs)
            for (a, _b), results in zip(ranges, results_in_order):
                for j, (members, note) in enumerate(results, start=a):
                    if members is None or note is not None:
                        entry = {"i": j, "input": job.describe(j), ("failed" if members is None else "mode"): note}
                        log[j] = entry
                        logfh.write(json.dumps(entry) + "\n")
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
                blocks += 1
                testhook.output_done(blocks)
        seconds = time.monotonic() - began
        failures = [{"input": e["input"], "reason": e["failed"]} for e in log.values() if "failed" in e]
        converted = [{"input": e["input"], "mode": e["mode"]} for e in log.values() if "mode" in e]
        summaries = []
        for t, w in zip(targets, writers):
            labels: list[list[str | int | None]] | None = [
                [member_name(k, t.stem, t.ext), t.labels[j]] for k, j in enumerate(written_inputs)]
            if labels is not None and any(label is None for _, label in labels):
                labels = None
            info = {**fingerprint, "transform": t.transform, **t.extra, "inputs": n_inputs,
                    "written": len(written_inputs), "failed": len(failures), "failures": failures,
                    "converted_modes": converted}
            w.finish(dataset_json_bytes(labels), info)
            summaries.append({**info, "path": str(t.dest), "skipped": False, "seconds": seconds})
        write_failures(str(targets[0].dest.parent / FAILURES_FILE), job.command, n_inputs, len(written_inputs),
                       failures, {"outputs": [t.dest.name for t in targets]})
        log_path.unlink(missing_ok=True)
        return summaries
    except Interrupted as stop:
        stop.done = done
        raise
    finally:
        for w in writers:
            w.close()


def _is_complete(target: ZipTarget, fingerprint: dict) -> bool:
    """A valid zip made from the same inputs and options; without provenance it must hold every input."""
    info = _read_provenance(target.dest)
    if info and any(info.get(k) != v for k, v in fingerprint.items()):
        return False
    count = int(info.get("written", len(target.labels)))
    return validate_zip(target.dest, count, target.stem, target.ext) is None


def _read_provenance(dest: Path) -> dict:
    try:
        return json.loads(provenance_path(dest).read_text())
    except (OSError, ValueError):
        return {}
