"""A writer process killed with SIGKILL mid-shard, then rerun, ends with the same bytes."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

WRITER = r"""
import os, signal, sys
from pathlib import Path
from fgdata.shards import ShardWriter

dest, images, n, kill_at = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
blobs = [Path(p).read_bytes() for p in images]
w = ShardWriter(dest, maxcount=5)
for i in range(w.resume_point.next_input, n):
    if i == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    if i % 7 == 3:
        w.fail(i, f"input-{i}", "unreadable")
        continue
    w.write(f"sample_{i:06d}", {"jpg": blobs[i % len(blobs)], "txt": str(i).encode()}, input_pos=i)
s = w.close()
print(s.samples, len(s.failures))
"""


def _run(dest: Path, images: list[Path], n: int, kill_at: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WRITER, str(dest), ",".join(map(str, images)), str(n), str(kill_at)],
        capture_output=True, text=True, timeout=120,
    )


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("kill_at", [2, 7, 13, 20])
def test_killed_writer_resumes_to_identical_bytes(tmp_path, sample_images, kill_at):
    n = 23
    ok = _run(tmp_path / "clean", sample_images, n, kill_at=-1)
    assert ok.returncode == 0, ok.stderr
    killed = _run(tmp_path / "crash", sample_images, n, kill_at=kill_at)
    assert killed.returncode == -9
    visible = sorted(p.name for p in (tmp_path / "crash").glob("*.tar"))
    written = sum(1 for i in range(kill_at) if i % 7 != 3)
    assert len(visible) == max(0, written - 1) // 5  # a shard closes when the next sample arrives
    rerun = _run(tmp_path / "crash", sample_images, n, kill_at=-1)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout == ok.stdout  # same samples written, same failures accounted
    assert _digest(tmp_path / "crash") == _digest(tmp_path / "clean")
