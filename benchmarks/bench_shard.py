"""Shard-writing speed: fgdata vs a plain webdataset ShardWriter loop vs ``tar cf``, and re-encode scaling.

Run: .venv/bin/python benchmarks/bench_shard.py [--images 400] [--repeats 3]
     .venv/bin/python benchmarks/bench_shard.py --base /work/main --images 300 --rounds 5
       (copy mode on sRGB JPEGs against another checkout, each in its own process, in paired rounds;
       then the cost per image that needs normalising: target within 5 % of the base's time)

All three pass-through writers read the same folder (copies of the bundled JPEGs, each with
a caption sidecar) from the page cache and write shards to the same disk; each figure is
the best of ``--repeats`` runs. Targets (issue): fgdata >= 1.5x the webdataset loop, within
3x of ``tar cf``; re-encoding >= 1.7x faster on 2 workers than on 1.

Re-encode scaling is measured in pairs: each round runs 1 worker then 2 workers back to back and
the figure is the median of the rounds' ratios. A best-of-N per side would compare the 1-worker
run's luckiest moment (one busy CPU) with the 2-worker run's (both CPUs quiet at once), which on a
shared VM is rarer, so it understates scaling. The same pairs on a pure CPU function through the
same pool (no files, no decoding) give the machine's own ceiling for 1 -> 2 workers in that run.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "fgdata" / "sample_data"
# The bundled sRGB JPEGs: shard images keeps them byte for byte. (rocket.jpg carries an Adobe RGB profile,
# which it converts to sRGB: a re-encode, not a copy.)
JPEGS = ("hubble_deep_field.jpg", "grace_hopper.jpg")


_TRANSFORM_CHILD = """
import sys, time
from pathlib import Path
from fgdata.producers.media import ShardOptions, transform
from fgdata.workitem import WorkItem
items = [WorkItem(index=i, name=p.name, path=str(p)) for i, p in enumerate(sorted(Path(sys.argv[1]).glob("*.jpg")))]
options = ShardOptions(kind="images")
runs = []
for _ in range(8):  # the first warms the caches
    c = time.process_time()
    for item in items:
        transform(0, item, options)
    runs.append(time.process_time() - c)
