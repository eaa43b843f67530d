"""Streamed sources: CPU per input and peak memory of reading a manifest or walking a folder.

Run: .venv/bin/python benchmarks/bench_sources.py [--rows 100000] [--files 20000]

For each manifest form (JSONL, its .gz and .zst, CSV, Parquet) of ``--rows`` rows, and for a flat folder and a
two-level tree of ``--files`` empty .jpg files with caption sidecars, it reports the CPU per input of iterating the
streamed source (best of 3, no tracing), and the peak Python memory traced (tracemalloc) while iterating it,
against the peak of holding the whole list. The streamed peak should stay flat as the source grows; the list's
grows with it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fgdata.sources.folder import walk_folder  # noqa: E402
from fgdata.sources.manifest import iter_manifest  # noqa: E402


def _manifests(folder: Path, rows: int) -> dict[str, Path]:
    lines = [{"path": f"img/{i:08d}.jpg", "caption": f"a photo of thing number {i} on a table", "score": i / 7}
             for i in range(rows)]
    jsonl = "".join(json.dumps(r) + "\n" for r in lines).encode()
    found = {"jsonl": folder / "m.jsonl"}
    found["jsonl"].write_bytes(jsonl)
    found["jsonl.gz"] = folder / "m.jsonl.gz"
    found["jsonl.gz"].write_bytes(gzip.compress(jsonl, 6, mtime=0))
    try:
        import zstandard

        found["jsonl.zst"] = folder / "m.jsonl.zst"
        found["jsonl.zst"].write_bytes(zstandard.ZstdCompressor().compress(jsonl))
    except ImportError:
        pass
    found["csv"] = folder / "m.csv"
    found["csv"].write_text("path,caption,score\n" + "".join(f'{r["path"]},{r["caption"]},{r["score"]}\n' for r in lines))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        found["parquet"] = folder / "m.parquet"
        pq.write_table(pa.Table.from_pylist(lines), found["parquet"])
    except ImportError:
        pass
    return found


def _folders(folder: Path, files: int) -> dict[str, Path]:
    flat, tree = folder / "flat", folder / "tree"
    for i in range(files):
        for root, sub in ((flat, ""), (tree, f"d{i % 200:03d}/")):
            (root / sub).mkdir(parents=True, exist_ok=True)
            (root / f"{sub}{i:08d}.jpg").touch()
            (root / f"{sub}{i:08d}.txt").touch()
    return {"folder (flat)": flat, "folder (200 sub-folders)": tree}


def _cpu_per_input(make: Callable[[], Iterable], count: int) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for _ in make():
            pass
        best = min(best, time.process_time() - start)
    return best / count * 1e6


def _peak(consume: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        kept = consume()
        del kept
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sources: dict[str, tuple[Callable[[], Iterable], int]] = {}
        for name, path in _manifests(Path(tmp), args.rows).items():
            sources[name] = (lambda p=str(path): iter_manifest(p), args.rows)
        for name, path in _folders(Path(tmp), args.files).items():
            sources[name] = (lambda p=str(path): walk_folder(p, {"jpg"}), args.files)
        print("| source | inputs | CPU per input | peak streamed | peak as a list |")
        print("|---|---|---|---|---|")
        for name, (make, count) in sources.items():
            cpu = _cpu_per_input(make, count)
            streamed = _peak(lambda make=make: sum(1 for _ in make()))
            listed = _peak(lambda make=make: list(make()))
            print(f"| {name} | {count:,} | {cpu:.1f} µs | {streamed / 2**20:.2f} MiB | {listed / 2**20:.1f} MiB |")


if __name__ == "__main__":
    main()
