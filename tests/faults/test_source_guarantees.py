"""Existing shards and a Parquet table as sources, with ``--where`` and ``--keep-top``: the same guarantees as every
writing command. One worker and two give the same bytes; a job SIGKILLed where it signals (``FGDATA_TEST_STOP_AFTER``)
and rerun gives the bytes of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from faultkit import FGDATA, png_bytes, stop_trials, tree

pytestmark = pytest.mark.timeout(600)

N = 40
SELECT = ["--where", "score >= 0.1 and status == 'success'", "--keep-top", "0.5", "--by", "score"]


def _score(i: int) -> float | None:
    return None if i % 9 == 4 else round((i * 37 % 23) / 23, 3)  # nulls and ties


@pytest.fixture
def shard_source(tmp_path: Path) -> Path:
    """img2dataset-style shards written by webdataset's ShardWriter: png, txt, json with a score and a status."""
    wds = pytest.importorskip("webdataset")
    folder = tmp_path / "shards"
    folder.mkdir()
    with wds.ShardWriter(str(folder / "%05d.tar"), maxcount=10, verbose=0) as sink:
        for i in range(N):
            meta = {"score": _score(i), "status": "failed_to_download" if i % 13 == 5 else "success"}
            sample = {"__key__": f"{i:09d}", "json": json.dumps(meta).encode()}
            if meta["status"] == "success":
                sample.update(png=png_bytes(i, size=24), txt=f"caption {i}".encode())
            sink.write(sample)
    return folder


@pytest.fixture
def table_source(tmp_path: Path) -> Path:
    """A Parquet file with the images in a binary column and a score column, two row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "table.parquet"
    table = pa.table({"image": [png_bytes(i, size=24) for i in range(N)],
                      "caption": [f"caption {i}" for i in range(N)],
                      "score": [_score(i) for i in range(N)],
                      "status": ["success"] * N})
    pq.write_table(table, path, row_group_size=N // 2)
    return path


def _argv(src: Path, dest: str, workers: int, extra: list[str]) -> list[str]:
    return [*FGDATA, "shard", "images", str(src), dest, "--maxcount", "4", "--no-progress", "--workers",
            str(workers), *SELECT, *extra]


@pytest.mark.parametrize("kind", ["shards", "table"])
@pytest.mark.slow  # end to end, several seconds
def test_one_worker_and_two_give_the_same_bytes_and_sigkill_then_rerun_the_uninterrupted_bytes(
        kind, shard_source, table_source, tmp_path):
    src, extra = (shard_source, []) if kind == "shards" else (table_source, ["--image-column", "image"])
    out = tmp_path / "out"
    runs = {}
    for workers in (1, 2):
        dest = out / f"w{workers}"
        done = subprocess.run(_argv(src, str(dest), workers, extra), capture_output=True, text=True, timeout=300,
                              env=os.environ)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[workers] = tree(dest, lambda rel: rel.startswith(".fgdata/"))
    assert runs[1] == runs[2]
    assert len([rel for rel in runs[1] if rel.endswith(".tar")]) >= 3  # the kill below lands between shards
    stop_trials(_argv(src, "{out}", 2, extra), out=out, clean=out / "clean",
                stops=[(1 if kind == "shards" else 2, signal.SIGKILL)])  # one stop per source kind
    # the rerun wrote the uninterrupted bytes, shard_stats.json included: each shard's filtered inputs are pandas'
    stats = json.loads((out / "clean" / "shard_stats.json").read_text())
    expected = _filtered_per_shard(failed_downloads=kind == "shards", maxcount=4)
    assert {name: row["filtered_by_reason"] for name, row in stats["shards"].items() if row["filtered"]} == expected
    assert stats["filtered_by_reason"] == dict(sum((Counter(r) for r in expected.values()), Counter()))


def _filtered_per_shard(failed_downloads: bool, maxcount: int) -> dict[str, dict[str, int]]:
    """The sources' rows in pandas, selected as ``SELECT`` says: the inputs left out that each output shard owns
    (those after one of its inputs; before the first input: the first shard's)."""
    import numpy as np
    import pandas as pd

    df = pd.DataFrame({"score": [_score(i) for i in range(N)], "status": [
        "failed_to_download" if failed_downloads and i % 13 == 5 else "success" for i in range(N)]}, dtype=object)
    score = df.score.astype(float)
    status = df.status != "success"  # the source leaves these out before --where sees them
    where = ~status & (score >= 0.1)
    kept = df.index.isin(score[where].nlargest(int(0.5 * where.sum()), keep="first").index)
    reason = pd.Series(np.where(status, "status", np.where(~where, "where", np.where(kept, "", "keep-top"))))
    owner = pd.Series(kept).astype(int).cumsum().clip(lower=1) - 1
    left = pd.DataFrame({"shard": owner // maxcount, "reason": reason})[reason != ""]
    out: dict[str, dict[str, int]] = {}
    for (shard, why), n in left.groupby(["shard", "reason"]).size().items():
        out.setdefault(f"{int(shard):05d}.tar", {})[str(why)] = int(n)
    return out


@pytest.mark.slow  # torchrun ranks as processes
def test_torchrun_ranks_give_the_local_bytes(shard_source, tmp_path):
    """Two torchrun ranks (real ``torch.distributed.run`` on CPU) share the source shards' work units and write the
    bytes one local process writes."""
    pytest.importorskip("torch")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    local = subprocess.run(_argv(shard_source, str(tmp_path / "local"), 1, ["--unit-size", "8"]),
                           capture_output=True, text=True, timeout=300, env=env)
    assert local.returncode == 0, local.stderr[-3000:]
    ranks = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                            *_argv(shard_source, str(tmp_path / "ranks"), 1, ["--unit-size", "8"])[1:]],
                           capture_output=True, text=True, timeout=300, env=env)
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    skip = lambda rel: rel.startswith(".fgdata/")  # noqa: E731
    assert tree(tmp_path / "ranks", skip) == tree(tmp_path / "local", skip)
