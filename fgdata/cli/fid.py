"""``fgdata fid-refs``: FID reference statistics of the prepared datasets.

Only typer and the standard library load at import; torch, transformers and the readers load inside the command.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fgdata.cli.flaggroups import flag, flag_groups
from fgdata.cli.options import OutputFlags, TorchrunJobFlags, quiet_model_libraries

if TYPE_CHECKING:
    from fgdata.cli.jobrun import Outcome
    from fgdata.fid.refs import RefOptions, RefResult

NAMES = ("cifar10", "imagenet-64", "imagenet-64-edmv2", "imagenet-256", "all")


@dataclass(frozen=True, kw_only=True)
class RefFlags:
    """What ``fid-refs`` reads and writes."""

    data_root: Path | None = flag(typer.Option(None, "--data-root", help="Data root (default $DATA_ROOT_DIR); "
                                                   "zips are read from it, references written to its fid-refs/."))
    dataset_zip: str | None = flag(typer.Option(None, "--dataset-zip", help="Any EDM zip or image folder (local or "
                                                    "s3://), or WDS:<shard dir or s3 prefix>."))
    output: str | None = flag(typer.Option(None, "-o", "--output", help="With --dataset-zip: the reference file, "
                                               ".npz (EDM, Inception) or .pkl (EDM2, Inception + DINOv2); local or "
                                               "s3://."))


@dataclass(frozen=True, kw_only=True)
class DetectorFlags:
    """The detectors ``fid-refs`` runs, and how."""

    inception: str | None = flag(typer.Option(None, "--inception", help="Inception-v3 FID weights: a .pth state "
                                                  "dict or .safetensors (path, URL or hub id owner/repo/file). "
                                                  "Default: the ported TF weights pytorch-fid uses."))
    dinov2: str | None = flag(typer.Option(None, "--dinov2", help="DINOv2 hub id or save_pretrained directory "
                                               "(default facebook/dinov2-large)."))
    trust_pickle: bool = flag(typer.Option(False, "--trust-pickle", help="Allow a pickled detector for --inception "
                                           "(the official .pkl); unpickling runs code from the file."))
    device: str = flag(typer.Option("auto", "--device",
                                    help="auto, cpu or cuda (this rank's LOCAL_RANK GPU under torchrun)."))
    batch_size: int = flag(typer.Option(128, "--batch-size", help="Images per detector call."))
    workers: int | None = flag(typer.Option(None, "--workers", help="Decode threads (default: all cores)."))
    chunk_size: int = flag(typer.Option(50_000, "--chunk-size",
                                        help="Images per resumable chunk (shards: whole shards)."))
    work_dir: str | None = flag(typer.Option(None, "--work-dir", help="Chunk files, in a folder per output "
                                                 "(default: OUT.chunks beside a local OUT; must be "
                                                 "shared by all ranks)."))

    def options(self, job: TorchrunJobFlags) -> RefOptions:
        """The library's options; a weights flag left out means the library's default weights."""
        from fgdata.fid.detectors import DINOV2_DEFAULT, INCEPTION_DEFAULT
        from fgdata.fid.refs import RefOptions

        return RefOptions(inception=self.inception or INCEPTION_DEFAULT, dinov2=self.dinov2 or DINOV2_DEFAULT,
                          trust_pickle=self.trust_pickle, device=self.device, batch_size=self.batch_size,
                          workers=self.workers, chunk_size=self.chunk_size, work_dir=self.work_dir,
                          resume=job.resume, overwrite=job.overwrite, wait_timeout=job.wait_timeout)


@flag_groups
def fid_refs(
    dataset: str | None = typer.Argument(None, help=f"{', '.join(NAMES)}; or use --dataset-zip with -o."),
    *,
    refs: RefFlags,
    detect: DetectorFlags,
    job: TorchrunJobFlags,
    out: OutputFlags,
) -> None:
    """Compute FID reference statistics (Inception-v3 mu/sigma; DINOv2 too for EDM2 .pkl files).

    Every image once, no flip, features summed in float64. Outputs under $DATA_ROOT_DIR/fid-refs/:
    cifar10-32x32.npz, imagenet-64x64.npz, imagenet-64x64-edmv2.pkl, imagenet_256.pkl, each with a
    .provenance.json naming the weights and their SHA-256. Resumes per chunk; under torchrun the ranks split
    the chunks.

    Example: fgdata fid-refs cifar10 --device cuda ;
    torchrun --nproc-per-node 8 -m fgdata fid-refs imagenet-256 --device cuda ;
    fgdata fid-refs --dataset-zip WDS:s3://bucket/shards -o refs.pkl
    """
    from fgdata.fid.refs import FID_REFS, DetectorCache, compute_refs, metrics_for, named_paths
    from fgdata.prepare.paths import resolve_data_root

    if (dataset is None) == (refs.dataset_zip is None):
        raise typer.BadParameter(f"give a dataset name ({', '.join(NAMES)}) or --dataset-zip Z -o OUT")
    if refs.dataset_zip is not None and refs.output is None:
        raise typer.BadParameter("--dataset-zip needs -o OUT (.npz or .pkl)")
    if refs.output is not None:
        metrics_for(refs.output)  # a wrong extension fails before any model loads
    if dataset is not None and dataset not in NAMES:
        raise typer.BadParameter(f"unknown dataset {dataset!r}; choose one of {', '.join(NAMES)}")
    options = detect.options(job)

    jobs: list[tuple[str | None, str, str]] = []
    missing: list[str] = []
    if refs.dataset_zip is not None:
        jobs.append((None, refs.dataset_zip, str(refs.output)))
    else:
        names = list(FID_REFS) if dataset == "all" else [str(dataset)]
        for name in names:
            zip_path, target = named_paths(name, refs.data_root)
            if zip_path.is_file():
                jobs.append((name, str(zip_path), str(target)))
            else:
                missing.append(f"{zip_path} (fgdata prepare {FID_REFS[name][1]})")
        if missing and (dataset != "all" or not jobs):
            from fgdata.errors import FgdataError

            raise FgdataError(f"dataset zip not found: {'; '.join(missing)}")
    from fgdata.cli.jobrun import JobBar, finish, notes, run_job
    from fgdata.cli.render import progress
    from fgdata.compute import resolve_device
    from fgdata.distributed import env_rank_world

    bars = out.bars
    quiet_model_libraries(bars=bars, quiet=out.quiet)
    say = notes(out.quiet)
    if say:
        from fgdata import storage

        for skipped in missing:
            say(f"skipped {skipped}")
        for _, _, dest in jobs if job.overwrite else []:
            if storage.exists(dest):
                say(f"replacing {dest} (--overwrite)")
    cache = DetectorCache(options, resolve_device(options.device))
    started = time.perf_counter()
    rank, world = env_rank_world()

    def run_all() -> list[RefResult]:
        """One bar per output (its images on this rank), each job stopped cleanly by SIGINT/SIGTERM."""
        done = []
        with progress(enabled=bars) as shown:
            for name, src, target in jobs:
                label = name or Path(target).name
                bar = JobBar(shown, label if world == 1 else f"{label} rank {rank}", None)
                done.append(compute_refs(src, target, options, detectors=cache, name=name, progress=bar.advance,
                                         on_start=bar.total, notify=say))
        return done

    results = run_job(run_all)
    if len(jobs) == 1:
        source, output = jobs[0][1], jobs[0][2]
    else:
        source, output = str(resolve_data_root(refs.data_root)), str(Path(jobs[0][2]).parent)
    finish(_outcome(results, missing, source, output, time.perf_counter() - started),
           quiet=out.quiet, json_out=out.json_out)


def _outcome(results: list[RefResult], missing: list[str], source: str, output: str, seconds: float) -> Outcome:
    """The summary every writing command prints: each image of the sources is an input, written once its features
    are in the reference (computed now, taken from an earlier run's chunks, or in an output kept as it was), failed
    when it cannot be decoded (listed in the output's ``.failures.json``). On a torchrun rank other than 0 the
    counts are that rank's share and rank 0 reports the job."""
    from fgdata.cli.jobrun import Outcome

    rank, world = results[0].rank, results[0].world_size
    rows: list[tuple[str, str]] = []
    if rank != 0:
        rows.append(("rank", f"{rank} of {world} (its share only)"))
    for r in results:
        rows.append(("kept" if r.kept else "wrote" if rank == 0 else "chunks for", r.path))
        if not r.kept:
            rate = f", {r.images_per_s:,.0f} img/s" if r.images_per_s else ""
            rows.append(("  images", f"{r.seen:,} ({r.computed:,} computed here{rate})"))
        if r.failed and r.failures_path and len(results) > 1:
            rows.append(("  failures", r.failures_path))
    if all(r.kept for r in results):
        rows.append(("", "complete: --no-resume recomputes"))
    rows += [("skipped", m) for m in missing]
    details: dict[str, Any] = {
        "outputs": [{"path": r.path, "images": r.seen, "failed": r.failed, "computed": r.computed,
                     "reused": r.reused, "kept": r.kept, "images_per_s": r.images_per_s,
                     "failures_file": r.failures_path} for r in results],
        "skipped": missing}
    if rank != 0:
        details |= {"rank": rank, "world": world}
    return Outcome(command="fid-refs", source=source, output=output, seen=sum(r.seen for r in results),
                   written=sum(r.written for r in results), failed=sum(r.failed for r in results),
                   failures_file=results[0].failures_path if len(results) == 1 else None, seconds=seconds, details=details, rows=rows, whole_job=rank == 0)


def register(app: typer.Typer) -> None:
    app.command("fid-refs")(fid_refs)
