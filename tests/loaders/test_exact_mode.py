"""``resize="reference"`` through the loaders: batches equal, bit for bit, the independent
re-implementation of the reference transforms (tests/reference_transforms.py) on the bundled
photos and the bundled 720p clip, in deterministic mode; and the batch slots that decoders write
samples into (no stack copy) deliver the same values as stacking would."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reference_transforms import reference_clip, reference_image

from fgdata.configs import (
    CameraVideoLoaderConfig,
    ImageEditLoaderConfig,
    ImageLoaderConfig,
    VideoAudioLoaderConfig,
    VideoLoaderConfig,
    instantiate,
)
from fgdata.loaders import ImageWDSLoader, LoaderConfigError, VideoWDSLoader
from fgdata.loaders.collate import BatchSlots, collate_samples
from fgdata.shards import ShardWriter

from .conftest import camera_track, npy_bytes


def expected_image(path, res) -> np.ndarray:
    """The reference transform; for a photo with alpha in fgdata's order (RGB before resizing)."""
    from PIL import Image

    with Image.open(path) as im:
        mode = im.mode
    return reference_image(path.read_bytes(), res, rgb_first=mode not in ("RGB", "L"))


def expected_shown(path, res) -> np.ndarray:
    """The reference transform of what a viewer shows (what ``resize="fast"`` decodes): for the photos
    the display rule changes (an Adobe RGB profile, transparency), of their normalised image."""
    import io

    from fgdata.media.image import decode_display

    shown, changes = decode_display(path.read_bytes())
    if not changes:
        return expected_image(path, res)
    buf = io.BytesIO()
    shown.save(buf, "PNG")
    return reference_image(buf.getvalue(), res)


@pytest.fixture(scope="module")
def photo_shards(tmp_path_factory, sample_images) -> str:
    """The bundled photos as they are (JPEG and PNG, RGB, RGBA and greyscale), each with another
    photo as its image-edit source, as ``fgdata shard images`` keeps them."""
    dest = str(tmp_path_factory.mktemp("photos") / "shards")
    with ShardWriter(dest, maxcount=4) as w:
        for n, path in enumerate(sample_images):
            src = sample_images[(n + 1) % len(sample_images)]
            w.write(f"photo_{n:06d}", {path.suffix[1:]: path.read_bytes(), "src." + src.suffix[1:]: src.read_bytes(),
                                       "txt": path.stem.encode()})
    return dest


@pytest.fixture(scope="module")
def bunny_shards(tmp_path_factory, sample_video) -> str:
    """The bundled 720p clip twice, with a camera track."""
    dest = str(tmp_path_factory.mktemp("bunny") / "shards")
    poses, intr = camera_track(132, 1280, 720)
    with ShardWriter(dest, maxcount=2) as w:
        for n in range(2):
            w.write(f"bunny_{n:06d}", {"mp4": sample_video.read_bytes(), "txt": b"bunny", "poses.npy": npy_bytes(poses),
                                       "intrinsics.npy": npy_bytes(intr)})
    return dest


def _configured(cfg, datatag: str, **fields):
    cfg = cfg.copy()
    cfg.datatags = ["WDS:" + datatag]
    cfg.deterministic = True
    cfg.num_workers = 0
    cfg.sampler_start_idx = 0
    for k, v in fields.items():
        setattr(cfg, k, v)
    return instantiate(cfg)


@pytest.mark.parametrize("input_res", [64, (48, 80)])
def test_image_configs_reference_mode_bit_exact(photo_shards, sample_images, input_res):
    n = len(sample_images)
    batch = next(iter(_configured(ImageLoaderConfig, photo_shards, batch_size=n, input_res=input_res, resize="reference")))
    expect = np.stack([expected_image(p, input_res) for p in sample_images])
    assert batch["fname"] == [f"photo_{i:06d}" for i in range(n)]
    assert float((batch["real_raw"].numpy() - expect).__abs__().max()) == 0.0

    edit = next(iter(_configured(ImageEditLoaderConfig, photo_shards, batch_size=n, input_res=input_res, resize="reference")))
    sources = np.stack([expected_image(sample_images[(i + 1) % n], input_res) for i in range(n)])
    np.testing.assert_array_equal(edit["real_raw"].numpy(), expect)
    np.testing.assert_array_equal(edit["condition_image_raw"].numpy(), sources)

    fast = next(iter(_configured(ImageLoaderConfig, photo_shards, batch_size=n, input_res=input_res)))
    shown = np.stack([expected_shown(p, input_res) for p in sample_images])
    mse = ((fast["real_raw"].numpy() - shown) / 2) ** 2
    assert 10 * np.log10(1 / mse.mean(axis=(1, 2, 3)).clip(1e-12)).min() > 35


def test_image_reference_mode_in_a_worker_and_partial(photo_shards, sample_images):
    """A DataLoader worker writes into shared-memory slots; a short last batch is a view of its slots."""
    loader = ImageWDSLoader(["WDS:" + photo_shards], batch_size=4, input_res=32, resize="reference", num_workers=1,
                            deterministic=True, train=False, partial=True, key_map={"real_raw": "jpg;png"})
    batches = list(loader)
    assert [len(b["fname"]) for b in batches] == [4, 3]
    got = torch.cat([b["real_raw"] for b in batches]).numpy()
    np.testing.assert_array_equal(got, np.stack([expected_image(p, 32) for p in sample_images]))


