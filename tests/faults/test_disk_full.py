"""A full disk stops the job with a line that names the file being written, not a bare ``[Errno 28]``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from faultkit import assert_clean_failure, run_cli


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 256 KiB tmpfs (needs the right to mount, as root in a container has; skipped elsewhere)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def noise(tmp_path: Path) -> Path:
    src = tmp_path / "noise"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):  # ~200 KB each: incompressible, so the first shard cannot fit in 256 KiB
        Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(src / f"{i}.png")
    return src


def _fill(disk: Path, leave_kib: int) -> None:
    """Fill ``disk`` but ``leave_kib`` KiB."""
    free = shutil.disk_usage(disk).free - leave_kib * 1024
    if free > 0:
        (disk / "filler").write_bytes(bytes(free))


def test_a_full_disk_names_the_shard_being_written(small_disk: Path, noise: Path):
    src = noise
    dest = small_disk / "out"
    proc = run_cli("shard", "images", str(src), str(dest), "--maxcount", "10", "--no-progress")
    assert_clean_failure(proc)
    assert f"error: {dest / '00000.tar'}: No space left on device" in proc.stderr, proc.stderr


@pytest.mark.parametrize("leave_kib", [0, 4, 8, 16])
def test_a_disk_full_from_the_start_names_a_file_under_dst(small_disk: Path, noise: Path, leave_kib: int):
    """Whatever the job writes first (its lock, its record, a unit marker, a shard), the line names it."""
    _fill(small_disk, leave_kib)
    dest = small_disk / "out"
    proc = run_cli("shard", "images", str(noise), str(dest), "--maxcount", "1", "--no-progress")
    assert_clean_failure(proc)
    assert proc.stderr.startswith(f"error: {dest}/") and "No space left on device" in proc.stderr, proc.stderr
    assert "[Errno" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_a_full_cache_of_an_s3_job_names_the_cache_file(small_disk: Path, noise: Path, s3_bucket: str):
    """An s3:// DST's shards are built in this host's cache: the line names the local file that could not be
    written (and the shard it was to become), not only the URL."""
    url = f"{s3_bucket}/out"
    cache = small_disk / "cache"
    proc = run_cli("shard", "images", str(noise), url, "--maxcount", "10", "--no-progress",
                   env={"FGDATA_CACHE": str(cache)})
    assert_clean_failure(proc)
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {cache}/") and "No space left on device" in line, proc.stderr
    assert f"(the local build of {url}/00000.tar)" in line, line
