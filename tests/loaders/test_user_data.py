"""Loaders on a user's real folders, as a new user meets them: `fgdata shard images|videos`, then a preset.

Mixed PNG/JPEG/GIF photo folders and real clips, written by fgdata's own shard job: the default
image config sees every sample exactly once per epoch; a wrong key_map, absent captions and clips
shorter than sequence_length are errors raised in the first batch, not streams of drops; the drop
rule's replacements are counted per epoch.
"""

from __future__ import annotations

import multiprocessing
import re
import shutil
from pathlib import Path

import pytest
from PIL import Image

from fgdata.configs import ImageLoaderConfig, VideoLoaderConfig, instantiate
from fgdata.sharding.job import ShardJob, run_shard
from fgdata.producers.media import ShardOptions
from fgdata.errors import FgdataError
from fgdata.loaders import LoaderConfigError, VideoWDSLoader

PHOTOS = ("chelsea.png", "coffee.png", "horse.png", "camera.png", "rocket.jpg", "grace_hopper.jpg", "hubble_deep_field.jpg")


def mixed_folder(dest: Path, sample_data: Path, captions: bool = True, only: tuple[str, ...] | None = None) -> Path:
    """The bundled photos as found (PNG and JPEG) plus a GIF and a second PNG/JPEG of each, 16 files."""
    dest.mkdir(parents=True)
    names = [n for n in PHOTOS if only is None or n.rsplit(".", 1)[1] in only]
    files: list[Path] = []
    for i, name in enumerate(names):
        src = sample_data / name
        files.append(shutil.copy(src, dest / f"a{i:02d}_{name}"))
        im = Image.open(src).convert("RGB")
        im.thumbnail((96, 96))
        kind = src.suffix.lower()[1:] if only is not None else ("gif" if i % 2 == 0 else ("png" if src.suffix == ".jpg" else "jpg"))
        out = dest / f"b{i:02d}_{src.stem}.{kind}"
        im.save(out, {"gif": "GIF", "png": "PNG", "jpg": "JPEG"}[kind])
        files.append(out)
    if captions:
        for f in files:
            f.with_suffix(".txt").write_text(f"a photo called {f.stem}")
    return dest


def shard_images(src: Path, dest: Path, maxcount: int = 4) -> str:
    """Shard keeping each photo's format (``--format keep``): these tests want datasets that mix formats."""
    report = run_shard(ShardJob(src=str(src), dest=str(dest), options=ShardOptions(kind="images", image_format="keep"),
                                    maxcount=maxcount))
    assert report.failed == 0
    return str(dest)


def image_config(shards: str, **overrides):
    cfg = ImageLoaderConfig.copy()
    cfg.datatags = ["WDS:" + shards]
    cfg.input_res, cfg.batch_size, cfg.num_workers = 32, 4, 0
    for k, v in overrides.items():
        cfg[k] = v
    return cfg


def epoch_keys(loader) -> list[str]:
    return [k for batch in loader for k in batch["__key__"]]


@pytest.fixture(scope="module")
def mixed_shards(tmp_path_factory, sample_data) -> str:
    root = tmp_path_factory.mktemp("mixed")
    return shard_images(mixed_folder(root / "photos", sample_data), root / "shards")


def test_shards_really_mix_formats(mixed_shards):
    from fgdata.shards import iter_samples

    exts = {e for p in sorted(Path(mixed_shards).glob("*.tar")) for s in iter_samples(str(p)) for e in s.members}
    assert {"jpg", "png", "gif", "txt"} <= exts


@pytest.mark.parametrize("workers", [0, 2])
def test_default_image_config_sees_every_sample_once(mixed_shards, workers, recwarn):
    loader = instantiate(image_config(mixed_shards, deterministic=True, train=False, partial=True, num_workers=workers))
    keys = epoch_keys(loader)
    assert len(keys) == len(set(keys)) == 14 == len(loader)
    assert loader.state_dict()["drops"] == 0
    assert not [w for w in recwarn if "replacement" in str(w.message)]


def test_default_image_config_in_training_and_validation_modes(mixed_shards):
    val = epoch_keys(instantiate(image_config(mixed_shards, train=False, partial=True)))
    assert sorted(val) == sorted(set(val)) and len(val) == 14
    it = iter(instantiate(image_config(mixed_shards, seed=3)))
    batch = next(it)
    assert batch["real_raw"].shape == (4, 3, 32, 32) and all(batch["condition_raw"])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", [{"deterministic": True}, {}, {"train": False}])
