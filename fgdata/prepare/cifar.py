"""``prepare cifar10``: the EDM CIFAR-10 zip from the python tarball."""

from __future__ import annotations

from pathlib import Path

from fgdata.errors import FgdataError
from fgdata.jobs.driver import RunSettings
from fgdata.prepare.build import Block, ZipJob, ZipSummary, ZipTarget, build_zips
from fgdata.prepare.options import Cifar10Options, Fingerprint
from fgdata.prepare.paths import CIFAR10_ZIP, resolve_data_root
from fgdata.prepare.transforms import png_bytes
from fgdata.sources.cifar import CIFAR10_MD5, CIFAR10_TARBALL, download_cifar10, file_md5, read_cifar10

def _encode_rows(_: None, block: Block) -> list[tuple[list[bytes] | None, str | None]]:
    """The PNG of every row of one block (its own rows, sent with it)."""
    return [([png_bytes(row)], None) for row in block.rows]


def prepare_cifar10(options: Cifar10Options = Cifar10Options(), run: RunSettings = RunSettings()) -> list[ZipSummary]:
    """Write ``cifar10/cifar10-32x32.zip`` under the data root; download the tarball there when no source is given."""
    root = resolve_data_root(options.data_root)
    dest = root / CIFAR10_ZIP
    source = options.source
    if source is None:
        local = dest.parent / CIFAR10_TARBALL
        source = local if local.is_file() else download_cifar10(dest.parent)  # the CLI downloads it with a bar
    if not Path(source).is_file():
        raise FgdataError(f"{source}: no such file (expected {CIFAR10_TARBALL})")
    md5 = file_md5(source)
    if md5 != CIFAR10_MD5 and not options.skip_md5:
        raise FgdataError(
            f"{source}: MD5 {md5} does not match the official {CIFAR10_TARBALL} ({CIFAR10_MD5}); "
            "pass --skip-md5 only for a CIFAR-format tarball you built yourself"
        )
    images, labels = read_cifar10(source, skip_md5=True)  # checked just above
    n = len(images) if options.max_images is None else min(len(images), options.max_images)
    fingerprint = Fingerprint.of(options, dataset="cifar10", source=str(Path(source).resolve()), source_md5=md5,
                                 inputs=n)
    target = ZipTarget(dest, labels[:n], transform="none (CIFAR rows as 32x32 RGB)")
    job = ZipJob("prepare cifar10", [target], n, _encode_rows, fingerprint, describe=_row_name, block=500,
                 rows=lambda a, b: images[a:b])  # each worker gets its blocks' rows, not all 50,000
    return build_zips(job, run)


def _row_name(j: int) -> str:
    return f"row {j}"
