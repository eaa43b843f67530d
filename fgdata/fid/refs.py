"""The ``fid-refs`` job: feature moments per chunk, split over ranks, merged into the reference files.

It runs through the job core's one driver (:func:`fgdata.jobs.driver.run_job`) as :class:`RefsJob`, with the
output's work folder as its DST (its lock, ``.fgdata/``, and a file fgdata did not write there refused unless
``--overwrite``). Chunks are fixed ranges of the source's images (``chunk_size`` images, or whole shards),
independent of the number of ranks, and each chunk is a work unit: chunk ``c`` belongs to rank ``c mod world``,
which writes its moments to ``<work>/chunk-NNNNN.npz`` atomically and then leaves the unit's marker
``<work>/units/NNNNNN.json``: the job's fingerprint (input, weights' checksums, input transforms, batch size,
chunk size, device type), the chunk's own fingerprint and range, the chunk file with its size, the chunk's
undecodable images and, under ``--no-resume``, the launch (:func:`fgdata.jobs.ranks.run_launch`). A rerun keeps
every chunk the one resume rule keeps (:func:`fgdata.jobs.units.resumable`, against the chunk files the work
folder holds), whatever the world size was; a chunk file without a marker is computed again. The options a rerun
must match are also in ``<work>/job.json``, so a rerun with another byte option is refused naming the flag, as is
a complete output written with other options (``--no-resume`` or ``--overwrite`` compute again).

Rank 0 waits for every other rank's markers (the driver's wait; under ``--no-resume`` only this launch's), then,
as the job's final files (:meth:`RefsJob.write_final`), adds the chunks' moments in chunk order and writes the
output, its ``<out>.failures.json`` and its provenance; so one process, any number of ranks and any resumed run
give byte-identical files (the chunk sums are the same floats, added in the same order). Ranks coordinate through
these files only, as the other fgdata jobs do: no process group spans the pass, and the work folder must be
visible to every rank. The work folder is removed once the output is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fgdata import __version__, storage
from fgdata.catalog import (
    CIFAR10_ZIP,
    IMAGENET64_EDMV2_ZIP,
    IMAGENET64_ZIP,
    IMAGENET256_RGB_ZIP,
    resolve_data_root,
)
from fgdata.errors import FgdataError, OptionError
from fgdata.fid.detectors import DINOV2_DEFAULT, INCEPTION_DEFAULT, Detector
from fgdata.fid.images import Chunk, ImageSource, open_source
from fgdata.fid.stats import Moments, edm2_pkl_bytes, edm_npz_bytes, npz_bytes
from fgdata.jobs.dest import STATE_DIR
from fgdata.jobs.driver import Context, JobDefinition, RunSettings, markers_of
from fgdata.jobs.executor import Executor
from fgdata.jobs.options import RUNTIME, byte_options, check_record, check_same, fingerprint
from fgdata.jobs.report import Failure, Outputs, category, write_failures
from fgdata.jobs.summary import JobSummary, OutputSummary
from fgdata.jobs.units import (
    Entry,
    Marker,
    Plan,
    ShardDone,
    Totals,
    drop_markers_from,
    existing_markers,
    marker_path,
    start_unit,
)
from fgdata.progress import Notify, ProgressFn

FID_REFS_DIR = "fid-refs"
#: Name -> (dataset zip under the data root, the ``fgdata prepare`` target that makes it, reference file).
FID_REFS: dict[str, tuple[str, str, str]] = {
    "cifar10": (CIFAR10_ZIP, "cifar10", f"{FID_REFS_DIR}/cifar10-32x32.npz"),
    "imagenet-64": (IMAGENET64_ZIP, "imagenet-64", f"{FID_REFS_DIR}/imagenet-64x64.npz"),
    "imagenet-64-edmv2": (IMAGENET64_EDMV2_ZIP, "imagenet-64", f"{FID_REFS_DIR}/imagenet-64x64-edmv2.pkl"),
    "imagenet-256": (IMAGENET256_RGB_ZIP, "imagenet-256", f"{FID_REFS_DIR}/imagenet_256.pkl"),
}
#: Metrics per output format: EDM's npz holds Inception only, EDM2's pickle both.
FORMATS = {".npz": ("fid",), ".pkl": ("fid", "fd_dinov2")}
CHUNK_SIZE = 50_000
JOB_FORMAT = 1
ACCUMULATION = ("every image once, no xflip; uint8 RGB NCHW into the detector; features as float64; "
                "mu = sum(f) / n; sigma = (sum(f^T f) - n mu mu^T) / (n - 1)")


@dataclass(frozen=True)
class RefOptions:
    """Everything a run takes besides the input and output.

    The rule of :mod:`fgdata.jobs.options` holds: a field changes the statistics, and joins the job's
    fingerprint, unless it is declared ``RUNTIME`` (batch and chunk sizes set the order in which float sums are
    added). The detectors join the fingerprint by their weights' checksums and the device by its type, not by
    how they were named, so those fields are ``RUNTIME`` here.
    """

    inception: str = field(default=INCEPTION_DEFAULT, metadata=RUNTIME)
    dinov2: str = field(default=DINOV2_DEFAULT, metadata=RUNTIME)
    trust_pickle: bool = field(default=False, metadata=RUNTIME)
    device: str = field(default="auto", metadata=RUNTIME)
    batch_size: int = 128
    workers: int | None = field(default=None, metadata=RUNTIME)
    chunk_size: int = CHUNK_SIZE
    work_dir: str | None = field(default=None, metadata=RUNTIME)
    resume: bool = field(default=True, metadata=RUNTIME)  # keep a complete output and complete chunks of the same job
    # replace an output that fgdata did not write; compute every chunk again (what else is in the work folder goes)
    overwrite: bool = field(default=False, metadata=RUNTIME)
    wait_timeout: float | None = field(default=None, metadata=RUNTIME)


@dataclass(kw_only=True)
class RefResult(OutputSummary):
    """What one :func:`compute_refs` call did, in the counts every writing command reports.

    ``seen`` is every image of the source on rank 0 (which writes the output and ``<out>.failures.json``) and
    the rank's own share on the others; ``written`` are those in the statistics and ``failed`` those that could
    not be decoded. Of the images, ``computed`` ran through the detectors here and ``reused`` came from chunk
    files an earlier run left. ``provenance`` is the output's provenance record (None on ranks other than 0,
    which write none).
    """

    computed: int = 0
    reused: int = 0
    rank: int = 0
    world_size: int = 1
    provenance: dict[str, Any] | None = None

    @property
    def images_per_s(self) -> float | None:
        """Detector throughput of this process (None when it computed nothing)."""
        return round(self.computed / self.seconds, 1) if self.computed and self.seconds > 0 else None


def metrics_for(out: str) -> tuple[str, ...]:
    """The statistics an output name asks for: ``.npz`` -> Inception (EDM), ``.pkl`` -> Inception + DINOv2 (EDM2)."""
    ext = os.path.splitext(out)[1].lower()
    if ext not in FORMATS:
        raise OptionError(f"{out}: name the output .npz (EDM format, Inception) or .pkl (EDM2 format, Inception + DINOv2)")
    return FORMATS[ext]


def named_paths(name: str, data_root: str | os.PathLike[str] | None = None) -> tuple[Path, Path]:
    """(dataset zip, reference file) of a named dataset; a missing zip says which prepare makes it."""
    if name not in FID_REFS:
        raise FgdataError(f"unknown dataset {name!r}; choose one of {', '.join(FID_REFS)} or all")
    root = resolve_data_root(data_root)
    zip_rel, _prepare, out_rel = FID_REFS[name]
    return root / zip_rel, root / out_rel


class DetectorCache:
    """Detectors loaded once per process and shared by every output of a run (``all``)."""

    def __init__(self, options: RefOptions, device: str):
        self.options, self.device = options, device
        self._loaded: dict[str, Detector] = {}

    def get(self, metrics: tuple[str, ...]) -> dict[str, Detector]:
        from fgdata.fid.detectors import load_dinov2, load_inception

        for metric in metrics:
            if metric not in self._loaded:
                self._loaded[metric] = (
                    load_inception(self.options.inception, self.device, self.options.trust_pickle)
                    if metric == "fid" else load_dinov2(self.options.dinov2, self.device))
        return {m: self._loaded[m] for m in metrics}


def work_dir(out: str, given: str | None) -> str:
    """Where an output's chunk files live: its own folder in ``--work-dir`` (``fid-refs all`` passes one for every
    output, and one output's chunks must never take another's names), else beside a local output, else in the
    node cache (remote output)."""
    if given:
        return os.path.join(given, f"{storage.basename(out)}.chunks")
    if not storage.is_url(out):
        return f"{out}.chunks"
    from fgdata.storage.cache import cache_root

    return os.path.join(cache_root(), "fid-refs", hashlib.sha256(out.encode()).hexdigest()[:20])


UNITS = "units"
RECORD_FILE = "job.json"
RECORD_FORMAT = "fgdata.fid-refs.job"
RECORD_VERSION = 1
#: The record's name of each metric's detector: the flag that picks its weights.
DETECTOR_FLAGS = {"fid": "inception", "fd_dinov2": "dinov2"}


def _chunk_name(index: int) -> str:
    return f"chunk-{index:05d}.npz"


@dataclass(frozen=True)
class ChunkFile:
    """One chunk's moments on disk (``<work>/chunk-NNNNN.npz``, docs/FORMATS.md): ``n``, ``Σf`` and ``Σfᵀf`` per
    metric. What the chunk is and which job wrote it is in its unit's marker, which is written after the file."""

    moments: dict[str, Moments]

    def to_bytes(self) -> bytes:
        arrays: dict[str, np.ndarray] = {}
        for metric, m in self.moments.items():
            arrays.update({f"{metric}.n": np.array(m.n, np.int64), f"{metric}.s1": m.s1, f"{metric}.s2": m.s2})
        return npz_bytes(arrays)

    @classmethod
    def read(cls, path: str, metrics: tuple[str, ...]) -> ChunkFile | None:
        """The moments of ``metrics`` in the chunk at ``path`` (read from the file lazily: the sums of one chunk
        are tens of MB); None when it is missing, torn or lacks a metric."""
        import zipfile

        try:
            with np.load(path, allow_pickle=False) as z:
                return cls({m: Moments(int(z[f"{m}.n"]), z[f"{m}.s1"], z[f"{m}.s2"]) for m in metrics})
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
            return None


