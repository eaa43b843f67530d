"""The ``fid-refs`` job: feature moments per chunk, split over ranks, merged into the reference files.

Chunks are fixed ranges of the source's images (``chunk_size`` images, or whole shards), independent of the
number of ranks, and each chunk is a work unit of the job core (:mod:`fgdata.jobs.units`): chunk ``c`` belongs
to rank ``c mod world``, which writes its moments to ``<work>/chunk-NNNNN.npz`` atomically and then leaves the
unit's marker ``<work>/units/NNNNNN.json``: the job's fingerprint (input, weights' checksums, input transforms,
batch size, chunk size, device type), the chunk's own fingerprint and range, the chunk file with its size, the
chunk's undecodable images and, under ``--no-resume``, the launch (:func:`fgdata.jobs.ranks.run_launch`). A
rerun keeps every chunk the one resume rule keeps (:func:`fgdata.jobs.units.resumable`), whatever the world size
was; a chunk file without a marker is computed again. The options a rerun must match are also in
``<work>/job.json``, so a rerun with another byte option is refused naming the flag, as is a complete output
written with other options (``--no-resume`` or ``--overwrite`` compute again).

Rank 0 waits for every other rank's markers (:func:`fgdata.jobs.units.wait_for_units`; under ``--no-resume``
only this launch's), adds the chunks' moments in chunk order and writes the output and its provenance; so one
process, any number of ranks and any resumed run give byte-identical files (the chunk sums are the same floats,
added in the same order). Ranks coordinate through these files only, as the other fgdata jobs do: no process
group spans the pass, and the work folder must be visible to every rank.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
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
from fgdata.jobs.options import RUNTIME, byte_options, check_record, check_same, fingerprint
from fgdata.jobs.report import Failure, Outputs, write_failures
from fgdata.jobs.summary import OutputSummary
from fgdata.jobs.units import (
    Entry,
    Marker,
    Plan,
    ShardDone,
    drop_markers_from,
    existing_markers,
    is_final,
    is_started,
    listed_sizes,
    marker_path,
    read_marker,
    resumable,
    start_unit,
    stat_sizes,
    wait_for_units,
)

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

ProgressFn = Callable[[str, int, int], None]


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
    overwrite: bool = field(default=False, metadata=RUNTIME)  # replace an output that fgdata did not write
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
    identity = {"job": JOB_FORMAT, "source": source.identity(), "metrics": list(metrics),
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


def _open_work(job: _RefJob) -> tuple[str, set[int]]:
    """The work folder, with its job record checked (or written), and the units an earlier run left markers for."""
    options = job.options
    work = work_dir(job.out, options.work_dir)
    storage.make_dirs(work)
    earlier = existing_markers(work, UNITS)
    check_record(storage.join(work, RECORD_FILE), work,
                 {"format": RECORD_FORMAT, "version": RECORD_VERSION, "command": "fid-refs", "options": job.record},
                 options.resume and not options.overwrite and bool(earlier), True,  # every rank: the same bytes
                 "written by an earlier fgdata version; rerun with --no-resume to compute it again")
    return work, earlier


@dataclass
class _Share:
    """What this rank did with the chunks it owns: their markers (by chunk), and the images computed here, taken
    from an earlier run's chunk files and left out as undecodable."""

    markers: dict[int, Marker]
    total: int
    computed: int = 0
    reused: int = 0
    failed: int = 0


def _run_own_chunks(job: _RefJob, work: str, earlier: set[int], launch: str | None, chunks: list[Chunk],
                    chunk_fp: dict[int, str], progress: ProgressFn | None) -> _Share:
    """Each chunk this rank owns: kept when an earlier run's marker passes the one resume rule, else computed,
    its file written and then its marker."""
    from fgdata.jobs.outputs import output_done
    from fgdata.jobs.ranks import owned

    options = job.options
    size_of = listed_sizes({i.name: (i.size, i.version) for i in storage.list_dir(work, ".npz")})
    mine = owned(chunks, job.rank, job.world)
    share = _Share({}, sum(c.size for c in mine))
    done = 0
    phase = job.label if job.world == 1 else f"{job.label} rank {job.rank}"

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(phase, done, share.total)

    for chunk in mine:
        marker = read_marker(work, chunk.index, UNITS) if options.resume and chunk.index in earlier else None
        if marker is not None and marker.inputs == chunk_fp[chunk.index] and resumable(marker, job.fp, size_of):
            share.reused += chunk.size
            tick(chunk.size)
        else:
            marker = _compute_unit(job, work, chunk, chunk_fp[chunk.index], launch, tick)
            share.computed += chunk.size
            output_done()
        share.failed += len(marker.failures)
        share.markers[chunk.index] = marker
    return share


