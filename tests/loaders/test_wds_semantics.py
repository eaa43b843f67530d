"""- on real shards: worked examples, modes, side files, filters, errors."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from fgdata.errors import FgdataError
from fgdata.loaders import PRESET_CONSTANTS, LoaderConfigError, WDSLoader

from .conftest import grid_key, write_grid

ALL = [grid_key(s, i) for s in range(3) for i in range(8)]
KM = {"real": "npy", "condition": "txt"}


def det(grid, **kw):
    kw.setdefault("num_workers", 0)
    kw.setdefault("key_map", KM)
    return WDSLoader(["WDS:" + grid], deterministic=True, **kw)


def keys(loader, n_batches):
    out = []
    for j, batch in enumerate(loader):
        out.append(list(batch["fname"]))
        if j + 1 == n_batches:
            break
    return out


def flat(batches):
    return [k for b in batches for k in b]


# -- worked examples (fgdata column) ------------------------------------

def test_b2_start0_wraps(grid):
    assert flat(keys(det(grid, batch_size=2), 13)) == ALL + ALL[:2]


@pytest.mark.parametrize("count_file", [True, False])
def test_start20_next_epoch_is_whole(grid, count_file):
    cf = grid + "/shard_count.json" if count_file else None
    got = flat(keys(det(grid, batch_size=4, sampler_start_idx=20, shard_count_file=cf), 8))
    assert got == ALL[20:] + ALL + ALL[:4]


def test_start6_sees_the_first_samples_after_the_wrap(grid):
    got = flat(keys(det(grid, batch_size=2, sampler_start_idx=6), 10))
    assert got[got.index(grid_key(2, 7)) + 1] == grid_key(0, 0)


def test_b5_batches_straddle_epochs(grid):
    assert keys(det(grid, batch_size=5), 5)[4] == ALL[20:24] + ALL[:1]


def test_two_workers_keep_the_one_worker_order(grid):
    assert keys(det(grid, batch_size=2, num_workers=2), 4) == [ALL[0:2], ALL[2:4], ALL[4:6], ALL[6:8]]


# -- deterministic acceptance --------------------------------------------

def test_deterministic_acceptance(grid, tmp_path):
    cf = grid + "/shard_count.json"
    full = [v for b in keys_values(det(grid, batch_size=4, shard_count_file=cf), 12) for v in b]
    again = [v for b in keys_values(det(grid, batch_size=4, shard_count_file=cf), 12) for v in b]
    assert full == again
    assert full[:24] == list(range(24))  # real[b,0,0,0] = shard*8 + i
    resumed = [v for b in keys_values(det(grid, batch_size=4, shard_count_file=cf, sampler_start_idx=12), 3) for v in b]
    assert resumed == full[12:24]
    ign3 = tmp_path / "ign3.json"
    ign3.write_text(json.dumps({"00000.tar": [grid_key(0, 1)], "00002.tar": [grid_key(2, 0), grid_key(2, 7)]}))
    one_pass = det(grid, batch_size=4, train=False, partial=True, ignore_index_paths=[str(ign3)], shard_count_file=cf)
    assert len(flat(keys(one_pass, 100))) == 21
    ign2 = tmp_path / "ign2.json"
    ign2.write_text(json.dumps({"00001.tar": [grid_key(1, 2), grid_key(1, 3)]}))
    stream = [k for k in ALL if k not in (grid_key(1, 2), grid_key(1, 3))]
    got = flat(keys(det(grid, batch_size=2, ignore_index_paths=[str(ign2)], sampler_start_idx=8), 7))
    assert got == stream[8:22]


def keys_values(loader, n_batches):
    out = []
    for j, batch in enumerate(loader):
        out.append(batch["real"][:, 0, 0, 0].int().tolist())
        if j + 1 == n_batches:
            break
    return out


def test_validation_skips_incomplete_samples_in_order(tmp_path):
    d = write_grid(str(tmp_path / "s"), skip={(0, 1), (0, 3)})
    loader = WDSLoader(["WDS:" + d], batch_size=2, key_map=KM, train=False, num_workers=0)
    batches = keys(loader, 100)
    assert batches[0] == [grid_key(0, 0), grid_key(0, 2)]
    assert len(flat(batches)) == 22


def test_validation_splits_shards_over_ranks_and_workers(grid):
    got = {}
    for rank, workers in [(0, 2), (1, 1)]:
        loader = WDSLoader(["WDS:" + grid], batch_size=4, key_map=KM, train=False, num_workers=workers, rank=rank, world_size=2)
        got[rank] = keys(loader, 100)
    # rank 0 holds shards 0 and 2, one per worker; the DataLoader alternates their batches
    assert got[0] == [ALL[0:4], ALL[16:20], ALL[4:8], ALL[20:24]]
    assert got[1] == [ALL[8:12], ALL[12:16]]


def test_validation_empty_worker_says_why(grid):
    loader = WDSLoader(["WDS:" + grid], batch_size=4, key_map=KM, train=False, num_workers=0, rank=3, world_size=4)
    with pytest.raises(FgdataError, match="got no batch.*more shards"):
        keys(loader, 1)


def test_deterministic_drop_is_replaced_by_next_good_sample(tmp_path):
    d = write_grid(str(tmp_path / "s"), skip={(0, 2)})
    loader = det(d, batch_size=4)
    first = keys(loader, 1)[0]
    assert first == [grid_key(0, 0), grid_key(0, 1), grid_key(0, 3), grid_key(0, 3)]
    assert loader.state_dict()["position"] == 4 and loader.state_dict()["drops"] == 1
    # the stream position stays exact: the next batch is positions 4..7
    assert keys(det(d, batch_size=4, sampler_start_idx=4), 1)[0] == [grid_key(0, i) for i in range(4, 8)]
    with pytest.raises(FgdataError, match=r"00000.tar key '00000_00002' \(position 2\).*missing member"):
        keys(det(d, batch_size=4, strict=True), 1)


def test_training_mode_is_seeded_shuffled_and_infinite(grid):
    def run(seed, workers=0):
        loader = WDSLoader(["WDS:" + grid], batch_size=4, key_map=KM, num_workers=workers, seed=seed, shuffle_size=10)
        return flat(keys(loader, 12))

    a = run(7)
    assert a == run(7) and a != run(8)
    assert len(a) == 48 and set(a) <= set(ALL) and a[:24] != ALL
    assert run(7, workers=2) == run(7, workers=2)


def test_training_shuffle_buffer_is_bounded_in_bytes(grid):
    from fgdata.loaders.wds import _ShuffleBuffer
    from fgdata.shards import iter_samples

    buf = _ShuffleBuffer(size=1000, max_bytes=200, rng=np.random.default_rng(0))
    out = []
    for s in iter_samples(grid + "/00000.tar"):
        out.extend(buf.push(s, None))
        assert buf.bytes <= 200 or len(buf.items) == 1
    assert len(out) + len(buf.items) == 8


def test_ignore_index_applies_in_training_mode(grid, tmp_path):
    ign = tmp_path / "ign.json"
    ign.write_text(json.dumps({"00000.tar": ALL[:8], "00001.tar": ALL[8:16]}))
    loader = WDSLoader(["WDS:" + grid], batch_size=4, key_map=KM, num_workers=0, seed=1, ignore_index_paths=str(ign))
    assert set(flat(keys(loader, 6))) <= set(ALL[16:])


@pytest.mark.parametrize("content", [None, "", "{not json"])
def test_ignore_index_must_exist_and_be_readable(grid, tmp_path, content):
    path = tmp_path / "ign.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(FgdataError, match="ignore index"):
        det(grid, batch_size=2, ignore_index_paths=[str(path)])


def test_ignore_index_unknown_shards_warn(grid, tmp_path):
    path = tmp_path / "ign.json"
    path.write_text(json.dumps({"09999.tar": ["x"]}))
    with pytest.warns(UserWarning, match="not among the discovered shards"):
        det(grid, batch_size=2, ignore_index_paths=[str(path)])


def test_qualified_shard_names_match_the_end_of_the_path(tmp_path, monkeypatch):
    """``folder/shard`` keys (as ``fgdata dedup`` writes) name the shard whose path ends so, from any working
    folder; a name two datatags end with is refused, one none ends with is dropped with a warning."""
    for top in ("x", "y"):
        write_grid(str(tmp_path / top / "data"), shards=1)
        write_grid(str(tmp_path / top / "other"), shards=1)
    monkeypatch.chdir(tmp_path / "x")
    ign = tmp_path / "ign.json"

    def kept(tags, key):
        ign.write_text(json.dumps({key: [grid_key(0, 1)]}))
        loader = WDSLoader(["WDS:" + str(tmp_path / t) for t in tags], batch_size=16, key_map=KM, partial=True,
                           deterministic=True, train=False, num_workers=0, ignore_index_paths=str(ign))
        return sorted((s_.rsplit("/", 3)[-3], s_.rsplit("/", 2)[-2], k) for b_ in loader
                      for s_, k in zip(b_["shard"], b_["fname"]))

    got = kept(["y/data", "y/other"], "data/00000.tar")  # not a file from x/: matched by its end
    assert len(got) == 15 and ("y", "data", grid_key(0, 1)) not in got
    got = kept(["x/data", "y/data"], "y/data/00000.tar")
    assert len(got) == 15 and ("y", "data", grid_key(0, 1)) not in got and ("x", "data", grid_key(0, 1)) in got
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoaderConfigError, match="matches several shards"):
        kept(["x/data", "y/data"], "data/00000.tar")
    with pytest.warns(UserWarning, match="not among the discovered shards"):
        assert len(kept(["x/other"], "data/00000.tar")) == 8


def test_shard_selection_is_absolute_and_validated(grid):
    assert flat(keys(det(grid, batch_size=8, shard_start=1, shard_end=1, train=False), 10)) == ALL[8:16]
    assert flat(keys(det(grid, batch_size=8, shard_start=2, train=False), 10)) == ALL[16:24]
    for bad in [dict(shard_start=2, shard_end=1), dict(shard_end=3), dict(shard_start=-1)]:
        with pytest.raises(LoaderConfigError, match="shard_start"):
            det(grid, batch_size=2, **bad)


def test_shards_per_worker_means_k_shards_per_worker(grid):
    loader = det(grid, batch_size=8, shards_per_worker=2, num_workers=2, train=False)
    assert [r.name for r in loader.shards] == ["00000.tar", "00001.tar", "00002.tar", "00000.tar"]
    assert len(loader) == 32


def test_count_file_with_missing_shard_is_completed_by_scanning(grid, tmp_path):
    cf = tmp_path / "counts.json"
    cf.write_text(json.dumps({"00000.tar": 8}))
    with pytest.warns(UserWarning, match="lacks 2"):
        loader = det(grid, batch_size=2, shard_count_file=str(cf))
    assert len(loader) == 24


def test_basename_collisions_across_datatags(tmp_path):
    a = write_grid(str(tmp_path / "a"), shards=1)
    b = write_grid(str(tmp_path / "b"), shards=1)
    loader = WDSLoader(["WDS:" + a, "WDS:" + b], batch_size=8, key_map=KM, deterministic=True, train=False, num_workers=0)
    assert [b_["shard"][0] for b_ in loader] == [a + "/00000.tar", b + "/00000.tar"]
    ign = tmp_path / "ign.json"
    ign.write_text(json.dumps({"00000.tar": [grid_key(0, 0)]}))
    with pytest.raises(LoaderConfigError, match="several datatags"):
        WDSLoader(["WDS:" + a, "WDS:" + b], batch_size=8, key_map=KM, deterministic=True, ignore_index_paths=str(ign))
    ign.write_text(json.dumps({b + "/00000.tar": [grid_key(0, 0)]}))
    loader = WDSLoader(["WDS:" + a, "WDS:" + b], batch_size=8, key_map=KM, deterministic=True, ignore_index_paths=str(ign))
    assert len(loader) == 15


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_attribute_is_a_dataloader_over_the_same_stream(grid, workers):
    """The reference's loaders expose ``.loader`` (a DataLoader); iterating it is iterating the loader."""
    from torch.utils.data import DataLoader

    loader = det(grid, batch_size=4, num_workers=workers, sampler_start_idx=6)
    view = loader.loader
    assert isinstance(view, DataLoader) and len(view) == len(loader) == 24
    got = flat(keys(view, 3))
    assert got == ALL[6:18] and loader.state_dict()["position"] == 18
    assert flat(keys(loader, 3)) == got
    with pytest.raises(TypeError, match="deterministic"):
        len(WDSLoader(["WDS:" + grid], batch_size=4, key_map=KM, num_workers=0, seed=1).loader)


