"""A full disk stops the job with a line that names the file being written, not a bare ``[Errno 28]``."""

from __future__ import annotations

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


def test_a_full_disk_names_the_shard_being_written(small_disk: Path, tmp_path: Path):
    src = tmp_path / "noise"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):  # ~200 KB each: incompressible, so the first shard cannot fit in 256 KiB
        Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(src / f"{i}.png")
    dest = small_disk / "out"
    proc = run_cli("shard", "images", str(src), str(dest), "--maxcount", "10", "--no-progress")
    assert_clean_failure(proc)
    assert f"error: {dest / '00000.tar'}: No space left on device" in proc.stderr, proc.stderr