def test_wrong_extension_is_an_error_in_the_first_batch(tmp_path, sample_data, mode, workers):
    shards = shard_images(mixed_folder(tmp_path / "photos", sample_data, only=("png",)), tmp_path / "shards")
    loader = instantiate(image_config(shards, key_map={"real_raw": "jpg", "condition_raw": "txt"}, num_workers=workers, **mode))
    children = set(multiprocessing.active_children())
    with pytest.raises(LoaderConfigError) as info:
        next(iter(loader))
    # The workers have stopped although the error (and its traceback) is still held: left to the garbage
    # collector, torch's shutdown waits 5 s per worker at some later moment.
    assert set(multiprocessing.active_children()) <= children
    message = str(info.value)
    assert "\n" not in message and message.startswith("key_map['real_raw']")  # one line, also from a worker process
    assert "key_map['real_raw'] = 'jpg'" in message
    assert re.search(r"they have (png|txt|json) in ([48]), (png|txt|json) in \2, (png|txt|json) in \2\.", message), message
    assert "Set key_map['real_raw']" in message


def test_absent_captions_are_an_error_or_the_empty_string(tmp_path, sample_data):
    shards = shard_images(mixed_folder(tmp_path / "photos", sample_data, captions=False), tmp_path / "shards")
    with pytest.raises(LoaderConfigError, match=r"key_map\['condition_raw'\] = 'txt'.*missing_text='empty'"):
        next(iter(instantiate(image_config(shards, deterministic=True))))
    loader = instantiate(image_config(shards, deterministic=True, train=False, partial=True, missing_text="empty"))
    batches = list(loader)
    assert sorted(k for b in batches for k in b["__key__"]) == sorted({k for b in batches for k in b["__key__"]})
    assert sum(len(b["__key__"]) for b in batches) == 14
    assert all(c == "" for b in batches for c in b["condition_raw"])
    with pytest.raises(LoaderConfigError, match="missing_text"):
        instantiate(image_config(shards, missing_text="skip"))


@pytest.mark.parametrize("rank", [None, 0, 1])
def test_replaced_positions_warn_once_per_epoch_at_its_end(tmp_path, sample_data, caplog, rank):
    """The warning counts the whole epoch (every replaced position of this rank), once, through warnings only."""
    import logging
    import warnings

    from fgdata.shards import scan_shard

    # Only the JPEG samples carry 'jpg': the others are replaced by the next JPEG (a data fault, as far
    # as the loader can tell, since some samples of the one shard do have the member).
    one_shard = shard_images(mixed_folder(tmp_path / "photos", sample_data), tmp_path / "shards", maxcount=16)
    lacks_jpg = ["jpg" not in e.members for e in scan_shard(f"{one_shard}/00000.tar").samples]
    assert len(lacks_jpg) == 14
    ranks = {} if rank is None else {"rank": rank, "world_size": 2}
    mine = lacks_jpg if rank is None else lacks_jpg[rank::2]  # this rank's positions of each epoch
    cfg = image_config(one_shard, key_map={"real_raw": "jpg", "condition_raw": "txt"}, deterministic=True, batch_size=1,
                       **ranks)
    loader = instantiate(cfg)
    steps = 2 * len(mine)  # two epochs of this rank's positions
    caplog.set_level(logging.INFO, logger="fgdata")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = []
        for batch in loader:
            got += batch["__key__"]
            if len(got) == len(mine) - 1:  # the epoch has not ended: nothing said yet
                assert not [w for w in caught if "replacements" in str(w.message)]
            if len(got) == steps:
                break
    messages = [str(w.message) for w in caught if "replacements" in str(w.message)]
    expected = f"{sum(mine)} of the {len(mine)} positions this rank delivered ({sum(mine) / len(mine):.1%}) were replacements"
    assert messages == [f"epoch {e}: {expected}" + messages[e].split("were replacements", 1)[1] for e in (0, 1)]
    assert not [r for r in caplog.records if "were replacements" in r.getMessage()]  # one channel: warnings
    assert len(set(got[: len(mine)])) < len(mine)  # the replaced positions repeat a JPEG sample
    strict_share = instantiate(cfg, max_replaced_fraction=0.25)
    limit = next(i for i in range(1, len(mine) + 1) if sum(mine[:i]) > 0.25 * len(mine))
    with pytest.raises(FgdataError, match=rf"epoch 0: at least {sum(mine[:limit])} of this rank's {len(mine)} positions "
                                          r"\(\d+\.\d%\) delivered a replacement so far.*max_replaced_fraction=0.25"):
        for _ in strict_share:
            pass


