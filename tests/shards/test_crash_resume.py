"""A writer process killed with SIGKILL mid-shard leaves only complete shards under final names.

The writer keeps no resume state: after a kill, removing temporaries (what a job does before it redoes a work
unit) leaves only shards equal to an uninterrupted run's, and writing again gives the same bytes.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from fgdata.storage.temps import clean_temps, is_temp

WRITER = r"""
import os, signal, sys
from pathlib import Path
from fgdata.shards import ShardWriter

dest, images, n, kill_at = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
blobs = [Path(p).read_bytes() for p in images]
w = ShardWriter(dest, maxcount=5)
for i in range(n):
    if i == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    w.write(f"sample_{i:06d}", {"jpg": blobs[i % len(blobs)], "txt": str(i).encode()})
s = w.close()
print(s.samples, [os.path.basename(p) for p in s.shards])
"""


def _run(dest: Path, images: list[Path], n: int, kill_at: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WRITER, str(dest), ",".join(map(str, images)), str(n), str(kill_at)],
        capture_output=True, text=True, timeout=120,
    )


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("kill_at", [1, 5, 7, 13, 20])
def test_killed_writer_leaves_complete_shards_and_rewrites_identical_bytes(tmp_path, sample_images, kill_at):
    n = 23
    ok = _run(tmp_path / "clean", sample_images, n, kill_at=-1)
    assert ok.returncode == 0, ok.stderr
    clean = _digest(tmp_path / "clean")
    crash = tmp_path / "crash"
    killed = _run(crash, sample_images, n, kill_at=kill_at)
    assert killed.returncode == -9
    closed = (kill_at - 1) // 5  # a shard closes when the next sample arrives
    final = {name: digest for name, digest in _digest(crash).items() if not name.startswith(".")}
    assert sorted(final) == sorted(f"{s:05d}.tar{ext}" for s in range(closed) for ext in ("", ".idx.json"))
    assert all(clean[name] == digest for name, digest in final.items())  # nothing partial under a final name
    # The open shard is a temporary; removing temporaries leaves exactly the complete shards.
    removed = clean_temps(str(crash))
    assert removed and all(is_temp(name) and name.startswith(f".{closed:05d}.tar") for name in removed), removed
    assert _digest(crash) == final
    # Writing again over what is left gives the uninterrupted run's bytes and summary.
    rerun = _run(crash, sample_images, n, kill_at=-1)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout == ok.stdout
    assert _digest(crash) == clean
