"""The Ray executor on a real multi-node cluster started here: a head and two worker nodes (one CPU each).

``shard images`` and ``encode latents`` on the cluster give the same bytes as the local executor, and a
worker node removed while the job runs ends in a completed job (Ray retries the lost unit elsewhere; units are
idempotent) or a one-line error, never in a silent gap. One cluster for the whole module (~10 s to start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultkit import FGDATA, png_bytes, tree

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from encode.conftest import tiny_vae, write_shards  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ENV = {"RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    os.environ.update(ENV)  # the raylets (and their workers) inherit this environment
    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [c.add_node(num_cpus=1) for _ in range(2)]
    c.wait_for_nodes()
    yield c, workers
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()


def run(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([*FGDATA, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **ENV})


def photos(root: Path, n: int) -> Path:
    root.mkdir()
    for i in range(n):
        (root / f"img{i:03d}.png").write_bytes(png_bytes(i, size=48))
        (root / f"img{i:03d}.txt").write_text(f"caption {i}")
    return root


def no_state(rel: str) -> bool:
    return rel.startswith(".fgdata/") or rel == "shard_job.json"  # the job record names the engine


def test_shard_images_on_the_cluster_equals_local(cluster, tmp_path):
    c, _ = cluster
    src = photos(tmp_path / "src", 24)
    local, remote = tmp_path / "local", tmp_path / "ray"
    common = ("--maxcount", "2", "--no-progress")
    assert run("shard", "images", str(src), str(local), *common).returncode == 0
    # --unit-size a multiple of --maxcount and no failures: the same shard boundaries, so the same files
    done = run("shard", "images", str(src), str(remote), *common, "--engine", "ray", "--ray-address", c.address,
               "--unit-size", "4", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["written"] == 24
    assert tree(remote, no_state) == tree(local, no_state)


def test_encode_latents_on_the_cluster_equals_local(cluster, tmp_path):
    c, _ = cluster
    vae = tmp_path / "vae"
    tiny_vae().save_pretrained(vae)
    items = [(f"s_{i:03d}", {"png": png_bytes(i, size=40), "txt": f"caption {i}".encode()}) for i in range(12)]
    src = write_shards(tmp_path / "src", items, per_shard=2)
    args = ("--vae", str(vae), "--size", "32", "--batch-size", "2", "-q")
    local = run("encode", "latents", str(src), str(tmp_path / "local"), *args)
    assert local.returncode == 0, local.stderr[-3000:]
    remote = run("encode", "latents", str(src), str(tmp_path / "ray"), *args, "--engine", "ray", "--workers", "3",
                 "--ray-address", c.address)
    assert remote.returncode == 0, remote.stderr[-3000:]
    assert tree(tmp_path / "ray", no_state) == tree(tmp_path / "local", no_state)


def test_score_on_the_cluster_equals_local(cluster, tmp_path):
    """``score --engine ray``: one Ray task per shard; the score files are those of the local run."""
    import shutil

    c, _ = cluster
    items = [(f"s_{i:03d}", {"png": png_bytes(i, size=40), "txt": f"caption {i}".encode()}) for i in range(10)]
    local = write_shards(tmp_path / "local", items, per_shard=3)
    remote = tmp_path / "ray"
    shutil.copytree(local, remote)
    assert run("score", str(local), "--with", "basic", "-q").returncode == 0
    done = run("score", str(remote), "--with", "basic", "--engine", "ray", "--ray-address", c.address, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["samples"] == 10
    assert tree(remote) == tree(local)


def test_dedup_on_the_cluster_equals_local(cluster, tmp_path):
    """``dedup --engine ray``: the shards hashed by Ray tasks, the same ignore index as the local run."""
    c, _ = cluster
    items = [(f"s_{i:03d}", {"png": png_bytes(i % 7, size=40)}) for i in range(14)]  # each picture twice
    src = write_shards(tmp_path / "src", items, per_shard=3)
    local, remote = tmp_path / "local.json", tmp_path / "ray.json"
    alone = run("dedup", str(src), "-o", str(local), "--json")
    assert alone.returncode == 0, alone.stderr[-3000:]
    done = run("dedup", str(src), "-o", str(remote), "--engine", "ray", "--ray-address", c.address, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["dropped"] == json.loads(alone.stdout)["dropped"] >= 7  # every copy at least
    assert remote.read_bytes() == local.read_bytes()


def test_a_node_removed_mid_job_never_leaves_a_silent_gap(cluster, tmp_path):
    c, workers = cluster
    src = photos(tmp_path / "src", 48)
    local, remote = tmp_path / "local", tmp_path / "ray"
    common = ("--maxcount", "2", "--max-side", "24", "--no-progress")
    assert run("shard", "images", str(src), str(local), *common).returncode == 0
    proc = subprocess.Popen([*FGDATA, "shard", "images", str(src), str(remote), *common, "--engine", "ray",
                             "--ray-address", c.address, "--unit-size", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **ENV})
    try:
        # the job's own signal that it is under way: a unit has closed a shard under its final name
        while proc.poll() is None and not list(remote.glob("*.tar")):
            time.sleep(0.05)
        c.remove_node(workers[-1])  # a worker node dies while units run on it
        out, err = proc.communicate(timeout=500)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode == 0:  # Ray ran the lost units again elsewhere: the job completed, with every input
        assert tree(remote, no_state) == tree(local, no_state)
        report = json.loads((remote / "failures.json").read_text())
        assert (report["seen"], report["written"], report["failed"]) == (48, 48, 0)
    else:  # or it ended in one line naming what failed, and no report claims success
        assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
        assert err.strip().splitlines()[-1].startswith("error: ") and not (remote / "failures.json").exists()
        again = run("shard", "images", str(src), str(remote), *common, "--engine", "ray", "--ray-address", c.address,
                    "--unit-size", "2")
        assert again.returncode == 0, again.stderr[-3000:]
        assert tree(remote, no_state) == tree(local, no_state)


def test_without_an_address_the_job_starts_its_own_cluster(cluster, tmp_path):
    """A cluster runs on the machine (the module's, recorded as the latest one, as `ray start` records it), but a
    job without --ray-address and RAY_ADDRESS starts a private local instance rather than joining it."""
    src = photos(tmp_path / "src", 4)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([*FGDATA, "shard", "images", str(src), str(tmp_path / "out"), "--maxcount", "2",
                           "--no-progress", "--engine", "ray"], capture_output=True, text=True, timeout=400,
                          env={**env, **ENV})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Started a local Ray instance" in done.stderr and "Connecting to existing" not in done.stderr, done.stderr