def test_ignore_entries_match_however_the_datatag_spells_the_folder(tmp_path, monkeypatch):
    """Absolute keys under relative datatags, relative keys under absolute ones, through a symlink; else refused."""
    write_grid(str(tmp_path / "a"), shards=1)
    write_grid(str(tmp_path / "b"), shards=1)
    (tmp_path / "link").symlink_to(tmp_path / "b")
    monkeypatch.chdir(tmp_path)
    ign = tmp_path / "ign.json"
    spellings = [str(tmp_path / "b" / "00000.tar"), "b/00000.tar", "./b/../b/00000.tar", "link/00000.tar"]
    for key in spellings:
        ign.write_text(json.dumps({key: [grid_key(0, 1)]}))
        for tags in (["WDS:a", "WDS:b"], ["WDS:" + str(tmp_path / "a"), "WDS:" + str(tmp_path / "b")]):
            loader = WDSLoader(tags, batch_size=15, key_map=KM, deterministic=True, train=False, num_workers=0,
                               ignore_index_paths=str(ign))
            got = [(s_.rsplit("/", 2)[-2], k) for b_ in loader for s_, k in zip(b_["shard"], b_["fname"])]
            assert len(got) == 15 and ("b", grid_key(0, 1)) not in got and ("a", grid_key(0, 1)) in got, (key, tags)
    ign.write_text(json.dumps({str(tmp_path / "c" / "00000.tar"): [grid_key(0, 1)]}))
    with pytest.raises(LoaderConfigError, match="not shards of the datatags"):
        WDSLoader(["WDS:a", "WDS:b"], batch_size=8, key_map=KM, deterministic=True, ignore_index_paths=str(ign))
    with pytest.raises(LoaderConfigError, match="not shards of the datatags"):  # training mode too: never skipped
        WDSLoader(["WDS:a"], batch_size=8, key_map=KM, ignore_index_paths=str(ign))


