"""Nothing is lost: written + failed = N, every failed input is listed with its reason, also across a kill and resume."""

from __future__ import annotations

import json
import random

import pytest

from faultkit import FGDATA, png_bytes, run_and_kill, run_cli

pytestmark = pytest.mark.timeout(180)


@pytest.mark.slow  # a job stopped by a signal and rerun
def test_shard_images_accounts_for_every_input_across_a_kill(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(7)
    bad = set()
    for i in range(40):
        name = f"img{i:03d}.png"
        if rng.random() < 0.2:
            (src / name).write_bytes(png_bytes(i)[: rng.randrange(0, 30)])  # empty or cut-off images
            bad.add(name)
        else:
            (src / name).write_bytes(png_bytes(i))
    dst = tmp_path / "out"
    run_and_kill([*FGDATA, "shard", "images", str(src), str(dst), "--maxcount", "3", "--no-progress"], watch=dst, delay=0.3)
    proc = run_cli("shard", "images", str(src), str(dst), "--maxcount", "3", "--no-progress", "--json")
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    failures = json.loads((dst / "failures.json").read_text())["failures"]
    assert report["written"] + report["failed"] == 40
    assert report["failed"] == len(bad) and {f["input"] for f in failures} == bad
    assert all(f["reason"] for f in failures)
    verified = run_cli("verify", str(dst), "--json", "--decode", "-w", "1")
    assert verified.returncode == 0, verified.stdout[-2000:]
    assert json.loads(verified.stdout)["readable"] == report["written"]