def _weights(provenance: dict[str, Any]) -> str:
    """A detector's weights as a rerun's refusal names them: each file with the start of its SHA-256."""
    files = provenance.get("files") or {}
    return ", ".join(f"{name} sha256:{digest[:12]}" for name, digest in sorted(files.items())) or \
        str(provenance.get("network"))


def _record_options(byte: dict[str, Any], device_type: str, detectors: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The options a rerun must match, under their flags' names: the byte options of :class:`RefOptions`, the
    device type and each detector's weights (``detectors``: metric -> the detector's provenance)."""
    return {**byte, "device": device_type, **{DETECTOR_FLAGS[m]: _weights(p) for m, p in detectors.items()}}


def _earlier_options(record: dict[str, Any], byte: dict[str, Any]) -> dict[str, Any]:
    """:func:`_record_options` of the run that wrote a complete output, read from its provenance."""
    detectors = record.get("detectors")
    return _record_options({k: record.get(k) for k in byte}, str(record.get("device")).split(":")[0],
                           detectors if isinstance(detectors, dict) else {})


def _shape_groups(batch: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Images of one shape per group, in order: shards may mix sizes, and each group runs as one tensor."""
    groups: dict[tuple[int, ...], list[np.ndarray]] = {}
    for arr in batch:
        groups.setdefault(arr.shape, []).append(arr)
    return list(groups.values())


