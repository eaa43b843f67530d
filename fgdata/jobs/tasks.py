"""Shard-to-shard jobs (``encode latents|text``, ``kd pairs|paths``): one output shard per task, rank-owned.

Task model: task i (one input shard, or one chunk of a prompt file) makes one output shard that keeps
the input shard's name, and belongs to rank ``i mod world`` (:mod:`fgdata.jobs.ranks`): no two ranks
ever write the same file, and any world size gives the same samples. Ranks meet through files only:
each finished shard leaves a marker ``DST/.fgdata/<command>/<shard>.json`` holding the options record;
a rerun skips the shards whose marker matches and refuses, naming the option, those written with other
options. The finishing rank (rank 0, or the Ray driver) waits for every marker, with a timeout that
names the missing shards and their ranks, then writes ``shard_count.json``, ``provenance.json`` and
the one ``failures.json``. With ``--no-resume`` under torchrun the markers carry the launch id and only
this launch's count (:func:`fgdata.jobs.ranks.run_launch`).

Each shard is built by :class:`fgdata.shards.ShardWriter` in a private work folder, then renamed (or
uploaded) onto its final name, so a killed job never leaves a partial shard under a real name.

**In place** (the output folder is the input folder): a sample the producer cannot process keeps every
member it had. It is written back unchanged and reported as *not updated* (a failure with
``"kept": true``); a damaged input shard is left exactly as it was. Nothing is ever removed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from fgdata import __version__, storage
from fgdata.errors import FgdataError, OptionError
from fgdata.jobs import dest as destmod
from fgdata.jobs import testhook
from fgdata.jobs.options import check_same, fingerprint, byte_options
from fgdata.jobs.ranks import dist_env, owned, owner, run_launch, this_launch, wait_for
from fgdata.jobs.report import FAILURES_FILE, clean_reason, write_failures
from fgdata.jobs.signals import Interrupted, critical, stop_on_signals
from fgdata.shards import COUNT_FILE, ShardScan, ShardWriter, load_index, write_index, write_shard_counts

STATE_DIR = destmod.STATE_DIR
PROVENANCE_FILE = "provenance.json"
PROVENANCE_FORMAT = "fgdata.encode-provenance"
MAX_SAMPLES_PER_SHARD = 2**31 - 1  # one output shard per task, whatever its size


@dataclass(frozen=True)
class Task:
    """One output shard: its name, the input shard it comes from (or None), or inline items (prompt files)."""

    name: str
    source: str | None = None
    items: tuple[tuple[str, str], ...] = ()


@dataclass
class Result:
    """What a producer says about one input: members to write, or why it failed (``original``: its members)."""

    pos: int
    key: str
    members: dict[str, bytes] | None
    reason: str = ""
    original: dict[str, bytes] | None = None


@dataclass(frozen=True)
class RunSettings:
    """How a job runs (never part of its fingerprint): rank, resume, callbacks."""

    rank: int | None = None
    world: int | None = None
    role: str = "all"  # all | prepare | work | finalize
    resume: bool = True
    overwrite: bool = False
    wait_timeout: float | None = None
    progress: Callable[[int], None] | None = None
    log: Callable[[str], None] | None = None
    notify: Callable[[str], None] | None = None


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


@dataclass
class JobSummary:
    dest: str
    command: str
    rank: int
    world: int
    shards_done: int = 0
    shards_skipped: int = 0
    written: int = 0
    failed: int = 0
    not_updated: int = 0
    seconds: float = 0.0
    finalized: bool = False
    failures_path: str | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.written / self.seconds if self.seconds > 0 else 0.0


def _marker(dest: str, command: str, name: str) -> str:
    return storage.join(dest, STATE_DIR, _key(command), name + ".json")


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(storage.read_bytes(path))
        return doc if isinstance(doc, dict) else None
    except Exception:  # noqa: BLE001 - a missing or torn marker means "not done"
        return None


def _work_dir(dest: str, name: str, rank: int) -> str:
    root = storage.staging_dir(dest)  # dest itself where renames are atomic, else a local folder
    path = os.path.join(root, STATE_DIR, "work", f"{name}.rank{rank}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def _write_task(job: TaskJob, task: Task, results: Iterable[Result], rank: int, record: dict[str, Any]) -> dict:
    """Build one output shard from ``results`` and move it into place; return its marker."""
    work = _work_dir(job.dest, task.name, rank)
    final = storage.join(job.dest, task.name)
    failures: list[dict[str, Any]] = []
    written = kept = 0
    untouched = False
    writer = ShardWriter(work, maxcount=MAX_SAMPLES_PER_SHARD)
    try:
        for r in results:
            if r.members is not None:
                writer.write(r.key, r.members)
                written += 1
                continue
            entry: dict[str, Any] = {"input": f"{task.source or task.name}#{r.key}", "reason": clean_reason(r.reason)}
            if job.in_place and r.original is not None:
                writer.write(r.key, r.original)  # kept as it was: not updated, never removed
                entry["kept"] = True
                kept += 1
            elif job.in_place:
                untouched = True  # a damaged input shard: replacing it would drop what cannot be read
            failures.append(entry)
    except BaseException:
        writer.abort()
        shutil.rmtree(work, ignore_errors=True)
        raise
    if untouched:
        writer.abort()
        shutil.rmtree(work, ignore_errors=True)
        failures = [{"input": task.source or task.name, "kept": True,
                     "reason": "damaged shard: left unchanged; " + "; ".join(f["reason"] for f in failures[-1:])}]
        scan = load_index(final)
        return {"shard": task.name, "source": task.source, "samples": len(scan.samples) if scan else 0,
                "written": 0, "failures": failures, **record}
    summary = writer.close()
    scan = staged = None
    if summary.samples:
        built = summary.shards[0]
        scan = load_index(built)
        if scan is None:
            raise FgdataError(f"{built}: the shard writer left no index")
        staged = storage.stage(built, final)  # a stop may land during this upload, not during the move below
    with critical():
        if scan is not None and staged is not None:
            # The index first: a shard never sits under its final name without one (other ranks would
            # take it for a file fgdata did not write); a stale index is told apart by its size.
            write_index(ShardScan(shard=final, size=scan.size, samples=scan.samples), final, record)
            storage.publish(staged, final)
        elif not job.in_place:
            storage.remove(final)
            storage.remove(final + ".idx.json")
    shutil.rmtree(work, ignore_errors=True)
    return {"shard": task.name, "source": task.source, "samples": summary.samples, "written": written,
            "failures": failures, **record}


def write_provenance(dest: str, command: str, record: dict[str, Any], base: str | None = None) -> str:
    """Merge this command's record into ``DST/provenance.json`` (one entry per command, plus ``base``'s)."""
    path = storage.join(dest, PROVENANCE_FILE)
    doc: dict[str, Any] = {"format": PROVENANCE_FORMAT, "version": 1, "jobs": {}}
    for source in ([storage.join(base, PROVENANCE_FILE)] if base else []) + [path]:
        if storage.exists(source):
            try:
                old = json.loads(storage.read_bytes(source))
                doc["jobs"].update(old.get("jobs", {}))
            except ValueError:
                pass
    doc["jobs"][command] = record
    storage.write_bytes(path, (json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n").encode())
    return path


def _key(command: str) -> str:
    """The name of a command's markers folder and provenance entry: ``latents``, ``text``, ``kd-pairs``."""
    return command.removeprefix("encode ").replace(" ", "-")


