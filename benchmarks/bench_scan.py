"""The header-only tar scanner (``fgdata.shards.scan``), this tree's against a base checkout's, side by side.

Usage: ``python benchmarks/bench_scan.py --base /path/to/checkout [--repeat 7]``

Both modules are loaded in one process (the base's ``fgdata/shards/scan.py`` under another name) and run on the
same shards, interleaved, best CPU time of ``--repeat`` rounds each, page cache warm:
  * count: ``scan_shard`` over shards of small samples (jpg, txt, json): what ``count-shards`` runs per shard;
  * long names: the same over shards whose names need GNU long-name and PAX headers (the extension path);
  * with data: ``iter_members(with_data=True)`` over the small samples: what ``iter_samples`` reads;
  * stream: ``scan_fileobj`` of a non-seekable reader (an s3:// or http(s) stream is read this way).
Prints microseconds per member and the ratio this tree / base (below 1: this tree is faster).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fgdata.shards import scan as current  # noqa: E402


def load_base(checkout: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("base_scan", checkout / "fgdata" / "shards" / "scan.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def build(dest: Path, n_shards: int, per_shard: int, long_names: bool) -> tuple[list[str], int]:
    """Shards of 3-member samples (2 KB jpg, txt, json); with ``long_names`` every name is over 100 bytes, half
    written as GNU long names and half as PAX. Returns the shards and their member count."""
    dest.mkdir(parents=True)
    payload, members = os.urandom(2048), 0
    shards = []
    for s in range(n_shards):
        path = dest / f"{s:05d}.tar"
        fmt = tarfile.PAX_FORMAT if long_names and s % 2 else tarfile.GNU_FORMAT
        with tarfile.open(path, "w", format=fmt) as tar:
            for i in range(per_shard):
                key = f"{'deep/' * 25 if long_names else ''}sample_{s:05d}_{i:06d}"
                for ext, data in (("jpg", payload), ("txt", b"a caption"), ("json", b'{"w": 256}')):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime = len(data), 0
                    tar.addfile(info, io.BytesIO(data))
                    members += 1
        shards.append(str(path))
    return shards, members


def count(scan: ModuleType, shards: list[str]) -> int:
    return sum(len(scan.scan_shard(p).samples) for p in shards)


def with_data(scan: ModuleType, shards: list[str]) -> int:
    n = 0
    for p in shards:
        with open(p, "rb") as f:
            n += sum(1 for _ in scan.iter_members(f, total=os.path.getsize(p), with_data=True))
    return n


def stream(scan: ModuleType, shards: list[str]) -> int:
    n = 0
    for p in shards:
        with open(p, "rb") as f:
            n += len(scan.scan_fileobj(p, f, seekable=False, total=None).samples)
    return n


def best(fns: dict[str, Callable[[], int]], repeat: int) -> dict[str, float]:
    """Best CPU seconds of each, rounds interleaved; every side must return the same count."""
    times = {name: float("inf") for name in fns}
    for _ in range(repeat):
        results = set()
        for name, fn in fns.items():
            t = time.process_time()
            results.add(fn())
            times[name] = min(times[name], time.process_time() - t)
        assert len(results) == 1, f"the scanners disagree: {results}"
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="a checkout of fgdata holding the scanner to compare")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--per-shard", type=int, default=2000, help="samples per shard (3 members each)")
    args = ap.parse_args()
    base = load_base(args.base.resolve())
    with tempfile.TemporaryDirectory() as tmp:
        small, n_small = build(Path(tmp) / "small", args.shards, args.per_shard, long_names=False)
        longn, n_long = build(Path(tmp) / "long", args.shards, args.per_shard // 4, long_names=True)
        cases: list[tuple[str, Callable[[ModuleType], int], int]] = [
            ("count", lambda m: count(m, small), n_small),
            ("long names", lambda m: count(m, longn), n_long),
            ("with data", lambda m: with_data(m, small), n_small),
            ("stream", lambda m: stream(m, small), n_small),
        ]
        count(base, small), count(current, small)  # warm the page cache and both modules
        print(f"{'case':<12}{'members':>9}{'base µs/member':>16}{'this µs/member':>16}{'this/base':>11}")
        for name, fn, members in cases:
            t = best({"base": lambda fn=fn: fn(base), "this": lambda fn=fn: fn(current)}, args.repeat)
            print(f"{name:<12}{members:>9,}{t['base'] / members * 1e6:>16.3f}{t['this'] / members * 1e6:>16.3f}"
                  f"{t['this'] / t['base']:>10.3f}×")


if __name__ == "__main__":
    main()
