"""Step 2 of ``prepare imagenet-256``: the SD-VAE moments zip from the RGB zip.

Under torchrun each rank encodes a contiguous slice into its own resumable part file; rank 0 waits for all parts
and merges them, in index order, into one zip. Ranks coordinate through the files alone, so no process group
(and no collective timeout) spans the hours an ImageNet encode takes. Rank 0 merges a part only once it is
complete and written with these options, and under ``--no-resume`` only when this launch wrote it (the part's
provenance names the launch, :func:`fgdata.jobs.ranks.run_launch`): a part an earlier launch left, which its
rank has not removed yet, is never merged.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fgdata.errors import FgdataError
from fgdata.jobs.dest import LOCK_FILE, DestLock, claimed
from fgdata.jobs.local import threaded_map
from fgdata.jobs.outputs import output_done, redoing
from fgdata.jobs.ranks import dist_env, run_launch, this_launch, wait_for
from fgdata.jobs.report import FAILURES_FILE, Failure, write_failures
from fgdata.jobs.signals import Interrupted, stop_on_signals
from fgdata.prepare.build import (Existing, ProgressFn, ZipRun, ZipSummary, check_output, check_partial, clear,
                                  kept_summary)
from fgdata.workers import default_workers
from fgdata.prepare.options import Fingerprint, LatentZipOptions
from fgdata.prepare.zipwriter import (EdmZipWriter, Provenance, ZipState, dataset_json_bytes, member_name,
                                      provenance_path, validate_zip)

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


def encode_latent_zip(rgb_zip: str | os.PathLike[str], dest: str | os.PathLike[str],
                      options: LatentZipOptions = LatentZipOptions(), run: ZipRun = ZipRun(),
                      rank: int | None = None, world_size: int | None = None) -> ZipSummary:
    """Encode this rank's slice of ``rgb_zip``; rank 0 then merges every rank's part into ``dest``.

    ``rank`` and ``world_size`` default to torchrun's environment (one process: rank 0 of 1).

    The job core's rules hold as for the RGB pass: rank 0 holds the lock of ``dest``'s folder (another rank
    the lock of its own part), SIGINT/SIGTERM stop it with the part file kept for the rerun, existing outputs
    are kept, resumed or refused as :func:`fgdata.prepare.build.check_output` says, and rank 0 writes
    ``failures.json`` for the whole command (the RGB pass's failures, the latents written), whose counts its
    summary gives; another rank's summary is its share (its part file).
    """
    rgb_zip, dest = Path(rgb_zip), Path(dest)
    env_rank, env_world = dist_env()
    rank = env_rank if rank is None else rank
    world = env_world if world_size is None else world_size
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock = claimed(str(dest.parent)) if rank == 0 else DestLock(str(dest.parent), f"{LOCK_FILE}.rank{rank}")
    with stop_on_signals(), lock:
        return _LatentJob(rgb_zip, dest, options, rank, world).run(run)


class _LatentJob:
    """One rank's share of the latent pass (its part file), and on rank 0 the merge and the report."""

    def __init__(self, rgb_zip: Path, dest: Path, options: LatentZipOptions, rank: int, world: int):
        self.rgb_zip, self.dest, self.options, self.rank, self.world = rgb_zip, dest, options, rank, world
        self.names, self.labels = _read_rgb_index(rgb_zip)
        n = len(self.names)
        # The RGB zip is named relative to the latent zip's folder: the same job in another data root is the same job.
        self.fingerprint = Fingerprint.of(options, dataset="imagenet-256", inputs=n, world_size=world,
                                          source=os.path.relpath(rgb_zip.resolve(), dest.parent.resolve()),
                                          source_size=rgb_zip.stat().st_size)
        self.start, self.stop = _slice(n, rank, world)
        self.part = _part_path(dest, rank, world)
        self.part_facts = {"rank": rank, "start": self.start, "stop": self.stop}
        self.launch: str | None = None

    def run(self, run: ZipRun) -> ZipSummary:
        n, dest, resume, progress = len(self.names), self.dest, run.resume and not run.overwrite, run.progress
        self.launch = run_launch(resume, prepare_wait_s())
        checks: list[Existing] = []
        if self.rank == 0:
            final = check_output(dest, self.fingerprint, lambda info: validate_zip(dest, n, LATENT_STEM, LATENT_EXT),
                                 resume=resume, overwrite=run.overwrite)
            if final.kept is not None:
                return kept_summary(dest, n, self._rgb_failures())
            checks += [final, check_partial(dest, self.fingerprint, resume=resume, overwrite=run.overwrite, merge=True)]
        elif resume and _complete(dest, n, self.fingerprint):  # --no-resume: rank 0 is about to redo it
            return self._share(kept=True)
        checks.append(check_partial(self.part, self.fingerprint, resume=resume, overwrite=run.overwrite,
                                    **self.part_facts))
        if not resume:  # a finished part of an earlier run is redone too
            redoing(self.rank)
            done = tuple(p.name for p in (self.part, provenance_path(self.part)) if p.exists())
            checks.append(Existing(self.part, remove=done, why="--overwrite" if run.overwrite else "--no-resume"))
        clear(checks, run.notify)
        info: dict = {}
        if not _complete(self.part, self.stop - self.start, self.fingerprint, first=self.start, **self.part_facts):
            info = self._encode(run)
        if self.rank != 0:
            return self._share(kept=False)
        parts = [_part_path(dest, r, self.world) for r in range(self.world)]
        ready: set[int] = set()

        def missing() -> list[str]:
            ready.update(r for r in range(self.world) if r not in ready and self._part_done(r))
            return [f"{p.name} (rank {r})" for r, p in enumerate(parts) if r not in ready]

        wait_for(missing, f"{dest}: the other ranks' part files", prepare_wait_s(), poll=5.0, log=run.notify)
        _merge(parts, dest, self.names, self.labels, self.fingerprint, info, progress)
        failures = self._rgb_failures()
        return ZipSummary(path=str(dest), seen=n + len(failures), written=n, failed=len(failures),
                          failures_path=self._report(failures))

    def _share(self, kept: bool) -> ZipSummary:
        """A rank's summary other than 0's: its slice, in its part file (or in the merged zip, already complete)."""
        size = self.stop - self.start
        return ZipSummary(path=str(self.dest if kept else self.part), seen=size, written=size, failed=0,
                          failures_path=None, kept=kept, whole_job=False)

    def _encode(self, run: ZipRun) -> dict:
        """Encode the rank's slice into its part file, resuming after its last complete member."""
        from fgdata.encode.vae import encode_moments, load_vae, npy_bytes, vae_info

        o, progress = self.options, run.progress
        model = load_vae(o.vae, device=o.device, dtype=o.dtype)
        info = vae_info(model, o.vae)
        start, stop, names, batch_size = self.start, self.stop, self.names, o.batch_size
        part_record = self.fingerprint.record(**self.part_facts)
        writer = EdmZipWriter(self.part, ZipState(part_record))
        pos = start
        try:
            pos = start + writer.keep_valid_prefix(lambda i: member_name(start + i, LATENT_STEM, LATENT_EXT))
            with zipfile.ZipFile(self.rgb_zip) as zf:
                # Members are read here, in order; the engine's threads decode up to two batches ahead of the
                # model, so decoding the next batch overlaps encoding this one.
                decoded = threaded_map(_decode, (zf.read(names[i]) for i in range(pos, stop)),
                                       run.workers or default_workers(), ahead=2 * batch_size)
                for a in range(pos, stop, batch_size):
                    images = np.stack(list(islice(decoded, min(batch_size, stop - a))))
                    for k, moments in enumerate(encode_moments(model, images)):
                        writer.add(member_name(a + k, LATENT_STEM, LATENT_EXT), npy_bytes(moments))
                    writer.flush()  # the batch is complete on disk before the test hook may pause here
                    pos = a + len(images)
                    if progress:
                        progress(f"encode rank {self.rank}", pos - start, stop - start)
                    output_done()
            info.update(batch_size=batch_size, device=str(next(model.parameters()).device))
            writer.finish(None, {**part_record, **info, "launch": self.launch})
        except Interrupted as stopped:
            stopped.done = pos - start
            raise
        finally:
            writer.close()
        return info

    def _part_done(self, rank: int) -> bool:
        """Whether rank ``rank``'s part is complete, of these options and (under ``--no-resume``) of this launch."""
        part = _part_path(self.dest, rank, self.world)
        info = Provenance.read(part)
        if info is None or not this_launch(info.record, self.launch):
            return False
        start, stop = _slice(len(self.names), rank, self.world)
        return _complete(part, stop - start, self.fingerprint, first=start, rank=rank, start=start, stop=stop)

    def _rgb_failures(self) -> tuple[Failure, ...]:
        """The inputs the RGB pass failed (they have no latent): they count in the command's report."""
        rgb = Provenance.read(self.rgb_zip)
        return rgb.failures if rgb is not None else ()

    def _report(self, failures: tuple[Failure, ...]) -> str:
        """``failures.json`` for the whole command: the inputs the RGB pass saw and failed, the latents written."""
        n = len(self.names)
        path = self.dest.parent / FAILURES_FILE
        write_failures(str(path), "prepare imagenet-256", n + len(failures), n, [f.to_json() for f in failures],
                       {"outputs": sorted({self.rgb_zip.name, self.dest.name})})
        return str(path)


def _slice(n: int, rank: int, world: int) -> tuple[int, int]:
    """The inputs ``[start, stop)`` rank ``rank`` encodes."""
    return n * rank // world, n * (rank + 1) // world


def _part_path(dest: Path, rank: int, world: int) -> Path:
    return dest.with_name(f"{dest.name}.rank{rank:05d}-of-{world:05d}.zip")


def _complete(path: Path, count: int, fingerprint: Fingerprint, first: int = 0, **facts: int) -> bool:
    """A finished zip whose provenance matches (with ``facts``: a rank's part file, holding names from ``first``
    on and no dataset.json)."""
    info = Provenance.read(path)
    if info is None or not fingerprint.matches(info.record, **facts):
        return False
    if not facts:
        return validate_zip(path, count, LATENT_STEM, LATENT_EXT) is None
    try:
        with zipfile.ZipFile(path) as zf:
            got = zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return got == [member_name(first + i, LATENT_STEM, LATENT_EXT) for i in range(count)]


def _merge(parts: list[Path], dest: Path, names: list[str], labels: dict[str, int], fingerprint: Fingerprint,
           info: dict[str, Any], progress: ProgressFn | None) -> None:
    """Concatenate the rank parts in order, then ``dataset.json`` with labels re-keyed to the .npy names;
    ``info`` is the VAE's description (empty: take it from rank 0's part)."""
    n = len(names)
    record = fingerprint.record()
    writer = EdmZipWriter(dest, ZipState({**record, "merge": True}))
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
            first = Provenance.read(parts[0])
            assert first is not None  # rank 0 found the part complete by its provenance
            info = {k: v for k, v in first.record.items()
                    if k not in ("rank", "start", "stop", "launch")}
        provenance = {**info, **record, "written": n, "failed": 0, "transform": "sd-vae moments mean||std",
                      "input_range": [0, n], "format": "float32 (8,32,32) mean||std, inputs x/127.5-1"}
        writer.finish(dataset_json_bytes(pairs or None), provenance)
    finally:
        writer.close()
    for p in parts:
        p.unlink(missing_ok=True)
        provenance_path(p).unlink(missing_ok=True)
