"""Re-sharding existing shards: ``fgdata shard images SHARDS/ DST`` against a straightforward webdataset loop.

Builds ``--shards`` source shards of ``--per-shard`` JPEG samples each (img2dataset's layout: jpg, txt, json with
url/caption/status/sha256/width/height), then writes them again in shards of ``--maxcount``, each side as its own
process, best of ``--repeats`` wall times, alternating:

* copy: ``fgdata shard images SRC DST --maxcount M --workers W`` (JPEGs that need no normalisation are kept byte
  for byte; the json extended) against ``wds.WebDataset(urls)`` read + ``wds.ShardWriter`` write of the same
  members, unchanged;
* normalise: ``--max-side 128`` against the same loop decoding each JPEG with PIL (EXIF orientation, RGB),
  shrinking the longer side to 128 px and encoding at quality 95.

The peak resident memory of every process of each run (the CLI, its worker processes, the forkserver) is sampled
every 20 ms with psutil and printed per run, with the load average before and after it. The issue's scale is 100
shards of 10,000 samples (1,000,000: ``--shards 100 --per-shard 10000 --maxcount 1000 --side 64`` keeps it to
about 7 GB of source); the defaults are scaled down for a shared 2-core machine (say so when quoting figures).
``--sides`` picks and orders the sides, ``--work`` the folder the data goes to (removed at the end).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fgdata.catalog import SAMPLE_DATA

REFERENCE = r"""
import io, sys, webdataset as wds
from PIL import Image, ImageOps
urls, dest, maxcount, side = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with wds.ShardWriter(dest + "/%05d.tar", maxcount=maxcount, verbose=0) as sink:
    for s in wds.WebDataset(urls, shardshuffle=False):
        out = {k: v for k, v in s.items() if k != "__url__" and k != "__local_path__"}
        if side:
            with Image.open(io.BytesIO(s["jpg"])) as im:
                im = ImageOps.exif_transpose(im).convert("RGB")
                im.thumbnail((side, side))
                buf = io.BytesIO()
                im.save(buf, "JPEG", quality=95)
            out["jpg"] = buf.getvalue()
        sink.write(out)
"""


def build(folder: Path, shards: int, per_shard: int, side: int = 256) -> list[str]:
    """img2dataset-style shards of small JPEGs (``side`` px squares) cut from the bundled photos."""
    import numpy as np
    import webdataset as wds
    from PIL import Image

    photos = sorted(SAMPLE_DATA.glob("*.jpg"))
    rng = np.random.default_rng(0)
    tiles = []
    for i in range(64):
        with Image.open(photos[i % len(photos)]) as im:
            im = im.convert("RGB")
            x, y = int(rng.integers(0, im.width - side)), int(rng.integers(0, im.height - side))
            buf = io.BytesIO()
            im.crop((x, y, x + side, y + side)).save(buf, "JPEG", quality=90)
            tiles.append(buf.getvalue())
    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / "%05d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(shards * per_shard):
            data = tiles[i % len(tiles)]
            meta = {"url": f"https://example.com/{i}.jpg", "caption": f"photo {i}", "status": "success",
                    "sha256": hashlib.sha256(data).hexdigest(), "width": side, "height": side, "key": f"{i:09d}"}
            sink.write({"__key__": f"{i:09d}", "jpg": data, "txt": meta["caption"].encode(),
                        "json": json.dumps(meta).encode()})
    return sorted(str(p) for p in folder.glob("*.tar"))


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, int, list[int]]:
    """Wall seconds, the largest resident memory (bytes) of the run's first process, and that of every other
    process it started (its workers, the forkserver), largest first."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    root_peak = [0]
    peaks: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                root_peak[0] = max(root_peak[0], root.memory_info().rss)
                for p in root.children(recursive=True):
                    peaks[p.pid] = max(peaks.get(p.pid, 0), p.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.02)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    rc = proc.wait()
    done.set()
    watcher.join()
    if rc:
        raise SystemExit(f"{cmd[:4]} failed with {rc}")
    return time.perf_counter() - start, root_peak[0], sorted(peaks.values(), reverse=True)


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--maxcount", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--side", type=int, default=256, help="the source JPEGs' side in px")
    parser.add_argument("--modes", default="copy,normalise", help="which of copy,normalise to run")
    parser.add_argument("--sides", default="fgdata,webdataset", help="which of fgdata,webdataset to run, in order")
    parser.add_argument("--max-side", type=int, default=128, help="normalise mode's --max-side")
    parser.add_argument("--work", help="folder for the data (default: a temporary one); removed at the end")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    if args.work:
        Path(args.work).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        started = time.perf_counter()
        urls = build(Path(tmp) / "src", args.shards, args.per_shard, args.side)
        n = args.shards * args.per_shard
        size = sum(os.path.getsize(u) for u in urls)
        print(f"{args.shards} source shards x {args.per_shard} samples = {n:,} samples ({size / 2**30:.2f} GiB, "
              f"{args.side} px JPEGs, built in {time.perf_counter() - started:.0f} s) -> shards of {args.maxcount}; "
              f"fgdata --workers {args.workers}", flush=True)
        modes = [(m, s) for m, s in (("copy", 0), ("normalise", args.max_side)) if m in args.modes.split(",")]
        for mode, side in modes:
            best: dict[str, tuple[float, int, int]] = {}
            for _ in range(args.repeats):
                for side_name in args.sides.split(","):
                    dest = Path(tmp) / f"out-{side_name}"
                    shutil.rmtree(dest, ignore_errors=True)
                    dest.mkdir()
                    if side_name == "fgdata":
                        cmd = [sys.executable, "-m", "fgdata.cli.main", "shard", "images", str(Path(tmp) / "src"),
                               str(dest), "--maxcount", str(args.maxcount), "--workers", str(args.workers),
                               "--no-progress", "-q", *(["--max-side", str(side)] if side else [])]
                    else:
                        cmd = [sys.executable, "-c", REFERENCE, ",".join(urls), str(dest), str(args.maxcount),
                               str(side)]
                    before = _load()
                    took, driver, others = run(cmd, env)
                    shutil.rmtree(dest, ignore_errors=True)
                    print(f"  {mode} {side_name}: {took:.1f} s, {n / took:,.0f} samples/s, peak RSS "
                          f"{driver / 2**20:,.0f} MB" + (f" + [{', '.join(f'{p / 2**20:,.0f}' for p in others)}] MB "
                                                         "(its other processes)" if others else "")
                          + f"; load {before} -> {_load()}", flush=True)
                    old = best.get(side_name, (took, driver, max(others, default=0)))
                    best[side_name] = (min(took, old[0]), max(driver, old[1]), max(max(others, default=0), old[2]))
            if set(best) == {"fgdata", "webdataset"}:
                (f, fd, fw), (w, wm, _) = best["fgdata"], best["webdataset"]
                print(f"{mode:>9}: fgdata {n / f:,.0f} samples/s (peak RSS: driver {fd / 2**20:,.0f} MB, largest "
                      f"other process {fw / 2**20:,.0f} MB), webdataset loop {n / w:,.0f} samples/s (peak "
                      f"{wm / 2**20:,.0f} MB): fgdata {w / f:.2f}x", flush=True)


if __name__ == "__main__":
    main()
