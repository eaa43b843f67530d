"""Image, video, audio-video and camera loaders on real shards: keys, shapes, dtypes, ranges."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reference_transforms import reference_image

from fgdata.loaders import (
    AudioVideoWDSLoader,
    CameraVideoWDSLoader,
    ImageWDSLoader,
    LoaderConfigError,
    VideoWDSLoader,
    quickstart_batch,
)
from fgdata.shards import ShardWriter

from .conftest import camera_track

DIAG = {"__key__", "__index__"}


def first(loader):
    return next(iter(loader))


def test_image_loader_legacy_acceptance_shape(image_shards):
    """Image shards, legacy maps, num_workers=0 -> real (2,3,512,512), strings elsewhere."""
    loader = ImageWDSLoader(
        ["WDS:" + image_shards], batch_size=2, num_workers=0, deterministic=True,
        key_map={"real": "jpg", "condition": "txt"}, presets_map={"neg_condition": "empty_string"},
    )
    batch = first(loader)
    assert set(batch) - DIAG == {"real", "condition", "neg_condition", "fname", "shard"}
    assert batch["real"].shape == (2, 3, 512, 512) and batch["real"].dtype == torch.float32
    assert -1 <= batch["real"].min() and batch["real"].max() <= 1
    assert batch["neg_condition"] == ["", ""]
    assert all(isinstance(batch[k], list) and all(isinstance(v, str) for v in batch[k]) for k in ("condition", "fname", "shard"))


def test_image_edit_pixels_match_the_reference_transform(image_shards):
    from fgdata.shards import ShardFile

    loader = ImageWDSLoader(
        ["WDS:" + image_shards], batch_size=3, num_workers=0, deterministic=True, input_res=48,
        key_map={"real_raw": "jpg", "condition_image_raw": "src.jpg", "condition_raw": "txt"},
    )
    batch = first(loader)
    assert batch["real_raw"].shape == batch["condition_image_raw"].shape == (3, 3, 48, 48)
    with ShardFile(image_shards + "/00000.tar") as f:
        for b in range(3):
            ref = reference_image(f.sample(b).members["jpg"], 48)
            mse = float(((batch["real_raw"][b].numpy() - ref) ** 2).mean()) / 4  # range 2 -> 1
            assert 10 * np.log10(1 / max(mse, 1e-12)) >= 35


def test_image_loader_rectangular_input_res(image_shards):
    batch = first(ImageWDSLoader(["WDS:" + image_shards], batch_size=2, num_workers=0, deterministic=True,
                                 input_res=(24, 40), key_map={"real_raw": "jpg"}))
    assert batch["real_raw"].shape == (2, 3, 24, 40)


@pytest.mark.parametrize("decoder_type", ["segment", "full"])
def test_video_loader_keys_shapes_and_cropping(video_shards, decoder_type):
    loader = VideoWDSLoader(
        ["WDS:" + video_shards], batch_size=2, num_workers=0, deterministic=True,
        sequence_length=8, img_size=(40, 32), decoder_type=decoder_type, seed=3,
    )
    batch = first(loader)
    assert set(batch) - DIAG == {"real_raw", "condition_raw", "cropping_params", "fname", "shard"}
    assert batch["real_raw"].shape == (2, 3, 8, 32, 40) and batch["real_raw"].dtype == torch.float32
    assert -1 <= batch["real_raw"].min() and batch["real_raw"].max() <= 1
    cp = batch["cropping_params"]
    assert set(cp) == {"resize_w", "resize_h", "crop_x0", "crop_y0", "crop_w", "crop_h"}
    assert all(v.dtype == torch.int64 and v.shape == (2,) for v in cp.values())
    # 80x48 -> scale max(40/80, 32/48) = 2/3 -> 53x32, crop x0 = round((53-40)/2) = 6 (half-even)
    assert cp["resize_w"].tolist()[0] == 53 and cp["crop_x0"].tolist()[0] == 6
    again = first(VideoWDSLoader(["WDS:" + video_shards], batch_size=2, num_workers=0, deterministic=True,
                                 sequence_length=8, img_size=(40, 32), decoder_type=decoder_type, seed=3))
    assert torch.equal(again["real_raw"], batch["real_raw"])  # segment starts are seeded by (seed, position)


def test_video_loader_bunny_acceptance_shape(sample_video, tmp_path):
    """'s video case at the real size: 81 frames of 480x832 from a 720p clip."""
    d = str(tmp_path / "s")
    with ShardWriter(d) as w:
        w.write("sample_000000", {"mp4": sample_video.read_bytes(), "txt": b"bunny"})
    batch = first(VideoWDSLoader(["WDS:" + d], batch_size=1, num_workers=0, deterministic=True,
                                 key_map={"real": "mp4", "condition": "txt"}, video_keys=("real",)))
    assert batch["real"].shape == (1, 3, 81, 480, 832)
    assert isinstance(batch["cropping_params"], dict)


