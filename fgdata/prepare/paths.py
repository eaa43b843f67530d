"""Where class-conditional datasets live, as the prepare commands name it: see :mod:`fgdata.catalog`."""

from fgdata.catalog import (
    CIFAR10_ZIP,
    DATASET_ZIPS,
    IMAGENET64_EDMV2_ZIP,
    IMAGENET64_ZIP,
    IMAGENET256_RGB_ZIP,
    IMAGENET256_SD_ZIP,
    data_root_dir,
    dataset_zip_paths,
    output_root_dir,
    resolve_data_root,
    s3_data_root_dir,
)

__all__ = [
    "CIFAR10_ZIP", "DATASET_ZIPS", "IMAGENET64_EDMV2_ZIP", "IMAGENET64_ZIP", "IMAGENET256_RGB_ZIP", "IMAGENET256_SD_ZIP",
    "data_root_dir", "dataset_zip_paths", "output_root_dir", "resolve_data_root", "s3_data_root_dir",
]