def _compute_chunk(source: ImageSource, chunk: Chunk, detectors: dict[str, Detector], options: RefOptions,
                   device: str, tick: Callable[[int], None]) -> tuple[dict[str, Moments], list[Entry]]:
    """Moments of one chunk's features, accumulated in float64 on the detector's device, and the chunk's images
    that could not be decoded (with their index in the source)."""
    import torch

    from fgdata.compute import batches
    from fgdata.workers import default_workers

    sums = {m: [torch.zeros(d.dim, dtype=torch.float64, device=device),
                torch.zeros(d.dim, d.dim, dtype=torch.float64, device=device)] for m, d in detectors.items()}
    seen = 0
    failures: list[Entry] = []

    def decoded() -> Iterator[np.ndarray]:
        for index, item in enumerate(source.read(chunk, options.workers or default_workers()), chunk.start):
            if isinstance(item, Failure):
                failures.append(Entry(item.input, item.reason, index))
                tick(1)
            else:
                yield item

    with torch.inference_mode():
        for batch in batches(decoded(), options.batch_size):
            for group in _shape_groups(batch):
                images = torch.from_numpy(np.stack(group)).to(device)
                for metric, detector in detectors.items():
                    features = detector.run(images).to(torch.float64)
                    if tuple(features.shape) != (len(group), detector.dim):
                        raise FgdataError(f"{metric} detector returned features {tuple(features.shape)}, "
                                          f"expected {(len(group), detector.dim)}")
                    sums[metric][0] += features.sum(0)
                    sums[metric][1] += features.T @ features
            seen += len(batch)
            tick(len(batch))
    if seen + len(failures) != chunk.size:
        raise FgdataError(f"{source.path}: read {seen + len(failures)} images for images {chunk.start}.."
                          f"{chunk.stop - 1}, expected {chunk.size}")
    return {m: Moments(seen, s1.cpu().numpy(), s2.cpu().numpy()) for m, (s1, s2) in sums.items()}, failures


