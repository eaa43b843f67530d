"""The shard job every ``encode``/``kd`` command runs: rank-owned output shards, resume, provenance.

Work is split by **output shard**: task i (one input shard, or one chunk of a prompt file) belongs to rank
``i mod world``, and its output shard keeps the input shard's name. So no two ranks ever write the same file
(fast-DiT#14), and any world size gives the same set of samples. Ranks coordinate through files only, with no
process group: each finished shard leaves a marker ``DST/.fgdata/<command>/<shard>.json``; a rerun skips the
shards whose marker matches the job's fingerprint (resume per output shard). Rank 0 (or the Ray driver) waits
for every marker, then writes ``shard_count.json``, ``provenance.json`` and ``failures-<command>.json``.

Each shard is built with :class:`fgdata.shards.ShardWriter` in a private work folder, then renamed (or
uploaded) onto its final name, so a killed job never leaves a partial shard under a real name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fgdata import __version__, storage
from fgdata.errors import FgdataError
from fgdata.shards import COUNT_FILE, ShardScan, ShardWriter, load_index, write_index, write_shard_counts

STATE_DIR = ".fgdata"
PROVENANCE_FILE = "provenance.json"
PROVENANCE_FORMAT = "fgdata.encode-provenance"
MAX_SAMPLES_PER_SHARD = 2**31 - 1  # one output shard per task, whatever its size

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Task:
    """One output shard: its name, the input shard it comes from (or None), or inline items (prompt files)."""

    name: str
    source: str | None = None
    items: tuple[tuple[str, str], ...] = ()


@dataclass
class Result:
    """What a producer says about one input: members to write, or the reason it failed."""

    pos: int
    key: str
    members: dict[str, bytes] | None
    reason: str = ""


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
    seconds: float = 0.0
    finalized: bool = False
    failures_path: str | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.written / self.seconds if self.seconds > 0 else 0.0


def dist_env() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) otherwise."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def owned(tasks: list[Task], rank: int, world: int) -> list[Task]:
    """Task i belongs to rank ``i mod world`` (round-robin balances shards of different sizes)."""
    if not 0 <= rank < world:
        raise FgdataError(f"rank {rank} is outside world size {world}")
    return [t for i, t in enumerate(tasks) if i % world == rank]


def sample_seed(seed: int, key: str) -> int:
    """A per-sample seed from the global seed and the sample key: any subset regenerates identically."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def fingerprint(options: dict[str, Any]) -> str:
    """A short hash of everything that changes the output bytes."""
    return hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()[:16]


def prefetch_map(fn: Callable[[T], R], items: Iterable[T], workers: int, ahead: int) -> Iterator[tuple[T, R | BaseException]]:
    """``(item, fn(item) or its exception)`` in order, with up to ``ahead`` items decoding on threads.

    Decoders (Pillow, PyAV) release the GIL, so the CPU decodes the next batch while the model runs.
    """

    def call(item: T) -> R | BaseException:
        try:
            return fn(item)
        except Exception as exc:  # noqa: BLE001 - the caller turns it into a per-sample failure
            return exc

    if workers <= 0:
        for item in items:
            yield item, call(item)
        return
    pending: list[tuple[T, Future]] = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fgdata-decode") as pool:
        for item in items:
            pending.append((item, pool.submit(call, item)))
            if len(pending) > ahead:
                first, fut = pending.pop(0)
                yield first, fut.result()
        for item, fut in pending:
            yield item, fut.result()


def batches(items: Iterable[T], size: int) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def batched_results(items: Iterable[Result | T], size: int,
                    run: Callable[[list[T]], Iterable[Result]]) -> Iterator[Result]:
    """``run`` on batches of the good items; each failure :class:`Result` among ``items`` passes through.

    A failure comes out just before the results of the batch it was read with (the ones after the last
    batch come last), so the shard's samples and failures stay in input order, batch by batch.
    """
    failed: list[Result] = []

    def good() -> Iterator[T]:
        for item in items:
            if isinstance(item, Result):
                failed.append(item)
            else:
                yield item

    for batch in batches(good(), size):
        yield from failed
        failed.clear()
        yield from run(batch)
    yield from failed


def merged_json(old: bytes | None, fields: dict[str, Any]) -> bytes:
    """The sample's json with fgdata's provenance fields set under its ``fgdata`` key (others kept), deterministic bytes."""
    from fgdata.shards.metadata import with_fgdata_fields

    doc: dict[str, Any] = {}
    if old:
        try:
            loaded = json.loads(old)
            doc = loaded if isinstance(loaded, dict) else {"value": loaded}
        except ValueError:
            doc = {}
    return json.dumps(with_fgdata_fields(doc, fields), sort_keys=True, separators=(",", ":")).encode()


def _marker(dest: str, command: str, name: str) -> str:
    return storage.join(dest, STATE_DIR, command, name + ".json")