# -- key_map, files_map, presets ------------------------------------------

def test_batch_contract_for_tensors_text_json_and_constants(latent_shards):
    loader = WDSLoader(
        ["WDS:" + latent_shards], batch_size=2, num_workers=0, deterministic=True,
        key_map={"real": "latent.pth", "condition": "txt_emb.pth", "meta": "json"},
        files_map={"neg_condition": "neg_prompt_emb.npy"},
        presets_map={"neg_condition_raw": "neg_prompt_wan"},
    )
    batch = next(iter(loader))
    assert batch["real"].shape == (2, 4, 8, 8) and batch["real"].dtype == torch.float32
    assert batch["condition"].shape == (2, 7, 16)
    assert batch["neg_condition"].shape == (2, 7, 16) and not batch["neg_condition"].any()
    assert batch["neg_condition_raw"] == [PRESET_CONSTANTS["neg_prompt_wan"]] * 2
    assert batch["meta"]["score"].tolist() == [0, 1] and batch["meta"]["score"].dtype == torch.int64
    assert batch["fname"] == ["sample_000000", "sample_000001"] == batch["__key__"]
    assert batch["shard"] == [latent_shards + "/00000.tar"] * 2


def test_files_map_relative_rule_and_missing_file(latent_shards, tmp_path):
    # "WDS:<dir>/" resolves against the directory itself, where the file is absent
    with pytest.raises(LoaderConfigError, match=r"neg_prompt_emb.npy \(relative to .*shards"):
        WDSLoader(["WDS:" + latent_shards + "/"], batch_size=2, files_map={"neg_condition": "neg_prompt_emb.npy"})
    zeros = WDSLoader(["WDS:" + latent_shards], batch_size=2, num_workers=0, deterministic=True, files_map={"neg_condition": {"zeros": [3]}})
    assert next(iter(zeros))["neg_condition"].shape == (2, 3)


