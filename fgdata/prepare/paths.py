"""Where class-conditional datasets live: the data root, the S3 root and the exact output names.

The presets in ``fgdata.configs`` and the ``prepare`` commands both resolve paths here, so the two can never
disagree about where a zip is.
"""

from __future__ import annotations

import os
from pathlib import Path

from fgdata.errors import FgdataError

#: Output zips per dataset name, relative to the data root (hyphens for 64, underscores for 256).
DATASET_ZIPS: dict[str, tuple[str, ...]] = {
    "cifar10": ("cifar10/cifar10-32x32.zip",),
    "imagenet-64": ("imagenet-64/imagenet-64x64.zip", "imagenet-64/imagenet-64x64-edmv2.zip"),
    "imagenet-256": ("imagenet-256/imagenet_256_rgb.zip", "imagenet-256/imagenet_256_sd.zip"),
}

CIFAR10_ZIP = DATASET_ZIPS["cifar10"][0]
IMAGENET64_ZIP, IMAGENET64_EDMV2_ZIP = DATASET_ZIPS["imagenet-64"]
IMAGENET256_RGB_ZIP, IMAGENET256_SD_ZIP = DATASET_ZIPS["imagenet-256"]


def output_root_dir() -> Path:
    """``$FASTGEN_OUTPUT_ROOT`` (default ``FASTGEN_OUTPUT``), made absolute so logs say where data went."""
    return Path(os.environ.get("FASTGEN_OUTPUT_ROOT") or "FASTGEN_OUTPUT").expanduser().resolve()


def data_root_dir() -> Path:
    """``$DATA_ROOT_DIR``, defaulting to ``$FASTGEN_OUTPUT_ROOT/DATA`` as the reference does, absolute."""
    value = os.environ.get("DATA_ROOT_DIR")
    if value:
        if value.startswith("s3://"):
            raise FgdataError(f"DATA_ROOT_DIR={value} is an s3:// URL; set S3_DATA_ROOT_DIR for the S3 root instead")
        return Path(value).expanduser().resolve()
    return output_root_dir() / "DATA"


def resolve_data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """``root`` made absolute, or the data root when None: where a prepare call writes its zips."""
    return Path(root).expanduser().resolve() if root is not None else data_root_dir()


def s3_data_root_dir() -> str:
    """``$S3_DATA_ROOT_DIR`` (default ``s3://data``); a separate variable so a local data root never leaks into S3 paths."""
    value = os.environ.get("S3_DATA_ROOT_DIR") or "s3://data"
    if not value.startswith("s3://") or len(value.rstrip("/")) <= len("s3://"):
        raise FgdataError(f"S3_DATA_ROOT_DIR={value} must be an s3:// URL such as s3://data")
    return value.rstrip("/")


def dataset_zip_paths(dataset: str, root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Absolute paths of the zips a dataset name produces, under ``root`` or the data root."""
    if dataset not in DATASET_ZIPS:
        raise FgdataError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASET_ZIPS)}")
    base = resolve_data_root(root)
    return [base / rel for rel in DATASET_ZIPS[dataset]]
