"""What the loaders trust, checked: count files, offset indexes, resume positions and state dicts,
and how much of a sample they read."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from collections import Counter

import numpy as np
import pytest

from fgdata.errors import FgdataError
from fgdata.loaders import LoaderConfigError, WDSLoader
from fgdata.shards import ShardWriter

from .conftest import grid_key, write_grid

KM = {"real": "npy", "condition": "txt"}
ALL = [grid_key(s, i) for s in range(3) for i in range(8)]


def loader(d: str, **kw) -> WDSLoader:
    kw.setdefault("num_workers", 0)
    kw.setdefault("key_map", KM)
    kw.setdefault("batch_size", 2)
    return WDSLoader(["WDS:" + d], **kw)


def one_pass(ld: WDSLoader) -> list[str]:
    return [k for batch in ld for k in batch["__key__"]]


def counts_file(tmp_path, counts: dict) -> str:
    path = tmp_path / "counts.json"
    path.write_text(json.dumps(counts))
    return str(path)


def test_counts_that_lie_raise_in_deterministic_mode_and_warn_in_training(tmp_path):
    d = write_grid(str(tmp_path / "s"))
    lying = counts_file(tmp_path, {"00000.tar": 0, "00001.tar": 3, "00002.tar": 20})
    with pytest.raises(LoaderConfigError, match=r"00000.tar: the shard holds 8 samples, but shard_count_file .* says 0.*count-shards"):
        loader(d, deterministic=True, shard_count_file=lying)
    lying = counts_file(tmp_path, {"00000.tar": 8, "00001.tar": 3, "00002.tar": 20})
    det = loader(d, deterministic=True, train=False, shard_count_file=lying, partial=True)
    assert len(det) == 31
    with pytest.raises(FgdataError, match=r"00001.tar: the shard holds 8 samples, but shard_count_file .*counts.json says 3.*"
                                          r"`fgdata count-shards` or `fgdata verify --write-counts`"):
        one_pass(det)
    with pytest.warns(UserWarning, match=r"00002.tar: the shard holds 8 samples, but .* says 20; using the 8 it holds"):
        keys = one_pass(loader(d, train=False, shard_count_file=lying, partial=True))
    assert sorted(keys) == ALL  # nothing duplicated, nothing skipped
    training = iter(loader(d, shard_count_file=lying, seed=0, shuffle_size=4))
    with pytest.warns(UserWarning, match=r"0000[12].tar: the shard holds 8 samples"):
        seen = [k for _ in range(12) for k in next(training)["__key__"]]
    assert set(seen) <= set(ALL)


@pytest.mark.parametrize("bad", [True, 2 * 2**62, 2**64, 10**6])
def test_counts_must_be_sample_counts(tmp_path, bad):
    d = write_grid(str(tmp_path / "s"), shards=1)
    with pytest.raises(LoaderConfigError, match=rf"count {bad!r} for 00000.tar is not a sample count .*holds at most"):
        loader(d, deterministic=True, shard_count_file=counts_file(tmp_path, {"00000.tar": bad}))


def test_a_stale_offset_index_is_not_used(tmp_path):
    d = write_grid(str(tmp_path / "s"), shards=1)
    index = tmp_path / "s" / "00000.tar.idx.json"
    kept = index.read_bytes()
    shutil.rmtree(tmp_path / "s")
    with ShardWriter(str(tmp_path / "s"), maxcount=8) as w:
        for i in range(3):
            w.write(grid_key(0, i), {"txt": b"x", "npy": np.zeros(2).tobytes()})
    index.write_bytes(kept)  # the 8-sample index beside the new 3-sample shard
    (tmp_path / "s" / "shard_count.json").unlink()
    for det in (True, False):
        keys = one_pass(loader(d, deterministic=det, train=False, partial=True, key_map={"c": "txt"}))
        assert keys == [grid_key(0, i) for i in range(3)]


@pytest.mark.parametrize("start", [2**63 - 2, 2**63, -1, True, 1.5])
def test_out_of_range_start_fails_at_construction(grid, start):
    with pytest.raises(LoaderConfigError, match="sampler_start_idx"):
        loader(grid, deterministic=True, sampler_start_idx=start)


@pytest.mark.parametrize(
    "state, match",
    [
        (None, "expected the dict"),
        ({}, "expected the dict"),
        ({"position": -1}, r"state\['position'\]"),
        ({"position": 2**63 - 2}, r"state\['position'\]"),
        ({"position": "12"}, r"state\['position'\]"),
        ({"position": 4, "epoch": -1}, r"state\['epoch'\]"),
        ({"position": 4, "drops": 1.5}, r"state\['drops'\]"),
    ],
)
def test_bad_state_dict_fails_at_load(grid, state, match):
    ld = loader(grid, deterministic=True)
    good = ld.state_dict()
    if isinstance(state, dict):
        state = {**good, **state} if state else state
    with pytest.raises(LoaderConfigError, match=match):
        ld.load_state_dict(state)
    ld.load_state_dict({**good, "position": 5})
    assert next(iter(ld))["__key__"] == ALL[5:7]


@pytest.mark.parametrize("mode", [{"train": False}, {"seed": 1, "shuffle_size": 2}])
def test_streaming_modes_read_only_the_mapped_members(tmp_path, mode):
    big = 48 << 20
    with ShardWriter(str(tmp_path / "s"), maxcount=4) as w:
        for i in range(4):
            w.write(f"k{i}", {"txt": f"caption {i}".encode(), "bin": bytes(big)})
    ld = loader(str(tmp_path / "s"), key_map={"caption": "txt"}, batch_size=2, **mode)
    tracemalloc.start()
    try:
        it = iter(ld)
        got = [k for _ in range(2) for k in next(it)["caption"]]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert Counter(got).keys() <= {f"caption {i}" for i in range(4)}
    assert peak < big // 4, peak
