"""A shard rewritten to the same byte size beside its old offset index: no reader trusts that index.

Shard 0 is rewritten with the same samples in reverse order, shard 1 with one sample fewer; tar's
10 KiB records keep both at their old sizes, and both keep their old ``.idx.json``. Shard 2 is
untouched, so its index must still be used. On s3:// (no ranged reads) only the first sample's
headers are compared (docs/FORMATS.md), so there shard 1 loses its first sample.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from fgdata import storage
from fgdata.loaders import WDSLoader
from fgdata.shards import ShardFile, ShardWriter, count_shards, index_path, load_index, scan_shard

from .conftest import grid_key, npy_bytes, write_grid

KM = {"real": "npy", "condition": "txt"}
PER = 8


def _members(s: int, i: int) -> dict[str, bytes]:
    """The grid's sample (shard ``s``, position ``i``): its ``npy`` value and caption name it."""
    return {"txt": f"caption {s} {i}".encode(), "npy": npy_bytes(np.full((1, 2, 2), s * PER + i, dtype=np.float32))}


def _stale(tmp_path: Path, dropped: int) -> str:
    """The grid with shards 0 (reversed) and 1 (sample ``dropped`` left out) rewritten to the same sizes,
    their old indexes kept."""
    ds = write_grid(str(tmp_path / "ds"), shards=3, per=PER)
    for shard, order in ((0, range(PER - 1, -1, -1)), (1, [i for i in range(PER) if i != dropped])):
        other = tmp_path / f"rewrite{shard}"
        with ShardWriter(str(other), maxcount=PER, count_file=False) as w:
            for i in order:
                w.write(grid_key(shard, i), _members(shard, i))
        target = Path(ds) / f"{shard:05d}.tar"
        size = target.stat().st_size
        old_index = Path(index_path(str(target))).read_bytes()
        shutil.copyfile(other / "00000.tar", target)
        assert target.stat().st_size == size and Path(index_path(str(target))).read_bytes() == old_index
    return ds


def _check_batches(loader: WDSLoader, ignored: str) -> list[str]:
    """Every sample's caption and value belong to its key; returns the keys in order."""
    seen = []
    for batch in loader:
        for key, caption, real in zip(batch["fname"], batch["condition"], batch["real"]):
            s, i = (int(p) for p in key.split("_"))
            assert caption == f"caption {s} {i}", key
            assert float(real.flatten()[0]) == s * PER + i, key
            seen.append(key)
    assert ignored not in seen
    return seen


def _expected_keys(ignored: str, dropped: int) -> list[str]:
    keys = [grid_key(0, i) for i in range(PER - 1, -1, -1)] + [grid_key(1, i) for i in range(PER) if i != dropped]
    return [k for k in keys + [grid_key(2, i) for i in range(PER)] if k != ignored]


def test_local_readers_do_not_use_a_same_size_stale_index(tmp_path):
    ds = _stale(tmp_path, dropped=PER - 1)
    shards = [f"{ds}/{n:05d}.tar" for n in range(3)]
    assert load_index(shards[0], os.path.getsize(shards[0])) is None
    assert load_index(shards[1], os.path.getsize(shards[1])) is None
    assert load_index(shards[2], os.path.getsize(shards[2])) is not None  # a true index is still used
    with ShardFile(shards[0]) as f:
        assert [e.key for e in f.entries] == [e.key for e in scan_shard(shards[0]).samples]
        assert f.sample(0).members["txt"] == b"caption 0 7"
    assert [r.samples for r in count_shards(ds)] == [PER, PER - 1, PER]

    ignored = grid_key(0, 6)  # the second sample of the rewritten shard, the seventh of its stale index
    (tmp_path / "ign.json").write_text(json.dumps({"00000.tar": [ignored]}))
    loader = WDSLoader(["WDS:" + ds], batch_size=4, key_map=KM, num_workers=0, deterministic=True, train=False,
                       partial=True, ignore_index_paths=str(tmp_path / "ign.json"))
    assert _check_batches(loader, ignored) == _expected_keys(ignored, PER - 1)


@pytest.mark.s3
@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_s3_readers_do_not_use_a_same_size_stale_index(tmp_path, s3_bucket):
    ds = _stale(tmp_path, dropped=0)
    url = f"{s3_bucket}/ds"
    for p in sorted(Path(ds).iterdir()):
        storage.upload(str(p), f"{url}/{p.name}")
    rows = count_shards(url)
    assert [(r.samples, r.from_index) for r in rows] == [(PER, False), (PER - 1, False), (PER, True)]

    from fgdata.cli.main import app
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, ["count-shards", url, "--no-write", "--json"])
    assert res.exit_code == 0, res.output
    assert [s["samples"] for s in json.loads(res.stdout)["shards"]] == [PER, PER - 1, PER]

    ignored = grid_key(0, 6)
    storage.write_bytes(f"{s3_bucket}/ign.json", json.dumps({"00000.tar": [ignored]}).encode())
    loader = WDSLoader(["WDS:" + url], batch_size=4, key_map=KM, num_workers=0, deterministic=True, train=False,
                       partial=True, ignore_index_paths=f"{s3_bucket}/ign.json", cache_path=str(tmp_path / "cache"))
    assert _check_batches(loader, ignored) == _expected_keys(ignored, 0)
