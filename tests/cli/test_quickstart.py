"""`fgdata quickstart` runs every main job on the bundled media, offline, through the console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FGDATA = str(Path(sys.executable).with_name("fgdata"))
STEPS = ("shard images", "count-shards", "inspect", "load a batch", "shard videos", "class-conditional zip", "report")


def fg(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([FGDATA, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "80", **(env or {})})


@pytest.mark.slow  # three full quickstart runs
def test_quickstart_end_to_end(tmp_path):
    out = fg("quickstart", str(tmp_path / "demo"))
    assert out.returncode == 0, out.stderr
    for step in STEPS:
        assert step in out.stdout  # the results table
        assert f"✓ {step}" in out.stderr  # one line per step while it runs (no terminal: no bar)
    assert "{" not in out.stdout and "(2, 3, 64, 64)" not in out.stdout  # no raw dict or tuple reprs
    assert "real_raw [2,3,64,64]" in out.stdout.replace("\n│", "").replace(" │", "")
    images = tmp_path / "demo" / "image_shards"
    counts = json.loads((images / "shard_count.json").read_text())
    assert sum(counts.values()) == 7  # the seven bundled photos
    report = json.loads((images / "failures.json").read_text())
    assert report["seen"] == report["written"] + report["failed"] == 7
    assert (tmp_path / "demo" / "video_shards" / "00000.tar").exists()
    assert (tmp_path / "demo" / "class_conditional" / "imagenet-64" / "imagenet-64x64.zip").exists()
    sheet, page = tmp_path / "demo" / "contact_sheet.png", tmp_path / "demo" / "report.html"
    lines = out.stdout.splitlines()
    assert lines[-2].split() == ["contact", "sheet:", str(sheet)] and lines[-1].split() == ["report:", str(page)]
    from PIL import Image

    with Image.open(sheet) as im:
        assert im.format == "PNG" and im.width > 400
    assert page.read_text().startswith("<!doctype html>")

    # a second run into the same folder refuses, naming what is there; --overwrite says what it removes
    again = fg("quickstart", str(tmp_path / "demo"))
    assert again.returncode == 1 and "--overwrite" in again.stderr and "image_shards" in again.stderr
    assert "Traceback" not in again.stderr
    again = fg("quickstart", str(tmp_path / "demo"), "--overwrite", "--json")
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert list(doc["steps"]) == list(STEPS)
    assert doc["steps"]["count-shards"]["samples"] == 7
    assert doc["steps"]["report"]["samples"] == 8 and doc["steps"]["report"]["problems"] == 0


@pytest.mark.slow  # end to end, several seconds
def test_quickstart_defaults_to_a_fresh_temp_folder(tmp_path, short_tmp):
    """Without OUTDIR nothing lands in the working directory (a clone stays clean)."""
    work = tmp_path / "clone"
    work.mkdir()
    temp = short_tmp
    out = subprocess.run([FGDATA, "quickstart", "--json"], capture_output=True, text=True, timeout=300, cwd=work,
                         env={**os.environ, "TMPDIR": str(temp)})
    assert out.returncode == 0, out.stderr
    outdir = Path(json.loads(out.stdout)["outdir"])
    assert outdir.parent == temp and outdir.name.startswith("fgdata-quickstart-")
    assert list(work.iterdir()) == []
