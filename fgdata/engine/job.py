"""A shard job end to end: read the inputs, order them, run an engine, write the report.

Side files beside the shards (all written atomically, local or s3://):

- ``shard_job.json``: the job record (kind, options, limits, order, engine, a fingerprint of
  the input list). A resumed job must match it, so a rerun never mixes two option sets;
- ``shard_count.json`` and ``<shard>.idx.json``: written by ShardWriter;
- ``failures.json``: the report — ``seen``, ``written``, ``failed``, ``samples``,
  ``failed_by_reason`` ({category: n}) and ``failures`` ([{input, name, reason}], where
  ``input`` is the item's index in the source order). ``seen == written + failed`` always.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from fgdata import storage
from fgdata.engine.local import ProgressFn, write_range
from fgdata.engine.transform import ShardOptions
from fgdata.errors import FgdataError, ShardError
from fgdata.shards import Failure, ShardWriter
from fgdata.sources.folder import WorkItem

JOB_FILE = "shard_job.json"
FAILURES_FILE = "failures.json"
PATTERN = "%05d.tar"


@dataclass
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
    shuffle_seed: int | None = None
    engine: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    unit_size: int | None = None  # ray: inputs per work unit (default: maxcount)


@dataclass
class JobReport:
    seen: int
    written: int
    failed: int
    samples: int
    failed_by_reason: dict[str, int]
    shards: list[str]
    counts: dict[str, int]
    failures_path: str
    resumed: int = 0  # inputs already covered by complete shards when the job started
    nbytes: int = 0  # input bytes read in this run
    failures: list[dict] = field(default_factory=list)


def load_items(job: ShardJob) -> list[WorkItem]:
    """The job's inputs in source order: a folder listing, manifest rows or prompt lines."""
    from fgdata.media import IMAGE_EXTS, VIDEO_EXTS
    from fgdata.sources.folder import list_folder
    from fgdata.sources.manifest import is_manifest, read_manifest, read_prompts

    if job.options.kind == "prompts":
        return read_prompts(job.src, job.caption_column)
    if is_manifest(job.src):
        return read_manifest(job.src, job.path_column, job.caption_column)
    if not storage.is_s3(job.src) and not storage.exists(job.src):
        raise FgdataError(f"{job.src}: no such folder or manifest")
    exts = IMAGE_EXTS if job.options.kind == "images" else VIDEO_EXTS
    return list_folder(job.src, exts)


def input_order(n: int, seed: int | None) -> list[int]:
    """Positions -> item indices: source order, or a seeded shuffle (Python's ``random``, stable across versions)."""
    order = list(range(n))
    if seed is not None:
        random.Random(seed).shuffle(order)
    return order


def job_record(job: ShardJob, items: list[WorkItem]) -> dict:
    digest = hashlib.sha256("\n".join(f"{i.name}\t{i.path}" for i in items).encode()).hexdigest()
    return {
        "format": "fgdata.shard-job",
        "version": 1,
        "kind": job.options.kind,
        "options": job.options.to_json(),
        "maxcount": job.maxcount,
        "maxsize": job.maxsize,
        "shuffle_seed": job.shuffle_seed,
        "engine": job.engine,
        "unit_size": (job.unit_size or job.maxcount) if job.engine == "ray" else None,
        "inputs": len(items),
        "inputs_sha256": digest,
    }


def _clean_side_temporaries(dest: str) -> None:
    """Drop temporaries of the job's own side files left by a killed run (``.failures.json.tmp-…``).

    ShardWriter cleans those of shards, indexes and the count file.
    """
    if storage.is_s3(dest) or not os.path.isdir(dest):
        return
    for name in os.listdir(dest):
        base = name[1:].split(".tmp-", 1)[0] if name.startswith(".") and ".tmp-" in name else None
        if base in (JOB_FILE, FAILURES_FILE):
            os.unlink(os.path.join(dest, name))


def _check_record(job: ShardJob, record: dict) -> None:
    path = storage.join(job.dest, JOB_FILE)
    if job.resume and storage.exists(path):
        try:
            old = json.loads(storage.read_bytes(path))
        except ValueError:
            old = {}
        changed = sorted(k for k in record if old.get(k) != record[k])
        if changed:
            raise FgdataError(
                f"{job.dest}: existing shards come from a different job ({', '.join(changed)} changed); "
                "rerun with the same inputs and options, or with --no-resume to start over"
            )
    storage.make_dirs(job.dest)
    storage.write_bytes(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())


def _reason_category(reason: str) -> str:
    return reason.split(":", 1)[0].strip()


def write_report(
    job: ShardJob, order: list[int], seen: int, written: int, samples: int, failures: list[Failure],
    shards: list[str], counts: dict[str, int], resumed: int, nbytes: int,
) -> JobReport:
    """Check the accounting, then write ``failures.json`` beside the shards."""
    entries = [
        {"input": order[f.input] if f.input is not None else None, "name": f.name, "reason": f.reason}
        for f in sorted(failures, key=lambda f: -1 if f.input is None else f.input)
    ]
    by_reason = dict(sorted(Counter(_reason_category(e["reason"]) for e in entries).items()))
    if seen != written + len(entries):
        raise ShardError(f"{job.dest}: accounting mismatch: {seen} inputs seen, {written} written, {len(entries)} failed")
    path = storage.join(job.dest, FAILURES_FILE)
    doc = {
        "format": "fgdata.shard-failures",
        "version": 1,
        "seen": seen,
        "written": written,
        "failed": len(entries),
        "samples": samples,
        "failed_by_reason": by_reason,
        "failures": entries,
    }
    storage.write_bytes(path, (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode())
    return JobReport(seen=seen, written=written, failed=len(entries), samples=samples, failed_by_reason=by_reason,
                     shards=shards, counts=counts, failures_path=path, resumed=resumed, nbytes=nbytes,
                     failures=entries)


def run_shard_job(
    job: ShardJob,
    progress: ProgressFn | None = None,
    on_start: Callable[[int], None] | None = None,
) -> JobReport:
    """Run a shard job on its engine and return the report (also written to ``DST/failures.json``).

    ``on_start(total_inputs)`` is called once the inputs are listed; ``progress(inputs, bytes)``
    after each input (increments).
    """
    if job.maxcount < 1:
        raise FgdataError("--maxcount must be at least 1")
    if job.workers < 1:
        raise FgdataError("--workers must be at least 1")
    items = load_items(job)
    order = input_order(len(items), job.shuffle_seed)
    _clean_side_temporaries(job.dest)
    _check_record(job, job_record(job, items))
    if on_start:
        on_start(len(items))
    if job.engine == "ray":
        from fgdata.engine.ray_engine import run_ray

        return run_ray(job, items, order, progress)
    if job.engine != "local":
        raise FgdataError(f"--engine must be 'local' or 'ray', not {job.engine!r}")
    writer = ShardWriter(job.dest, pattern=PATTERN, maxcount=job.maxcount, maxsize=job.maxsize, resume=job.resume)
    resumed = writer.resume_point.next_input
    try:
        result = write_range(writer, items, order, 0, len(items), job.options, job.workers, progress)
    except BaseException:
        writer.abort()
        raise
    summary = writer.close()
    return write_report(job, order, len(items), result.written, summary.samples, summary.failures,
                        summary.shards, summary.counts, resumed, result.nbytes)
