"""Step 2 of ``prepare imagenet-256``: the SD-VAE moments zip from the RGB zip.

Under torchrun each rank encodes a contiguous slice into its own resumable part file; rank 0 waits for all parts
and merges them, in index order, into one zip. Ranks coordinate through the files alone, so no process group
(and no collective timeout) spans the hours an ImageNet encode takes.
"""

from __future__ import annotations

import io
import json
import os
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from fgdata.errors import FgdataError
from fgdata.jobs.ranks import dist_env, wait_for
from fgdata.prepare.build import ProgressFn, default_workers
from fgdata.prepare.zipwriter import (EdmZipWriter, dataset_json_bytes, member_name, provenance_path,
                                      validate_zip)

LATENT_STEM, LATENT_EXT = "img-mean-std-", "npy"


def prepare_wait_s() -> float:
    """How long a rank waits for another's files: ``FGDATA_WAIT_TIMEOUT`` seconds, default 24 h (an ImageNet pass)."""
    return float(os.environ.get("FGDATA_WAIT_TIMEOUT", 86400))


def _read_rgb_index(rgb_zip: Path) -> tuple[list[str], dict[str, int]]:
    with zipfile.ZipFile(rgb_zip) as zf:
        names = sorted(n for n in zf.namelist() if n.lower().endswith(".png"))
        meta = json.loads(zf.read("dataset.json")) if "dataset.json" in zf.namelist() else {"labels": None}
    labels = {str(n).replace("\\", "/"): int(v) for n, v in (meta.get("labels") or [])}
    if not names:
        raise FgdataError(f"{rgb_zip}: holds no PNG images")
    return names, labels


def _decode(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def encode_latent_zip(rgb_zip: str | os.PathLike[str], dest: str | os.PathLike[str], vae: str = "stabilityai/sd-vae-ft-mse",
                      device: str = "auto", batch_size: int = 32, dtype: str = "float32", force: bool = False,
                      workers: int | None = None, rank: int | None = None, world_size: int | None = None,
                      progress: ProgressFn | None = None) -> dict:
    """Encode this rank's slice of ``rgb_zip``; rank 0 then merges every rank's part into ``dest``."""
    from fgdata.encode.vae import encode_moments, load_vae, npy_bytes, vae_info

    rgb_zip, dest = Path(rgb_zip), Path(dest)
    env_rank, env_world = dist_env()
    rank = env_rank if rank is None else rank
    world = env_world if world_size is None else world_size
    names, labels = _read_rgb_index(rgb_zip)
    n = len(names)
    fingerprint = {"dataset": "imagenet-256", "source": str(rgb_zip.resolve()), "inputs": n,
                   "source_size": rgb_zip.stat().st_size, "vae": vae, "dtype": dtype, "world_size": world}
    if not force and _complete(dest, n, fingerprint):
        return {**json.loads(provenance_path(dest).read_text()), "path": str(dest), "skipped": True}
    start, stop = n * rank // world, n * (rank + 1) // world
    part = dest.with_name(f"{dest.name}.rank{rank:05d}-of-{world:05d}.zip")
    part_fp = {**fingerprint, "rank": rank, "start": start, "stop": stop}
    info: dict = {}
    if force or not _complete(part, stop - start, part_fp, first=start):
        model = load_vae(vae, device=device, dtype=dtype)
        info = vae_info(model, vae)
        writer = EdmZipWriter(part, part_fp, resume=not force)
        try:
            pos = start + writer.keep_valid_prefix(lambda i: member_name(start + i, LATENT_STEM, LATENT_EXT))
            began = time.monotonic()
            with zipfile.ZipFile(rgb_zip) as zf, ThreadPoolExecutor(workers or default_workers()) as pool:
                def submit(a: int):
                    batch = [zf.read(names[i]) for i in range(a, min(a + batch_size, stop))]
                    return pool.map(_decode, batch)
                pending = submit(pos) if pos < stop else None
                for a in range(pos, stop, batch_size):
                    assert pending is not None  # submitted for every a < stop
                    images = np.stack(list(pending))
                    pending = submit(a + batch_size) if a + batch_size < stop else None
                    for k, moments in enumerate(encode_moments(model, images)):
                        writer.add(member_name(a + k, LATENT_STEM, LATENT_EXT), npy_bytes(moments))
                    if progress:
                        progress(f"encode rank {rank}", a + len(images) - start, stop - start)
            info.update(seconds=time.monotonic() - began, batch_size=batch_size, device=str(next(model.parameters()).device))
            writer.finish(None, {**part_fp, **info})
        finally:
            writer.close()
    if rank != 0:
        return {"path": str(part), "rank": rank, "start": start, "stop": stop, "skipped": False}
    parts = [dest.with_name(f"{dest.name}.rank{r:05d}-of-{world:05d}.zip") for r in range(world)]
    wait_for(lambda: [f"{p.name} (rank {r})" for r, p in enumerate(parts) if not p.exists()],
             f"{dest}: the other ranks' part files", prepare_wait_s(), poll=5.0, log=print)
    return _merge(parts, dest, names, labels, fingerprint, info, progress)


def _complete(path: Path, count: int, fingerprint: dict, first: int = 0) -> bool:
    """A finished zip whose provenance matches; part files hold names from ``first`` on and no dataset.json."""
    try:
        info = json.loads(provenance_path(path).read_text())
    except (OSError, ValueError):
        return False
    if any(info.get(k) != v for k, v in fingerprint.items()):
        return False
    if first == 0 and "rank" not in fingerprint:
        return validate_zip(path, count, LATENT_STEM, LATENT_EXT) is None
    try:
        with zipfile.ZipFile(path) as zf:
            got = zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return got == [member_name(first + i, LATENT_STEM, LATENT_EXT) for i in range(count)]


def _merge(parts: list[Path], dest: Path, names: list[str], labels: dict[str, int], fingerprint: dict,
           info: dict, progress: ProgressFn | None) -> dict:
    """Concatenate the rank parts in order, then ``dataset.json`` with labels re-keyed to the .npy names."""
    n = len(names)
    writer = EdmZipWriter(dest, {**fingerprint, "merge": True})
    try:
        pos = writer.keep_valid_prefix(lambda i: member_name(i, LATENT_STEM, LATENT_EXT))
        for p in parts:
            with zipfile.ZipFile(p) as zf:
                for name in zf.namelist():
                    index = int(name.rsplit(LATENT_STEM, 1)[1].split(".")[0])
                    if index >= pos:
                        writer.add(name, zf.read(name))
            if progress:
                progress("merge", writer.count, n)
        if writer.count != n:
            raise FgdataError(f"{dest}: merged {writer.count} latents but the RGB zip has {n} images")
        pairs = [[member_name(i, LATENT_STEM, LATENT_EXT), labels[name]] for i, name in enumerate(names) if name in labels]
        if not info:
            info = {k: v for k, v in json.loads(provenance_path(parts[0]).read_text()).items() if k not in ("rank", "start", "stop")}
        provenance = {**info, **fingerprint, "written": n, "failed": 0, "transform": "sd-vae moments mean||std",
                      "input_range": [0, n], "format": "float32 (8,32,32) mean||std, inputs x/127.5-1"}
        writer.finish(dataset_json_bytes(pairs or None), provenance)
    finally:
        writer.close()
    for p in parts:
        p.unlink(missing_ok=True)
        provenance_path(p).unlink(missing_ok=True)
    return {**provenance, "path": str(dest), "skipped": False}