print(min(runs[1:]) / len(items))
"""


def make_folder(root: Path, n: int, orientation: int | None = None) -> tuple[int, int]:
    """``n`` images (cycling through the bundled JPEGs) with captions; returns (files, bytes). ``orientation``:
    an EXIF APP1 segment with that tag is inserted after SOI (the compressed data stays the same), so every
    copy needs turning upright."""
    from PIL import Image

    root.mkdir(parents=True)
    app1 = b""
    if orientation:
        exif = Image.Exif()
        exif[0x0112] = orientation
        payload = exif.tobytes()
        app1 = b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload
    total = 0
    for i in range(n):
        name = JPEGS[i % len(JPEGS)]
        data = (EXAMPLES / name).read_bytes()
        (root / f"img{i:05d}.jpg").write_bytes(data[:2] + app1 + data[2:])
        shutil.copyfile(EXAMPLES / name.replace(".jpg", ".txt"), root / f"img{i:05d}.txt")
        total += len(data) + len(app1)
    return n, total


CPU: dict[int, float] = {}  # id(fn) -> CPU seconds (self + reaped children) of the best run


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def best(fn, repeats: int) -> float:
    """Best wall time of ``repeats`` runs; its CPU time (pool workers included) goes to CPU[id(fn)]."""
    runs = []
    for _ in range(repeats):
        c, t = _cpu(), time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t, _cpu() - c))
    wall, cpu = min(runs)
    CPU[id(fn)] = cpu
    return wall


def run_fgdata(src: Path, dest: Path, workers: int = 1, **options) -> None:
    from fgdata.jobs.driver import RunSettings
    from fgdata.producers.media import ShardOptions
    from fgdata.sharding.job import ShardJob, run_shard

    shutil.rmtree(dest, ignore_errors=True)
    report = run_shard(ShardJob(src=str(src), dest=str(dest), options=ShardOptions(kind="images", **options)),
                       RunSettings(workers=workers, resume=False))
    assert report.failed == 0


def run_webdataset(src: Path, dest: Path) -> None:
    """The plain reference loop: sorted files, read image + caption, ShardWriter.write."""
    import webdataset as wds

    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    with wds.ShardWriter(str(dest / "%05d.tar"), maxcount=1000, verbose=0) as sink:
        for i, path in enumerate(sorted(src.rglob("*.jpg"))):
            sink.write({
                "__key__": f"sample_{i:06d}",
                "jpg": path.read_bytes(),
                "txt": path.with_suffix(".txt").read_text(),
            })


def run_tar(src: Path, dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    subprocess.run(["tar", "cf", str(dest / "all.tar"), "-C", str(src), "."], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reencode-images", type=int, default=240)
    parser.add_argument("--max-side", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7, help="(1 worker, 2 workers) pairs for the scaling figures")
    parser.add_argument("--base", type=Path, default=None,
                        help="another fgdata checkout (e.g. /work/main): compare copy mode with it, then exit")
    args = parser.parse_args()
    if args.base is not None:
        with tempfile.TemporaryDirectory(prefix="bench-shard-") as tmp:
            print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
            compare_copy_mode(Path(tmp), args.base, args.images, args.rounds, args.repeats)
        return
    import webdataset  # noqa: F401 - import cost (torch) stays out of the timings

    with tempfile.TemporaryDirectory(prefix="bench-shard-") as tmp:
        root = Path(tmp)
        print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
        n, nbytes = make_folder(root / "src", args.images)
        for p in (root / "src").iterdir():  # warm the page cache
            p.read_bytes()
        fg = lambda: run_fgdata(root / "src", root / "fg")  # noqa: E731
        fg2 = lambda: run_fgdata(root / "src", root / "fg2", workers=2)  # noqa: E731
        ref = lambda: run_webdataset(root / "src", root / "wds")  # noqa: E731
        tar = lambda: run_tar(root / "src", root / "tar")  # noqa: E731
        t_fg, t_fg2, t_wds, t_tar = (best(f, args.repeats) for f in (fg, fg2, ref, tar))
        print(f"pass-through, {n} images + captions, {nbytes / 1e6:.1f} MB, best of {args.repeats}")
        for name, t, f in (("fgdata shard images", t_fg, fg), ("fgdata shard images -w 2", t_fg2, fg2),
                           ("webdataset ShardWriter loop", t_wds, ref), ("tar cf", t_tar, tar)):
            print(f"  {name:<28} {t:7.3f} s  {n / t:9.0f} samples/s  {nbytes / t / 1e6:8.1f} MB/s"
                  f"  cpu {CPU[id(f)]:6.3f} s")
        t_fg = min(t_fg, t_fg2)
        print(f"  fgdata (best) / webdataset speed: {t_wds / t_fg:.2f}x   (target >= 1.5x)")
        print(f"  fgdata (best) time / tar cf time: {t_fg / t_tar:.2f}x   (target <= 3x)")

        m, _ = make_folder(root / "re", args.reencode_images)
        r1 = lambda: run_fgdata(root / "re", root / "r1", workers=1, max_side=args.max_side)  # noqa: E731
        r2 = lambda: run_fgdata(root / "re", root / "r2", workers=2, max_side=args.max_side)  # noqa: E731
        r2()  # the forkserver starts once per process; a job does not pay it again
        print(f"re-encode to --max-side {args.max_side}, {m} images, cpus={os.cpu_count()}, "
              f"{args.rounds} rounds of (1 worker, 2 workers)")
        reencode = paired_ratios(r1, r2, args.rounds, "re-encode")
        same = all((root / "r1" / f).read_bytes() == (root / "r2" / f).read_bytes()
                   for f in os.listdir(root / "r1") if (root / "r1" / f).is_file())
        ceiling = paired_ratios(functools.partial(cpu_loop, 1, m), functools.partial(cpu_loop, 2, m), args.rounds,
                                "pure CPU")
        print(f"  re-encode speed-up 1 -> 2 workers, median of {args.rounds}: {reencode:.2f}x (target >= 1.7x)"
              f"   identical output: {same}")
        print(f"  the machine's ceiling (pure CPU through the same pool), median: {ceiling:.2f}x")


# -- copy mode against another checkout (main), and the cost of normalising ---------------------------

_CHILD = """
import shutil, sys, time
from fgdata.jobs.driver import RunSettings
from fgdata.producers.media import ShardOptions
from fgdata.sharding.job import ShardJob, run_shard
src, dest, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = []
for _ in range(repeats):
    shutil.rmtree(dest, ignore_errors=True)
    t, c = time.perf_counter(), time.process_time()
    report = run_shard(ShardJob(src=src, dest=dest, options=ShardOptions(kind="images")), RunSettings(resume=False))
    runs.append((time.perf_counter() - t, time.process_time() - c))
    assert report.failed == 0
