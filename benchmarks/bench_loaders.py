"""fgdata's WDS loaders vs a reference pipeline written to the reference's behaviour, on the same shards, in one run.

Reference pipelines (what FastGen's loaders do per sample), built from the independent
re-implementation of the reference's transforms in ``tests/reference_transforms.py`` (the one
the tests hold fgdata's ``resize="reference"`` mode to, bit for bit), plus collation by
``torch.stack``:
* images: webdataset tar iteration + full Pillow decode + full BICUBIC resize + centre crop +
  RGB + ``x/255`` and normalisation in torch;
* video: webdataset + PyAV rgb24 decode of every frame up to the segment's end at full size
  (the clips' first keyframe precedes every possible start, so this is also what a seek to the
  keyframe before the start decodes) + torch antialiased bicubic on the whole clip + crop +
  ``x/127.5 - 1``;
* latents: webdataset with its default decoders (``torch.load`` of each ``.pth``).

Figures, one process each (per-worker throughput, one torch thread), best of ``--repeats``
passes over warm page cache:
1. ImageWDSLoader samples/s vs reference (target >= 2x), fast and ``resize="reference"``;
2. VideoWDSLoader clips/s vs reference at the reference's own settings: 81 frames,
   ``img_size=(832, 480)``, B=1, ``num_workers=0``, from 720p h264 clips of 4 s made here with
   PyAV from the bundled Big Buck Bunny (target >= 3.5x), fast and ``resize="reference"``;
3. WDSLoader on latent shards MB/s vs reference (target >= 1.5x);
4. bytes read per epoch in deterministic mode with 2 workers / dataset bytes (target <= 1.05;
   the reference reads every byte once per worker), with offset indexes and without (then the
   loader's construction, which scans the headers once, counts too);
5. time to first batch when resuming at positions deep inside a 1,000-sample shard / at 0
   (target <= 2x);
6. ``shm``: how a DataLoader worker allocates its batch tensors: torch's public ``share_memory_()``
   (of a ``torch.empty`` or a numpy buffer), or a plain allocation that the DataLoader moves into
   shared memory when it sends the batch, against the private ``UntypedStorage._new_shared`` the
   loaders used before (the "reference" column here): the CPU cost of one allocation alone (median
   of 12 rounds or more), whole passes with one worker over images at 256² and clips at the
   reference's video settings, and the public path's extra CPU per batch as a share of a batch's.

Run: ``python benchmarks/bench_loaders.py [--repeats 3] [--out FILE.md]``.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from fractions import Fraction
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "fgdata" / "sample_data"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from reference_transforms import reference_clip, reference_image  # noqa: E402

from fgdata.loaders import ImageWDSLoader, VideoWDSLoader, WDSLoader  # noqa: E402
from fgdata.loaders.collate import BatchSlots  # noqa: E402
from fgdata.shards import ShardWriter  # noqa: E402

warnings.filterwarnings("ignore", message="deterministic mode")
IMAGE_RES = (256, 128, 64)
# The reference's own video settings, from 720p h264 clips of 4 s at 25 fps (1 s GOP).
VIDEO_FRAMES, VIDEO_SIZE = 81, (832, 480)
CLIP_FPS, CLIP_FRAMES = 25, 100


def _jpeg(im, quality=90) -> bytes:
    b = io.BytesIO()
    im.save(b, "JPEG", quality=quality)
    return b.getvalue()


def build_images(dest: str, n: int) -> None:
    """``n`` JPEGs of 500 px to 1000 px (the bundled photos, resized and mirrored for variety)."""
    from PIL import Image

    srcs = [Image.open(p).convert("RGB") for p in sorted(DATA.iterdir()) if p.suffix in (".jpg", ".png")]
    with ShardWriter(dest, maxcount=100) as w:
        for i in range(n):
            im = srcs[i % len(srcs)]
            side = 500 + (i * 37) % 501
            im = im.resize((side, int(side * im.height / im.width)), Image.BICUBIC)
            if i // len(srcs) % 2:
                im = im.transpose(Image.FLIP_LEFT_RIGHT)
            w.write(f"sample_{i:06d}", {"jpg": _jpeg(im), "txt": f"caption {i}".encode()})


def build_videos(dest: str, n: int) -> None:
    """720p h264 clips of 4 s: the first 100 frames of Big Buck Bunny (1280x720) re-encoded at
    25 fps with a 1 s GOP, as prepared training clips usually are (the bundled file has a single
    keyframe). Made here, never committed."""
    import av

    frames = []
    with av.open(str(DATA / "bigbuckbunny.mp4")) as c:
        for f in c.decode(video=0):
            frames.append(f.reformat(format="yuv420p"))
            if len(frames) == CLIP_FRAMES:
                break
    assert (frames[0].width, frames[0].height) == (1280, 720)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        vs = out.add_stream("libx264", rate=CLIP_FPS, options={"preset": "veryfast", "g": str(CLIP_FPS)})
        vs.width, vs.height, vs.pix_fmt = frames[0].width, frames[0].height, "yuv420p"
        for i, f in enumerate(frames):
            f.pts, f.time_base = i, Fraction(1, CLIP_FPS)
            for p in vs.encode(f):
                out.mux(p)
        for p in vs.encode():
            out.mux(p)
    clip = buf.getvalue()
    with ShardWriter(dest, maxcount=8) as w:
        for i in range(n):
            w.write(f"clip_{i:06d}", {"mp4": clip, "txt": f"clip {i}".encode()})


def build_latents(dest: str, n: int, per_shard: int = 16) -> None:
    """Wan-like latent shards: latent [16,21,30,52] float32 + txt_emb [512,4096] bf16 (about 6 MB/sample)."""
    import torch

    g = torch.Generator().manual_seed(0)
    with ShardWriter(dest, maxcount=per_shard) as w:
        for i in range(n):
            members = {}
            for ext, t in (("latent.pth", torch.randn((16, 21, 30, 52), generator=g)),
                           ("txt_emb.pth", torch.randn((512, 4096), generator=g).bfloat16())):
                b = io.BytesIO()
                torch.save(t, b)
                members[ext] = b.getvalue()
            w.write(f"sample_{i:06d}", members)


def build_resume(dest: str) -> None:
    """2 shards x 1,000 small image samples, for time-to-first-batch at any position."""
    from PIL import Image

    im = Image.open(DATA / "rocket.jpg").convert("RGB").resize((128, 96))
    data = _jpeg(im)
    with ShardWriter(dest, maxcount=1000) as w:
        for i in range(2000):
            w.write(f"sample_{i:06d}", {"jpg": data, "txt": f"caption {i}".encode()})


def shard_list(d: str) -> list[str]:
    return sorted(str(p) for p in Path(d).glob("*.tar"))


def compare(fgdata: Callable[[], int], reference: Callable[[], int], repeats: int) -> tuple[float, float]:
    """Items per second of the fastest of ``repeats`` runs of each (each returns its item count).

    The two alternate, so load from other processes on the machine hits both alike. The ratio of
    items per second of this process's CPU time is printed too: on a shared, busy machine it
    moves less than wall time (both pipelines run single-threaded apart from the video decoder's
    own threads, which they share).
    """
    rates: dict[Callable[[], int], list[float]] = {fgdata: [], reference: []}
    cpu: dict[Callable[[], int], list[float]] = {fgdata: [], reference: []}
    for _ in range(repeats):
        for fn in (fgdata, reference):
            t0, c0 = time.perf_counter(), time.process_time()
            n = fn()
            rates[fn].append(n / (time.perf_counter() - t0))
            cpu[fn].append(n / (time.process_time() - c0))
    print(f"    per CPU second: fgdata {max(cpu[fgdata]):.3f}, reference {max(cpu[reference]):.3f}, "
          f"ratio {max(cpu[fgdata]) / max(cpu[reference]):.2f}x", flush=True)
    return max(rates[fgdata]), max(rates[reference])


def batched(items: Iterable, size: int) -> Iterable[list]:
    batch = []
    for x in items:
        batch.append(x)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def ref_wds(shards: list[str], decode: bool = False):
    import webdataset as wds

    ds = wds.WebDataset(shards, shardshuffle=False, empty_check=False)
    return ds.decode() if decode else ds


def bench_images(d: str, res: int, repeats: int, resize: str, batch: int = 16) -> tuple[float, float]:
    import torch

    def reference() -> int:
        n = 0
        for samples in batched(ref_wds(shard_list(d)), batch):
            torch.stack([torch.from_numpy(reference_image(s["jpg"], res)) for s in samples])
            n += len(samples)
        return n

    def fgdata() -> int:
        loader = ImageWDSLoader(["WDS:" + d], batch_size=batch, input_res=res, num_workers=0, train=False,
                                partial=True, key_map={"real_raw": "jpg", "condition_raw": "txt"}, resize=resize)
        return sum(len(b["fname"]) for b in loader)

    return compare(fgdata, reference, repeats)


def bench_videos(d: str, repeats: int, resize: str) -> tuple[float, float]:
    import torch

    def reference() -> int:
        """Uniform segment starts in [0, duration - (n+1)/fps], the first n frames at or after it."""
        rng, n = np.random.default_rng(0), 0
        span = CLIP_FRAMES / CLIP_FPS - (VIDEO_FRAMES + 1) / CLIP_FPS
        for s in ref_wds(shard_list(d)):
            first = int(np.ceil(rng.uniform(0, span) * CLIP_FPS - 1e-6))
            clip = reference_clip(s["mp4"], range(first, first + VIDEO_FRAMES), VIDEO_SIZE)
            torch.stack([torch.from_numpy(clip)])  # collation, B=1
            n += 1
        return n

    def fgdata() -> int:
        loader = VideoWDSLoader(["WDS:" + d], batch_size=1, sequence_length=VIDEO_FRAMES, img_size=VIDEO_SIZE,
                                num_workers=0, train=False, seed=0, resize=resize)
        return sum(len(b["fname"]) for b in loader)

    return compare(fgdata, reference, repeats)


def bench_latents(d: str, repeats: int, batch: int = 4) -> tuple[float, float, float]:
    import torch

    from fgdata.loaders.collate import collate_samples

    mb = sum(os.path.getsize(p) for p in shard_list(d)) / 1e6
    n_samples = sum(1 for _ in ref_wds(shard_list(d)))

    def reference() -> int:
        for samples in batched(ref_wds(shard_list(d), decode=True), batch):
            collate_samples([{"real": s["latent.pth"], "condition": s["txt_emb.pth"]} for s in samples])
        return n_samples

    def fgdata() -> int:
        loader = WDSLoader(["WDS:" + d], batch_size=batch, num_workers=0, train=False, partial=True)
        for b in loader:
            assert isinstance(b["real"], torch.Tensor)
        return n_samples

    f, r = compare(fgdata, reference, repeats)
    per = mb / n_samples
    return f * per, r * per, mb


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar")).split()[1])


def bench_bytes(d: str, workers: int = 2) -> tuple[float, float]:
    """rchar of both workers' share of one epoch (run in this process, one after the other) / dataset bytes."""
    total = sum(os.path.getsize(p) for p in shard_list(d))
    loader = WDSLoader(["WDS:" + d], batch_size=4, deterministic=True, num_workers=workers,
                       key_map={"real": "latent.pth", "condition": "txt_emb.pth"})
    per_epoch = len(loader)
    batches_per_worker = -(-per_epoch // (4 * workers))
    before = _rchar()
    for w in range(workers):
        it = loader.worker_batches(0, 0, w, workers)
        for _ in range(batches_per_worker):
            next(it)
        it.close()
    fg = (_rchar() - before) / total
    before = _rchar()
    for _ in range(workers):  # the reference: every worker reads every shard and keeps its share
        for _s in ref_wds(shard_list(d)):
            pass
    return fg, (_rchar() - before) / total


def bench_bytes_without_index(d: str, key_map: dict[str, str], workers: int = 2) -> tuple[float, float]:
    """Like :func:`bench_bytes` on a copy of the shards without offset indexes or count file, counting
    construction too: without an index the loader's one header scan is part of an epoch's reading."""
    import shutil

    with tempfile.TemporaryDirectory(prefix="fgdata-noidx-") as tmp:
        for p in shard_list(d):
            shutil.copy(p, tmp)
        total = sum(os.path.getsize(p) for p in shard_list(tmp))
        before = _rchar()
        loader = WDSLoader(["WDS:" + tmp], batch_size=4, deterministic=True, num_workers=workers, key_map=key_map)
        batches_per_worker = -(-len(loader) // (4 * workers))
        for w in range(workers):
            it = loader.worker_batches(0, 0, w, workers)
            for _ in range(batches_per_worker):
                next(it)
            it.close()
        fg = (_rchar() - before) / total
        before = _rchar()
        for _ in range(workers):
            for _s in ref_wds(shard_list(tmp)):
                pass
        return fg, (_rchar() - before) / total


class _ReferenceResume:
    """The reference's resume: a worker re-reads the stream from the start and discards ``pos`` samples."""

    def __init__(self, shards: list[str], pos: int, batch: int):
        self.shards, self.pos, self.batch = shards, pos, batch

    def __iter__(self):
        it = iter(ref_wds(self.shards))
        for _ in range(self.pos):
            next(it)
        yield [reference_image(next(it)["jpg"], 64) for _ in range(self.batch)]


def bench_ttfb(d: str, positions: list[int], repeats: int) -> dict[int, tuple[float, float]]:
    """Median time from construction to the first batch with one DataLoader worker (the deterministic default).

    The reference gets the same one-worker DataLoader around its skip-and-decode stream.
    """
    from torch.utils.data import DataLoader, IterableDataset

    class RefDataset(IterableDataset):
        def __init__(self, inner: _ReferenceResume):
            super().__init__()
            self.inner = inner

        def __iter__(self):
            return iter(self.inner)

    out = {}
    for pos in positions:
        fg, ref = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            loader = ImageWDSLoader(["WDS:" + d], batch_size=8, input_res=64, deterministic=True, num_workers=1,
                                    sampler_start_idx=pos, shard_count_file=d + "/shard_count.json",
                                    key_map={"real_raw": "jpg", "condition_raw": "txt"})
            next(iter(loader))
            fg.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            dl = DataLoader(RefDataset(_ReferenceResume(shard_list(d), pos, 8)), batch_size=None, num_workers=1)
            next(iter(dl))
            ref.append(time.perf_counter() - t0)
        out[pos] = (statistics.median(fg), statistics.median(ref))
    return out


_LIBRARY_ALLOCATE = BatchSlots._allocate  # kept before bench_shared_memory swaps the method


def _shm_private(batch_size: int, shape: tuple[int, ...], in_worker: bool):
    """Before: a worker's batch tensor straight in shared memory through torch's private ``_new_shared``."""
    import math

    import torch

    full = (batch_size, *shape)
    if in_worker:
        storage = torch.UntypedStorage._new_shared(math.prod(full) * 4)
        return torch.empty(0, dtype=torch.float32).set_(storage, 0, full)
    return torch.from_numpy(np.empty(full, np.float32))


def _shm_public_torch(batch_size: int, shape: tuple[int, ...], in_worker: bool):
    """Public API: ``torch.empty`` moved into shared memory by ``share_memory_()`` before it is written
    (the move copies the fresh buffer, and reading it faults on each of its 4 KB pages)."""
    import torch

    full = (batch_size, *shape)
    return torch.empty(full, dtype=torch.float32).share_memory_() if in_worker else torch.from_numpy(np.empty(full, np.float32))


def _shm_now(batch_size: int, shape: tuple[int, ...], in_worker: bool):
    """What the loaders do now (``BatchSlots._allocate``, which tells a worker itself): torch's public
    ``share_memory_()`` of numpy's buffer, advised for huge pages, so that the copy the move makes
    reads the huge zero page instead of faulting per 4 KB."""
    return _LIBRARY_ALLOCATE(BatchSlots(batch_size), shape)


def _shm_on_send(batch_size: int, shape: tuple[int, ...], in_worker: bool):
    """No shared allocation: numpy's allocator, and the DataLoader copies the batch into shared memory when it sends it."""
    import torch

    return torch.from_numpy(np.empty((batch_size, *shape), np.float32))


PRIVATE, PUBLIC = "_new_shared (private, before)", "share_memory_() of numpy's empty (now)"
SHM_PATHS = {PRIVATE: _shm_private, "share_memory_() of torch.empty": _shm_public_torch,
             PUBLIC: _shm_now, "DataLoader copies on send": _shm_on_send}


def bench_allocation(shapes: dict[str, tuple[int, ...]], rounds: int) -> dict[str, dict[str, float]]:
    """Median CPU ms for a DataLoader worker to allocate one batch tensor (``shapes``: batch size first)
    by each shared path and write all of it once, as decoders do; the paths alternate, each freed before the next."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    shared = {name: fn for name, fn in SHM_PATHS.items() if fn is not _shm_on_send}  # that one copies on send

    class Allocations(IterableDataset):
        def __iter__(self):
            torch.set_num_threads(1)
            for _ in range(rounds):
                for case, shape in shapes.items():
                    for name, allocate in shared.items():
                        c0 = time.process_time()
                        tensor = allocate(shape[0], shape[1:], True)
                        assert tensor.is_shared()
                        tensor.fill_(1.0)
                        del tensor
                        yield case, name, time.process_time() - c0

    times: dict[str, dict[str, list[float]]] = {case: {name: [] for name in shared} for case in shapes}
    for case, name, seconds in DataLoader(Allocations(), batch_size=None, num_workers=1):
        times[case][name].append(seconds)
    return {case: {name: 1e3 * statistics.median(v) for name, v in by.items()} for case, by in times.items()}


def bench_shared_memory(make_loader: Callable[[], object], repeats: int) -> dict[str, tuple[float, float]]:
    """Samples/s (wall, and per CPU second of this process and its DataLoader worker) of one loader pass
    with one worker, for each way of allocating the worker's batch tensors; the paths alternate in
    every round, the best round of each counts.
    """
    import resource

    from torch.utils.data import get_worker_info

    def cpu() -> float:
        return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                       resource.getrusage(resource.RUSAGE_CHILDREN)))

    paths = {name: fn for name, fn in SHM_PATHS.items() if fn is not _shm_public_torch}
    wall: dict[str, list[float]] = {name: [] for name in paths}
    per_cpu: dict[str, list[float]] = {name: [] for name in paths}
    try:
        for _ in range(repeats):
            for name, allocate in paths.items():
                BatchSlots._allocate = (  # type: ignore[method-assign]
                    lambda slots, shape, allocate=allocate: allocate(slots.batch_size, shape, get_worker_info() is not None))
                loader = make_loader()
                t0, c0 = time.perf_counter(), cpu()
                n = sum(len(b["fname"]) for b in loader)  # type: ignore[attr-defined]
                wall[name].append(n / (time.perf_counter() - t0))
                per_cpu[name].append(n / (cpu() - c0))  # the worker is joined (and counted) when the pass ends
    finally:
        BatchSlots._allocate = _LIBRARY_ALLOCATE  # type: ignore[method-assign]
    return {name: (max(wall[name]), max(per_cpu[name])) for name in paths}


PARTS = ("images", "video", "latents", "bytes", "resume", "shm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--images", type=int, default=240)
    ap.add_argument("--videos", type=int, default=4)
    ap.add_argument("--latents", type=int, default=48)
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts to run, of {', '.join(PARTS)}")
    ap.add_argument("--out", default=None, help="write the markdown table here")
    args = ap.parse_args()
    parts = set(args.only.split(","))
    if parts - set(PARTS):
        ap.error(f"--only: unknown part(s) {sorted(parts - set(PARTS))}; choose from {', '.join(PARTS)}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)  # one worker = one core
    rows: list[tuple[str, str, str, str, str]] = []

    def row(*cells: str) -> None:
        rows.append(cells)  # type: ignore[arg-type]
        print(cells, flush=True)

    with tempfile.TemporaryDirectory(prefix="fgdata-bench-") as tmp:
        t = Path(tmp)
        print("building shards ...", flush=True)
        if "images" in parts:
            build_images(str(t / "img"), args.images)
            for res in IMAGE_RES:
                for resize in ("fast", "reference") if res == IMAGE_RES[0] else ("fast",):
                    f, r = bench_images(str(t / "img"), res, args.repeats, resize)
                    row(f"ImageWDSLoader resize={resize!r}, {args.images} JPEGs 500-1000 px -> {res}², samples/s",
                        f"{f:.1f}", f"{r:.1f}", f"{f / r:.2f}x", ">= 2x" if resize == "fast" else "(exact mode's cost)")
        if "video" in parts:
            build_videos(str(t / "vid"), args.videos)
            for resize in ("fast", "reference"):
                f, r = bench_videos(str(t / "vid"), args.repeats, resize)
                row(f"VideoWDSLoader resize={resize!r}, 720p h264 4 s (1 s GOP) -> {VIDEO_FRAMES}x{VIDEO_SIZE[1]}x{VIDEO_SIZE[0]}, "
                    f"B=1, frames/s", f"{f * VIDEO_FRAMES:.1f}", f"{r * VIDEO_FRAMES:.1f}", f"{f / r:.2f}x",
                    ">= 3.5x" if resize == "fast" else "(exact mode's cost)")
        if "latents" in parts or "bytes" in parts:
            build_latents(str(t / "lat"), args.latents)
        if "latents" in parts:
            f, r, mb = bench_latents(str(t / "lat"), args.repeats)
            row(f"WDSLoader, latent .pth shards ({mb:.0f} MB), MB/s", f"{f:.0f}", f"{r:.0f}", f"{f / r:.2f}x", ">= 1.5x")
        if "bytes" in parts or "resume" in parts:
            build_resume(str(t / "res"))
        if "bytes" in parts:
            fg, ref = bench_bytes(str(t / "lat"))
            row("Deterministic, 2 workers: bytes read per epoch / dataset bytes", f"{fg:.3f}", f"{ref:.3f}", f"{ref / fg:.2f}x less", "<= 1.05")
            for name, d, km in (("6 MB latent samples", "lat", {"real": "latent.pth", "condition": "txt_emb.pth"}),
                                ("5 KB JPEG samples", "res", {"real": "jpg", "condition": "txt"})):
                fg, ref = bench_bytes_without_index(str(t / d), km)
                row(f"Deterministic, 2 workers, no offset index, {name}: bytes read (construction + epoch) / dataset bytes",
                    f"{fg:.3f}", f"{ref:.3f}", f"{ref / fg:.2f}x less", "<= 1.05")
        if "resume" in parts:
            ttfb = bench_ttfb(str(t / "res"), [0, 500, 999, 1500], 2 * args.repeats + 1)
            base = ttfb[0][0]
            for pos, (fg_t, ref_t) in ttfb.items():
                row(f"Time to first batch resuming at {pos} (2 x 1,000-sample shards), s; ratio to position 0",
                    f"{fg_t:.3f} ({fg_t / base:.2f}x)", f"{ref_t:.3f} ({ref_t / ttfb[0][1]:.2f}x)", f"{ref_t / fg_t:.2f}x", "<= 2x of position 0")

        if "shm" in parts:
            if "images" not in parts:
                build_images(str(t / "img"), args.images)
            if "video" not in parts:
                build_videos(str(t / "vid"), args.videos)
            cases = {  # name: (batch shape, batch size, one-worker loader)
                "ImageWDSLoader 256² B=16 (12.6 MB batches)": ((3, 256, 256), 16, lambda: ImageWDSLoader(
                    ["WDS:" + str(t / "img")], batch_size=16, input_res=256, num_workers=1, train=False, partial=True,
                    key_map={"real_raw": "jpg", "condition_raw": "txt"})),
                f"VideoWDSLoader {VIDEO_FRAMES}x{VIDEO_SIZE[1]}x{VIDEO_SIZE[0]} B=1 (390 MB batches)": (
                    (3, VIDEO_FRAMES, VIDEO_SIZE[1], VIDEO_SIZE[0]), 1, lambda: VideoWDSLoader(
                        ["WDS:" + str(t / "vid")], batch_size=1, sequence_length=VIDEO_FRAMES, img_size=VIDEO_SIZE,
                        num_workers=1, train=False, seed=0)),
            }
            ms = bench_allocation({case: (b, *shape) for case, (shape, b, _) in cases.items()}, max(12, 4 * args.repeats))
            for case, (_, batch_size, make) in cases.items():
                for name, value in ms[case].items():
                    row(f"{case}: a worker allocates and writes one batch tensor via {name}, CPU ms (median)",
                        f"{value:.1f}", f"{ms[case][PRIVATE]:.1f}", f"{ms[case][PRIVATE] / value:.3f}x", "")
                rates = bench_shared_memory(make, args.repeats)
                base_wall, base_cpu = rates[PRIVATE]
                for name, (w, c) in rates.items():
                    row(f"{case}, 1 worker, batch tensors via {name}: samples/s (per CPU second)",
                        f"{w:.2f} ({c:.2f})", f"{base_wall:.2f} ({base_cpu:.2f})",
                        f"{w / base_wall:.3f}x ({c / base_cpu:.3f}x)", "")
                batch_ms = 1e3 * batch_size / base_cpu
                extra = ms[case][PUBLIC] - ms[case][PRIVATE]
                row(f"{case}: the public path's extra CPU per batch / a batch's CPU (private path)",
                    f"{extra:.1f} ms / {batch_ms:.0f} ms", "", f"{extra / batch_ms:.1%}", "<= ~5 %")

    table = ["| measurement | fgdata | reference | fgdata vs reference | target |", "|---|---|---|---|---|"]
    table += [f"| {' | '.join(r)} |" for r in rows]
    text = "\n".join(table)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