def _inputs_kept(job: TaskJob) -> list[str]:
    """Files in DST that are not foreign though fgdata did not write them: an in-place job's inputs."""
    return [t.name for t in job.tasks] if job.in_place else []


def _prepare_dest(job: TaskJob, run: RunSettings, rank: int, world: int) -> None:
    """Refuse foreign files (every rank checks: outputs appear with their index first, so no rank takes another's
    output for a foreign file); ``--no-resume`` drops this rank's earlier markers (every rank's for the "prepare"
    role, which a driver runs before it starts the ranks), saying so. ``--overwrite`` removes the foreign files and
    (rank 0) fgdata's earlier outputs that no task of this job writes again, then redoes every task."""
    if run.role == "finalize":
        return
    destmod.check_foreign(job.dest, keep=_inputs_kept(job), overwrite=run.overwrite and rank == 0, notify=run.notify)
    if run.overwrite and rank == 0 and not job.in_place:
        rewritten = ({t.name for t in job.tasks} | {t.name + destmod.INDEX_SUFFIX for t in job.tasks}
                     | {COUNT_FILE, FAILURES_FILE, PROVENANCE_FILE})  # written again by this job
        destmod.remove_files(job.dest, destmod.own_outputs(job.dest, keep=rewritten), "--overwrite", run.notify)
    if not run.resume:
        testhook.hold("no-resume", rank)
        mine = job.tasks if run.role == "prepare" else owned(job.tasks, rank, world)
        if run.notify:
            flag = "--overwrite" if run.overwrite else "--no-resume"
            run.notify(f"{flag}: redoing {len(mine)} output shard(s) in {job.dest} from scratch")
        for task in mine:
            storage.remove(_marker(job.dest, job.command, task.name))


