"""The shard commands' closing summary counts what it says: bytes read are the inputs' bytes, and clips cut at
keyframes say how many were written and how many came out longer than asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from keyframedclip import make_clip

FGDATA = str(Path(sys.executable).with_name("fgdata"))


def fg(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([FGDATA, *map(str, args)], capture_output=True, text=True, timeout=300, env=env)


def test_bytes_read_are_the_input_bytes_when_reencoding(image_folder: Path, tmp_path: Path):
    inputs = sum(p.stat().st_size for p in image_folder.rglob("*") if p.is_file())
    done = fg("shard", "images", image_folder, tmp_path / "small", "--max-side", "32", "--format", "jpg", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["failed"] == 0 and doc["nbytes"] == inputs
    written = sum(p.stat().st_size for p in (tmp_path / "small").glob("*.tar"))
    assert written < inputs / 4  # the outputs are much smaller: a count of them would be far off


def test_sparse_keyframes_make_long_clips_and_the_summary_says_so(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    make_clip(src / "long_gop.mp4", seconds=3, gop=300)  # one keyframe: cut at keyframes, one 3 s "clip"
    done = fg("shard", "videos", src, tmp_path / "out", "--clip-seconds", "1", "--json")
    assert done.returncode == 0, done.stderr
    clips = json.loads(done.stdout)["clips"]
    assert (clips["asked_seconds"], clips["written"], clips["longer_than_asked"]) == (1.0, 1, 1)
    assert 2.9 <= clips["longest_seconds"] <= 3.1
    table = fg("shard", "videos", src, tmp_path / "table", "--clip-seconds", "1")
    assert table.returncode == 0, table.stderr
    assert "clips written" in table.stdout and "longer than 1 s" in table.stdout and "--exact" in table.stdout


def test_dense_keyframes_make_clips_as_asked(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    make_clip(src / "dense.mp4", seconds=3, fps=24, gop=24)  # a keyframe every second
    done = fg("shard", "videos", src, tmp_path / "out", "--clip-seconds", "1", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["clips"]["written"] == doc["samples"] == 3 and doc["clips"]["longer_than_asked"] == 0
    exact = json.loads(fg("shard", "videos", src, tmp_path / "exact", "--clip-seconds", "1", "--exact",
                          "--json").stdout)
    assert exact["clips"]["written"] == 3 and exact["clips"]["longer_than_asked"] == 0