def _compute_unit(job: _RefJob, work: str, chunk: Chunk, chunk_fp: str, launch: str | None,
                  tick: Callable[[int], None]) -> Marker:
    """One unit: its start recorded, the chunk's moments computed and written, then its marker."""
    start_unit(work, Plan(chunk.index, chunk.start, chunk.size, job.fp, chunk_fp, launch), UNITS)
    moments, undecoded = _compute_chunk(job.source, chunk, job.dets, job.options, job.device, tick)
    file = _chunk_name(chunk.index)
    summed = chunk.size - len(undecoded)
    size = _write_chunk(os.path.join(work, file), ChunkFile(moments))
    marker = Marker(unit=chunk.index, first=chunk.start, count=chunk.size, options=job.fp, inputs=chunk_fp,
                    stamps=[], names=[], shards=[ShardDone(file, summed, size)], written=summed, failures=undecoded,
                    warnings=[], launch=launch)
    storage.write_bytes(marker_path(work, chunk.index, UNITS), marker.to_bytes())
    return marker


def _sum_chunks(job: _RefJob, work: str, chunks: list[Chunk],
                markers: dict[int, Marker]) -> tuple[dict[str, Moments], list[Failure]]:
    """Every chunk's moments added in chunk order (the same floats in the same order, whoever computed them), and
    the images left out; a chunk file that does not match its marker loses the marker, so a rerun computes it."""
    totals = {m: Moments.zeros(d.dim) for m, d in job.dets.items()}
    failures: list[Failure] = []
    for chunk in chunks:
        marker = markers[chunk.index]
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


def compute_refs(source_path: str, out: str, options: RefOptions | None = None, *,
                 detectors: dict[str, Detector] | DetectorCache | None = None, name: str | None = None,
                 rank: int | None = None, world_size: int | None = None, progress: ProgressFn | None = None,
                 notify: Callable[[str], None] | None = None) -> RefResult:
    """Reference statistics of every image of ``source_path`` into ``out`` (``.npz`` EDM or ``.pkl`` EDM2).

    ``detectors`` maps metric -> :class:`Detector` (tests pass tiny ones) or is a shared cache; by default they
    load from ``options``. ``notify`` gets rank 0's line when it starts waiting for other ranks' chunks. On ranks
    other than 0 the result covers only that rank's chunks.
    """
    from fgdata.jobs.outputs import redoing
    from fgdata.jobs.ranks import run_launch

    options = options or RefOptions()
    job = _plan(source_path, out, options, detectors, name, rank, world_size)
    kept = _kept_output(job)
    if kept is not None:
        return kept
    launch = run_launch(options.resume, options.wait_timeout)
    if not options.resume:
        redoing(job.rank)
    began = time.monotonic()
    work, earlier = _open_work(job)
    chunks = job.chunks()
    chunk_fp = job.chunk_fingerprints(chunks)
    share = _run_own_chunks(job, work, earlier, launch, chunks, chunk_fp, progress)
    result = RefResult(path=out, seen=share.total, written=share.total - share.failed, failed=share.failed,
                       failures_path=None, computed=share.computed, reused=share.reused, rank=job.rank,
                       world_size=job.world, seconds=time.monotonic() - began, whole_job=False)
    if job.rank != 0:
        return result

    markers = share.markers
    now = stat_sizes(work)
    wait_for_units(work, [c.index for c in chunks if c.index not in markers],
                   (lambda m: is_final(m, (job.fp, launch), chunk_fp[m.unit], options.resume, now),
                    lambda p: is_started(p, (job.fp, launch), chunk_fp[p.unit])),
                   lambda m: markers.update({m.unit: m}), job.world, work, options.wait_timeout, notify,
                   folder=UNITS, name=_chunk_name)
    totals, failures = _sum_chunks(job, work, chunks, markers)
    provenance = _write_output(job, totals, failures, len(chunks))
    _clean(work)
    written = job.source.count - len(failures)
    return replace(result, seen=job.source.count, written=written, failed=len(failures),
                   failures_path=failures_path(out), whole_job=True, provenance=provenance)


def _clean(work: str) -> None:
    """Remove the work folder's markers, chunk files and job record, and the folder itself when nothing else is
    in it."""
    drop_markers_from(work, 0, UNITS)
    for info in storage.list_dir(work, ".npz"):
        if re.fullmatch(r"chunk-\d{5}\.npz", info.name):
            storage.remove(os.path.join(work, info.name))
    storage.remove(storage.join(work, RECORD_FILE))
    for folder in (os.path.join(work, UNITS), work):
        with contextlib.suppress(OSError):
            os.rmdir(folder)
