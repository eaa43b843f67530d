"""Benchmark: ``fgdata prepare`` vs the reference tools' single-process loop, on the same inputs, in one run.

Inputs are synthetic but realistic: a CIFAR-format tarball of 10,000 rows cut from the bundled photos, and an
ImageNet-style tree of JPEGs at ImageNet-typical sizes (10 class folders). The reference is the in-repo
re-implementation of the EDM / EDM2 dataset tools (tests/prepare/edm_reference.py); for ImageNet-64 it runs
both tools, one after the other, as FastGen's downloader does.

Run: .venv/bin/python benchmarks/bench_prepare.py [--workers 2] [--jpegs 300] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "prepare"))

import edm_reference as ref  # noqa: E402
from conftest import build_cifar_tarball  # noqa: E402

from fgdata.prepare import Cifar10Options, ImagenetOptions, RunSettings, prepare_cifar10, prepare_imagenet64  # noqa: E402

PHOTOS = sorted(p for p in (REPO / "fgdata" / "sample_data").iterdir() if p.suffix.lower() in (".jpg", ".png"))


def build_tree(root: Path, count: int) -> None:
    """``count`` q90 JPEGs of 500x375, 375x500 and 500x333 (ImageNet's common shapes) in 10 class folders."""
    rng = np.random.default_rng(0)
    photos = [Image.open(p).convert("RGB") for p in PHOTOS]
    shapes = [(500, 375), (375, 500), (500, 333)]
    for i in range(count):
        photo = photos[i % len(photos)]
        w, h = shapes[i % len(shapes)]
        scale = max(w / photo.width, h / photo.height) * (1 + rng.random() * 0.3)
        big = photo.resize((int(photo.width * scale) + 1, int(photo.height * scale) + 1))
        x, y = rng.integers(0, big.width - w + 1), rng.integers(0, big.height - h + 1)
        folder = root / f"n{i % 10:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        big.crop((x, y, x + w, y + h)).save(folder / f"img_{i:05d}.JPEG", quality=90)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--jpegs", type=int, default=300)
    parser.add_argument("--cifar-rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved runs; the best of each is kept")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tarball = tmp / "cifar-10-python.tar.gz"
        build_cifar_tarball(tarball, PHOTOS, per_batch=args.cifar_rows // 5)
        tree = tmp / "train"
        build_tree(tree, args.jpegs)

        def ref_cifar() -> None:
            images, labels = ref.read_cifar(str(tarball))
            ref.convert_cifar(images, labels, str(tmp / "ref-cifar.zip"))

        def ref_imagenet() -> None:
            ref.convert_folder(str(tree), str(tmp / "ref-edm.zip"), "edm", 64)
            ref.convert_folder(str(tree), str(tmp / "ref-edm2.zip"), "edm2", 64)

        rows = []
        rebuild = RunSettings(workers=args.workers, resume=False)
        for name, n, reference, ours in [
            ("cifar10", args.cifar_rows, ref_cifar,
             lambda: prepare_cifar10(Cifar10Options(tmp / "fg", tarball, skip_md5=True), rebuild)),
            ("imagenet-64 (both zips)", args.jpegs, ref_imagenet,
             lambda: prepare_imagenet64(ImagenetOptions(tree, tmp / "fg"), rebuild)),
        ]:
            # Interleave and keep the best run of each: the machines are shared and noisy (ENVIRONMENT.md).
            t_ref, t_fg = float("inf"), float("inf")
            for _ in range(args.repeats):
                t_ref, t_fg = min(t_ref, timed(reference)), min(t_fg, timed(ours))
            rows.append((name, n, t_ref, t_fg))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [
        f"Machine: {platform.machine()}, {cpus} CPUs visible, Python {platform.python_version()}; "
        f"fgdata with --workers {args.workers}; reference = single-process EDM/EDM2 loop; "
        f"best of {args.repeats} interleaved runs; load average at the end: {os.getloadavg()[0]:.1f}.",
        "",
        "| dataset | inputs | reference s (img/s) | fgdata s (img/s) | speed-up |",
        "|---|---|---|---|---|",
    ]
    for name, n, t_ref, t_fg in rows:
        lines.append(f"| {name} | {n} | {t_ref:.2f} ({n / t_ref:.0f}) | {t_fg:.2f} ({n / t_fg:.0f}) | {t_ref / t_fg:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
