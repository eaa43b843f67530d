"""Step 2 of ``prepare imagenet-256``: the SD-VAE moments zip from the RGB zip, in work units.

**Units.** The latents are cut into work units of consecutive positions (:data:`~fgdata.prepare.build.UNIT_INPUTS`,
fewer when that would leave a torchrun rank without one: at most ``ceil(n / world)``); unit ``u`` belongs to
rank ``u mod world`` (:func:`fgdata.jobs.ranks.owner`). A unit encodes its positions into its own part zip,
``<folder>/.fgdata/zips/<zip>/parts/unitNNNNNN.zip`` (resumed after its last complete batch), then leaves its
typed :class:`~fgdata.jobs.units.Marker` (positions, options, the fingerprint of its RGB members' names and,
under ``--no-resume``, the launch) in ``.fgdata/zips/<zip>/units/``; its :class:`~fgdata.jobs.units.Plan` goes
there when it starts. A unit whose marker and part match is never encoded again.

**On the job core.** The pass is a :class:`LatentJob` that :func:`fgdata.jobs.driver.run_job` runs on every rank:
the engine gives each rank its units, keeps those whose marker matches (and whose part is complete:
:meth:`LatentJob.redo`), and makes rank 0 wait, bounded by ``FGDATA_WAIT_TIMEOUT``, for the other ranks'.

**The one zip.** An EDM zip is one file whose members are numbered over the whole dataset, so no unit writes it:
rank 0, after its own units, waits for every unit's marker (of these options; under ``--no-resume`` of this
launch), and then one step, :func:`_append_units` in the job's ``write_final``, appends the parts'
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
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.jobs.dest import remove_files
from fgdata.jobs.driver import Context, JobDefinition, RunSettings, run_job
from fgdata.jobs.executor import Executor
from fgdata.jobs.local import threaded_map
from fgdata.jobs.options import fingerprint as options_fingerprint
from fgdata.jobs.outputs import output_done, redoing
from fgdata.jobs.ranks import dist_env, owner, run_launch
from fgdata.jobs.report import FAILURES_FILE, Failure, Outputs, write_failures
from fgdata.jobs.signals import critical
from fgdata.jobs.summary import JobSummary
from fgdata.jobs.units import Marker, Plan, Totals, marker_path, start_unit
from fgdata.prepare import build
from fgdata.prepare.build import (ZipSummary, check_output, check_partial, clear, kept_summary, remove_job_folder,
                                  units_folder)
from fgdata.prepare.options import Fingerprint, LatentZipOptions
from fgdata.prepare.zipwriter import (EdmZipWriter, Provenance, ZipState, dataset_json_bytes, member_name,
                                      partial_paths, provenance_path, validate_zip)
from fgdata.progress import ProgressFn

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
                      options: LatentZipOptions = LatentZipOptions(), run: RunSettings = RunSettings(),
                      rank: int | None = None, world_size: int | None = None) -> ZipSummary:
    """Encode this rank's units of ``rgb_zip``; rank 0 then appends every unit's part into ``dest``.

    ``rank`` and ``world_size`` default to torchrun's environment (one process: rank 0 of 1). The job runs on
    :func:`fgdata.jobs.driver.run_job`: rank 0 holds the lock of ``dest``'s folder (another rank a lock of its
    own there), SIGINT/SIGTERM stop it with the unit's part kept for the rerun, existing outputs are kept,
    resumed or refused as :func:`fgdata.prepare.build.check_output` says, and rank 0 writes ``failures.json`` for
    the whole command (the RGB pass's failures, the latents written), whose counts its summary gives; another
    rank's summary is its share (the latents of its units).
    """
    env_rank, env_world = dist_env()
    rank = env_rank if rank is None else rank
    world = env_world if world_size is None else world_size
    job = LatentJob(Path(rgb_zip), Path(dest), options, rank, world)
    wait = run.wait_timeout if run.wait_timeout is not None else prepare_wait_s()
    run_job(job, replace(run, rank=rank, world=world, wait_timeout=wait))
    assert job.summary is not None  # summarize runs on every rank
    return job.summary


@dataclass(frozen=True)
class _Unit:
    """One latent work unit: positions ``first .. first + count - 1``, the fingerprint of its RGB members' names
    (``inputs``) and the part zip it encodes them into."""

    number: int
    first: int
    count: int
    inputs: str
    part: Path

    def facts(self) -> dict[str, Any]:
        """What the part's state and provenance record beside the fingerprint."""
        return {"unit": self.number, "start": self.first, "stop": self.first + self.count}


def unit_size(n: int, world: int) -> int:
    """Positions per latent unit: :data:`~fgdata.prepare.build.UNIT_INPUTS`, fewer when ``n`` is too small for
    every rank to own a unit."""
    return max(1, min(build.UNIT_INPUTS, -(-n // world)))


class LatentJob(JobDefinition[_Unit]):
    """The latent pass on :func:`~fgdata.jobs.driver.run_job`: ``execute`` encodes each pending unit of this rank
    into its part (:meth:`_encode_unit`) and leaves its marker; rank 0's ``write_final`` is the one step that
    writes the latent zip (:func:`_append_units`) and the command's ``failures.json``."""

    command = "prepare imagenet-256"
    owns_dest = False  # the data root: the RGB zip (the job's input) lives beside the latent zip
    relist = False
    others = "the other ranks' units"

    def __init__(self, rgb_zip: Path, dest: Path, options: LatentZipOptions, rank: int, world: int):
        self.rgb_zip, self.zip, self.options, self.rank, self.world = rgb_zip, dest, options, rank, world
        self.names, self.labels = _read_rgb_index(rgb_zip)
        n = len(self.names)
        # The RGB zip is named relative to the latent zip's folder: the same job in another data root is the same job.
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.fp = Fingerprint.of(options, dataset="imagenet-256", inputs=n, world_size=world,
                                 source=os.path.relpath(rgb_zip.resolve(), dest.parent.resolve()),
                                 source_size=rgb_zip.stat().st_size)
        self.options_fp = options_fingerprint({"latents": self.fp.record()})
        self.dest, self.folder = str(dest.parent), units_folder(dest)
        self.job_dir = (dest.parent / self.folder).parent
        self.size = unit_size(n, world)
        self.kept = False  # the latent zip is complete with these options: nothing runs
        self.summary: ZipSummary | None = None

    def fingerprint(self) -> str:
        return self.options_fp

    def launch(self, settings: RunSettings, world: int) -> str | None:
        return run_launch(settings.resume, prepare_wait_s())

    def mine(self) -> Iterator[_Unit]:
        """This rank's units (unit ``u`` is rank ``u mod world``'s, as the engine assigns them)."""
        return (u for u in self.units() if owner(u.number, self.world) == self.rank)

    def prepare(self, ctx: Context) -> None:
        """Keep a complete latent zip, clear what must go (rank 0), and check or clear this rank's parts."""
        run, n, dest = ctx.settings, len(self.names), self.zip
        if self.rank == 0:
            final = check_output(dest, self.fp, lambda info: validate_zip(dest, n, LATENT_STEM, LATENT_EXT),
                                 resume=run.resume, overwrite=run.overwrite)
            self.kept = final.kept is not None
            if not self.kept:
                clear([final, check_partial(dest, self.fp, resume=run.resume, overwrite=run.overwrite, merge=True)],
                      run.notify)
        elif run.resume and _complete(dest, n, self.fp):  # --no-resume: rank 0 is about to redo it
            self.kept = True
        if self.kept:
            return
        if run.resume:
            for u in self.mine():  # a partial part written with other options is refused, naming the option
                check_partial(u.part, self.fp, resume=True, **u.facts())
            return
        redoing(self.rank)  # the owner removes its earlier parts and markers, never another rank
        why = "--overwrite" if run.overwrite else "--no-resume"
        mine = list(self.mine())
        parts = [p.name for u in mine for p in (u.part, provenance_path(u.part), *partial_paths(u.part)) if p.exists()]
        remove_files(str(self.job_dir / "parts"), parts, why, run.notify)
        markers = [Path(marker_path(self.dest, u.number, self.folder)) for u in mine]
        remove_files(str(self.job_dir / "units"), [m.name for m in markers if m.exists()], why, None)

    def plan(self) -> Iterator[_Unit]:
        return iter(()) if self.kept else self.units()

    def units(self) -> Iterator[_Unit]:
        """Every unit of the pass, with its inputs' fingerprint (its positions and the RGB members' names)."""
        n = len(self.names)
        for u, first in enumerate(range(0, n, self.size)):
            count = min(self.size, n - first)
            h = hashlib.sha256()
            for j in range(first, first + count):
                h.update(f"{j}\t{self.names[j]}\n".encode("utf-8", "surrogateescape"))
            yield _Unit(u, first, count, h.hexdigest()[:32], self.job_dir / "parts" / f"unit{u:06d}.zip")

    def redo(self, marker: Marker) -> bool:
        """A unit whose marker matches is encoded again all the same when its part is not complete."""
        first, count = marker.first, marker.count
        return not _complete(self.job_dir / "parts" / f"unit{marker.unit:06d}.zip", count, self.fp, first=first,
                             unit=marker.unit, start=first, stop=first + count)

    def unit_name(self, number: int) -> str:
        return f"unit {number} (rank {owner(number, self.world)})"

    def execute(self, pending: Iterator[_Unit], executor: Executor, ctx: Context) -> Iterator[Marker]:
        """Load the VAE once (when a unit is left to encode), then encode each pending unit and leave its marker."""
        from fgdata.encode.vae import load_vae, vae_info

        if ctx.settings.on_start:
            ctx.settings.on_start(sum(u.count for u in self.mine()))
        first = next(pending, None)
        if first is None:
            return
        o = self.options
        model = load_vae(o.vae, device=o.device, dtype=o.dtype)
        info = {**vae_info(model, o.vae), "batch_size": o.batch_size, "device": str(next(model.parameters()).device)}
        launch = ctx.stamp[1]
        for u in chain([first], pending):
            start_unit(self.dest, Plan(u.number, u.first, u.count, self.options_fp, u.inputs, launch), self.folder)
            self._encode_unit(u, model, info, ctx)
            marker = Marker(unit=u.number, first=u.first, count=u.count, options=self.options_fp, inputs=u.inputs,
                            stamps=[], names=[], shards=[], written=u.count, failures=[], warnings=[],
                            launch=launch)  # the part: checked by :meth:`redo`
            with critical():
                storage.write_bytes(marker_path(self.dest, u.number, self.folder), marker.to_bytes())
            yield marker

    def _encode_unit(self, u: _Unit, model: Any, info: dict[str, Any], ctx: Context) -> None:
        """Encode unit ``u`` into its part, resuming after the part's last complete member."""
        from fgdata.encode.vae import encode_moments, npy_bytes

        record, batch_size = self.fp.record(**u.facts()), self.options.batch_size
        u.part.parent.mkdir(parents=True, exist_ok=True)
        writer = EdmZipWriter(u.part, ZipState(record))
        stop = u.first + u.count
        try:
            pos = u.first + writer.keep_valid_prefix(partial(_latent_name, u.first))
            ctx.progress(pos - u.first, 0)
            with zipfile.ZipFile(self.rgb_zip) as zf:
                # Members are read here, in order; the engine's threads decode up to two batches ahead of the
                # model, so decoding the next batch overlaps encoding this one.
                decoded = threaded_map(_decode, (zf.read(self.names[i]) for i in range(pos, stop)),
                                       ctx.settings.workers, ahead=2 * batch_size)
                for a in range(pos, stop, batch_size):
                    images = np.stack(list(islice(decoded, min(batch_size, stop - a))))
                    for k, moments in enumerate(encode_moments(model, images)):
                        writer.add(member_name(a + k, LATENT_STEM, LATENT_EXT), npy_bytes(moments))
                    writer.flush()  # the batch is complete on disk before the test hook may pause here
                    ctx.progress(len(images), 0)
                    output_done()
            writer.finish(None, {**record, **info, "launch": ctx.stamp[1]})
        finally:
            writer.close()

    def write_final(self, ctx: Context) -> Totals:
        """The one step that writes the latent zip: every unit's part appended in unit order, then the
        command's ``failures.json`` (the inputs the RGB pass failed count in it) and the parts and markers gone."""
        n, failures = len(self.names), self._rgb_failures()
        if self.kept:
            return Totals(inputs=n + len(failures), written=n, failed=len(failures))
        if ctx.settings.on_start:
            ctx.settings.on_start(n)
        parts = [u.part for u in self.units()]
        _append_units(parts, self.zip, self.names, self.labels, self.fp, ctx.progress)
        path = self.zip.parent / FAILURES_FILE
        write_failures(str(path), self.command, n + len(failures), n, [f.to_json() for f in failures],
                       Outputs(sorted({self.rgb_zip.name, self.zip.name})))
        remove_job_folder(self.job_dir)
        return Totals(inputs=n + len(failures), written=n, failed=len(failures))

    def summarize(self, summary: JobSummary, ctx: Context, totals: Totals | None) -> JobSummary:
        """This pass's :class:`ZipSummary`: the whole command's counts on rank 0, a rank's share elsewhere."""
        if totals is None:
            size = sum(u.count for u in self.mine())
            self.summary = ZipSummary(path=str(self.zip), seen=size, written=size, failed=0, failures_path=None,
                                      kept=self.kept, whole_job=False)
        elif self.kept:
            self.summary = kept_summary(self.zip, len(self.names), self._rgb_failures())
        else:
            self.summary = ZipSummary(path=str(self.zip), seen=totals.inputs, written=totals.written,
                                      failed=totals.failed, failures_path=str(self.zip.parent / FAILURES_FILE),
                                      seconds=ctx.seconds)
        return summary

    def _rgb_failures(self) -> tuple[Failure, ...]:
        """The inputs the RGB pass failed (they have no latent): they count in the command's report."""
        rgb = Provenance.read(self.rgb_zip)
        return rgb.failures if rgb is not None else ()


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
        pos = done = writer.keep_valid_prefix(lambda i: member_name(i, LATENT_STEM, LATENT_EXT))
        if progress:
            progress(done, 0)
        for p in parts:
            with zipfile.ZipFile(p) as zf:
                for name in zf.namelist():
                    index = int(name.rsplit(LATENT_STEM, 1)[1].split(".")[0])
                    if index >= pos:
                        writer.add(name, zf.read(name))
            if progress:
                progress(writer.count - done, 0)
                done = writer.count
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
