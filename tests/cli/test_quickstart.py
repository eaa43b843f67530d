"""`fgdata quickstart` runs every main job on the bundled media, offline, through the console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_quickstart_end_to_end(tmp_path):
    fgdata = str(Path(sys.executable).with_name("fgdata"))
    out = subprocess.run([fgdata, "quickstart", str(tmp_path / "demo")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for step in ("shard images", "count-shards", "inspect", "load a batch", "shard videos", "class-conditional zip"):
        assert step in out.stdout
    images = tmp_path / "demo" / "image_shards"
    counts = json.loads((images / "shard_count.json").read_text())
    assert sum(counts.values()) == 7  # the seven bundled photos
    report = json.loads((images / "failures.json").read_text())
    assert report["seen"] == report["written"] + report["failed"] == 7
    assert (tmp_path / "demo" / "video_shards" / "00000.tar").exists()
    assert (tmp_path / "demo" / "class_conditional" / "imagenet-64" / "imagenet-64x64.zip").exists()
    assert "(2, 3, 64, 64)" in out.stdout
