"""Class-conditional dataset zips in the EDM/EDM2 formats FastGen trains on.

Public entry points: :func:`prepare_cifar10`, :func:`prepare_imagenet64`, :func:`prepare_imagenet256` and the
:data:`DATASETS` table behind ``fgdata prepare --list``. Each takes its options dataclass (:class:`Cifar10Options`,
:class:`ImagenetOptions`, :class:`LatentZipOptions`: what the CLI flags set) and the job core's
:class:`~fgdata.jobs.driver.RunSettings` (workers, resume, overwrite, the callbacks of :mod:`fgdata.progress`: one
``on_start`` per pass, then ``progress`` increments), e.g. ``prepare_imagenet64(ImagenetOptions("/data/imagenet", "/data"))``.
Nothing here imports the loaders: ``fgdata quickstart`` loads a batch from what these functions write.
"""

from __future__ import annotations

from fgdata.jobs.driver import RunSettings
from fgdata.prepare.build import ZipSummary
from fgdata.prepare.cifar import prepare_cifar10
from fgdata.prepare.imagenet import prepare_imagenet64, prepare_imagenet256_rgb
from fgdata.prepare.options import Cifar10Options, ImagenetOptions, LatentZipOptions
from fgdata.prepare.paths import DATASET_ZIPS, IMAGENET256_RGB_ZIP, IMAGENET256_SD_ZIP, resolve_data_root

#: What ``fgdata prepare --list`` shows: dataset name -> (outputs, what it needs).
DATASETS: dict[str, tuple[tuple[str, ...], str]] = {
    "cifar10": (DATASET_ZIPS["cifar10"], "the CIFAR-10 python tarball (downloaded, or --source PATH; ~170 MB)"),
    "imagenet-64": (DATASET_ZIPS["imagenet-64"], "--imagenet-source: the unzipped Kaggle ImageNet (fgdata download imagenet)"),
    "imagenet-256": (DATASET_ZIPS["imagenet-256"], "--imagenet-source, and the SD VAE (--vae; a GPU for the full set)"),
}


def prepare_imagenet256(options: ImagenetOptions, latents: LatentZipOptions = LatentZipOptions(),
                        run: RunSettings = RunSettings()) -> list[ZipSummary]:
    """The RGB zip (rank 0 only; other torchrun ranks wait for it), then the latent zip, encoded by every rank.

    The VAE is found and loaded once (on the CPU) before the RGB pass, so a missing, unreachable or broken
    model fails in one line before hours of work instead of after them. Under ``--no-resume`` the other ranks
    wait for the RGB zip of this launch (rank 0 leaves the launch id beside it in ``.fgdata/`` once it is
    written), never for the one an earlier launch left and rank 0 is about to replace.
    """
    from fgdata import storage
    from fgdata.compute import check_model
    from fgdata.encode.vae import load_vae
    from fgdata.jobs.dest import STATE_DIR
    from fgdata.jobs.outputs import redoing
    from fgdata.jobs.ranks import dist_env, run_launch, wait_for
    from fgdata.prepare.latents import encode_latent_zip, prepare_wait_s
    from fgdata.prepare.zipwriter import provenance_path

    root = resolve_data_root(options.data_root)
    check_model(latents.vae, "VAE", "--vae")
    load_vae(latents.vae, device="cpu")  # downloads and checks the weights; encoding loads them again on its device
    rgb = root / IMAGENET256_RGB_ZIP
    stamp = rgb.parent / STATE_DIR / f"{rgb.name}.launch"
    rank, _world = dist_env()
    launch = run_launch(run.resume, prepare_wait_s())
    results: list[ZipSummary] = []

    def written() -> bool:
        if launch is not None:
            return stamp.is_file() and stamp.read_text() == launch
        return provenance_path(rgb).exists() and not rgb.with_name(rgb.name + ".partial").exists()

    if not run.resume:
        redoing(rank)  # rank 0 is about to replace the earlier RGB zip
    if rank == 0:
        results += prepare_imagenet256_rgb(options, run)
        if launch is not None:
            storage.write_bytes(str(stamp), launch.encode())
    else:
        wait_for(lambda: [] if written() else [f"{rgb.name} (rank 0)"], f"{root}: the RGB zip", prepare_wait_s(),
                 poll=5.0, log=run.notify)
    results.append(encode_latent_zip(rgb, root / IMAGENET256_SD_ZIP, latents, run))
    return results


__all__ = ["DATASETS", "prepare_cifar10", "prepare_imagenet64", "prepare_imagenet256", "Cifar10Options",
           "ImagenetOptions", "LatentZipOptions", "RunSettings", "ZipSummary", "IMAGENET256_RGB_ZIP", "IMAGENET256_SD_ZIP"]
