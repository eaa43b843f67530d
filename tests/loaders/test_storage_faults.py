"""Shards that vanish after the loader was built: a storage fault, named with its error in every mode, never a
drop that ends in a message about ignore indexes or workers' shares, and never an endless training stream; one
vanished shard among readable ones is skipped by a training stream, however often it is drawn."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from fgdata.errors import StorageError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))  # faultkit, the fault-injection helpers

from faultkit import write_dataset  # noqa: E402

MODES = {"training": dict(train=True), "deterministic": dict(deterministic=True, train=False),
         "validation": dict(train=False)}
pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_vanished_shards_fail_naming_the_shard(tmp_path, mode):
    from fgdata.loaders import WDSLoader

    ds = tmp_path / "ds"
    write_dataset(ds, n=6, maxcount=3, kinds=("png", "txt"))
    loader = WDSLoader(["WDS:" + str(ds)], batch_size=2, num_workers=0, key_map={"image": "png", "caption": "txt"},
                       shard_count_file=str(ds / "shard_count.json"), **MODES[mode])
    for shard in ds.glob("*.tar*"):  # the shards and their indexes go after the loader has counted them
        shard.unlink()
    with pytest.raises(StorageError, match=r"/0000[01]\.tar: (file not found|No such file or directory)") as err:
        next(iter(loader))
    assert "\n" not in str(err.value)


def test_a_training_stream_skips_one_vanished_shard(tmp_path, caplog):
    """One of two shards vanishes: the training stream keeps delivering the other shard's samples, logging the drop;
    the vanished shard is drawn again after each good read (a drop each time) and never ends the stream."""
    from fgdata.loaders import WDSLoader

    ds = tmp_path / "ds"
    write_dataset(ds, n=6, maxcount=3, kinds=("png", "txt"))
    loader = WDSLoader(["WDS:" + str(ds)], batch_size=3, num_workers=0, key_map={"image": "png", "caption": "txt"},
                       seed=0, shuffle_size=3, train=True)
    (ds / "00000.tar").unlink()
    with caplog.at_level(logging.WARNING, logger="fgdata.loaders"):
        batches = [b for _, b in zip(range(30), loader)]
    assert {k for b in batches for k in b["__key__"]} == {"sample_000003", "sample_000004", "sample_000005"}
    drops = [r.getMessage() for r in caplog.records if "unreadable shard" in r.getMessage()]
    assert len(drops) > 1 and all("00000.tar" in d for d in drops)