def run_tasks(job: TaskJob, run: RunSettings | None = None) -> JobSummary:
    """Run this rank's share of ``job.tasks`` (role "all" or "work"), then finalize on rank 0 ("all" or "finalize");
    role "prepare" only checks and clears DST (``--overwrite``, ``--no-resume``) for ranks started after it.

    ``produce(task)`` yields one :class:`Result` per input. ``provenance()`` is called after the work, so it
    can report the loaded model. SIGINT/SIGTERM raise :class:`Interrupted` with the inputs done so far.
    """
    run = run or RunSettings()
    if run.overwrite:  # a fresh run: fgdata's earlier outputs go, whatever options made them
        run = replace(run, resume=False)
    env_rank, env_world = dist_env()
    rank = env_rank if run.rank is None else run.rank
    world = env_world if run.world is None else run.world
    if not job.tasks:
        raise FgdataError(f"nothing to do for {job.dest}: no input shards or prompts")
    names = [t.name for t in job.tasks]
    if len(set(names)) != len(names):
        raise FgdataError(f"{job.dest}: two inputs map to the same output shard name")
    storage.make_dirs(job.dest)
    opts = byte_options(job.options)
    record = {"command": job.command, "fingerprint": fingerprint(opts), "options": opts, "fgdata": __version__}
    summary = JobSummary(dest=job.dest, command=job.command, rank=rank, world=world)
    launch = run_launch(run.resume, run.wait_timeout)  # None outside torchrun (a Ray driver clears DST first)
    refuse = None
    if run.role != "finalize" and not (run.overwrite and rank == 0):  # a refused DST is left as it was found
        refuse = partial(destmod.check_foreign, job.dest, _inputs_kept(job))
    with stop_on_signals(), destmod.claimed(job.dest, destmod.rank_lock(rank), refuse):
        before = destmod.shard_versions(job.dest) if run.role == "all" and rank == 0 else None
        _prepare_dest(job, run, rank, world)
        if run.role == "prepare":
            return summary
        try:
            info = _work(job, run, rank, world, record, launch, summary) if run.role in ("all", "work") else None
        except Interrupted as stop:
            stop.done = summary.written + summary.failed
            raise
        if run.role == "finalize" or (run.role == "all" and rank == 0):
            info = info or _rank_record(job, record, launch, world) or (job.provenance() if job.provenance else {})
            _finalize(job, run, world, record, launch, info, summary)
        if before is not None:
            destmod.drop_stale_indexes(job.dest, before, run.notify)
    return summary


def _work(job: TaskJob, run: RunSettings, rank: int, world: int, record: dict[str, Any], launch: str | None,
          summary: JobSummary) -> dict[str, Any] | None:
    say = run.log or (lambda _msg: None)
    start = time.perf_counter()
    for task in owned(job.tasks, rank, world):
        marker_path = _marker(job.dest, job.command, task.name)
        marker = _read_json(marker_path) if run.resume else None
        if marker is not None and marker.get("fingerprint") != record["fingerprint"]:
            check_same(storage.join(job.dest, task.name), marker.get("options") or {}, record["options"])
        if marker is not None and (marker["samples"] == 0 or storage.exists(storage.join(job.dest, task.name))):
            summary.shards_skipped += 1
            if run.progress:
                run.progress(marker.get("written", marker["samples"]) + len(marker["failures"]))
            continue
        t0 = time.perf_counter()

        def counted(results: Iterable[Result]) -> Iterator[Result]:
            for r in results:
                yield r
                if run.progress:
                    run.progress(1)

        marker = _write_task(job, task, counted(job.produce(task)), rank, record)
        storage.write_bytes(marker_path, json.dumps({**marker, "launch": launch}, sort_keys=True).encode())
        dt = time.perf_counter() - t0
        summary.shards_done += 1
        summary.written += marker["written"]
        summary.failed += len(marker["failures"])
        say(f"rank {rank}: {task.name}: {marker['written']} written, {len(marker['failures'])} failed, "
            f"{marker['written'] / dt if dt > 0 else 0:.1f} samples/s")
        testhook.output_done(summary.shards_done)
    summary.seconds = time.perf_counter() - start
    if job.provenance is None or not summary.shards_done:
        return None
    info = job.provenance()
    # Each rank records what it loaded, so the finalizer need not load the model again.
    info_path = storage.join(job.dest, STATE_DIR, _key(job.command), f"model-info.rank{rank}.json")
    storage.write_bytes(info_path, json.dumps({"fingerprint": record["fingerprint"], "launch": launch, "record": info},
                                              default=str).encode())
    return info