@pytest.mark.parametrize("cfg, key", [(VideoLoaderConfig, None), (VideoAudioLoaderConfig, "video"), (CameraVideoLoaderConfig, None)])
def test_video_configs_reference_mode_bit_exact(bunny_shards, sample_video, cfg, key):
    """The real clip, 12 frames from the start, two samples in one batch (two slot rows)."""
    loader = _configured(cfg, bunny_shards, batch_size=2, sequence_length=12, img_size=(160, 96), decoder_type="full",
                         resize="reference", num_workers=0)
    batch = next(iter(loader))
    video = batch["real_raw"] if key is None else batch["real_raw"][key]
    expect = reference_clip(sample_video.read_bytes(), range(12), (160, 96))
    assert video.shape == (2, 3, 12, 96, 160)
    np.testing.assert_array_equal(video[0].numpy(), expect)
    np.testing.assert_array_equal(video[1].numpy(), expect)
    if key is not None:
        assert batch["real_raw"]["audio"].shape[:2] == (2, 2)
    if cfg is CameraVideoLoaderConfig:
        assert batch["camera_poses"].shape == (2, 12, 4, 4)


def test_video_segment_fast_and_reference_agree_on_frames(bunny_shards):
    """Same seeded segment start in both modes: same crop, PSNR of the fast path above 35 dB."""
    kw = dict(batch_size=1, sequence_length=8, img_size=(160, 96), num_workers=0, deterministic=True, train=False,
              key_map={"real_raw": "mp4"})
    fast = next(iter(VideoWDSLoader(["WDS:" + bunny_shards], **kw)))
    ref = next(iter(VideoWDSLoader(["WDS:" + bunny_shards], resize="reference", **kw)))
    assert {k: v.tolist() for k, v in fast["cropping_params"].items()} == {k: v.tolist() for k, v in ref["cropping_params"].items()}
    mse = float((((fast["real_raw"] - ref["real_raw"]) / 2) ** 2).mean())
    assert 35 < 10 * np.log10(1 / mse) < 99


def test_resize_option_is_validated():
    with pytest.raises(LoaderConfigError, match="resize='exact'"):
        ImageWDSLoader(["WDS:/nonexistent"], batch_size=1, resize="exact")
    with pytest.raises(LoaderConfigError, match="'fast'.*'reference'"):
        VideoWDSLoader(["WDS:/nonexistent"], batch_size=1, resize="bicubic")


@pytest.mark.parametrize("resize", ["fast", "reference"])
def test_unusable_clip_replaced_in_its_slot(tmp_path, clip_encoder, resize):
    """A clip that fails after its batch row was handed out (too short): the next usable clip is
    written into that row, and the batch equals the clips decoded on their own."""
    from fgdata.media import ClipSpec, decode_clip

    a, short, c = (clip_encoder(frames=f, size=(64, 48)) for f in (12, 6, 14))
    dest = str(tmp_path / "shards")
    with ShardWriter(dest, maxcount=8) as w:
        for key, clip in (("a", a), ("b", short), ("c", c)):
            w.write(key, {"mp4": clip})
    loader = VideoWDSLoader(["WDS:" + dest], batch_size=2, sequence_length=8, img_size=(32, 32), decoder_type="full",
                            resize=resize, num_workers=0, deterministic=True, train=False, key_map={"real_raw": "mp4"})
    with pytest.warns(UserWarning, match="replacements"):  # said once, when the pass ends
        batch = list(loader)[0]
    assert batch["fname"] == ["a", "c"]
    for row, clip in enumerate((a, c)):
        alone = decode_clip(clip, ClipSpec(sequence_length=8, img_size=(32, 32), decoder_type="full", resize=resize)).video
        np.testing.assert_array_equal(batch["real_raw"][row].numpy(), alone)


def test_batch_slots_collate_without_copy():
    slots = BatchSlots(3)
    samples = []
    for row in range(3):
        slots.next_row(row)
        out = slots.row("x", (2, 2))
        again = slots.row("x", (2, 2))  # a retry within the same pull gets the same row
        assert again is out
        out[:] = row
        samples.append({"x": out, "y": np.full((2,), row, np.float32)})
    batch = collate_samples(samples, slots)
    assert batch["x"].untyped_storage().data_ptr() == torch.from_numpy(samples[0]["x"]).untyped_storage().data_ptr()
    assert batch["x"][:, 0, 0].tolist() == [0, 1, 2]
    # rows out of order, or a value that is not the row, fall back to stacking the same values
    shuffled = collate_samples([samples[1], samples[0], samples[2]], slots)
    assert shuffled["x"][:, 0, 0].tolist() == [1, 0, 2]
    slots.next_row(0)
    fresh = slots.row("x", (2, 2))
    assert not np.shares_memory(fresh, samples[0]["x"])  # a new batch never reuses a delivered tensor
