"""Step 2 of ``prepare imagenet-256``: the SD-VAE moments zip from the RGB zip, in work units.

**Units.** The latents are cut into work units of consecutive positions (:data:`~fgdata.prepare.build.UNIT_INPUTS`,
fewer when that would leave a torchrun rank without one: at most ``ceil(n / world)``); unit ``u`` belongs to
rank ``u mod world`` (:func:`fgdata.jobs.ranks.owner`). A unit encodes its positions into its own part zip,
``<folder>/.fgdata/zips/<zip>/parts/unitNNNNNN.zip`` (resumed after its last complete batch), then leaves its
typed :class:`~fgdata.jobs.units.Marker` (positions, options, the fingerprint of its RGB members' names and,
under ``--no-resume``, the launch) in ``.fgdata/zips/<zip>/units/``; its :class:`~fgdata.jobs.units.Plan` goes
there when it starts. A unit whose marker and part match is never encoded again.

**The one zip.** An EDM zip is one file whose members are numbered over the whole dataset, so no unit writes it:
rank 0, after its own units, waits for every unit's marker (of these options; under ``--no-resume`` of this
launch), and then one step, :func:`_append_units`, appends the parts'
members in unit order to ``<zip>.partial`` (a rerun keeps what it appended), adds ``dataset.json``, renames it
into place and writes its provenance; ``failures.json`` follows and the parts and markers go. Ranks meet through
these files alone, so no process group (and no collective timeout) spans the hours an ImageNet encode takes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.jobs.dest import LOCK_FILE, DestLock, claimed, remove_files
from fgdata.jobs.local import threaded_map
from fgdata.jobs.options import fingerprint as options_fingerprint
from fgdata.jobs.outputs import output_done, redoing
from fgdata.jobs.ranks import dist_env, owner, run_launch, wait_for
from fgdata.jobs.report import FAILURES_FILE, Failure, Outputs, write_failures
from fgdata.jobs.signals import Interrupted, critical, stop_on_signals
from fgdata.jobs.units import Marker, Plan, ShardDone, marker_path, read_marker, start_unit
from fgdata.prepare import build
from fgdata.prepare.build import (ProgressFn, ZipRun, ZipSummary, check_output, check_partial, clear, kept_summary,
                                  remove_job_folder, units_folder)
from fgdata.prepare.options import Fingerprint, LatentZipOptions
from fgdata.prepare.zipwriter import (EdmZipWriter, Provenance, ZipState, dataset_json_bytes, member_name,
                                      partial_paths, provenance_path, validate_zip)
from fgdata.workers import default_workers

LATENT_STEM, LATENT_EXT = "img-mean-std-", "npy"
#: Facts a unit's part records beside the fingerprint; the finished zip's provenance leaves them out.
_PART_FACTS = ("unit", "start", "stop", "launch")


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
    """Encode this rank's units of ``rgb_zip``; rank 0 then appends every unit's part into ``dest``.

    ``rank`` and ``world_size`` default to torchrun's environment (one process: rank 0 of 1).

    The job core's rules hold as for the RGB pass: rank 0 holds the lock of ``dest``'s folder (another rank
    a lock of its own there), SIGINT/SIGTERM stop it with the unit's part kept for the rerun, existing outputs
    are kept, resumed or refused as :func:`fgdata.prepare.build.check_output` says, and rank 0 writes
    ``failures.json`` for the whole command (the RGB pass's failures, the latents written), whose counts its
    summary gives; another rank's summary is its share (the latents of its units).
    """
    rgb_zip, dest = Path(rgb_zip), Path(dest)
    env_rank, env_world = dist_env()
    rank = env_rank if rank is None else rank
    world = env_world if world_size is None else world_size
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock = claimed(str(dest.parent)) if rank == 0 else DestLock(str(dest.parent), f"{LOCK_FILE}.rank{rank}")
    with stop_on_signals(), lock:
        return _LatentJob(rgb_zip, dest, options, rank, world).run(run)


@dataclass(frozen=True)
class _Unit:
    """One latent work unit: positions ``first .. first + count - 1`` and the part zip it encodes them into."""

    unit: int
    first: int
    count: int
    part: Path

    def facts(self) -> dict[str, Any]:
        """What the part's state and provenance record beside the fingerprint."""
        return {"unit": self.unit, "start": self.first, "stop": self.first + self.count}


def unit_size(n: int, world: int) -> int:
    """Positions per latent unit: :data:`~fgdata.prepare.build.UNIT_INPUTS`, fewer when ``n`` is too small for
    every rank to own a unit."""
    return max(1, min(build.UNIT_INPUTS, -(-n // world)))


class _LatentJob:
    """One rank's units of the latent pass, and on rank 0 the append of every unit's part and the report."""

    def __init__(self, rgb_zip: Path, dest: Path, options: LatentZipOptions, rank: int, world: int):
        self.rgb_zip, self.dest, self.options, self.rank, self.world = rgb_zip, dest, options, rank, world
        self.names, self.labels = _read_rgb_index(rgb_zip)
        n = len(self.names)
        # The RGB zip is named relative to the latent zip's folder: the same job in another data root is the same job.
        self.fingerprint = Fingerprint.of(options, dataset="imagenet-256", inputs=n, world_size=world,
                                          source=os.path.relpath(rgb_zip.resolve(), dest.parent.resolve()),
                                          source_size=rgb_zip.stat().st_size)
        self.options_fp = options_fingerprint({"latents": self.fingerprint.record()})
        self.folder, self.units_folder = str(dest.parent), units_folder(dest)
        self.job_dir = (dest.parent / self.units_folder).parent
        size = unit_size(n, world)
        self.units = [_Unit(u, first, min(size, n - first), self.job_dir / "parts" / f"unit{u:06d}.zip")
                      for u, first in enumerate(range(0, n, size))]
        self.mine = [u for u in self.units if owner(u.unit, world) == rank]
        self.launch: str | None = None

    def run(self, run: ZipRun) -> ZipSummary:
        n, dest, resume = len(self.names), self.dest, run.resume and not run.overwrite
        self.launch = run_launch(resume, prepare_wait_s())
        if self.rank == 0:
            final = check_output(dest, self.fingerprint, lambda info: validate_zip(dest, n, LATENT_STEM, LATENT_EXT),
                                 resume=resume, overwrite=run.overwrite)
            if final.kept is not None:
                return kept_summary(dest, n, self._rgb_failures())
            clear([final, check_partial(dest, self.fingerprint, resume=resume, overwrite=run.overwrite, merge=True)],
                  run.notify)
        elif resume and _complete(dest, n, self.fingerprint):  # --no-resume: rank 0 is about to redo it
            return self._share(kept=True)
        todo = self._units_to_encode(resume, run)
        if todo:
            self._encode(todo, run)
        if self.rank != 0:
            return self._share(kept=False)
        ready: set[int] = set()

        def missing() -> list[str]:
            ready.update(u.unit for u in self.units if u.unit not in ready and self._unit_done(u))
            return [f"unit {u.unit} (rank {owner(u.unit, self.world)})" for u in self.units if u.unit not in ready]

        wait_for(missing, f"{dest}: the other ranks' units", prepare_wait_s(), poll=5.0, log=run.notify)
        _append_units([u.part for u in self.units], dest, self.names, self.labels, self.fingerprint, run.progress)
        failures = self._rgb_failures()
        report = self._report(failures)
        remove_job_folder(self.job_dir)
        return ZipSummary(path=str(dest), seen=n + len(failures), written=n, failed=len(failures),
                          failures_path=report)

    def _units_to_encode(self, resume: bool, run: ZipRun) -> list[_Unit]:
        """This rank's units that are not finished with these options. Under ``--no-resume`` every earlier part
        and marker of them goes first (the owner removes them, never another rank); a partial part written with
        other options is refused naming the option unless ``--no-resume``."""
        if not resume:
            redoing(self.rank)
            why = "--overwrite" if run.overwrite else "--no-resume"
            parts = [p.name for u in self.mine for p in (u.part, provenance_path(u.part), *partial_paths(u.part))
                     if p.exists()]
            remove_files(str(self.job_dir / "parts"), parts, why, run.notify)
            markers = [Path(marker_path(self.folder, u.unit, self.units_folder)) for u in self.mine]
            remove_files(str(self.job_dir / "units"), [m.name for m in markers if m.exists()], why, None)
            return list(self.mine)
        for u in self.mine:
            check_partial(u.part, self.fingerprint, resume=True, **u.facts())
        return [u for u in self.mine if not self._unit_done(u)]

    def _share(self, kept: bool) -> ZipSummary:
        """A rank's summary other than 0's: the latents of its units (or of the zip, already complete)."""
        size = sum(u.count for u in self.mine)
        return ZipSummary(path=str(self.dest), seen=size, written=size, failed=0, failures_path=None, kept=kept,
                          whole_job=False)

    def _unit_inputs(self, u: _Unit) -> str:
        """The fingerprint of a unit's inputs: its positions and the RGB members' names."""
        h = hashlib.sha256()
        for j in range(u.first, u.first + u.count):
            h.update(f"{j}\t{self.names[j]}\n".encode("utf-8", "surrogateescape"))
        return h.hexdigest()[:32]

    def _unit_done(self, u: _Unit) -> bool:
        """Whether unit ``u`` is finished: its marker of these options, inputs and (under ``--no-resume``) this
        launch, and its complete part."""
        marker = read_marker(self.folder, u.unit, self.units_folder)
        return (marker is not None and marker.options == self.options_fp and marker.inputs == self._unit_inputs(u)
                and (self.launch is None or marker.launch == self.launch)
                and _complete(u.part, u.count, self.fingerprint, first=u.first, **u.facts()))

    def _encode(self, todo: list[_Unit], run: ZipRun) -> None:
        """Load the VAE once, then encode each unit of ``todo`` and leave its marker."""
        from fgdata.encode.vae import load_vae, vae_info

        o = self.options
        model = load_vae(o.vae, device=o.device, dtype=o.dtype)
        info = {**vae_info(model, o.vae), "batch_size": o.batch_size, "device": str(next(model.parameters()).device)}
        total = sum(u.count for u in self.mine)
        done = total - sum(u.count for u in todo)  # the latents of this rank's units finished earlier
        for u in todo:
            start_unit(self.folder, Plan(u.unit, u.first, u.count, self.options_fp, self._unit_inputs(u), self.launch),
                       self.units_folder)
            self._encode_unit(u, model, info, run, done, total)
            marker = Marker(unit=u.unit, first=u.first, count=u.count, options=self.options_fp,
                            inputs=self._unit_inputs(u), stamps=[], names=[],
                            shards=[ShardDone(u.part.name, u.count, u.part.stat().st_size)], written=u.count,
                            failures=[], warnings=[], launch=self.launch)
            with critical():
                storage.write_bytes(marker_path(self.folder, u.unit, self.units_folder), marker.to_bytes())
            done += u.count

    def _encode_unit(self, u: _Unit, model: Any, info: dict[str, Any], run: ZipRun, before: int, total: int) -> None:
        """Encode unit ``u`` into its part, resuming after the part's last complete member; ``before``: this rank's
        latents done before this unit (progress and a stop report them with the unit's)."""
        from fgdata.encode.vae import encode_moments, npy_bytes

        record, batch_size, progress = self.fingerprint.record(**u.facts()), self.options.batch_size, run.progress
        u.part.parent.mkdir(parents=True, exist_ok=True)
        writer = EdmZipWriter(u.part, ZipState(record))
        pos, stop = u.first, u.first + u.count
        try:
            pos += writer.keep_valid_prefix(partial(_latent_name, u.first))
            if progress:
                progress(f"encode rank {self.rank}", before + pos - u.first, total)
            with zipfile.ZipFile(self.rgb_zip) as zf:
                # Members are read here, in order; the engine's threads decode up to two batches ahead of the
                # model, so decoding the next batch overlaps encoding this one.
                decoded = threaded_map(_decode, (zf.read(self.names[i]) for i in range(pos, stop)),
                                       run.workers or default_workers(), ahead=2 * batch_size)
                for a in range(pos, stop, batch_size):
                    images = np.stack(list(islice(decoded, min(batch_size, stop - a))))
                    for k, moments in enumerate(encode_moments(model, images)):
                        writer.add(member_name(a + k, LATENT_STEM, LATENT_EXT), npy_bytes(moments))
                    writer.flush()  # the batch is complete on disk before the test hook may pause here
                    pos = a + len(images)
                    if progress:
                        progress(f"encode rank {self.rank}", before + pos - u.first, total)
                    output_done()
            writer.finish(None, {**record, **info, "launch": self.launch})
        except Interrupted as stopped:
            stopped.done = before + pos - u.first
            raise
        finally:
            writer.close()

    def _rgb_failures(self) -> tuple[Failure, ...]:
        """The inputs the RGB pass failed (they have no latent): they count in the command's report."""
        rgb = Provenance.read(self.rgb_zip)
        return rgb.failures if rgb is not None else ()

    def _report(self, failures: tuple[Failure, ...]) -> str:
        """``failures.json`` for the whole command: the inputs the RGB pass saw and failed, the latents written."""
        n = len(self.names)
        path = self.dest.parent / FAILURES_FILE
        write_failures(str(path), "prepare imagenet-256", n + len(failures), n, [f.to_json() for f in failures],
                       Outputs(sorted({self.rgb_zip.name, self.dest.name})))
        return str(path)


def _latent_name(first: int, i: int) -> str:
    """The name of the ``i``-th member of a part whose first position is ``first``."""
    return member_name(first + i, LATENT_STEM, LATENT_EXT)


def _complete(path: Path, count: int, fingerprint: Fingerprint, first: int = 0, **facts: int) -> bool:
    """A finished zip whose provenance matches (with ``facts``: a unit's part, holding names from ``first`` on
    and no dataset.json)."""
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


def _append_units(parts: list[Path], dest: Path, names: list[str], labels: dict[str, int], fingerprint: Fingerprint,
                  progress: ProgressFn | None) -> None:
    """The one step that writes the latent zip: the units' parts appended in unit order (a rerun keeps the members
    appended before it stopped), then ``dataset.json`` with labels re-keyed to the .npy names; the provenance
    takes the VAE's description from the first part."""
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
        first = Provenance.read(parts[0])
        assert first is not None  # rank 0 found the part complete by its provenance
        info = {k: v for k, v in first.record.items() if k not in _PART_FACTS}
        provenance = {**info, **record, "written": n, "failed": 0, "transform": "sd-vae moments mean||std",
                      "input_range": [0, n], "format": "float32 (8,32,32) mean||std, inputs x/127.5-1"}
        writer.finish(dataset_json_bytes(pairs or None), provenance)
    finally:
        writer.close()