def _rank_record(job: TaskJob, record: dict[str, Any], launch: str | None, world: int) -> dict[str, Any] | None:
    for r in range(world):
        doc = _read_json(storage.join(job.dest, STATE_DIR, _key(job.command), f"model-info.rank{r}.json"))
        if doc and doc.get("fingerprint") == record["fingerprint"] and this_launch(doc, launch):
            return doc["record"]
    return None


def _finalize(job: TaskJob, run: RunSettings, world: int, record: dict[str, Any], launch: str | None,
              info: dict[str, Any], summary: JobSummary) -> None:
    """Wait for every shard's marker (of this launch, under ``--no-resume``), then write the side files
    (rank 0 only: nobody else writes them)."""
    markers: dict[str, dict[str, Any]] = {}

    def missing() -> list[str]:
        for task in job.tasks:
            if task.name not in markers:
                m = _read_json(_marker(job.dest, job.command, task.name))
                if m is not None and m.get("fingerprint") == record["fingerprint"] and this_launch(m, launch):
                    markers[task.name] = m
        return [f"{t.name} (rank {owner(i, world)})" for i, t in enumerate(job.tasks) if t.name not in markers]

    wait_for(missing, f"{job.dest}: output shards of other ranks", run.wait_timeout, log=run.log)
    counts = {name: m["samples"] for name, m in markers.items() if m["samples"]}
    write_shard_counts(storage.join(job.dest, COUNT_FILE), counts)
    failures = [f for t in job.tasks for f in markers[t.name]["failures"]]
    written = sum(m.get("written", m["samples"]) for m in markers.values())
    not_updated = sum(1 for f in failures if f.get("kept"))
    path = storage.join(job.dest, FAILURES_FILE)
    extra = {"not_updated": not_updated} if job.in_place else {}
    write_failures(path, job.command, written + len(failures), written, failures, extra)
    prov = {**info, "command": job.command, "options": record["options"], "fingerprint": record["fingerprint"],
            "fgdata": __version__, "shards": len(counts), "samples": sum(counts.values()), "written": written,
            "failed": len(failures), **({"not_updated": not_updated} if job.in_place else {})}
    write_provenance(job.dest, _key(job.command), prov, job.base)
    summary.finalized = True
    summary.failures_path = path
    summary.failures = failures
    summary.written, summary.failed, summary.not_updated = written, len(failures), not_updated


def run_on_ray(fn: Callable[..., JobSummary], args: dict[str, Any], run: RunSettings, workers: int,
               num_gpus: float = 0.0, address: str | None = None) -> JobSummary:
    """``--engine ray``: ``workers`` Ray tasks act as ranks 0..workers-1 (same ownership rule as torchrun),
    then this process finalizes. ``fn(**args, run=...)`` is the command's library function."""
    from fgdata.jobs.ray_executor import run_units

    if workers < 1:
        raise OptionError("--workers must be at least 1")
    # DST is checked and cleared here, where what goes can be said; the ranks then continue from a clean DST.
    fn(**args, run=replace(run, rank=0, world=workers, role="prepare"))
    work = replace(run, world=workers, role="work", resume=True, overwrite=False, progress=None, log=None,
                   notify=None)
    done = run_units(fn, [{"run": replace(work, rank=r)} for r in range(workers)], address=address,
                     num_gpus=num_gpus, shared=args)
    summary = fn(**args, run=replace(run, rank=0, world=workers, role="finalize"))
    summary.shards_done = sum(d.shards_done for d in done)
    summary.shards_skipped = sum(d.shards_skipped for d in done)
    summary.seconds = max((d.seconds for d in done), default=0.0)
    return summary


def shard_tasks(src: str) -> list[Task]:
    """One task per input shard; the output shard keeps its name."""
    from fgdata.shards import discover_shards

    shards = discover_shards(src)
    if not shards:
        raise FgdataError(f"{src}: no .tar shards found")
    return [Task(storage.basename(p), p) for p in shards]


def same_place(a: str | None, b: str) -> bool:
    """Whether two folders or prefixes are the same place (an in-place update)."""
    if a is None:
        return False
    if storage.is_url(a) or storage.is_url(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)