print(*min(runs))
"""


def child_time(tree: Path, src: Path, dest: Path, repeats: int) -> tuple[float, float]:
    """(wall, CPU) seconds of the best of ``repeats`` default ``shard images`` runs of ``src`` with the
    fgdata of ``tree``, in a fresh process (one worker: the job runs in that process)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(src), str(dest), str(repeats)], env=env, check=True,
                         capture_output=True, text=True)
    wall, cpu = out.stdout.split()[-2:]
    return float(wall), float(cpu)


def compare_copy_mode(root: Path, base: Path, n: int, rounds: int, repeats: int) -> None:
    """Copy mode on a JPEG-only folder, this tree against ``base`` (e.g. /work/main), in paired rounds;
    then the cost per normalised image (the same JPEGs with an EXIF orientation to apply)."""
    here = Path(__file__).resolve().parents[1]
    plain, turned = root / "plain", root / "turned"
    make_folder(plain, n)
    make_folder(turned, n, orientation=6)
    print(f"copy mode, {n} sRGB JPEGs + captions, {rounds} rounds of (base, this tree), best of {repeats} each")
    walls, cpus = [], []
    for i in range(rounds):
        (w_base, c_base), (w_here, c_here) = child_time(base, plain, root / "b", repeats), child_time(here, plain, root / "h", repeats)
        walls.append(w_here / w_base)
        cpus.append(c_here / c_base)
        print(f"  round {i + 1}: base {w_base:6.3f} s (cpu {c_base:6.3f}), this tree {w_here:6.3f} s (cpu {c_here:6.3f})")
    print(f"  this tree / base, median of {rounds}: wall time {statistics.median(walls):.3f}, "
          f"CPU time {statistics.median(cpus):.3f} (target <= 1.05)")
    per_jpeg = {tree: [] for tree in (base, here)}
    for _ in range(3):
        for tree in (base, here):
            out = subprocess.run([sys.executable, "-c", _TRANSFORM_CHILD, str(plain)], check=True, capture_output=True,
                                 text=True, env={**os.environ, "PYTHONPATH": str(tree)})
            per_jpeg[tree].append(float(out.stdout.split()[-1]))
    t_base, t_here = min(per_jpeg[base]), min(per_jpeg[here])
    print(f"  the per-input transform alone (header, checks, json), CPU per JPEG kept: base {t_base * 1e6:.1f} us, "
          f"this tree {t_here * 1e6:.1f} us, ratio {t_here / t_base:.3f}")
    t_plain = [child_time(here, plain, root / "h", repeats)[1] for _ in range(rounds)]
    t_turned = [child_time(here, turned, root / "t", repeats)[1] for _ in range(rounds)]
    per = (statistics.median(t_turned) - statistics.median(t_plain)) / n
    print(f"  the same {n} JPEGs with EXIF orientation 6 (each decoded, turned, re-encoded at quality 95): "
          f"median CPU {statistics.median(t_turned):.3f} s vs {statistics.median(t_plain):.3f} s kept")
    print(f"  cost per normalised image: {per * 1e3:.1f} ms CPU")


def cpu_loop(workers: int, n: int) -> None:
    """``n`` items of pure CPU work (about 10 ms each, like one re-encoded photo) through the job core's pool."""
    from fgdata.jobs.local import ordered_map

    work = functools.partial(hashlib.pbkdf2_hmac, "sha256", b"password", b"salt")
    for _ in ordered_map(work, [20000] * n, workers=workers, chunksize=8):
        pass


def paired_ratios(one, two, rounds: int, label: str) -> float:
    """Run ``one`` then ``two`` ``rounds`` times; print each pair; return the median of time(one)/time(two)."""
    ratios = []
    for i in range(rounds):
        t1, t2 = best(one, 1), best(two, 1)
        ratios.append(t1 / t2)
        print(f"  {label:<10} round {i + 1}: 1 worker {t1:6.3f} s, 2 workers {t2:6.3f} s, {t1 / t2:.2f}x")
    return statistics.median(ratios)

if __name__ == "__main__":
    main()
