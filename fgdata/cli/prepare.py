"""``fgdata download`` and ``fgdata prepare``: class-conditional dataset zips.

Only typer, rich and the standard library load at import; the library modules load inside each command.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from fgdata.cli import options
from fgdata.cli.flaggroups import flag, flag_groups
from fgdata.cli.options import JobFlags, OutputFlags
from fgdata.cli.render import terminal_safe

if TYPE_CHECKING:
    from fgdata.cli.jobrun import Outcome
    from fgdata.prepare import RunSettings, ZipSummary

DOWNLOADS = ("cifar10", "imagenet")
PREPARES = ("cifar10", "imagenet-64", "imagenet-256")


def _outcome(dataset: str, source: str, summaries: list[ZipSummary], seconds: float) -> Outcome:
    """The command's result in the shape every writing command shares. The last pass's summary counts the
    whole command (the latent pass of imagenet-256 counts the inputs the RGB pass failed too); on a torchrun
    rank other than 0 it is the rank's share, and rank 0 reports the job."""
    from fgdata.cli.jobrun import Outcome

    last = summaries[-1]
    zips = [s.path for s in summaries]
    rows = [("kept" if s.kept else "wrote", Path(s.path).name) for s in summaries]
    resumed = summaries[0].resumed
    if resumed:
        rows.append(("resumed", f"{resumed:,} inputs an earlier run finished (kept)"))
    converted = len(summaries[0].converted)
    if converted:
        rows.append(("converted to RGB", f"{converted:,} (listed in the provenance file)"))
    skipped = all(s.kept for s in summaries)
    if skipped:
        rows.append(("", "complete: --no-resume rebuilds"))
    report = last.failures_path
    return Outcome(command=f"prepare {dataset}", source=source, output=str(Path(zips[0]).parent),
                   seen=last.seen, written=last.written, failed=last.failed,
                   failures_file=report if report and Path(report).is_file() else None, seconds=seconds,
                   details={"outputs": zips, "skipped": skipped, "resumed": resumed}, rows=rows,
                   whole_job=all(s.whole_job for s in summaries))


@dataclass
class Phases:
    """The job core's ``progress`` and ``on_start`` drawn as one bar per pass of ``prepare`` (``labels`` in order,
    the last one reused): a pass begins at the engine's ``on_start(None)``, or where a pass that knows its total
    starts a step with a total of its own (the latent zip's merge)."""

    labels: list[str]
    update: Callable[[str, int, int], None]
    index: int = -1
    done: int = 0
    total: int | None = None

    @property
    def label(self) -> str:
        return self.labels[min(max(self.index, 0), len(self.labels) - 1)]

    def on_start(self, total: int | None) -> None:
        if total is None or self.total is not None or self.index < 0:
            self.index, self.done, self.total = self.index + 1, 0, None
        if total is not None:
            self.total = total  # the bar appears with the pass's first inputs (kept ones first)

    def progress(self, inputs: int, _nbytes: int) -> None:
        self.done += inputs
        self.update(self.label, self.done, self.total or 0)


def _download_cifar10(data_root: Path | None, update: Callable[[str, int, int], None]) -> None:
    """The CIFAR-10 tarball under the data root, downloaded with its own bar when it is not there yet."""
    from fgdata.prepare.paths import CIFAR10_ZIP, resolve_data_root
    from fgdata.sources.cifar import CIFAR10_TARBALL, download_cifar10

    folder = (resolve_data_root(data_root) / CIFAR10_ZIP).parent
    if not (folder / CIFAR10_TARBALL).is_file():
        download_cifar10(folder, progress=lambda done, total: update("download", done, total))


def download(
    dataset: Optional[str] = typer.Argument(None, help="cifar10 or imagenet."),
    data_root: Optional[Path] = typer.Option(None, "--data-root", help="cifar10: data root (default $DATA_ROOT_DIR)."),
    dest: Optional[Path] = typer.Option(None, "--dest", help="imagenet: where to download and unzip."),
) -> None:
    """Download a source dataset: the CIFAR-10 tarball (MD5-checked, resumable) or ImageNet from Kaggle.

    Example: fgdata download cifar10 --data-root /data ; fgdata download imagenet --dest /data/imagenet
    """
    if dataset not in DOWNLOADS:
        raise typer.BadParameter(f"choose what to download: {', '.join(DOWNLOADS)}")
    from fgdata.prepare.paths import data_root_dir

    from fgdata.cli.render import phase_progress

    with phase_progress() as update:
        if dataset == "cifar10":
            from fgdata.sources.cifar import download_cifar10

            root = data_root.expanduser().resolve() if data_root else data_root_dir()
            path = download_cifar10(root / "cifar10", progress=lambda d, t: update("download", d, t))
        else:
            if dest is None:
                raise typer.BadParameter("fgdata download imagenet needs --dest DIR")
            from fgdata.sources.imagenet import download_imagenet

            path = download_imagenet(dest, progress=update)
    typer.echo(f"ready: {terminal_safe(str(path))}")


