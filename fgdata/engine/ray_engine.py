"""The Ray engine: the same job as the local engine, as work units on a Ray cluster, then one merge.

1. Positions ``0..n`` are split into units of ``unit_size`` inputs (default ``maxcount``).
2. Each unit is a Ray task that writes its own shards through ShardWriter into
   ``DST/_units/NNNNN/`` (resumable: a rerun keeps a unit's complete shards).
3. The driver writes a merge plan (``DST/_units/merge.json``: every move, the counts and the
   failures), then moves the unit shards into one numbering (unit order, then shard order),
   rewriting each offset index under its new name, drops stale shards past the end, writes
   ``shard_count.json`` and ``failures.json`` and removes the staging folder. A driver that
   dies during the merge finishes it from the plan on the next run.

Keys come from the item index, as in the local engine, so the samples and their order are
the same; only shard boundaries differ (each unit closes its last shard).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence

from fgdata import storage
from fgdata.engine.local import ProgressFn, write_range
from fgdata.engine.transform import ShardOptions
from fgdata.errors import FgdataError
from fgdata.shards import Failure, ShardWriter, write_shard_counts
from fgdata.shards.index import COUNT_FILE, index_path, parse_index, write_index
from fgdata.sources.folder import WorkItem

STAGING = "_units"
PLAN = "merge.json"


def _run_unit(
    items: Sequence[WorkItem], order: Sequence[int], first: int, stop: int, dest: str,
    options: ShardOptions, maxcount: int, maxsize: int | None, resume: bool, pattern: str,
) -> dict:
    """One work unit (runs in a Ray worker): positions [first, stop) into shards under ``dest``."""
    writer = ShardWriter(dest, pattern=pattern, maxcount=maxcount, maxsize=maxsize, resume=resume)
    try:
        result = write_range(writer, items, order, first, stop, options)
    except BaseException:
        writer.abort()
        raise
    summary = writer.close()
    return {
        "dest": dest,
        "shards": [storage.basename(s) for s in summary.shards],
        "counts": summary.counts,
        "failures": [f.to_json() for f in summary.failures],
        "written": result.written,
        "nbytes": result.nbytes,
        "inputs": stop - first,
        "resumed": max(0, writer.resume_point.next_input - first),
    }


def _move(src: str, dst: str) -> None:
    if storage.is_s3(src):
        from fgdata.storage import s5cmd

        s5cmd.run(src, "mv", "--raw", src, dst, timeout=s5cmd.TRANSFER_TIMEOUT_S)
    else:
        os.replace(src, dst)


def _remove_tree(path: str) -> None:
    if storage.is_s3(path):
        for info in storage.list_recursive(path):
            storage.remove(info.path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _finish_merge(dest: str, plan: dict, pattern: str) -> None:
    """Apply a merge plan; idempotent, so an interrupted merge can simply run again."""
    for src, dst in plan["moves"]:
        if storage.exists(src):
            scan, job = parse_index(src, storage.read_bytes(index_path(src)))
            scan.shard = dst
            write_index(scan, dst, job)
            _move(src, dst)
        storage.remove(index_path(src))
    total = len(plan["moves"])
    for info in storage.list_dir(dest, suffix=".tar"):
        stem = info.name[: -len(".tar")]
        if stem.isdigit() and int(stem) >= total and info.name == pattern % int(stem):
            storage.remove(info.path)
            storage.remove(index_path(info.path))
    write_shard_counts(storage.join(dest, COUNT_FILE), plan["counts"])
    _remove_tree(storage.join(dest, STAGING))


def _connect(address: str | None) -> None:
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(address=address, include_dashboard=False, log_to_driver=False)


def run_ray(job, items: list[WorkItem], order: list[int], progress: ProgressFn | None):  # noqa: ANN001, ANN201
    """Run ``job`` (a ShardJob) on Ray; returns its JobReport."""
    from fgdata.engine.job import PATTERN, write_report

    try:
        import ray
    except ImportError:
        raise FgdataError("--engine ray needs Ray: pip install 'fgdata[ray]'") from None
    staging = storage.join(job.dest, STAGING)
    plan_path = storage.join(staging, PLAN)
    if not job.resume:
        _remove_tree(staging)
    if job.resume and storage.exists(plan_path):
        plan = json.loads(storage.read_bytes(plan_path))
    else:
        _connect(job.ray_address)
        unit = job.unit_size or job.maxcount
        n = len(items)
        remote = ray.remote(_run_unit)
        items_ref, order_ref = ray.put(items), ray.put(order)
        futures = {}
        for u, first in enumerate(range(0, n, unit)):
            stop = min(first + unit, n)
            dest = storage.join(staging, "%05d" % u)
            ref = remote.remote(items_ref, order_ref, first, stop, dest, job.options, job.maxcount, job.maxsize,
                                job.resume, PATTERN)
            futures[ref] = u
        results: dict[int, dict] = {}
        pending = list(futures)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    results[futures[ref]] = ray.get(ref)
                except ray.exceptions.RayTaskError as e:
                    cause = e.cause if isinstance(getattr(e, "cause", None), FgdataError) else None
                    raise cause or FgdataError(f"a Ray work unit failed: {str(e).splitlines()[0]}") from None
                if progress:
                    progress(results[futures[ref]]["inputs"], results[futures[ref]]["nbytes"])
        moves, counts, failures = [], {}, []
        written = resumed = nbytes = 0
        for u in sorted(results):
            r = results[u]
            for name in r["shards"]:
                final = PATTERN % len(moves)
                moves.append([storage.join(r["dest"], name), storage.join(job.dest, final)])
                counts[final] = r["counts"][name]
            failures += r["failures"]
            written += r["written"]
            resumed += r["resumed"]
            nbytes += r["nbytes"]
        plan = {"moves": moves, "counts": counts, "failures": failures, "written": written,
                "resumed": resumed, "nbytes": nbytes}
        storage.write_bytes(plan_path, json.dumps(plan).encode())
    _finish_merge(job.dest, plan, PATTERN)
    return write_report(
        job, order, len(items), plan["written"], sum(plan["counts"].values()),
        [Failure(f["input"], f["name"], f["reason"]) for f in plan["failures"]],
        [storage.join(job.dest, name) for name in plan["counts"]], plan["counts"], plan["resumed"], plan["nbytes"],
    )