def test_video_target_fps_and_too_short_clips(video_shards):
    batch = first(VideoWDSLoader(["WDS:" + video_shards], batch_size=1, num_workers=0, deterministic=True,
                                 sequence_length=6, img_size=(32, 32), target_fps=12))
    assert batch["real_raw"].shape == (1, 3, 6, 32, 32)
    # every clip has < 100 frames: deterministic mode cannot find a usable sample and says so
    loader = VideoWDSLoader(["WDS:" + video_shards], batch_size=1, num_workers=0, deterministic=True,
                            sequence_length=100, img_size=(32, 32), max_consecutive_errors=5)
    with pytest.raises(Exception, match="consecutive unusable"):
        first(loader)


def test_video_keys_must_be_mapped(video_shards):
    with pytest.raises(LoaderConfigError, match="video_keys"):
        VideoWDSLoader(["WDS:" + video_shards], batch_size=1, video_keys=("real",))


def test_audio_video_modality_dict(video_shards):
    loader = AudioVideoWDSLoader(["WDS:" + video_shards], batch_size=1, num_workers=0, deterministic=True,
                                 sequence_length=12, img_size=(32, 32), target_fps=24, target_sample_rate=16000, train=False)
    batches = list(loader)
    assert len(batches) == 4
    with_audio = batches[0]["real_raw"]
    assert set(with_audio) == {"video", "audio"}
    assert with_audio["video"].shape == (1, 3, 12, 32, 32)
    assert with_audio["audio"].shape == (1, 2, round(12 * 16000 / 24)) and with_audio["audio"].dtype == torch.float32
    assert float(with_audio["audio"].abs().max()) > 0.05
    assert set(batches[3]["real_raw"]) == {"video"}  # clip 3 has no audio stream: audio omitted
    mixed = list(AudioVideoWDSLoader(["WDS:" + video_shards], batch_size=2, num_workers=0, deterministic=True,
                                     sequence_length=12, img_size=(32, 32), train=False))[1]["real_raw"]
    assert mixed["video"].shape == (2, 3, 12, 32, 32)
    assert mixed["audio"][0].shape[0] == 2 and mixed["audio"][1] is None  # cannot stack: a list, with a warning


def test_camera_loader_slices_and_rescales(video_shards):
    loader = CameraVideoWDSLoader(["WDS:" + video_shards], batch_size=1, num_workers=0, deterministic=True,
                                  sequence_length=6, img_size=(40, 32), target_fps=12, seed=5)
    batch = first(loader)
    assert set(batch) - DIAG == {"real_raw", "condition_raw", "camera_poses", "camera_intrinsics", "cropping_params", "fname", "shard"}
    poses, intr = batch["camera_poses"][0].numpy(), batch["camera_intrinsics"][0].numpy()
    assert poses.shape == (6, 4, 4) and intr.shape == (6, 4)
    # the x translation is the source frame index; at 12 fps from 24 fps every other frame is taken
    idx = poses[:, 0, 3]
    assert np.allclose(np.diff(idx), 2)
    cp = {k: int(v[0]) for k, v in batch["cropping_params"].items()}
    src_poses, src_intr = camera_track(36, 80, 48)
    sx, sy = cp["resize_w"] / 80, cp["resize_h"] / 48
    assert np.allclose(intr[0], [100 * sx, 100 * sy, 40 * sx - cp["crop_x0"], 24 * sy - cp["crop_y0"]], atol=1e-4)


def test_quickstart_batch(image_shards):
    shapes = quickstart_batch(image_shards)
    assert shapes["real_raw"] == (2, 3, 64, 64)
    assert shapes["condition_raw"] == (2,) and shapes["neg_condition_raw"] == (2,)