def _write_chunk(path: str, chunk: ChunkFile) -> int:
    """Write the chunk atomically; return its size in bytes (the marker records it)."""
    data = chunk.to_bytes()
    with storage.atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
    return len(data)


def provenance_path(out: str) -> str:
    return f"{out}.provenance.json"


def failures_path(out: str) -> str:
    """The output's failure report (one per reference: several share the fid-refs folder)."""
    return f"{out}.failures.json"


@dataclass(frozen=True)
class RefProvenance:
    """``<out>.provenance.json`` of a reference fgdata wrote, read back: the document as written, and the job
    fingerprint, image count and images left out as undecodable (absent in earlier versions: none) a rerun
    reads."""

    record: dict[str, Any]
    fingerprint: str
    images: int
    failed: int = 0

    @classmethod
    def parse(cls, data: bytes) -> RefProvenance | None:
        """The provenance in ``data``; None when it is torn, foreign or malformed."""
        try:
            doc = json.loads(data)
            return cls(doc, str(doc["fingerprint"]), int(doc["images"]), int(doc.get("failed", 0)))
        except (ValueError, KeyError, TypeError):
            return None


def _existing(out: str) -> RefProvenance | None:
    """The provenance of an existing output fgdata wrote; None when there is no output; raises when a file
    is there that fgdata did not write (a reference downloaded or made by another tool)."""
    if not storage.exists(out):
        return None
    try:
        info = RefProvenance.parse(storage.read_bytes(provenance_path(out)))
    except (OSError, FgdataError):
        info = None
    if info is None:
        raise FgdataError(f"{out} exists and fgdata did not write it (no {storage.basename(provenance_path(out))} "
                          "beside it); pass --overwrite to replace it, or choose another output")
    return info


@dataclass(frozen=True)
class _RefJob:
    """One output's job, as every step after the planning sees it: the source and its chunks, the detectors, the
    job's fingerprint and each chunk's, the options record a rerun must match, this rank's place and the work
    folder with this launch's identity."""

    source_path: str
    out: str
    name: str | None
    options: RefOptions
    source: ImageSource
    metrics: tuple[str, ...]
    dets: dict[str, Detector]
    device: str
    identity: dict[str, Any]
    fp: str
    record: dict[str, Any]
    rank: int
    world: int

    @property
    def label(self) -> str:
        """The name progress shows: the dataset's, else the output's."""
        return self.name or storage.basename(self.out)

    def chunks(self) -> list[Chunk]:
        return self.source.chunks(self.options.chunk_size)

    def chunk_fingerprints(self, chunks: list[Chunk]) -> dict[int, str]:
        """Each chunk's own fingerprint: the job's identity and the chunk's range."""
        return {c.index: fingerprint({**self.identity, "chunk": [c.start, c.stop]}) for c in chunks}