def _read_marker(path: str) -> dict[str, Any] | None:
    try:
        return json.loads(storage.read_bytes(path))
    except Exception:  # noqa: BLE001 - a missing or torn marker means "not done"
        return None


def _work_dir(dest: str, name: str, rank: int) -> str:
    if storage.is_s3(dest):
        return tempfile.mkdtemp(prefix="fgdata-encode-")
    path = os.path.join(dest, STATE_DIR, "work", f"{name}.rank{rank}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def _write_task(dest: str, command: str, task: Task, results: Iterable[Result], rank: int, job: dict) -> dict:
    """Build one output shard from ``results`` and move it into place; return its marker record."""
    work = _work_dir(dest, task.name, rank)
    final = storage.join(dest, task.name)
    failures: list[dict[str, Any]] = []
    writer = ShardWriter(work, maxcount=MAX_SAMPLES_PER_SHARD, resume=False)
    try:
        for r in results:
            if r.members is None:
                reason = re.sub(r" at 0x[0-9a-fA-F]+", "", r.reason)  # object addresses would break byte-identity
                writer.fail(r.pos, r.key, reason)
                failures.append({"input": f"{task.source or task.name}#{r.key}", "reason": reason})
            else:
                writer.write(r.key, r.members, input_pos=r.pos)
    except BaseException:
        writer.abort()
        shutil.rmtree(work, ignore_errors=True)
        raise
    summary = writer.close()
    if summary.samples:
        built = summary.shards[0]
        scan = load_index(built)
        if scan is None:
            raise FgdataError(f"{built}: the shard writer left no index")
        if storage.is_s3(final):
            storage.upload(built, final)
        else:
            os.replace(built, final)
        write_index(ShardScan(shard=final, size=scan.size, samples=scan.samples), final, job)
    else:
        storage.remove(final)
        storage.remove(final + ".idx.json")
    shutil.rmtree(work, ignore_errors=True)
    return {"shard": task.name, "source": task.source, "samples": summary.samples, "failures": failures, **job}


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


def run_job(
    *,
    dest: str,
    command: str,
    tasks: list[Task],
    options: dict[str, Any],
    produce: Callable[[Task], Iterable[Result]] | None,
    provenance: Callable[[], dict[str, Any]] | None = None,
    rank: int | None = None,
    world: int | None = None,
    role: str = "all",
    overwrite: bool = False,
    base: str | None = None,
    progress: Callable[[int], None] | None = None,
    log: Callable[[str], None] | None = None,
    wait_timeout: float | None = None,
    poll: float = 1.0,
) -> JobSummary:
    """Run this rank's share of ``tasks`` (``role`` "all" or "work"), then finalize on rank 0 ("all" or "finalize").

    ``produce(task)`` yields one :class:`Result` per input. ``provenance()`` is called after the work, so it
    can report the loaded model; on a rank that had nothing to do it may be skipped.
    """
    env_rank, env_world = dist_env()
    rank = env_rank if rank is None else rank
    world = env_world if world is None else world
    if not tasks:
        raise FgdataError(f"nothing to do for {dest}: no input shards or prompts")
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise FgdataError(f"{dest}: two inputs map to the same output shard name")
    storage.make_dirs(dest)
    fp = fingerprint(options)
    job = {"command": command, "fingerprint": fp, "fgdata": __version__}
    summary = JobSummary(dest=dest, command=command, rank=rank, world=world)
    say = log or (lambda _msg: None)
    start = time.perf_counter()
    record: dict[str, Any] | None = None
    if role in ("all", "work"):
        for task in owned(tasks, rank, world):
            marker_path = _marker(dest, command, task.name)
            marker = None if overwrite else _read_marker(marker_path)
            if marker is not None and marker.get("fingerprint") != fp:
                raise FgdataError(
                    f"{storage.join(dest, task.name)} was written by an earlier {command} job with other options; "
                    "rerun with the same options, or pass --overwrite"
                )
            if marker is not None and (marker["samples"] == 0 or storage.exists(storage.join(dest, task.name))):
                summary.shards_skipped += 1
                if progress:
                    progress(marker["samples"] + len(marker["failures"]))
                continue
            assert produce is not None
            t0 = time.perf_counter()

            def counted(results: Iterable[Result]) -> Iterator[Result]:
                for r in results:
                    yield r
                    if progress:
                        progress(1)

            marker = _write_task(dest, command, task, counted(produce(task)), rank, job)
            storage.write_bytes(marker_path, json.dumps(marker, sort_keys=True).encode())
            dt = time.perf_counter() - t0
            summary.shards_done += 1
            summary.written += marker["samples"]
            summary.failed += len(marker["failures"])
            say(f"rank {rank}: {task.name}: {marker['samples']} samples, {len(marker['failures'])} failed, "
                f"{marker['samples'] / dt if dt > 0 else 0:.1f} samples/s")
        if provenance is not None and summary.shards_done:
            record = provenance()
            # Each rank records what it loaded, so the finalizer need not load the model again.
            info_path = storage.join(dest, STATE_DIR, command, f"model-info.rank{rank}.json")
            storage.write_bytes(info_path, json.dumps({"fingerprint": fp, "record": record}, default=str).encode())
    summary.seconds = time.perf_counter() - start
    if role == "finalize" or (role == "all" and rank == 0):
        record = record or _rank_record(dest, command, fp, world) or (provenance() if provenance else {})
        _finalize(dest, command, tasks, fp, summary, record, options, base, world, wait_timeout, poll, say)
    return summary


def _rank_record(dest: str, command: str, fp: str, world: int) -> dict[str, Any] | None:
    for r in range(world):
        doc = _read_marker(storage.join(dest, STATE_DIR, command, f"model-info.rank{r}.json"))
        if doc and doc.get("fingerprint") == fp:
            return doc["record"]
    return None


def run_ray(fn: Callable[..., JobSummary], kwargs: dict[str, Any], workers: int, gpus_per_worker: float = 0.0,
            log: Callable[[str], None] | None = None) -> JobSummary:
    """``--engine ray``: ``workers`` Ray tasks act as ranks 0..workers-1 (same ownership rule as torchrun), then
    this process finalizes. Connects to a running cluster (``RAY_ADDRESS``) or starts a local one."""
    try:
        import ray
    except ImportError:
        raise FgdataError("--engine ray needs the ray package (pip install 'fgdata[ray]')") from None
    if workers < 1:
        raise FgdataError("--workers must be at least 1")
    started = not ray.is_initialized()
    if started:
        ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_gpus=gpus_per_worker, max_retries=0)(fn)
        refs = [remote.remote(**kwargs, rank=r, world=workers, role="work") for r in range(workers)]
        done = ray.get(refs)
    finally:
        if started:
            ray.shutdown()
    summary = fn(**kwargs, rank=0, world=workers, role="finalize", log=log)
    summary.shards_done = sum(d.shards_done for d in done)
    summary.shards_skipped = sum(d.shards_skipped for d in done)
    summary.seconds = max((d.seconds for d in done), default=0.0)
    return summary


