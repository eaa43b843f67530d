"""ImageLoader: batch contract, labels, xflip, max_size, the reference order, exact resume, workers, folders, latents."""

from __future__ import annotations

import io
import json
import warnings
import zipfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from fgdata.errors import FgdataError
from fgdata.loaders.image_loader import ImageLoader, PositionSampler
from fgdata.prepare import Cifar10Options, RunSettings, prepare_cifar10


@pytest.fixture(scope="module")
def cifar_zip(cifar_tarball, tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    prepare_cifar10(Cifar10Options(root, cifar_tarball[0], skip_md5=True), RunSettings(workers=1))
    return root / "cifar10" / "cifar10-32x32.zip"


def _batches(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def test_batch_contract_and_values(cifar_zip, cifar_tarball):
    _, images, labels = cifar_tarball
    batch = next(iter(ImageLoader(str(cifar_zip), None, batch_size=8, num_workers=0)))
    assert set(batch) == {"real", "condition", "neg_condition", "idx"}
    assert batch["real"].shape == (8, 3, 32, 32) and batch["real"].dtype == torch.float32
    assert batch["condition"].shape == (8, 10) and batch["idx"].dtype == torch.int64
    assert torch.count_nonzero(batch["neg_condition"]) == 0
    for row, i in enumerate(batch["idx"].tolist()):
        want = torch.from_numpy(images[i].transpose(2, 0, 1).copy()).float() / 127.5 - 1
        torch.testing.assert_close(batch["real"][row], want, rtol=0, atol=0)
        assert batch["condition"][row].argmax().item() == labels[i] and batch["condition"][row].sum() == 1


def test_order_follows_il7_and_resume_is_exact(cifar_zip):
    loader = ImageLoader(str(cifar_zip), None, batch_size=4, num_workers=0)
    first = _batches(loader, 60)  # 240 samples: crosses the 200-sample epoch boundary
    idx = torch.cat([b["idx"] for b in first]).tolist()
    expected = []
    for p in range(240):
        e, i = divmod(p, 200)
        order = np.arange(200)
        np.random.RandomState(e).shuffle(order)
        expected.append(int(order[i]))
    assert idx == expected
    resumed = next(iter(ImageLoader(str(cifar_zip), None, batch_size=4, num_workers=0, sampler_start_idx=8)))
    assert resumed["idx"].tolist() == first[2]["idx"].tolist()
    torch.testing.assert_close(resumed["real"], first[2]["real"])


def test_ranks_stride_and_workers_do_not_change_order(cifar_zip):
    ranks = [torch.cat([b["idx"] for b in _batches(ImageLoader(str(cifar_zip), None, batch_size=5, num_workers=0,
                                                               rank=r, world_size=2), 3)]) for r in range(2)]
    sampler = PositionSampler(200, shuffle=True)
    stream = [x for x, _ in zip(iter(sampler), range(30))]
    assert ranks[0].tolist() == stream[0::2] and ranks[1].tolist() == stream[1::2]
    two = _batches(ImageLoader(str(cifar_zip), None, batch_size=5, num_workers=2, rank=1, world_size=2), 3)
    assert torch.cat([b["idx"] for b in two]).tolist() == ranks[1].tolist()


def test_xflip_max_size_and_unshuffled(cifar_zip):
    loader = ImageLoader(str(cifar_zip), None, batch_size=4, num_workers=0, shuffle=False, xflip=True, max_size=50,
                         random_seed=3)
    assert len(loader.dataset) == 100
    keep = np.arange(200)
    np.random.RandomState(3).shuffle(keep)
    keep = np.sort(keep[:50])
    item, mirrored = loader.dataset[7], loader.dataset[57]
    assert item["idx"] == 7 and mirrored["idx"] == 57
    torch.testing.assert_close(mirrored["real"], item["real"].flip(-1))
    raw = ImageLoader(str(cifar_zip), None, batch_size=1, num_workers=0).dataset[int(keep[7])]
    torch.testing.assert_close(item["real"], raw["real"])
    assert next(iter(loader))["idx"].tolist() == [0, 1, 2, 3]


def test_folder_npy_latents_palette_and_no_labels(tmp_path, sample_images):
    folder = tmp_path / "folder"
    (folder / "a").mkdir(parents=True)
    Image.open(sample_images[0]).convert("RGB").resize((16, 16)).convert("P").save(folder / "a" / "p.png")
    Image.open(sample_images[1]).convert("RGB").resize((16, 16)).save(folder / "a" / "q.png")
    with pytest.warns(UserWarning, match="palette"):
        batch = next(iter(ImageLoader(str(folder), None, batch_size=2, num_workers=0, shuffle=False)))
    assert batch["real"].shape == (2, 3, 16, 16) and batch["condition"].shape == (2, 0)
    latents = tmp_path / "lat.zip"
    arrays = [np.random.default_rng(i).standard_normal((8, 4, 4)).astype(np.float32) for i in range(3)]
    with zipfile.ZipFile(latents, "w") as zf:
        for i, a in enumerate(arrays):
            buf = io.BytesIO()
            np.save(buf, a)
            zf.writestr(f"{i:05d}.npy", buf.getvalue())
        zf.writestr("dataset.json", json.dumps({"labels": [[f"{i:05d}.npy", i] for i in range(3)]}))
    batch = next(iter(ImageLoader(str(latents), None, batch_size=3, num_workers=0, shuffle=False)))
    torch.testing.assert_close(batch["real"], torch.from_numpy(np.stack(arrays)))
    assert batch["condition"].tolist() == np.eye(3).tolist()
    unlabelled = next(iter(ImageLoader(str(latents), None, batch_size=3, num_workers=0, use_labels=False)))
    assert unlabelled["condition"].shape == (3, 0)


def test_cache_is_opt_in_and_warns_only_at_a_size_that_matters(cifar_zip, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ImageLoader(str(cifar_zip), None, batch_size=2, num_workers=0)
        loader = ImageLoader(str(cifar_zip), None, batch_size=2, num_workers=0, cache=True)  # 0.6 MB: nothing to say
    assert next(iter(loader))["real"].shape == (2, 3, 32, 32)
    # 16 latents of 64 MiB each (sparse files: zeros on disk cost nothing): 1 GiB of cache per process
    big = tmp_path / "big"
    big.mkdir()
    for i in range(16):
        np.lib.format.open_memmap(big / f"{i:05d}.npy", mode="w+", dtype=np.float32, shape=(1, 4096, 4096)).flush()
    with pytest.warns(UserWarning, match=r"cache=True keeps about 1\.0 GiB of decoded samples in one process \(1\.0 GiB in all\)"):
        ImageLoader(str(big), None, batch_size=2, num_workers=0, cache=True, use_labels=False)
    with pytest.warns(UserWarning, match=r"about 0\.5 GiB .* in each of 2 worker processes \(1\.0 GiB in all\)"):
        ImageLoader(str(big), None, batch_size=2, num_workers=2, cache=True, use_labels=False, max_size=8)


def _take(loader, n):
    return [b for _, b in zip(range(n), loader)]


def _idx(batches):
    return [i for b in batches for i in b["idx"].tolist()]


def test_len_is_batches_per_epoch_for_this_rank(cifar_zip):
    assert len(ImageLoader(str(cifar_zip), None, batch_size=8, num_workers=0)) == 25
    assert len(ImageLoader(str(cifar_zip), None, batch_size=7, num_workers=0)) == 29  # the last batch runs on
    # rank 1 of 3 takes positions 1, 4, ..., 199 of each epoch: 67 samples, 9 batches of 8
    assert len(ImageLoader(str(cifar_zip), None, batch_size=8, num_workers=0, rank=1, world_size=3)) == 9
    one_epoch = _idx(_take(ImageLoader(str(cifar_zip), None, batch_size=8, num_workers=0), 25))
    assert sorted(one_epoch) == list(range(200))


@given(batch=st.integers(1, 9), world=st.integers(1, 3), rank_frac=st.floats(0, 0.99), start=st.integers(0, 450),
       stop_frac=st.floats(0, 1), shuffle=st.booleans(), via_state=st.booleans())
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.slow  # a job stopped and rerun
def test_resume_equals_uninterrupted(cifar_zip, batch, world, rank_frac, start, stop_frac, shuffle, via_state):
    kw = dict(batch_size=batch, num_workers=0, rank=int(rank_frac * world), world_size=world, shuffle=shuffle, seed=5)
    total = -(-200 // (batch * world)) + 2  # past an epoch end
    stop = int(stop_frac * total)
    full = _idx(_take(ImageLoader(str(cifar_zip), None, sampler_start_idx=start, **kw), total))
    first = ImageLoader(str(cifar_zip), None, sampler_start_idx=start, **kw)
    head = _take(first, stop)
    state = first.state_dict()
    assert state["position"] == start + stop * batch * world and state["epoch"] == state["position"] // 200
    if via_state:
        second = ImageLoader(str(cifar_zip), None, **kw)
        second.load_state_dict(state)
    else:
        second = ImageLoader(str(cifar_zip), None, sampler_start_idx=state["position"], **kw)
    assert _idx(head) + _idx(_take(second, total - stop)) == full


def test_state_dict_with_workers_and_refusals(cifar_zip):
    first = ImageLoader(str(cifar_zip), None, batch_size=6, num_workers=2)
    head = _take(first, 5)
    second = ImageLoader(str(cifar_zip), None, batch_size=6, num_workers=2)
    second.load_state_dict(first.state_dict())
    full = _take(ImageLoader(str(cifar_zip), None, batch_size=6, num_workers=0), 9)
    assert _idx(head) + _idx(_take(second, 4)) == _idx(full)
    assert _idx(_take(second, 4)) == _idx(full[5:])  # every iter() starts at the resume position
    for other in (dict(seed=1), dict(shuffle=False), dict(max_size=100)):
        with pytest.raises(FgdataError, match="cannot resume"):
            ImageLoader(str(cifar_zip), None, batch_size=6, num_workers=0, **other).load_state_dict(first.state_dict())
    with pytest.raises(FgdataError, match="sampler_start_idx"):
        ImageLoader(str(cifar_zip), None, batch_size=6, num_workers=0, sampler_start_idx=-1)


def test_loader_attribute_is_a_dataloader_over_the_same_stream(cifar_zip):
    """The reference's class-conditional loader exposes ``.loader`` (a DataLoader), as the WDS loaders do: its batches
    are the loader's own, from the resume position, and they move the loader's resume state."""
    loader = ImageLoader(str(cifar_zip), None, batch_size=6, num_workers=0, sampler_start_idx=12)
    view = loader.loader
    assert isinstance(view, torch.utils.data.DataLoader) and len(view) == len(loader) == 34
    got = _take(view, 3)
    assert loader.state_dict()["position"] == 30
    want = _take(ImageLoader(str(cifar_zip), None, batch_size=6, num_workers=0, sampler_start_idx=12), 3)
    assert _idx(got) == _idx(want)
    torch.testing.assert_close(torch.cat([b["real"] for b in got]), torch.cat([b["real"] for b in want]))


def test_missing_path_raises_ioerror(tmp_path):
    with pytest.raises(IOError):
        ImageLoader(str(tmp_path / "none.zip"), None, batch_size=2)
