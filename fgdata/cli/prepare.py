"""``fgdata download`` and ``fgdata prepare``: class-conditional dataset zips.

Only typer, rich and the standard library load at import; the library modules load inside each command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from fgdata.cli import options

DOWNLOADS = ("cifar10", "imagenet")
PREPARES = ("cifar10", "imagenet-64", "imagenet-256")


def _summary(dataset: str, summaries: list[dict]) -> dict:
    """The command's result in the one shape of every writing command: inputs seen, written and failed (the
    first pass saw and failed them; the last pass wrote them), the zips and the failure report."""
    full = [s for s in summaries if "written" in s] or [{}]
    return {"command": f"prepare {dataset}", "seen": full[0].get("inputs", 0), "written": full[-1].get("written", 0),
            "failed": full[0].get("failed", 0), "outputs": [s["path"] for s in summaries],
            "failures_file": full[-1].get("failures_file"), "skipped": all(s.get("skipped") for s in summaries)}


def _report(summaries: list[dict]) -> None:
    from fgdata.cli.render import console

    for s in summaries:
        if s.get("skipped"):
            console.print(f"[green]kept[/] {s['path']} (complete; --no-resume rebuilds)", highlight=False)
            continue
        if "written" not in s:  # another torchrun rank's part of the latent zip
            console.print(f"rank {s.get('rank')}: wrote {s['path']}", highlight=False)
            continue
        console.print(f"[green]wrote[/] {s['path']}: {s.get('written')} written, {s.get('failed', 0)} failed"
                      f" of {s.get('inputs')} inputs", highlight=False)
        converted = s.get("converted_modes") or []
        if converted:
            console.print(f"  {len(converted)} source(s) converted to RGB:", highlight=False)
            for item in converted[:20]:
                console.print(f"    {item['input']} ({item['mode']})", highlight=False, markup=False)
            if len(converted) > 20:
                console.print(f"    ... {len(converted) - 20} more in {s['path']}.provenance.json", highlight=False)


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
    typer.echo(f"ready: {path}")


def prepare(
    dataset: Optional[str] = typer.Argument(None, help="cifar10, imagenet-64 or imagenet-256."),
    list_: bool = typer.Option(False, "--list", help="Show the datasets, their outputs and what each needs."),
    data_root: Optional[Path] = typer.Option(None, "--data-root", help="Output root (default $DATA_ROOT_DIR)."),
    source: Optional[Path] = typer.Option(None, "--source", help="cifar10: a local cifar-10-python.tar.gz."),
    skip_md5: bool = typer.Option(False, "--skip-md5", help="cifar10: accept a CIFAR-format tarball that is not the official one."),
    imagenet_source: Optional[Path] = typer.Option(None, "--imagenet-source", help="ImageNet: Kaggle root or the train folder."),
    allow_any_tree: bool = typer.Option(False, "--allow-any-tree",
                                        help="ImageNet: accept a source that is not the ImageNet train tree (any class-folder tree)."),
    max_images: Optional[int] = typer.Option(None, "--max-images", min=1, help="Only the first N images."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Decode processes (default: all cores)."),
    resume: bool = options.RESUME,
    overwrite: bool = options.OVERWRITE,
    strict: bool = typer.Option(False, "--strict", help="ImageNet: fail on the first source that is not RGB or L."),
    vae: str = typer.Option("stabilityai/sd-vae-ft-mse", "--vae", help="imagenet-256: VAE hub id or local directory."),
    device: str = typer.Option("auto", "--device", help="imagenet-256: auto, cpu, cuda or cuda:N."),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="imagenet-256: images per VAE call."),
    dtype: str = typer.Option("float32", "--dtype", help="imagenet-256: float32 (reference numerics) or bfloat16."),
    show_progress: Optional[bool] = options.PROGRESS,
    quiet: bool = options.QUIET,
    json_out: bool = options.JSON,
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
    if dataset != "cifar10" and imagenet_source is None:
        raise typer.BadParameter(f"fgdata prepare {dataset} needs --imagenet-source DIR (fgdata download imagenet)")
    if dtype not in ("float32", "bfloat16"):
        raise typer.BadParameter("--dtype must be float32 or bfloat16")
    import fgdata.prepare as lib
    from fgdata.cli.jobrun import notify, run_job
    from fgdata.cli.render import phase_progress

    bars = options.show_progress(show_progress, quiet=quiet, json_out=json_out)
    say = None if quiet else notify
    common: dict[str, Any] = {"max_images": max_images, "workers": workers, "resume": resume, "overwrite": overwrite, "notify": say}

    def build() -> list[dict]:
        with phase_progress(enabled=bars) as update:
            progress = update if bars else None
            if dataset == "cifar10":
                return lib.prepare_cifar10(data_root, source=source, skip_md5=skip_md5, progress=progress, **common)
            assert imagenet_source is not None  # refused above
            imagenet: dict[str, Any] = {"strict": strict, "progress": progress, "allow_any_tree": allow_any_tree, **common}
            if dataset == "imagenet-64":
                return lib.prepare_imagenet64(imagenet_source, data_root, **imagenet)
            return lib.prepare_imagenet256(imagenet_source, data_root, vae=vae, device=device, batch_size=batch_size,
                                           dtype=dtype, **imagenet)

    summaries = run_job(build)  # the bar is closed before an interrupt line is printed
    result = _summary(dataset, summaries)
    if json_out:
        from fgdata.cli.render import print_json

        print_json(result)
    elif not quiet:
        _report(summaries)
    if not result["skipped"]:
        options.exit_if_all_failed(result["written"], result["failed"], result["failures_file"])


def register(app: typer.Typer) -> None:
    app.command("download")(download)
    app.command("prepare")(prepare)