def test_missing_member_with_constant_keeps_the_constant(tmp_path, caplog):
    d = write_grid(str(tmp_path / "s"), skip={(0, 0)})
    np.save(tmp_path / "const.npy", np.full((1, 2, 2), -1, np.float32))
    loader = det(d, batch_size=2, files_map={"real": "const.npy"})
    with caplog.at_level(logging.WARNING, logger="fgdata.loaders"):
        batch = next(iter(loader))
    assert batch["real"][:, 0, 0, 0].tolist() == [-1, 1]
    assert "keeping the constant" in caplog.text


def test_presets_filter(latent_shards, tmp_path, caplog):
    loader = WDSLoader(
        ["WDS:" + latent_shards], batch_size=2, num_workers=0, train=False, partial=True,
        presets_filter={"score": {"threshold": 3}}, key_map={"real": "latent.pth"},
    )
    assert flat(keys(loader, 10)) == ["sample_000003", "sample_000004", "sample_000005"]
    with pytest.raises(LoaderConfigError, match="deterministic"):
        WDSLoader(["WDS:" + latent_shards], batch_size=2, deterministic=True, presets_filter={"score": {}})
    with pytest.raises(FgdataError, match="unknown filter"):
        WDSLoader(["WDS:" + latent_shards], batch_size=2, presets_filter={"nope": {}})