def _finalize(dest: str, command: str, tasks: list[Task], fp: str, summary: JobSummary, record: dict[str, Any],
              options: dict[str, Any], base: str | None, world: int, wait_timeout: float | None, poll: float,
              say: Callable[[str], None]) -> None:
    """Wait for every shard's marker, then write the side files (rank 0 only: nobody else writes them)."""
    deadline = None if wait_timeout is None else time.monotonic() + wait_timeout
    markers: dict[str, dict[str, Any]] = {}
    announced = False
    while True:
        for task in tasks:
            if task.name not in markers:
                m = _read_marker(_marker(dest, command, task.name))
                if m is not None and m.get("fingerprint") == fp:
                    markers[task.name] = m
        missing = len(tasks) - len(markers)
        if not missing:
            break
        if deadline is not None and time.monotonic() > deadline:
            raise FgdataError(f"{dest}: {missing} output shards still unfinished after {wait_timeout:g} s")
        if not announced:
            say(f"rank 0: waiting for {missing} shards from other ranks")
            announced = True
        time.sleep(poll)
    counts = {name: m["samples"] for name, m in markers.items() if m["samples"]}
    count_path = storage.join(dest, COUNT_FILE)
    write_shard_counts(count_path, counts)
    failures = [f for t in tasks for f in markers[t.name]["failures"]]
    failures_path = storage.join(dest, f"failures-{command}.json")
    storage.write_bytes(failures_path, (json.dumps(failures, indent=1) + "\n").encode())
    written = sum(counts.values())
    record = {
        **record,
        "command": command,
        "options": options,
        "fingerprint": fp,
        "fgdata": __version__,
        "shards": len(counts),
        "samples": written,
        "failed": len(failures),
    }
    write_provenance(dest, command, record, base)
    summary.finalized = True
    summary.failures_path = failures_path
    summary.failures = failures
    summary.written, summary.failed = written, len(failures)


def shard_tasks(src: str) -> list[Task]:
    """One task per input shard; the output shard keeps its name."""
    from fgdata.shards import discover_shards

    shards = discover_shards(src)
    if not shards:
        raise FgdataError(f"{src}: no .tar shards found")
    return [Task(storage.basename(p), p) for p in shards]


def task_samples(task: Task) -> Iterator[Any]:
    """The input shard's samples, then a failure :class:`Result` if the shard is damaged (the job goes on)."""
    from fgdata.errors import DamagedShardError
    from fgdata.shards import iter_samples

    assert task.source is not None
    try:
        yield from iter_samples(task.source)
    except DamagedShardError as exc:
        yield Result(exc.good, f"<after {exc.good} samples>", None, f"damaged shard: {exc.reason}")
