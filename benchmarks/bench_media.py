"""fgdata.media vs the reference pipelines, side by side in one run, one worker (one process).

The reference pipelines are fgdata's ``resize="reference"`` mode, which the tests hold bit for
bit to an independent re-implementation of the reference's transforms.
Images: load_image_for_training fast (DCT-scaled JPEG decode, crop-box resample) vs reference
mode (full Pillow decode + full BICUBIC resize + centre crop), samples/s.
Video: decode_clip fast (libswscale resize to planar RGB) vs reference mode (rgb24 at full
size + torch antialiased bicubic), 16 frames at 320x192, clips/s over the same random start
times (both seek to the keyframe before the start).
Then the fast path's fidelity: PSNR (on the [0, 1] scale) and the largest pixel difference of
the fast mode against the reference mode, per bundled photo at 256, 128 and 64 px, and per clip
segment of the bundled 720p clip at 81 frames -> 832x480 and 16 frames -> 320x192.
Run: ``python benchmarks/bench_media.py [--seconds S]``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fgdata.media import decode_clip, load_image_for_training, probe_video

DATA = Path(__file__).resolve().parents[1] / "fgdata" / "sample_data"


def rate(fn: Callable[[int], object], items: int, seconds: float) -> float:
    """Calls per second of ``fn(i)`` cycling over ``items`` inputs for about ``seconds``."""
    fn(0)  # warm-up: imports, codec init
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn(n % items)
        n += 1
    return n / (time.perf_counter() - t0)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """dB on the [0, 1] scale for two arrays in [-1, 1]."""
    mse = float(np.mean(((a.astype(np.float64) - b) / 2) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1 / mse)


def fidelity() -> list[tuple[str, float, float, float]]:
    """(case, lowest PSNR, highest PSNR, largest |difference| in 1/255 steps) of fast vs reference mode."""
    out = []
    photos = [p.read_bytes() for p in sorted(DATA.iterdir()) if p.suffix in (".jpg", ".png")]
    for res in (256, 128, 64):
        for simplejpeg in (True, False):
            pairs = [(load_image_for_training(b, res, simplejpeg=simplejpeg), load_image_for_training(b, res, resize="reference"))
                     for b in photos]
            vals = [psnr(f, r) for f, r in pairs]
            worst = max(float(np.abs(f - r).max()) * 127.5 for f, r in pairs)
            out.append((f"image, {len(photos)} bundled photos @ {res}, simplejpeg={simplejpeg}", min(vals), max(vals), worst))
    video = (DATA / "bigbuckbunny.mp4").read_bytes()
    info = probe_video(video)
    for n, size in ((81, (832, 480)), (16, (320, 192))):
        starts = np.random.default_rng(1).uniform(0, info.duration - (n + 1) / info.fps, 3).tolist()
        pairs = [(decode_clip(video, sequence_length=n, img_size=size, start_time=t, info=info).video,
                  decode_clip(video, sequence_length=n, img_size=size, start_time=t, info=info, resize="reference").video)
                 for t in starts]
        vals = [psnr(f, r) for f, r in pairs]
        worst = max(float(np.abs(f - r).max()) * 127.5 for f, r in pairs)
        out.append((f"video, bundled 720p clip, {len(starts)} segments of {n} frames -> {size[0]}x{size[1]}", min(vals), max(vals), worst))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)  # one worker = one core for the torch resize too

    rows = []
    groups = {
        "jpg": sorted(DATA.glob("*.jpg")),
        "png": sorted(DATA.glob("*.png")),
    }
    for name, paths in groups.items():
        blobs = [p.read_bytes() for p in paths]
        for res in (256, 64):
            fast, ref = (
                rate(lambda i, b=blobs, r=res, m=mode: load_image_for_training(b[i], r, resize=m), len(blobs), args.seconds)
                for mode in ("fast", "reference")
            )
            rows.append((f"image {name} ({len(blobs)} files) @ {res}", "samples/s", fast, ref))

    video = (DATA / "bigbuckbunny.mp4").read_bytes()
    info = probe_video(video)
    n, size = 16, (320, 192)
    starts = np.random.default_rng(0).uniform(0, info.duration - (n + 1) / info.fps, 8).tolist()
    fast = rate(
        lambda i: decode_clip(video, sequence_length=n, img_size=size, start_time=starts[i]),
        len(starts),
        args.seconds * 2,
    )
    ref = rate(
        lambda i: decode_clip(video, sequence_length=n, img_size=size, start_time=starts[i], resize="reference"),
        len(starts),
        args.seconds * 2,
    )
    rows.append(("video bigbuckbunny 720p, 16 fr -> 320x192 (probe included)", "clips/s", fast, ref))

    print(f"{'case':60s} {'unit':10s} {'fgdata':>8s} {'reference':>10s} {'ratio':>6s}")
    for case, unit, f, r in rows:
        print(f"{case:60s} {unit:10s} {f:8.1f} {r:10.1f} {f / r:6.2f}x")
    print(f"\n{'fast vs reference mode':75s} {'PSNR dB':>13s} {'max |diff|':>10s}")
    for case, lo, hi, worst in fidelity():
        print(f"{case:75s} {lo:5.1f} - {hi:5.1f} {worst:7.0f}/255")


if __name__ == "__main__":
    main()