def _plan(source_path: str, out: str, options: RefOptions, detectors: dict[str, Detector] | DetectorCache | None,
          name: str | None, rank: int | None, world_size: int | None) -> _RefJob:
    """Check the flags and the paths, open the source, load (or take) the detectors and fingerprint the job."""
    from fgdata.compute import resolve_device
    from fgdata.jobs.dest import check_sources
    from fgdata.jobs.ranks import dist_env
    from fgdata.workers import default_workers

    check_sources(out, [source_path])  # --overwrite replaces OUT: never the images it reads
    metrics = metrics_for(out)
    env_rank, env_world = dist_env()
    if options.batch_size < 1 or options.chunk_size < 1:
        raise OptionError("--batch-size and --chunk-size must be positive")
    device = resolve_device(options.device)
    source = open_source(source_path, workers=options.workers or default_workers())
    if detectors is None:
        detectors = DetectorCache(options, device)
    dets = detectors.get(metrics) if isinstance(detectors, DetectorCache) else {m: detectors[m] for m in metrics}
    device_type = device.split(":")[0]
    identity: dict[str, Any] = {"job": JOB_FORMAT, "source": source.identity(), "metrics": list(metrics),
                "detectors": {m: d.identity for m, d in dets.items()}, "device_type": device_type,
                **byte_options(options)}
    record = _record_options(byte_options(options), device_type, {m: d.provenance for m, d in dets.items()})
    return _RefJob(source_path=source_path, out=out, name=name, options=options, source=source, metrics=metrics,
                   dets=dets, device=device, identity=identity, fp=fingerprint(identity), record=record,
                   rank=env_rank if rank is None else rank, world=env_world if world_size is None else world_size)


def _kept_output(job: _RefJob) -> RefResult | None:
    """The result of a complete output of this same job, kept as it is (None: compute it); a complete output
    written with other options is refused naming the option, unless ``--no-resume`` or ``--overwrite``."""
    if job.options.overwrite:
        return None
    kept = _existing(job.out)
    if not job.options.resume or kept is None:
        return None
    if kept.fingerprint != job.fp:
        check_same(job.out, _earlier_options(kept.record, byte_options(job.options)), job.record)
        return None
    report = failures_path(job.out)
    return RefResult(path=job.out, seen=kept.images, written=kept.images - kept.failed, failed=kept.failed,
                     failures_path=report if storage.exists(report) else None, kept=True, rank=job.rank,
                     world_size=job.world, provenance=kept.record)


def _check_record(job: _RefJob, work: str, resume: bool) -> None:
    """The work folder's job record checked (a rerun with another byte option is refused naming the flag) or
    written."""
    earlier = existing_markers(work, UNITS)
    check_record(storage.join(work, RECORD_FILE), work,
                 {"format": RECORD_FORMAT, "version": RECORD_VERSION, "command": "fid-refs", "options": job.record},
                 resume and bool(earlier), True,  # every rank: the same bytes
                 "written by an earlier fgdata version; rerun with --no-resume to compute it again")


@dataclass(frozen=True)
class ChunkUnit:
    """One work unit: chunk ``number`` of the source, and its fingerprint (the job's identity and its range)."""

    number: int
    inputs: str
    chunk: Chunk


def _compute_unit(job: _RefJob, work: str, unit: ChunkUnit, launch: str | None,
                  tick: Callable[[int], None]) -> Marker:
    """One unit: its start recorded, the chunk's moments computed and written, then its marker."""
    chunk = unit.chunk
    start_unit(work, Plan(chunk.index, chunk.start, chunk.size, job.fp, unit.inputs, launch), UNITS)
    moments, undecoded = _compute_chunk(job.source, chunk, job.dets, job.options, job.device, tick)
    file = _chunk_name(chunk.index)
    summed = chunk.size - len(undecoded)
    size = _write_chunk(os.path.join(work, file), ChunkFile(moments))
    marker = Marker(unit=chunk.index, first=chunk.start, count=chunk.size, options=job.fp, inputs=unit.inputs,
                    stamps=[], names=[], shards=[ShardDone(file, summed, size)], written=summed, failures=undecoded,
                    warnings=[], launch=launch)
    storage.write_bytes(marker_path(work, chunk.index, UNITS), marker.to_bytes())
    return marker


def _sum_chunks(job: _RefJob, work: str, chunks: list[Chunk], markers: Iterable[Marker]) -> tuple[dict[str, Moments], list[Failure]]:
    """Every chunk's moments added in chunk order (the same floats in the same order, whoever computed them), and
    the images left out; a chunk file that does not match its marker loses the marker, so a rerun computes it."""
    totals = {m: Moments.zeros(d.dim) for m, d in job.dets.items()}
    failures: list[Failure] = []
    for chunk, marker in zip(chunks, markers, strict=True):
        assert marker.unit == chunk.index  # the driver hands every unit's marker, in unit order
        path = os.path.join(work, marker.shards[0].name)
        part = ChunkFile.read(path, job.metrics)
        if part is None or any(m.n != marker.written for m in part.moments.values()):
            storage.remove(marker_path(work, chunk.index, UNITS))  # so that the rerun computes it again
            raise FgdataError(f"{path}: unreadable or not what its marker says; rerun to compute it again")
        for metric in job.metrics:
            totals[metric].add(part.moments[metric])
        failures += [Failure(f.input, f.reason) for f in marker.failures]
    return totals, failures


