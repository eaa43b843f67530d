"""fgdata dedup --by phash side by side with imagededup 0.3.3 (PHash, its default threshold 10).

(a) Quality on the generated near-duplicate set of tests/dedup/nearset.py (the sample photos, their quadrants,
    and copies resized, re-encoded at JPEG quality 60, cropped by 5 %, brightened by 10 %, exact): fgdata through
    the CLI on shards, imagededup on the same images as files. A copy counts as found when a reported pair joins
    it to its own photo group; precision is the share of reported pairs inside one group (fgdata reports a
    pair per dropped sample, imagededup every pair within the threshold).
(b) Search time, CPU time and peak memory (each in a fresh process, ru_maxrss) at each of ``--sizes``, and
    fgdata alone at ``--large``. These stores are built directly from generated 64-bit hashes (random, plus 10 %
    copies with 0-6 flipped bits), not from images: both tools then do only their search (imagededup's
    ``find_duplicates(encoding_map=...)`` with its default all-pairs ``brute_force_cython`` up to
    ``--peer-max`` and its ``search_method="bktree"`` up to ``--bktree-max``, each with its default workers;
    fgdata's multi-index search and keep rule).

imagededup runs in its own virtualenv (``--venv``, default /tmp/dedup-bench-venv), created and filled here when
missing; it is never installed into fgdata's environment.

    python benchmarks/bench_dedup.py [--sizes 1000,2000,4000,20000,30000,100000] [--large 1000000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

IMAGEDEDUP = ["imagededup==0.3.3.post2"]
IMAGEDEDUP_DEPS = ["numpy", "scipy", "Pillow", "PyWavelets", "tqdm", "matplotlib", "scikit-learn"]

# imagededup imports torch and torchvision at import time for its CNN mode, which this benchmark never runs; they
# have no build to pair here, so its processes get inert stand-in modules for them (the hashing path never
# touches them).
NO_TORCH = r"""
import importlib.abc, importlib.machinery, sys, types
class _Meta(type):
    def __getattr__(cls, attr):
        return cls
    def __call__(cls, *args, **kwargs):
        return cls
_Any = _Meta("_Any", (), {})
class _Inert(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = lambda attr: _Any
        return m
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, _Inert())
"""

PEER_QUALITY = NO_TORCH + r"""
import json, sys
from imagededup.methods import PHash
dups = PHash().find_duplicates(image_dir=sys.argv[1])
print(json.dumps({k: sorted(v) for k, v in dups.items()}))
"""

PEER_SEARCH = NO_TORCH + r"""
import json, resource, sys, time
import numpy as np
from imagededup.methods import PHash
h = np.load(sys.argv[1])
enc = {f"{i}": f"{int(x):016x}" for i, x in enumerate(h)}
t = time.perf_counter()
dups = PHash(verbose=False).find_duplicates(encoding_map=enc, max_distance_threshold=10, search_method=sys.argv[3])
s = time.perf_counter() - t
pairs = sum(len(v) for v in dups.values()) // 2
use = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(json.dumps({"seconds": s, "pairs": pairs, "cpu_s": sum(u.ru_utime + u.ru_stime for u in use),
                  "peak_mb": max(u.ru_maxrss for u in use) / 1024}))
"""

OURS_SEARCH = r"""
import json, resource, sys, time
import numpy as np
sys.path.insert(0, sys.argv[2])
from fgdata.dedup.index import keep_greedy
h = np.load(sys.argv[1]).reshape(-1, 1)
t = time.perf_counter()
d = keep_greedy(h, 10, np.arange(len(h)))
s = time.perf_counter() - t
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": s, "dropped": int(len(d.index)), "cpu_s": use.ru_utime + use.ru_stime,
                  "peak_mb": use.ru_maxrss / 1024}))