@dataclass(frozen=True, kw_only=True)
class PrepareFlags:
    """What ``prepare`` reads and how: the data root, the source, and the checks on it."""

    data_root: Optional[Path] = flag(typer.Option(None, "--data-root", help="Output root (default $DATA_ROOT_DIR)."))
    source: Optional[Path] = flag(typer.Option(None, "--source", help="cifar10: a local cifar-10-python.tar.gz."))
    skip_md5: bool = flag(typer.Option(False, "--skip-md5",
                                       help="cifar10: accept a CIFAR-format tarball that is not the official one."))
    imagenet_source: Optional[Path] = flag(typer.Option(None, "--imagenet-source",
                                                        help="ImageNet: Kaggle root or the train folder."))
    allow_any_tree: bool = flag(typer.Option(
        False, "--allow-any-tree",
        help="ImageNet: accept a source that is not the ImageNet train tree (any class-folder tree)."))
    follow_symlinks: bool = flag(options.FOLLOW_SYMLINKS)
    max_pixels: Optional[int] = flag(options.MAX_PIXELS)
    max_images: Optional[int] = flag(typer.Option(None, "--max-images", min=1, help="Only the first N images."))
    workers: Optional[int] = flag(typer.Option(None, "--workers", min=1, help="Decode processes (default: all cores)."))
    strict: bool = flag(typer.Option(False, "--strict", help="ImageNet: fail on the first source that is not RGB or L."))


@dataclass(frozen=True, kw_only=True)
class VaeFlags:
    """``prepare imagenet-256``: the VAE pass that turns images into latents."""

    vae: str = flag(typer.Option("stabilityai/sd-vae-ft-mse", "--vae", help="imagenet-256: VAE hub id or local directory."))
    device: str = flag(typer.Option("auto", "--device", help="imagenet-256: auto, cpu, cuda or cuda:N."))
    batch_size: int = flag(typer.Option(32, "--batch-size", min=1, help="imagenet-256: images per VAE call."))
    dtype: str = flag(typer.Option("float32", "--dtype", help="imagenet-256: float32 (reference numerics) or bfloat16."))


@flag_groups
def prepare(
    dataset: Optional[str] = typer.Argument(None, help="cifar10, imagenet-64 or imagenet-256."),
    list_: bool = typer.Option(False, "--list", help="Show the datasets, their outputs and what each needs."),
    *,
    inputs: PrepareFlags,
    latents: VaeFlags,
    job: JobFlags,
    out: OutputFlags,
) -> None:
    """Build the class-conditional dataset zips that FastGen-style training reads, under the data root, with the exact file names it expects.

    Example: fgdata prepare cifar10 --source ~/cifar-10-python.tar.gz ;
    fgdata prepare imagenet-64 --imagenet-source /data/imagenet ;
    torchrun --nproc-per-node 8 -m fgdata prepare imagenet-256 --imagenet-source /data/imagenet --device cuda
    """
    if list_:
        from fgdata.prepare import DATASETS

        for name, (outputs, needs) in DATASETS.items():
            typer.echo(f"{name}: {', '.join(outputs)}\n    needs {needs}")
        return
    if dataset not in PREPARES:
        raise typer.BadParameter(f"choose a dataset: {', '.join(PREPARES)} (fgdata prepare --list shows what each needs)")
    if dataset != "cifar10" and inputs.imagenet_source is None:
        raise typer.BadParameter(f"fgdata prepare {dataset} needs --imagenet-source DIR (fgdata download imagenet)")
    import fgdata.prepare as lib
    from fgdata.cli.jobrun import finish, notes, run_job
    from fgdata.cli.render import phase_progress
    from fgdata.jobs.ranks import dist_env
    from fgdata.workers import default_workers

    i = inputs
    rank, _world = dist_env()
    labels = ["convert"]
    if dataset == "cifar10":
        job_fn: Callable[[RunSettings], list[ZipSummary]] = partial(
            lib.prepare_cifar10, lib.Cifar10Options(i.data_root, i.source, i.skip_md5, max_images=i.max_images))
    else:
        assert i.imagenet_source is not None  # refused above
        imagenet = lib.ImagenetOptions(i.imagenet_source, i.data_root, i.allow_any_tree, max_images=i.max_images,
                                       strict=i.strict, follow_symlinks=i.follow_symlinks,
                                       max_pixels=i.max_pixels)
        if dataset == "imagenet-64":
            job_fn = partial(lib.prepare_imagenet64, imagenet)
        else:
            vae = lib.LatentZipOptions(vae=latents.vae, dtype=latents.dtype, device=latents.device,
                                       batch_size=latents.batch_size)  # a bad value: OptionError, exit 2
            job_fn = partial(lib.prepare_imagenet256, imagenet, vae)
            labels = (["convert"] if rank == 0 else []) + [f"encode rank {rank}"] + (["merge"] if rank == 0 else [])
    bars = out.bars

    def build() -> list[ZipSummary]:
        with phase_progress(enabled=bars) as update:
            if dataset == "cifar10" and i.source is None:
                _download_cifar10(i.data_root, update)
            run = lib.RunSettings(workers=i.workers or default_workers(), resume=job.resume, overwrite=job.overwrite,
                                  notify=notes(out.quiet))
            if bars:
                phases = Phases(labels, update)
                run = replace(run, progress=phases.progress, on_start=phases.on_start)
            return job_fn(run)

    started = time.perf_counter()
    summaries = run_job(build)  # the bar is closed before an interrupt line is printed
    where = str(i.imagenet_source if dataset != "cifar10" else i.source or "the CIFAR-10 tarball")
    outcome = _outcome(dataset, where, summaries, time.perf_counter() - started)
    finish(outcome, quiet=out.quiet, json_out=out.json_out)


def register(app: typer.Typer) -> None:
    app.command("download")(download)
    app.command("prepare")(prepare)