def _write_output(job: _RefJob, totals: dict[str, Moments], failures: list[Failure], chunks: int) -> dict[str, Any]:
    """The failure report, the reference file and its provenance (written last: it marks the output complete);
    returns the provenance."""
    source = job.source
    written = source.count - len(failures)
    for metric, m in totals.items():
        if m.n != written:
            raise FgdataError(f"{job.source_path}: {metric} saw {m.n} images, the source holds {written} it can decode")
    report = failures_path(job.out)
    write_failures(report, "fid-refs", source.count, written, [f.to_json() for f in failures],
                   Outputs([storage.basename(job.out)]))
    if written < 2:
        raise FgdataError(f"{job.source_path}: {written} of {source.count} images could be decoded; FID statistics "
                          f"need at least 2 (reasons in {report})")
    stats = {metric: m.mu_sigma() for metric, m in totals.items()}
    edm = job.metrics == FORMATS[".npz"]
    data = edm_npz_bytes(*stats["fid"]) if edm else edm2_pkl_bytes(stats)
    storage.write_bytes(job.out, data)
    provenance = {
        "format": "edm-npz" if edm else "edm2-pkl",
        "dataset": job.name, "source": source.identity(), "images": source.count, "failed": len(failures),
        "detectors": {m: d.provenance for m, d in job.dets.items()}, "accumulation": ACCUMULATION,
        "batch_size": job.options.batch_size, "device": job.device, "world_size": job.world,
        "chunk_size": job.options.chunk_size, "chunks": chunks, "fingerprint": job.fp,
        "sha256": hashlib.sha256(data).hexdigest(), "fgdata_version": __version__,
    }  # no timings: the same inputs and options give the same bytes (the summary says how long it took)
    storage.write_bytes(provenance_path(job.out), json.dumps(provenance, indent=1, sort_keys=True).encode())
    return provenance