"""


def ensure_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if subprocess.run([str(python), "-c", "import imagededup"], capture_output=True).returncode != 0:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # imagededup's torch/torchvision are only for its CNN mode: PHash needs the rest
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *IMAGEDEDUP], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *IMAGEDEDUP_DEPS], check=True)
    return python


def _metrics(items: list, pairs: set[tuple[int, int]]) -> dict[str, float]:
    from tests.dedup.nearset import KINDS

    same = {(i, j) for i, j in pairs if items[i].group == items[j].group}
    found = {i for p in same for i in p}
    out = {f"recall_{k}": round(sum(1 for i, it in enumerate(items) if it.kind == k and i in found)
                                / sum(1 for it in items if it.kind == k), 4) for k in KINDS[1:]}
    out["precision"] = round(len(same) / len(pairs), 4) if pairs else 1.0
    out["pairs"] = len(pairs)
    return out


def quality(peer: Path, work: Path) -> dict[str, dict[str, float]]:
    from tests.dedup.nearset import near_duplicate_set, write_shards

    items = near_duplicate_set()
    write_shards(items, work / "shards")
    images = work / "images"
    images.mkdir()
    for n, it in enumerate(items):
        (images / f"{n:06d}.jpg").write_bytes(it.data)
    out = work / "dups.json"
    subprocess.run([sys.executable, "-m", "fgdata", "dedup", str(work / "shards"), "-o", str(out), "-q"], check=True)
    ours = {tuple(sorted((int(k), int(r["dup_of"]["key"])))) for keys in json.loads(out.read_text()).values()
            for k, r in keys.items()}
    peer_dups = json.loads(subprocess.run([str(peer), "-c", PEER_QUALITY, str(images)], check=True,
                                          capture_output=True, text=True).stdout)
    theirs = {tuple(sorted((int(a[:6]), int(b[:6])))) for a, bs in peer_dups.items() for b in bs}
    return {"fgdata": _metrics(items, ours), "imagededup": _metrics(items, theirs)}  # type: ignore[arg-type]


def generated_hashes(n: int, path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(n)
    base = rng.integers(0, 2**64 - 1, size=n - n // 10, dtype=np.uint64)
    copies = base[rng.integers(0, len(base), n // 10)].copy()
    for bit in range(64):  # each copy flips each bit with probability 3/64 (about 3 bits)
        flip = rng.random(len(copies)) < 3 / 64
        copies[flip] ^= np.uint64(1) << np.uint64(bit)
    np.save(path, np.concatenate([base, copies]))


def search(python: str, script: str, hashes: Path, timeout: int, method: str = "") -> dict:
    try:
        r = subprocess.run([python, "-c", script, str(hashes), str(ROOT), method], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"not finished in {timeout} s"}
    if r.returncode:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", default="/tmp/dedup-bench-venv")
    ap.add_argument("--sizes", default="1000,2000,4000,20000,30000,100000")
    ap.add_argument("--large", type=int, default=1_000_000)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--peer-max", type=int, default=30_000,
                    help="largest size imagededup's default search runs at (all pairs: time grows with n**2)")
    ap.add_argument("--bktree-max", type=int, default=4_000,
                    help="largest size imagededup's search_method='bktree' runs at (pure Python; on 64-bit hashes "
                         "at distance 10 it visits nearly the whole tree per query)")
    args = ap.parse_args()
    peer = ensure_venv(Path(args.venv))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.skip_quality:
            q = quality(peer, work)
            print(json.dumps({"near_duplicate_set": q}, indent=1), flush=True)
        for n in [int(s) for s in args.sizes.split(",") if s]:
            path = work / f"h{n}.npy"
            generated_hashes(n, path)
            ours = search(sys.executable, OURS_SEARCH, path, args.timeout)
            row: dict = {"hashes": n, "fgdata": ours}
            for method, most in (("brute_force_cython", args.peer_max), ("bktree", args.bktree_max)):
                if n <= most:
                    theirs = row[f"imagededup_{method}"] = search(str(peer), PEER_SEARCH, path, args.timeout, method)
                    if "seconds" in ours and "seconds" in theirs:
                        row[f"time_ratio_{method}"] = round(theirs["seconds"] / ours["seconds"], 1)
            print(json.dumps(row), flush=True)
        if args.large:
            path = work / f"h{args.large}.npy"
            generated_hashes(args.large, path)
            started = time.perf_counter()
            print(json.dumps({"hashes": args.large, "fgdata": search(sys.executable, OURS_SEARCH, path, args.timeout),
                              "wall_s": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