@pytest.fixture(scope="module")
def short_clips(tmp_path_factory, clip_encoder) -> str:
    root = tmp_path_factory.mktemp("clips")
    src = root / "videos"
    src.mkdir()
    for i in range(3):
        (src / f"clip{i}.mp4").write_bytes(clip_encoder(frames=24, fps=24, size=(64, 48)))
        (src / f"clip{i}.txt").write_text(f"clip {i}")
    report = run_shard(ShardJob(src=str(src), dest=str(root / "shards"), options=ShardOptions(kind="videos"), maxcount=2))
    assert report.failed == 0
    return str(root / "shards")


def video_config(shards: str, **overrides):
    cfg = VideoLoaderConfig.copy()
    cfg.datatags = ["WDS:" + shards]
    cfg.num_workers, cfg.img_size, cfg.batch_size = 0, (32, 24), 1
    for k, v in overrides.items():
        cfg[k] = v
    return cfg


@pytest.mark.parametrize("mode", [{"deterministic": True}, {}, {"train": False}])
def test_clips_shorter_than_sequence_length_are_an_error_in_the_first_batch(short_clips, mode):
    with pytest.raises(FgdataError, match=r"every one too short: clip has 24 frames, sequence_length=81"):
        next(iter(instantiate(video_config(short_clips, **mode))))
    with pytest.raises(FgdataError, match=r"clip has 12 frames at target_fps=12 \(24 at 24 fps\), sequence_length=20"):
        next(iter(instantiate(video_config(short_clips, sequence_length=20, target_fps=12, **mode))))
    batch = next(iter(instantiate(video_config(short_clips, sequence_length=16, **mode))))
    assert batch["real_raw"].shape == (1, 3, 16, 24, 32)


def test_snapshot_era_key_map_infers_the_video_keys(short_clips):
    loader = VideoWDSLoader(["WDS:" + short_clips], batch_size=1, key_map={"real": "mp4", "condition": "txt"},
                            sequence_length=8, img_size=(32, 24), num_workers=0, deterministic=True)
    assert loader.video_keys == ("real",)
    batch = next(iter(loader))
    assert batch["real"].shape == (1, 3, 8, 24, 32) and batch["condition"] == ["clip 0"]
    with pytest.raises(LoaderConfigError, match="maps no key to a video extension"):
        VideoWDSLoader(["WDS:" + short_clips], batch_size=1, key_map={"condition": "txt"})


def test_config_alternatives_cover_what_the_shard_commands_write():
    from fgdata.configs import ImageEditLoaderConfig
    from fgdata.media import IMAGE_EXTS, VIDEO_EXTS

    assert set(ImageLoaderConfig.key_map["real_raw"].split(";")) == set(IMAGE_EXTS)
    assert ImageEditLoaderConfig.key_map["condition_image_raw"].split(";") == [
        "src." + e for e in ImageEditLoaderConfig.key_map["real_raw"].split(";")]
    assert set(VideoLoaderConfig.key_map["real_raw"].split(";")) == set(VIDEO_EXTS)


def test_a_bug_in_a_filter_propagates_instead_of_dropping(mixed_shards):
    from fgdata.loaders import PRESET_FILTERS

    def broken(**_kwargs):
        def check(members):
            raise RuntimeError("filter bug")

        return check

    PRESET_FILTERS["broken"] = broken
    try:
        loader = instantiate(image_config(mixed_shards, train=False, presets_filter={"broken": {}}))
        with pytest.raises(RuntimeError, match="filter bug"):
            next(iter(loader))
    finally:
        del PRESET_FILTERS["broken"]


def test_a_shard_without_the_mapped_key_is_an_error_when_deterministic_mode_opens_it(tmp_path, sample_data):
    """The first samples have the key, a later shard has it in none of its samples: a misconfiguration
    (a dataset mixing formats), not a data fault to paper over with replacements."""
    jpegs = shard_images(mixed_folder(tmp_path / "j", sample_data, only=("jpg",)), tmp_path / "js")
    pngs = shard_images(mixed_folder(tmp_path / "p", sample_data, only=("png",)), tmp_path / "ps")
    cfg = image_config(jpegs, key_map={"real_raw": "jpg", "condition_raw": "txt"}, deterministic=True, train=False,
                       batch_size=2)
    cfg.datatags = ["WDS:" + jpegs, "WDS:" + pngs]
    keys: list[str] = []
    with pytest.raises(LoaderConfigError) as info:
        for batch in instantiate(cfg):
            keys += batch["__key__"]
    message = str(info.value)
    assert "\n" not in message and "key_map['real_raw'] = 'jpg'" in message
    assert re.search(r"any of the 4 samples of .*/ps/\d+\.tar; they have", message), message
    assert len(keys) == len(set(keys))  # what came before the error came once: nothing was replaced
