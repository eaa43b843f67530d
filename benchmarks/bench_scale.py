"""The job core at scale: the driver's peak memory and the CPU per input as the manifest grows.

Run: python benchmarks/bench_scale.py [--rows 10000000] [--run 10000,100000,1000000] [--repeats 3]
     [--base /path/to/checkout]

Builds a JSONL manifest of ``--rows`` rows over 1,000 small distinct JPEGs (repeated; each is stored as it is,
a pass-through), then, each in its own process:

- **plan**: streams the manifest and plans every work unit (stamps and input fingerprints) without writing,
  at 1/10 of the rows and at all of them: the driver's peak RSS, which must not grow with the rows;
- **run**: ``fgdata shard images MANIFEST DST`` on the first N rows for each N of ``--run`` (one worker
  process besides the driver): the driver's peak RSS and the CPU per input (driver + workers, user + system),
  which must stay within 1.2x across sizes. It counts the job, from the call to its return (its pool, lock,
  finalize included); the column beside it adds the process's start-up (the interpreter, ``import fgdata``).

``--base`` runs the same ``run`` sizes with another checkout (e.g. fgdata 0.2) side by side, so the old
job core's growth with the input list shows next to the new one's. Figures go to stdout as a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

DISTINCT = 1000

_RUN_CHILD = r"""
import json, resource, sys, time
from fgdata.jobs.driver import RunSettings
from fgdata.sharding.job import ShardJob, run_shard
from fgdata.producers.media import ShardOptions
manifest, dest, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
def cpu():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
started = cpu()  # the interpreter and `import fgdata` are the process's start-up, not the job's
t = time.perf_counter()
report = run_shard(ShardJob(src=manifest, dest=dest, options=ShardOptions(kind="images")),
                   RunSettings(workers=workers, resume=False))
wall = time.perf_counter() - t
print(json.dumps({"seen": report.seen, "written": report.written, "wall": wall, "cpu": cpu() - started,
                  "cpu_total": cpu(), "driver_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_PLAN_CHILD = r"""
import json, resource, sys, time
from fgdata.sharding.job import ShardJob, _stamps, stream_items
from fgdata.jobs.units import plan_units
from fgdata.producers.media import ShardOptions
manifest = sys.argv[1]
job = ShardJob(src=manifest, dest="unused", options=ShardOptions(kind="images"))
t = time.perf_counter()
units = inputs = 0
for unit in plan_units(stream_items(job, []), job.units_of, None, _stamps):
    units += 1
    inputs += len(unit.items)
own = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"inputs": inputs, "units": units, "wall": time.perf_counter() - t,
                  "driver_rss_mb": own.ru_maxrss / 1024}))
"""


def make_images(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(DISTINCT):
        Image.new("RGB", (32, 32), (i % 256, (i // 256) * 40, 90)).save(folder / f"{i:04d}.jpg", quality=90)


def make_manifest(path: Path, rows: int) -> None:
    """``rows`` rows cycling over the images, written in blocks (the builder never holds the manifest)."""
    block = 100_000
    with open(path, "w") as f:
        for start in range(0, rows, block):
            f.write("".join(f'{{"path": "img/{i % DISTINCT:04d}.jpg", "caption": "image {i}"}}\n'
                            for i in range(start, min(rows, start + block))))


def head(path: Path, rows: int, out: Path) -> Path:
    with open(path) as src, open(out, "w") as dst:
        for n, line in enumerate(src):
            if n == rows:
                break
            dst.write(line)
    return out


def child(code: str, args: list[str], checkout: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          cwd=checkout)  # "-c" puts the working folder first on sys.path
    if done.returncode != 0:
        raise SystemExit(f"child failed ({checkout}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    here = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--run", default="10000,100000,1000000", help="comma-separated run sizes")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds over every size and checkout; each row keeps its run with the least CPU (the "
                         "machines are shared: the least disturbed run is the closest to the job's own cost)")
    ap.add_argument("--base", type=Path, help="another checkout to run side by side")
    ap.add_argument("--work", type=Path, help="folder for the manifest and outputs (default: a temp folder)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="fgdata-scale-"))
    make_images(work / "img")
    full = work / f"rows-{args.rows}.jsonl"
    if not full.exists():
        t = time.perf_counter()
        make_manifest(full, args.rows)
        print(f"manifest: {args.rows:,} rows, {full.stat().st_size / 1e6:,.0f} MB in {time.perf_counter() - t:.0f} s")
    print("| step | inputs | checkout | driver peak RSS (MB) | wall (s) | CPU per input, job (us) | "
          "with process start-up (us) |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for rows in sorted({max(1, args.rows // 10), args.rows}):
        part = full if rows == args.rows else head(full, rows, work / f"rows-{rows}.jsonl")
        r = child(_PLAN_CHILD, [str(part)], here)
        print(f"| plan | {r['inputs']:,} | this | {r['driver_rss_mb']:.0f} | {r['wall']:.1f} | | |", flush=True)
    sizes = [int(x) for x in args.run.split(",")]
    parts = {rows: head(full, rows, work / f"run-{rows}.jsonl") for rows in sizes}
    checkouts = [("this", here)] + ([("base", args.base)] if args.base else [])
    best: dict[tuple[int, str], dict] = {}
    for _ in range(args.repeats):  # rounds over every size and checkout: a slow spell of the machine hits all
        for rows in sizes:
            for name, checkout in checkouts:
                dest = work / f"out-{name}-{rows}"
                r = child(_RUN_CHILD, [str(parts[rows]), str(dest), str(args.workers)], checkout)
                assert r["seen"] == rows == r["written"], r
                if (rows, name) not in best or r["cpu_total"] < best[rows, name]["cpu_total"]:
                    best[rows, name] = r
                subprocess.run(["rm", "-rf", str(dest)], check=True)
    for rows in sizes:
        for name, _checkout in checkouts:
            r = best[rows, name]
            print(f"| run | {rows:,} | {name} | {r['driver_rss_mb']:.0f} | {r['wall']:.1f} | "
                  f"{r['cpu'] / rows * 1e6:.0f} | {r['cpu_total'] / rows * 1e6:.0f} |", flush=True)


if __name__ == "__main__":
    main()