class RefsJob(JobDefinition[ChunkUnit]):
    """One output's job on the one driver (:func:`fgdata.jobs.driver.run_job`): DST is the work folder, each chunk
    a unit whose output is its ``chunk-NNNNN.npz``; the final files are the reference, its failure report and its
    provenance beside ``out``, not the driver's ``shard_count.json``/``failures.json``.

    The units run in this process, one after another: the detectors are loaded here on this rank's device, and a
    pool would load them once per worker to share the one accelerator."""

    command = "fid-refs"
    folder = UNITS
    others = ""  # the wait names the work folder: "waiting for OUT.chunks: N missing"

    def __init__(self, job: _RefJob, work: str):
        self.job, self.dest = job, work
        self.chunks = job.chunks()
        self.chunk_fp = job.chunk_fingerprints(self.chunks)
        self.computed = 0
        self.result: RefResult | None = None
        self.provenance: dict[str, Any] | None = None

    def kept_inputs(self) -> list[str]:
        """What an earlier run of this job left in the work folder is fgdata's own (the only other content is
        foreign)."""
        if not storage.is_dir(self.dest):
            return []
        return [n for n in storage.list_names(self.dest) if n in (UNITS, RECORD_FILE) or _CHUNK.fullmatch(n)]

    def fingerprint(self) -> str:
        return self.job.fp

    def launch(self, settings: RunSettings, world: int) -> str | None:
        from fgdata.jobs.ranks import run_launch

        return run_launch(settings.resume, settings.wait_timeout)

    def prepare(self, ctx: Context) -> None:
        """``--overwrite`` removes what fgdata did not write in the work folder (rank 0, saying so); the job record
        is checked (a rerun with another byte option is refused) or written."""
        from fgdata.jobs.dest import check_foreign
        from fgdata.jobs.outputs import redoing

        if not ctx.resume:
            redoing(ctx.rank)
        check_foreign(self.dest, self.kept_inputs(), overwrite=ctx.settings.overwrite and ctx.rank == 0,
                      notify=ctx.notify)
        _check_record(self.job, self.dest, ctx.resume)

    def plan(self) -> Iterator[ChunkUnit]:
        for chunk in self.chunks:
            yield ChunkUnit(chunk.index, self.chunk_fp[chunk.index], chunk)

    def unit_outputs(self, ctx: Context) -> dict[str, tuple[int, str]]:
        return {i.name: (i.size, i.version) for i in storage.list_dir(self.dest, ".npz")}

    def execute(self, pending: Iterator[ChunkUnit], executor: Executor, ctx: Context) -> Iterator[Marker]:
        from fgdata.jobs.outputs import output_done
        from fgdata.jobs.ranks import owned

        if ctx.settings.on_start:
            ctx.settings.on_start(sum(c.size for c in owned(self.chunks, ctx.rank, ctx.world)))
        for unit in pending:
            yield _compute_unit(self.job, self.dest, unit, ctx.stamp[1], ctx.progress)
            output_done()

    def count(self, marker: Marker, ctx: Context, fresh: bool | None) -> None:
        self.computed += marker.count if fresh else 0

    def unit_name(self, number: int) -> str:
        return _chunk_name(number)

    def write_final(self, ctx: Context) -> Totals:
        totals, failures = _sum_chunks(self.job, self.dest, self.chunks, markers_of(ctx))
        self.provenance = _write_output(self.job, totals, failures, ctx.units)
        written = self.job.source.count - len(failures)
        return Totals(inputs=self.job.source.count, written=written, failed=len(failures),
                      failed_by_reason=Counter(category(f.reason) for f in failures))

    def summarize(self, summary: JobSummary, ctx: Context, totals: Totals | None) -> JobSummary:
        whole = totals is not None
        self.result = RefResult(path=self.job.out, seen=summary.seen, written=summary.written, failed=summary.failed,
                                failures_path=failures_path(self.job.out) if whole else None, computed=self.computed,
                                reused=ctx.resumed, rank=ctx.rank, world_size=ctx.world, seconds=ctx.seconds,
                                whole_job=whole, provenance=self.provenance)
        return summary


_CHUNK = re.compile(r"chunk-\d{5}\.npz")


def compute_refs(source_path: str, out: str, options: RefOptions | None = None, *,
                 detectors: dict[str, Detector] | DetectorCache | None = None, name: str | None = None,
                 rank: int | None = None, world_size: int | None = None, progress: ProgressFn | None = None,
                 on_start: Callable[[int | None], None] | None = None, notify: Notify | None = None) -> RefResult:
    """Reference statistics of every image of ``source_path`` into ``out`` (``.npz`` EDM or ``.pkl`` EDM2).

    ``detectors`` maps metric -> :class:`Detector` (tests pass tiny ones) or is a shared cache; by default they
    load from ``options``. ``progress(images, 0)`` counts this rank's images as they are done (or kept), after
    ``on_start`` got their number; ``notify`` gets rank 0's line when it starts waiting for other ranks' chunks.
    On ranks other than 0 the result covers only that rank's chunks.
    """
    from fgdata.jobs.driver import RunSettings, run_job

    options = options or RefOptions()
    job = _plan(source_path, out, options, detectors, name, rank, world_size)
    kept = _kept_output(job)
    if kept is not None:
        return kept
    definition = RefsJob(job, work_dir(out, options.work_dir))
    run_job(definition, RunSettings(resume=options.resume, overwrite=options.overwrite,
                                    wait_timeout=options.wait_timeout, rank=job.rank, world=job.world,
                                    progress=progress, notify=notify, log=notify, on_start=on_start))
    assert definition.result is not None  # summarize runs on every rank
    if definition.result.whole_job:
        _clean(definition.dest)
    return definition.result


def _clean(work: str) -> None:
    """Remove the work folder's markers, chunk files, job record and job state (its lock), and the folder itself
    when nothing else is in it."""
    drop_markers_from(work, 0, UNITS)
    for info in storage.list_dir(work, ".npz"):
        if _CHUNK.fullmatch(info.name):
            storage.remove(os.path.join(work, info.name))
    storage.remove(storage.join(work, RECORD_FILE))
    storage.remove_tree(storage.join(work, STATE_DIR))
    for folder in (os.path.join(work, UNITS), work):
        with contextlib.suppress(OSError):
            os.rmdir(folder)
