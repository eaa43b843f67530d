"""``fgdata score --with basic`` against the loaders' own decode of the same shards, side by side.

Builds one local dataset of JPEG photos (the repository's photos resized to ``--size`` on the longer side, with
small per-copy changes so no two samples are equal), warms the page cache, then measures wall time, best of N with
the two interleaved, one process each time (workers=1, num_workers=0):
  * score: :func:`fgdata.score.job.score_datasets` with every weight-free signal (one decode per sample; the
    score files are removed before each round so every shard is scored);
  * loader decode: iterating ``ImageWDSLoader(input_res=--res, resize="reference", train=False)`` over the same
    shards (full decode, resize, crop, normalise; the loaders' reference path, no DCT-scaled shortcut), and the
    default ``resize="fast"`` path for context.
Prints samples per second of each and the ratio score / loader (the issue's target: >= 1 against the loaders'
decode).
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import tempfile
import time
from pathlib import Path

from PIL import Image, ImageEnhance

ROOT = Path(__file__).resolve().parent.parent
PHOTOS = sorted(p for p in (ROOT / "examples" / "data").iterdir() if p.suffix in (".jpg", ".png"))


def build(dest: str, n: int, size: int) -> None:
    from fgdata.shards import ShardWriter

    bases = [Image.open(p).convert("RGB") for p in PHOTOS]
    with ShardWriter(dest, maxcount=100) as w:
        for i in range(n):
            im = bases[i % len(bases)]
            scale = size / max(im.size)
            im = im.resize((round(im.width * scale), round(im.height * scale)), Image.Resampling.BICUBIC)
            im = ImageEnhance.Brightness(im).enhance(0.9 + 0.2 * (i / max(n - 1, 1)))
            buf = io.BytesIO()
            im.save(buf, format="JPEG", quality=90)
            w.write(f"sample_{i:06d}", {"jpg": buf.getvalue(), "txt": f"photo {i} of a thing".encode()})


def run_score(dest: str) -> float:
    from fgdata.score.job import ScoreOptions, parse_signals, score_datasets

    for f in glob.glob(os.path.join(dest, "*.scores.jsonl")):
        os.remove(f)
    start = time.perf_counter()
    summary = score_datasets([dest], ScoreOptions(parse_signals("basic")))
    took = time.perf_counter() - start
    assert summary.failed == 0
    return summary.samples / took


def run_loader(dest: str, res: int, resize: str) -> float:
    from fgdata.loaders import ImageWDSLoader

    for f in glob.glob(os.path.join(dest, "*.scores.jsonl")):
        os.remove(f)  # the loader reads only the shards
    loader = ImageWDSLoader(["WDS:" + dest], batch_size=16, input_res=res, resize=resize, num_workers=0,
                            train=False, partial=True, key_map={"real": "jpg", "caption": "txt"})
    start = time.perf_counter()
    n = 0
    for batch in loader:
        n += len(batch["__key__"])
    return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--size", type=int, default=1024, help="longer side of the stored JPEGs")
    ap.add_argument("--res", type=int, default=512, help="the loader's input_res")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dest = os.path.join(tmp, "wds")
        build(dest, args.samples, args.size)
        for path in glob.glob(os.path.join(dest, "*.tar")):
            Path(path).read_bytes()  # warm the page cache
        best = {"score": 0.0, "loader reference": 0.0, "loader fast": 0.0}
        for _ in range(args.repeats):
            best["score"] = max(best["score"], run_score(dest))
            best["loader reference"] = max(best["loader reference"], run_loader(dest, args.res, "reference"))
            best["loader fast"] = max(best["loader fast"], run_loader(dest, args.res, "fast"))
        print(f"{args.samples} JPEGs, longer side {args.size}, loader input_res {args.res}, best of {args.repeats}")
        for name, rate in best.items():
            print(f"  {name:18s} {rate:8.1f} samples/s")
        print(f"  score / loader reference: {best['score'] / best['loader reference']:.2f}x")
        print(f"  score / loader fast:      {best['score'] / best['loader fast']:.2f}x")


if __name__ == "__main__":
    main()
