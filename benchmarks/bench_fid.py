"""Benchmark: ``fgdata fid-refs``'s pass vs a batch-64, single-process reference loop, same zip, same detector.

The reference loop is what EDM's and EDM2's reference scripts do per process, without their DataLoader
workers: read each PNG from the zip, decode it, stack 64, run the detector, add ``Σf`` and ``Σfᵀf`` in float64.
fgdata's pass is :func:`fgdata.fid.refs.compute_refs` (decode threads ahead of the detector, ``--batch-size``
batches, chunk files). Two detectors:

- ``inception``: the real Inception-v3 FID network (random weights; speed does not depend on them);
  compute-bound on a CPU, where the ratio says little; the issue's target (>= 2x) is for one GPU;
- ``decode``: a tiny conv net, so the pass is bound by reading and decoding, which is what the threads buy.

Both passes must agree: the script prints the largest relative difference of ``mu``/``sigma``.

Run: .venv/bin/python benchmarks/bench_fid.py [--device cpu|cuda] [--images 256] [--size 64] [--workers 2]
     [--detectors inception,decode] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fgdata.fid.detectors import Detector  # noqa: E402
from fgdata.fid.inception import InceptionV3  # noqa: E402
from fgdata.fid.refs import RefOptions, compute_refs  # noqa: E402


class DecodeBound(torch.nn.Module):
    """A detector so cheap that reading and decoding dominate: 8 channels pooled to 2x2, projected to 2048."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.proj = torch.nn.Linear(32, 2048)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(images.to(torch.float32) / 255))
        return self.proj(torch.nn.functional.adaptive_avg_pool2d(x, 2).flatten(1))


def build_zip(path: Path, n: int, size: int) -> None:
    """An EDM zip of ``n`` PNGs cut from the bundled photos (real image content, so PNG decode costs what it does)."""
    photos = [Image.open(p).convert("RGB") for p in sorted((REPO / "fgdata" / "sample_data").iterdir())
              if p.suffix.lower() in (".jpg", ".png")]
    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for i in range(n):
            photo = photos[i % len(photos)]
            side = int(min(photo.size) * (0.5 + 0.5 * rng.random()))
            x, y = rng.integers(0, photo.width - side + 1), rng.integers(0, photo.height - side + 1)
            buf = io.BytesIO()
            photo.crop((x, y, x + side, y + side)).resize((size, size), Image.BICUBIC).save(buf, "PNG")
            zf.writestr(f"{i // 1000:05d}/img{i:08d}.png", buf.getvalue())


def reference_loop(zip_path: Path, net: torch.nn.Module, device: str, batch: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """One process, serial decode, batches of 64, float64 sums; the reference's formulas at the end."""
    with zipfile.ZipFile(zip_path) as zf:
        names = sorted(n for n in zf.namelist() if n.endswith(".png"))
        s1 = s2 = None
        with torch.inference_mode():
            for a in range(0, len(names), batch):
                images = np.stack([np.asarray(Image.open(io.BytesIO(zf.read(n))).convert("RGB")).transpose(2, 0, 1)
                                   for n in names[a:a + batch]])
                f = net(torch.from_numpy(images).to(device)).to(torch.float64)
                s1 = f.sum(0) if s1 is None else s1 + f.sum(0)
                s2 = f.T @ f if s2 is None else s2 + f.T @ f
    n = len(names)
    mu = s1.cpu().numpy() / n
    return mu, (s2.cpu().numpy() - np.outer(mu, mu) * n) / (n - 1)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--detectors", default="inception,decode")
    parser.add_argument("--decode-images", type=int, default=4000, help="images for the decode-bound detector")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.detectors.split(","):
            n = args.images if kind == "inception" else args.decode_images
            zip_path = Path(tmp) / f"{kind}.zip"
            build_zip(zip_path, n, args.size)
            net = (InceptionV3() if kind == "inception" else DecodeBound()).to(args.device).eval()
            with torch.inference_mode():  # warm-up: allocator and kernels, outside both timings
                net(torch.zeros(2, 3, args.size, args.size, dtype=torch.uint8, device=args.device))
            sync(args.device)
            start = time.perf_counter()
            mu_r, sigma_r = reference_loop(zip_path, net, args.device)
            sync(args.device)
            t_ref = time.perf_counter() - start
            out = Path(tmp) / f"{kind}.npz"
            det = Detector("fid", 2048, net, {"network": kind})
            start = time.perf_counter()
            compute_refs(str(zip_path), str(out), RefOptions(device=args.device, batch_size=args.batch_size,
                                                             workers=args.workers), detectors={"fid": det})
            sync(args.device)
            t_fg = time.perf_counter() - start
            with np.load(out) as z:
                diff = max(float(np.abs(z["mu"] - mu_r).max() / np.abs(mu_r).max()),
                           float(np.abs(z["sigma"] - sigma_r).max() / np.abs(sigma_r).max()))
            rows.append((kind, n, n / t_ref, n / t_fg, t_ref / t_fg, diff))
    load = os.getloadavg()[0]
    lines = [f"device {args.device}; {args.size}x{args.size} PNGs; fgdata batch {args.batch_size}, "
             f"{args.workers} decode threads; reference batch 64, serial decode; {platform.processor() or platform.machine()}, "
             f"torch {torch.__version__}, load average {load:.1f}",
             "", "| detector | images | reference img/s | fgdata img/s | ratio | max rel. diff mu/sigma |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {k} | {n} | {r:.1f} | {f:.1f} | {ratio:.2f}x | {d:.1e} |" for k, n, r, f, ratio, d in rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
