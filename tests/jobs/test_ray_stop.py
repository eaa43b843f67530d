"""``--engine ray`` stops like every engine: SIGTERM to the driver cancels its tasks, shuts down the local cluster it
started (no Ray process of it is left), prints the resume line and exits 143; after SIGKILL no process of that
cluster is left either (its watchdog ends them). The rerun completes the job.

The driver starts its own local cluster (no ``--ray-address``). ``FGDATA_TEST_STOP_AFTER=1`` reaches the Ray
workers through the cluster's environment: each unit pauses after its first shard, so the job is known to be
mid-run when the signal comes, with no timing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from faultkit import FGDATA, alive, descendants, png_bytes, tree

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ENV = {"RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}


def _photos(root: Path, n: int) -> Path:
    root.mkdir()
    for i in range(n):
        (root / f"img{i:03d}.png").write_bytes(png_bytes(i, size=24))
    return root


def _no_state(rel: str) -> bool:
    return rel.startswith(".fgdata/")


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()[:120].replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "(gone)"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_ray_driver_leaves_no_process_of_its_own_cluster(tmp_path, sig):
    pytest.importorskip("ray")
    src = _photos(tmp_path / "src", 8)
    common = ["--maxcount", "2", "--no-progress"]
    local = subprocess.run([*FGDATA, "shard", "images", str(src), str(tmp_path / "local"), *common],
                           capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr[-2000:]
    dst = tmp_path / "ray"
    cmd = [*FGDATA, "shard", "images", str(src), str(dst), *common, "--engine", "ray", "--unit-size", "2"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(cmd, env={**env, **ENV, "FGDATA_TEST_STOP_AFTER": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    cluster: list[int] = []
    try:
        for _ in range(3000):  # a bounded poll of the job's own signal: a unit paused after a shard (300 s at most)
            if proc.poll() is not None or list(dst.glob("*.tar")):
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        cluster = descendants(proc.pid)
        assert len(cluster) > 2, cluster  # the cluster the driver started: GCS, raylet, workers, agents
        os.kill(proc.pid, sig)
        err = proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith("interrupted: ") and last.endswith(" inputs done; rerun the same command to resume")
    else:
        assert proc.returncode == -signal.SIGKILL
    for _ in range(600):  # a bounded poll: the cluster's processes end with the driver's shutdown (60 s at most)
        if not any(alive(p) for p in cluster):
            break
        time.sleep(0.1)
    left = {p: _command(p) for p in cluster if alive(p)}
    try:
        assert left == {}, left
    finally:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    again = subprocess.run(cmd, env={**env, **ENV}, capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stderr[-3000:]
    assert tree(dst, _no_state) == tree(tmp_path / "local", _no_state)
