"""Sources read regular files only: a manifest row naming a FIFO, a device or a folder is one reported failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from faultkit import FGDATA, png_bytes


def _run_bounded(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``fgdata ARGS`` in its own process group, the whole group killed if it outlives ``timeout`` (a hang)."""
    proc = subprocess.Popen([*FGDATA, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"fgdata {' '.join(args)} still running after {timeout} s") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_manifest_rows_naming_special_files_fail_one_by_one(tmp_path: Path):
    good = tmp_path / "good.png"
    good.write_bytes(png_bytes(1))
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.png"
    folder.mkdir()
    rows = [str(good), str(fifo), "/dev/zero", str(folder), str(good)]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"path": p, "caption": f"row {i}"}) + "\n" for i, p in enumerate(rows)))
    dest = tmp_path / "out"
    proc = _run_bounded(["shard", "images", str(manifest), str(dest), "--no-progress", "--json"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert (doc["seen"], doc["written"], doc["failed"]) == (5, 2, 3)
    reasons = {f["index"]: f["reason"] for f in json.loads((dest / "failures.json").read_text())["failures"]}
    assert reasons == {
        1: f"read: {fifo}: is a FIFO, not a regular file",
        2: "read: /dev/zero: is a device, not a regular file",
        3: f"read: {folder}: is a directory, not a regular file",
    }
