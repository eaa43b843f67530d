"""The pure sample plan and the resume property: stop at k + resume from k == the uninterrupted run."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fgdata.errors import FgdataError
from fgdata.loaders import WDSLoader
from fgdata.loaders.plan import EpochStream, SamplePlan, Split

from .conftest import grid_key


def test_epoch_stream_removes_ignored_before_counting():
    e = EpochStream([3, 4, 2], [[], [0, 2], []])
    assert len(e) == 7
    assert [e.locate(i) for i in range(7)] == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 3), (2, 0), (2, 1)]
    with pytest.raises(IndexError):
        e.locate(7)


@pytest.mark.parametrize("block", [None, 1, 3, 5, 100])
def test_every_epoch_is_a_permutation_and_order_is_pure(block):
    e = EpochStream([5, 7, 4], [[1], [], [3]])
    plan = SamplePlan(e, seed=11, shuffle_block=block)
    n = len(plan)
    epochs = [[(plan.at(ep * n + j).shard, plan.at(ep * n + j).index) for j in range(n)] for ep in range(3)]
    expected = {e.locate(i) for i in range(n)}
    for ep in epochs:
        assert set(ep) == expected and len(ep) == n
    again = SamplePlan(EpochStream([5, 7, 4], [[1], [], [3]]), seed=11, shuffle_block=block)
    assert [(again.at(p).shard, again.at(p).index) for p in range(3 * n)] == [x for ep in epochs for x in ep]
    if block is not None and block < n:
        assert epochs[0] != epochs[1]  # a new permutation each epoch
    if block is None:
        assert epochs[0] == [e.locate(i) for i in range(n)]


def test_block_shuffle_keeps_locality():
    plan = SamplePlan(EpochStream([100] * 10), seed=3, shuffle_block=50)
    for start in range(0, 1000, 50):
        shards = {plan.at(p).shard for p in range(start, start + 50)}
        assert len(shards) == 1


def test_plan_hash_depends_on_data_seed_and_shuffle():
    base = SamplePlan(EpochStream([4, 4]), seed=0).hash
    assert SamplePlan(EpochStream([4, 4]), seed=0).hash == base
    assert SamplePlan(EpochStream([4, 5]), seed=0).hash != base
    assert SamplePlan(EpochStream([4, 4], [[1], []]), seed=0).hash != base
    assert SamplePlan(EpochStream([4, 4]), seed=1).hash != base
    assert SamplePlan(EpochStream([4, 4]), seed=0, shuffle_block=2).hash != base


def test_split_ranks_and_workers():
    # rank 1 of 2 from start 3: positions 4, 6, 8, ...; worker 1 of 2 owns batches 1, 3, ...
    s = Split(start=3, rank=1, world_size=2, worker=1, num_workers=2, batch_size=2)
    it = s.batches()
    assert [next(it), next(it)] == [[8, 10], [16, 18]]
    # finite stream of 20: rank 1 gets 4..18 (8 samples) -> batches [4,6] [8,10] [12,14] [16,18]
    assert list(Split(3, 1, 2, 0, 1, 3).batches(20)) == [[4, 6, 8], [10, 12, 14]]
    assert list(Split(3, 1, 2, 0, 1, 3).batches(20, partial=True))[-1] == [16, 18]


def _take(loader, n_batches):
    out = []
    if n_batches == 0:
        return out
    for batch in loader:
        out.append(batch)
        if len(out) == n_batches:
            break
    return out


def _ignore_file(ignored: set[tuple[int, int]]) -> str | None:
    if not ignored:
        return None
    doc: dict[str, list[str]] = {}
    for s, i in sorted(ignored):
        doc.setdefault(f"{s:05d}.tar", []).append(grid_key(s, i))
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    return path


@given(
    world=st.integers(1, 4),
    workers=st.integers(0, 3),
    batch=st.integers(1, 5),
    seed=st.integers(0, 2**31),
    start=st.integers(0, 60),
    stop_frac=st.floats(0, 1),
    ignored=st.sets(st.tuples(st.integers(0, 2), st.integers(0, 7)), max_size=4),
    block=st.sampled_from([None, 4]),
    via_state=st.booleans(),
)
@pytest.mark.slow  # a job stopped and rerun
def test_resume_equals_uninterrupted_and_epochs_are_exact(grid, world, workers, batch, seed, start, stop_frac, ignored, block, via_state):
    ignore = _ignore_file(ignored)
    kw = dict(
        batch_size=batch, key_map={"condition": "txt"}, deterministic=True, num_workers=workers, seed=seed,
        shuffle_block=block, world_size=world, ignore_index_paths=[ignore] if ignore else None,
    )
    n = 24 - len(ignored)
    total = -(-2 * n // (batch * world)) + 1  # batches per rank: past at least one epoch end
    stop = int(stop_frac * total)
    seen: dict[int, str] = {}
    try:
        for rank in range(world):
            full = _take(WDSLoader(["WDS:" + grid], rank=rank, sampler_start_idx=start, **kw), total)
            first = WDSLoader(["WDS:" + grid], rank=rank, sampler_start_idx=start, **kw)
            head = _take(first, stop)
            state = first.state_dict()
            assert state["position"] == start + stop * batch * world
            if via_state:
                second = WDSLoader(["WDS:" + grid], rank=rank, **kw)
                second.load_state_dict(state)
            else:
                second = WDSLoader(["WDS:" + grid], rank=rank, sampler_start_idx=state["position"], **kw)
            tail = _take(second, total - stop)
            keys = [k for b in full for k in b["fname"]]
            assert [k for b in head + tail for k in b["fname"]] == keys
            positions = [p for b in full for p in b["__index__"].tolist()]
            assert positions == [start + rank + k * world for k in range(total * batch)]
            seen.update(zip(positions, keys))
    finally:
        if ignore:
            os.unlink(ignore)
    expected = sorted(grid_key(s, i) for s in range(3) for i in range(8) if (s, i) not in ignored)
    for epoch in range(start // n, (start + total * batch * world) // n + 1):
        span = range(epoch * n, (epoch + 1) * n)
        if all(p in seen for p in span):
            assert sorted(seen[p] for p in span) == expected  # every sample exactly once per epoch


def test_resume_refuses_another_dataset_or_seed(grid, tmp_path):
    a = WDSLoader(["WDS:" + grid], batch_size=2, key_map={"condition": "txt"}, deterministic=True, num_workers=0, seed=1)
    _take(a, 2)
    b = WDSLoader(["WDS:" + grid], batch_size=2, key_map={"condition": "txt"}, deterministic=True, num_workers=0, seed=2)
    with pytest.raises(FgdataError, match="cannot resume"):
        b.load_state_dict(a.state_dict())
    c = WDSLoader(["WDS:" + grid], batch_size=2, key_map={"condition": "txt"}, deterministic=True, num_workers=0, seed=1, shard_end=1)
    with pytest.raises(FgdataError, match="cannot resume"):
        c.load_state_dict(a.state_dict())


def test_iteration_is_repeatable(grid):
    """A second iter() gives the same stream (no in-place rotation)."""
    loader = WDSLoader(["WDS:" + grid], batch_size=3, key_map={"condition": "txt"}, deterministic=True, num_workers=0, sampler_start_idx=5)
    first = [b["fname"] for b in _take(loader, 4)]
    assert [b["fname"] for b in _take(loader, 4)] == first
    assert np.array_equal(first[0], [grid_key(0, 5), grid_key(0, 6), grid_key(0, 7)])