def test_score_filter_drops_invalid_json_instead_of_ending(tmp_path, caplog):
    from fgdata.shards import ShardWriter

    d = str(tmp_path / "s")
    with ShardWriter(d) as w:
        for i, js in enumerate([b'{"score": 9}', b"{bad", b'{"score": "high"}', b"{}", b'{"score": 1}', b""]):
            members = {"txt": b"x"}
            if js:
                members["json"] = js
            w.write(f"k{i}", members)
    loader = WDSLoader(["WDS:" + d], batch_size=1, key_map={"c": "txt"}, train=False, num_workers=0,
                       presets_filter={"score": {"threshold": 5}, "empty_keys": {"keys": ["txt"]}})
    with caplog.at_level(logging.WARNING, logger="fgdata.loaders"):
        assert flat(keys(loader, 10)) == ["k0", "k3", "k5"]
    assert "invalid JSON" in caplog.text and "non-numeric" in caplog.text


def test_preset_texts_are_byte_exact():
    import hashlib

    sha = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in PRESET_CONSTANTS.items()}
    assert sha["empty_string"] == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert sha["neg_prompt_wan"] == "e488b06083693241fbe71bed61a3eb0035f4ec96d858d235be1662c226452fac"
    assert sha["neg_prompt_cosmos"] == "6d7ca93077e7e4a8417947ab03266c97dd44c9ec0d7b97fa4272ed956895239f"
    assert len(PRESET_CONSTANTS["neg_prompt_wan"]) == 392 and len(PRESET_CONSTANTS["neg_prompt_cosmos"]) == 538
    assert len(PRESET_CONSTANTS) == 7 and all(isinstance(v, str) for v in PRESET_CONSTANTS.values())


def test_unknown_preset_and_bad_tags(grid):
    with pytest.raises(FgdataError, match="unknown preset"):
        det(grid, batch_size=2, presets_map={"neg": "nope"})
    for tags, msg in [(["/x"], "no type prefix"), (["TAR:" + grid], "not a WDS tag"), (["WDS:/nonexistent"], "not an existing directory"),
                      (["WDS:/path/to/image_shards"], "placeholder")]:
        with pytest.raises(LoaderConfigError, match=msg):
            WDSLoader(tags, batch_size=2)


def test_construction_warnings(grid):
    with pytest.warns(UserWarning, match="1-worker order"):
        WDSLoader(["WDS:" + grid], batch_size=2, deterministic=True, num_workers=2)
    with pytest.warns(UserWarning, match="unshuffled; pass shuffle_block"):
        WDSLoader(["WDS:" + grid], batch_size=2, deterministic=True)
    with pytest.warns(UserWarning, match="ignored without deterministic"):
        WDSLoader(["WDS:" + grid], batch_size=2, sampler_start_idx=5)


def test_num_workers_defaults(grid):
    import os

    assert WDSLoader(["WDS:" + grid], batch_size=2, deterministic=True).num_workers == 1
    assert WDSLoader(["WDS:" + grid], batch_size=2, world_size=1, rank=0).num_workers == min(os.cpu_count(), 8)


def test_txt_extensions_decide_what_is_text(tmp_path, caplog):
    from fgdata.shards import ShardWriter

    d = str(tmp_path / "s")
    with ShardWriter(d) as w:
        w.write("k0", {"caption": b"  a cat \n", "txt": b" hi "})
    as_bytes = WDSLoader(["WDS:" + d], batch_size=1, key_map={"c": "caption", "t": "txt"}, deterministic=True, num_workers=0)
    with caplog.at_level(logging.WARNING, logger="fgdata.loaders"):
        batch = next(iter(as_bytes))
    assert batch["c"] == [b"  a cat \n"] and batch["t"] == ["hi"]
    assert "raw bytes" in caplog.text
    as_text = WDSLoader(["WDS:" + d], batch_size=1, key_map={"c": "caption"}, txt_extensions=("txt", "caption"),
                        deterministic=True, num_workers=0)
    assert next(iter(as_text))["c"] == ["a cat"]
