"""fgdata.media: geometry, image and clip decode in both modes (the reference mode equal to the
re-implementation in tests/reference_transforms.py, the fast one within a PSNR of it), camera,
member decode and verify checks."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from reference_transforms import reference_clip, reference_image

from fgdata.errors import FgdataError
from fgdata.media import (
    ClipTooShort,
    ImageDecodeError,
    MemberDecodeError,
    check_member,
    check_resize,
    ClipSpec,
    decode_clip,
    decode_member,
    describe_image,
    describe_member,
    image_transform_geometry,
    load_image_for_training,
    probe_video,
    slice_camera,
    transform_intrinsics,
    validate_camera,
    video_transform_geometry,
)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two [-1, 1] arrays, on the [0, 1] pixel scale."""
    mse = float(np.mean(((a - b) / 2) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(1 / mse)


def png_bytes(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


# ---------------------------------------------------------------- geometry


@pytest.mark.parametrize(
    "w, h, res, expect",
    [
        (500, 375, 256, (341, 256, 42, 0, 256, 256)),  # long side floor(256*500/375) = 341
        (375, 500, 64, (64, 85, 0, 10, 64, 64)),  # (85-64)/2 = 10.5 -> 10 (half-even)
        (7, 4, 4, (7, 4, 2, 0, 4, 4)),  # (7-4)/2 = 1.5 -> 2, reported AND applied
        (9, 4, 4, (9, 4, 2, 0, 4, 4)),  # 2.5 -> 2
        (64, 64, 64, (64, 64, 0, 0, 64, 64)),
        (640, 427, (96, 128), (128, 96, 0, 0, 128, 96)),  # tuple = (h, w), exact resize
    ],
)
def test_image_geometry(w, h, res, expect):
    g = image_transform_geometry(w, h, res)
    assert (g.resize_w, g.resize_h, g.crop_x0, g.crop_y0, g.crop_w, g.crop_h) == expect


def test_video_geometry_bunny_case():
    g = video_transform_geometry(1280, 720, 320, 192)
    assert g.as_dict() == {"resize_w": 341, "resize_h": 192, "crop_x0": 10, "crop_y0": 0, "crop_w": 320, "crop_h": 192}
    # floor(scale*dim + 0.5), not int(): 832x480 from 1920x1080 -> 853.33 -> 853
    assert video_transform_geometry(1920, 1080, 832, 480).resize_w == 853


@pytest.mark.parametrize("fast", [True, False])
def test_d5_crop_cuts_where_it_reports(fast):
    """A 7x4 image with one distinct column each, cropped to 4: columns 2..5 are kept."""
    cols = np.array([0, 40, 80, 120, 160, 200, 240], np.uint8)
    img = np.broadcast_to(cols[None, :, None], (4, 7, 3)).copy()
    out = load_image_for_training(png_bytes(Image.fromarray(img)), 4, simplejpeg=fast)
    ref = reference_image(png_bytes(Image.fromarray(img)), 4)
    kept = np.round((out[0, 0] + 1) * 127.5).astype(int)
    assert kept.tolist() == [80, 120, 160, 200]
    np.testing.assert_array_equal(out, ref)
    assert image_transform_geometry(7, 4, 4).crop_x0 == 2


# ---------------------------------------------------------------- images


@pytest.mark.parametrize("res", [64, 256])
def test_fast_path_psnr_vs_reference(sample_images, res):
    """Against the reference transform of what a viewer shows: for the photos the display rule changes
    (an Adobe RGB profile, transparency) that is the reference applied to the displayed image."""
    from fgdata.media.image import decode_display

    assert len(sample_images) >= 7
    changed = set()
    for path in sample_images:
        data = path.read_bytes()
        shown, changes = decode_display(data)
        if changes:
            changed.add(path.name)
            buf = io.BytesIO()
            shown.save(buf, "PNG")
            ref = reference_image(buf.getvalue(), res, rgb_first=True)
        else:
            ref = reference_image(data, res, rgb_first=True)
        for fast in (True, False):
            out = load_image_for_training(data, res, simplejpeg=fast)
            assert out.shape == ref.shape == (3, res, res) and out.dtype == np.float32
            assert out.min() >= -1.0 and out.max() <= 1.0
            assert psnr(out, ref) >= 35.0, (path.name, res, fast, psnr(out, ref))
    assert changed == {"rocket.jpg", "horse.png"}


@pytest.mark.parametrize("res", [64, 256, (96, 160)])
def test_reference_mode_is_the_reference_bit_for_bit(sample_images, res):
    """Every bundled RGB and greyscale photo (JPEG, PNG): max abs difference 0. The RGBA photo
    equals the reference transform applied in fgdata's order (alpha dropped before resizing,
    where the reference resizes with it)."""
    modes = set()
    for path in sample_images:
        data = path.read_bytes()
        mode = describe_image(data)["mode"]
        modes.add(mode)
        out = load_image_for_training(data, res, resize="reference")
        np.testing.assert_array_equal(out, reference_image(data, res, rgb_first=mode not in ("RGB", "L")), err_msg=path.name)
    assert {"RGB", "L", "RGBA"} <= modes
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet constants: awkward floats
    data = sample_images[0].read_bytes()
    out = load_image_for_training(data, 64, mean, std, resize="reference")
    np.testing.assert_array_equal(out, reference_image(data, 64, mean, std))


def test_float_conversion_matches_torch_for_every_pixel_value():
    """All 256 values through both conversions, against the reference's torch arithmetic."""
    import torch

    from fgdata.media.pixels import image_to_float, video_frame_to_float

    values = np.arange(256, dtype=np.uint8).reshape(16, 16)
    rgb = np.stack([values, values[::-1], values.T], axis=-1)
    for mean, std in [((0.5,) * 3, (0.5,) * 3), ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), ((0, 0, 0), (1, 1, 1))]:
        t = torch.from_numpy(rgb).permute(2, 0, 1).contiguous().to(torch.float32).div(255)
        t.sub_(torch.as_tensor(mean, dtype=torch.float32)[:, None, None])
        t.div_(torch.as_tensor(std, dtype=torch.float32)[:, None, None])
        np.testing.assert_array_equal(image_to_float(rgb, mean, std), t.numpy())
    out = np.empty((3, 16, 16), np.float32)
    video_frame_to_float([rgb[:, :, c] for c in range(3)], out)
    expect = torch.from_numpy(rgb).permute(2, 0, 1).float() / 127.5 - 1
    np.testing.assert_array_equal(out, expect.numpy())
    # a multiplication by the reciprocal would not do: it rounds differently
    assert (values.astype(np.float32) * np.float32(2 / 255) - 1 != image_to_float(rgb, (0.5,) * 3, (0.5,) * 3)[0]).any()


def test_resize_option_validated_and_out_slot(sample_data):
    with pytest.raises(ValueError, match="'fast', 'reference'"):
        load_image_for_training((sample_data / "rocket.jpg").read_bytes(), 64, resize="exact")
    with pytest.raises(ValueError):
        check_resize("bilinear")
    batch = np.zeros((2, 3, 64, 64), np.float32)
    data = (sample_data / "rocket.jpg").read_bytes()
    got = load_image_for_training(data, 64, resize="reference", out=batch[1])
    assert np.shares_memory(got, batch[1])
    np.testing.assert_array_equal(batch[1], reference_image(data, 64))
    assert not batch[0].any()


def test_tuple_input_res_and_custom_norm(sample_data):
    data = (sample_data / "rocket.jpg").read_bytes()
    out = load_image_for_training(data, (48, 80), norm_mean=(0, 0, 0), norm_std=(1, 1, 1))
    assert out.shape == (3, 48, 80) and out.min() >= 0 and out.max() <= 1


def test_modes_converted_before_resize(sample_data):
    """RGBA loses alpha and P is expanded BEFORE resampling; L becomes 3 equal channels."""
    rgba = (sample_data / "horse.png").read_bytes()
    assert describe_image(rgba)["mode"] == "RGBA"
    rgb_first = Image.open(io.BytesIO(rgba)).convert("RGB")
    expect = reference_image(png_bytes(rgb_first), 64)
    np.testing.assert_array_equal(load_image_for_training(rgba, 64, resize="reference"), expect)
    assert psnr(load_image_for_training(rgba, 64), expect) >= 35

    # Palette image: two colours alternating per column. Resizing indices (or nearest) would
    # give only palette colours; converting first gives blended values.
    p = Image.new("P", (40, 20))
    p.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    p.putdata([x % 2 for _ in range(20) for x in range(40)])
    out = load_image_for_training(png_bytes(p), 10)
    assert out.shape == (3, 10, 10)
    assert np.allclose(out[0], out[2], atol=0.1)  # red and blue mixed evenly
    assert -0.5 < out[0].mean() < 0.5

    grey = (sample_data / "camera.png").read_bytes()
    out = load_image_for_training(grey, 64)
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(out[0], out[2])
    np.testing.assert_allclose(out, reference_image(grey, 64), atol=0.05)


def test_image_errors_and_describe(sample_data):
    data = (sample_data / "grace_hopper.jpg").read_bytes()
    assert describe_image(data) == {"width": 512, "height": 600, "mode": "RGB", "format": "JPEG"}
    with pytest.raises(ImageDecodeError):
        load_image_for_training(b"not an image", 64)
    with pytest.raises(FgdataError):
        load_image_for_training(data[: len(data) // 3], 64, simplejpeg=False)


# ---------------------------------------------------------------- video


def test_probe_bunny(bunny, sample_video):
    info = probe_video(bunny)
    assert (info.width, info.height, info.codec, info.fps) == (1280, 720, "h264", 25.0)
    assert info.frame_count == 132 and abs(info.duration - 5.28) < 0.05
    assert info.keyframe_times[0] == 0.0 and info.rotation == 0
    assert info.audio_codec == "aac" and info.audio_sample_rate == 48000
    assert probe_video(sample_video).frame_count == 132  # a path works too
    d = info.to_dict()
    assert "frame_pts" not in d and json.dumps(d)


def test_segment_decode_matches_reference(bunny):
    info = probe_video(bunny)
    clip = decode_clip(bunny, ClipSpec(sequence_length=8, img_size=(160, 96)), start_time=2.0, info=info)
    assert clip.video.shape == (3, 8, 96, 160) and clip.video.dtype == np.float32
    assert clip.video.min() >= -1.0 and clip.video.max() <= 1.0
    cp = clip.cropping_params
    assert cp == video_transform_geometry(1280, 720, 160, 96).as_dict()
    assert (cp["crop_w"], cp["crop_h"]) == (160, 96) and cp["crop_x0"] + 160 <= cp["resize_w"]
    assert clip.frame_indices == list(range(50, 58)) and clip.start_time == pytest.approx(2.0)
    assert clip.fps == 25.0 and clip.audio is None
    ref = reference_clip(bunny, clip.frame_indices, (160, 96))
    assert ref.shape == clip.video.shape
    assert np.abs(ref - clip.video).mean() < 0.03
    assert psnr(ref, clip.video) > 30


@pytest.mark.parametrize("decoder_type, start", [("full", None), ("segment", 2.0)])
def test_reference_mode_clip_is_the_reference_bit_for_bit(bunny, decoder_type, start):
    """The real 720p clip, 12 frames (more than one resize chunk), max abs difference 0."""
    from fgdata.media.video import REFERENCE_CHUNK

    n = REFERENCE_CHUNK + 4
    clip = decode_clip(bunny, ClipSpec(sequence_length=n, img_size=(160, 96), decoder_type=decoder_type,
                                       resize="reference"), start_time=start)
    assert clip.frame_indices == list(range(n) if start is None else range(50, 50 + n))
    np.testing.assert_array_equal(clip.video, reference_clip(bunny, clip.frame_indices, (160, 96)))
    fast = decode_clip(bunny, ClipSpec(sequence_length=n, img_size=(160, 96), decoder_type=decoder_type),
                       start_time=start)
    assert fast.frame_indices == clip.frame_indices and fast.cropping_params == clip.cropping_params
    assert 35 < psnr(fast.video, clip.video) < 99


@pytest.mark.parametrize("resize", ["fast", "reference"])
def test_clip_written_into_a_batch_slot(silent_clip, resize):
    """``out`` receives the clip in place; repeated frames (target_fps) are copies; shape is checked."""
    batch = np.full((2, 3, 8, 32, 32), 7.0, np.float32)
    clip = decode_clip(silent_clip, ClipSpec(sequence_length=8, img_size=(32, 32), target_fps=48, resize=resize),
                       start_time=0.5, out=batch[1])
    assert np.shares_memory(clip.video, batch) and (batch[0] == 7).all()
    alone = decode_clip(silent_clip, ClipSpec(sequence_length=8, img_size=(32, 32), target_fps=48, resize=resize),
                        start_time=0.5)
    np.testing.assert_array_equal(batch[1], alone.video)
    np.testing.assert_array_equal(batch[1][:, 0], batch[1][:, 1])
    if resize == "reference":
        np.testing.assert_array_equal(batch[1], reference_clip(silent_clip, clip.frame_indices, (32, 32)))
    with pytest.raises(ValueError, match="need float32"):
        decode_clip(silent_clip, ClipSpec(sequence_length=8, img_size=(32, 32)), out=batch[1][:, :4])


def test_seek_lands_on_right_frames(silent_clip):
    """g=12 keyframes: a seek to 1.1 s lands on 1.0 and decodes forward; frame i has grey 4*i."""
    info = probe_video(silent_clip)
    assert info.keyframe_times == (0.0, 0.5, 1.0, 1.5)
    clip = decode_clip(silent_clip, ClipSpec(sequence_length=4, img_size=(64, 48)), start_time=1.1, info=info)
    assert clip.frame_indices == [27, 28, 29, 30]  # 1.1 s * 24 = 26.4 -> first frame at/after: 27
    grey = np.round((clip.video[0, :, 24, 40] + 1) * 127.5)
    np.testing.assert_allclose(grey, [4 * i for i in clip.frame_indices], atol=3)
    ref = reference_clip(silent_clip, clip.frame_indices, (64, 48))
    assert np.abs(ref - clip.video).mean() < 0.02


def test_random_start_in_range_and_reproducible(silent_clip):
    spec = ClipSpec(sequence_length=8, img_size=(32, 32))
    a = decode_clip(silent_clip, spec, rng=np.random.default_rng(7))
    b = decode_clip(silent_clip, spec, rng=np.random.default_rng(7))
    assert a.frame_indices == b.frame_indices
    np.testing.assert_array_equal(a.video, b.video)
    starts = {decode_clip(silent_clip, spec, rng=np.random.default_rng(s)).frame_indices[0] for s in range(6)}
    assert len(starts) > 1 and max(starts) + 8 <= 48
    assert a.cropping_params["crop_x0"] == 6  # 64x48 -> 43x32; (43-32)/2 = 5.5 -> 6 (half-even)


def test_target_fps_duplicates_and_drops(silent_clip):
    up = decode_clip(silent_clip, ClipSpec(sequence_length=8, img_size=(32, 32), target_fps=48), start_time=0.5)
    assert up.frame_indices == [12, 12, 13, 13, 14, 14, 15, 15] and up.fps == 48
    np.testing.assert_array_equal(up.video[:, 0], up.video[:, 1])
    down = decode_clip(silent_clip, ClipSpec(sequence_length=5, img_size=(32, 32), target_fps=8), start_time=0.5)
    assert down.frame_indices == [12, 15, 18, 21, 24]
    # 'full' resamples from t=0 and takes the first n
    full = decode_clip(silent_clip, ClipSpec(sequence_length=6, img_size=(32, 32), decoder_type="full", target_fps=12))
    assert full.frame_indices == [0, 2, 4, 6, 8, 10] and full.start_time == 0.0
    with pytest.raises(ClipTooShort):
        decode_clip(silent_clip, ClipSpec(sequence_length=30, img_size=(32, 32), decoder_type="full", target_fps=12))


def test_full_vs_segment_and_too_short(silent_clip):
    full = decode_clip(silent_clip, ClipSpec(sequence_length=10, img_size=(32, 32), decoder_type="full"),
                       rng=np.random.default_rng(1))
    seg0 = decode_clip(silent_clip, ClipSpec(sequence_length=10, img_size=(32, 32)), start_time=0.0)
    assert full.frame_indices == list(range(10)) == seg0.frame_indices
    np.testing.assert_array_equal(full.video, seg0.video)
    with pytest.raises(ClipTooShort):
        decode_clip(silent_clip, ClipSpec(sequence_length=49, img_size=(32, 32)))
    assert issubclass(ClipTooShort, FgdataError)


def test_audio_native_and_resampled(bunny):
    info = probe_video(bunny)
    clip = decode_clip(bunny, ClipSpec(sequence_length=8, img_size=(64, 64), with_audio=True), start_time=1.0,
                       info=info)
    assert clip.audio.shape == (2, round(8 * 48000 / 25)) and clip.sample_rate == 48000  # 5.1 downmixed
    assert clip.audio.dtype == np.float32 and np.abs(clip.audio).max() <= 1.0
    assert np.abs(clip.audio).max() > 0.01
    r16 = decode_clip(bunny, ClipSpec(sequence_length=8, img_size=(64, 64), with_audio=True, target_sample_rate=16000,
                                      target_fps=10), start_time=1.0, info=info)
    assert r16.audio.shape == (2, round(8 * 16000 / 10)) and r16.sample_rate == 16000


def test_audio_mono_duplicated_and_absent(mono_clip, silent_clip):
    clip = decode_clip(mono_clip, ClipSpec(sequence_length=12, img_size=(32, 32), with_audio=True), start_time=0.5)
    assert clip.audio.shape == (2, 24000)
    np.testing.assert_array_equal(clip.audio[0], clip.audio[1])
    spectrum = np.abs(np.fft.rfft(clip.audio[0]))
    assert abs(np.argmax(spectrum) * 48000 / 24000 - 440) < 5
    assert decode_clip(silent_clip, ClipSpec(sequence_length=4, img_size=(32, 32), with_audio=True)).audio is None


def test_rotation_honoured(clip_encoder):
    data = clip_encoder(frames=6, rotation=90)
    info = probe_video(data)
    assert info.rotation == 90
    clip = decode_clip(data, ClipSpec(sequence_length=2, img_size=(48, 64)), start_time=0.0, info=info)
    assert clip.video.shape == (3, 2, 64, 48)
    # the white left quarter of the coded frame is at the bottom after a 90° ccw rotation
    assert clip.video[0, 0, -4:, 24].min() > 0.9 and clip.video[0, 0, :4, 24].max() < -0.9


def test_bad_video_raises_fgdata_error():
    with pytest.raises(FgdataError):
        decode_clip(b"\x00" * 1000, ClipSpec(sequence_length=2, img_size=(32, 32)))
    with pytest.raises(ValueError):
        decode_clip(b"", ClipSpec(sequence_length=2, img_size=(32, 32), decoder_type="random"))


# ---------------------------------------------------------------- camera


def test_camera_slice_and_intrinsics():
    T = 10
    poses = np.tile(np.eye(4), (T, 1, 1))
    poses[:, 0, 3] = np.arange(T)
    intr = np.tile([1000.0, 1000.0, 640.0, 360.0], (T, 1))
    p, k = slice_camera(poses, intr, [3, 3, 5])
    assert p[:, 0, 3].tolist() == [3, 3, 5] and k.shape == (3, 4)
    cp = video_transform_geometry(1280, 720, 320, 192).as_dict()
    k2 = transform_intrinsics(k, 1280, 720, cp)
    sx, sy = 341 / 1280, 192 / 720
    np.testing.assert_allclose(k2[0], [1000 * sx, 1000 * sy, 640 * sx - 10, 360 * sy - 0])
    # the principal point at the image centre stays near the centre of the 320x192 crop
    assert abs(k2[0, 2] - 160) < 1 and abs(k2[0, 3] - 96) < 1


def test_camera_validation_errors():
    T = 4
    good = np.tile(np.eye(4), (T, 1, 1))
    intr = np.tile([500.0, 500.0, 32.0, 24.0], (T, 1))
    validate_camera(good, intr, T)
    with pytest.raises(FgdataError, match="frame count"):
        validate_camera(good, intr, T + 1)
    bad = good.copy()
    bad[2, 3] = [0, 0, 1, 1]
    with pytest.raises(FgdataError, match="last row"):
        validate_camera(bad, intr, T)
    bad = good.copy()
    bad[1, :3, :3] *= 1.1
    with pytest.raises(FgdataError, match="orthonormal"):
        validate_camera(bad, intr, T)
    bad = intr.copy()
    bad[3, 1] = 0
    with pytest.raises(FgdataError, match="focal"):
        validate_camera(good, bad, T)
    with pytest.raises(FgdataError, match=r"\[T,4,4\]"):
        validate_camera(np.zeros((T, 3, 4)), intr, T)


# ---------------------------------------------------------------- members


class _Evil:
    """A pickle payload that would create a file if it were ever unpickled."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (Path.touch, (Path(self.target),))


def test_decode_member_each_ext(sample_data, bunny):
    import torch

    jpg = (sample_data / "rocket.jpg").read_bytes()
    im = decode_member("jpg", jpg)
    assert im.size == (640, 427)
    assert decode_member("png", (sample_data / "horse.png").read_bytes()).mode == "RGBA"
    assert decode_member("txt", b"  a caption \n") == "a caption"
    assert decode_member("caption", b" x ", txt_extensions=("txt", "caption")) == "x"
    assert decode_member("json", b'{"score": 1.5}') == {"score": 1.5}
    assert decode_member("cls", b"7") == 7
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.float16).reshape(2, 3))
    arr = decode_member("poses.npy", buf.getvalue())
    assert arr.shape == (2, 3) and arr.dtype == np.float16
    buf = io.BytesIO()
    np.savez(buf, a=np.zeros(3), b=np.ones((2, 2), np.int64))
    z = decode_member("npz", buf.getvalue())
    assert set(z) == {"a", "b"} and z["b"].dtype == np.int64
    buf = io.BytesIO()
    torch.save([torch.zeros(2, 3), torch.ones(4)], buf)
    lst = decode_member("txt_emb.pth", buf.getvalue())
    assert [t.shape for t in lst] == [(2, 3), (4,)]
    assert decode_member("mp4", bunny) is bunny
    assert decode_member("JSON.gz", gzip.compress(b"[1, 2]")) == [1, 2]  # + lower-casing
    assert decode_member("weird", b"\x01\x02") == b"\x01\x02"


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_malicious_pth_not_executed(tmp_path):
    import pickle

    import torch

    target = tmp_path / "pwned"
    buf = io.BytesIO()
    torch.save({"x": torch.zeros(1), "evil": _Evil(str(target))}, buf)
    # sanity: plain unpickling WOULD run it
    assert isinstance(_Evil(str(target)).__reduce__(), tuple)
    with pytest.raises(MemberDecodeError, match="refused"):
        decode_member("latent.pth", buf.getvalue())
    assert not target.exists()
    assert check_member("latent.pth", buf.getvalue()) == "pth"
    assert not target.exists()
    pickled = pickle.dumps(_Evil(str(target)))
    with pytest.raises(MemberDecodeError):
        decode_member("pth", pickled)
    assert not target.exists()


def test_object_npy_refused():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(MemberDecodeError, match="refused"):
        decode_member("npy", buf.getvalue())
    assert check_member("npy", buf.getvalue()) == "npy"


def test_describe_member(sample_data, bunny):
    import torch

    assert describe_member("jpg", (sample_data / "rocket.jpg").read_bytes())["width"] == 640
    v = describe_member("mp4", bunny)
    assert (v["width"], v["height"], v["fps"], v["frame_count"], v["audio_channels"]) == (1280, 720, 25.0, 132, 6)
    assert describe_member("txt", b"x" * 200)["text"] == "x" * 80
    assert describe_member("json", b'{"b": 1, "a": 2}') == {"keys": ["a", "b"]}
    buf = io.BytesIO()
    torch.save(torch.arange(4, dtype=torch.bfloat16), buf)
    t = describe_member("latent.pth", buf.getvalue())["tensor"]
    assert t == {"dtype": "bfloat16", "shape": [4], "min": 0.0, "max": 3.0, "mean": 1.5}
    buf = io.BytesIO()
    np.savez(buf, a=np.ones(2))
    assert describe_member("npz", buf.getvalue())["tensor"]["a"]["shape"] == [2]
    assert set(describe_member("json", b"{bad")) == {"error"}
    assert set(describe_member("mp4", b"junk")) == {"error"}


def test_check_member(sample_data, bunny, silent_clip):
    jpg = (sample_data / "hubble_deep_field.jpg").read_bytes()
    assert check_member("jpg", jpg) is None
    assert check_member("jpg", jpg[: len(jpg) // 2]) == "image-decode"
    assert check_member("mp4", bunny) is None
    assert check_member("mp4", bunny[: len(bunny) // 2]) == "video-decode"  # moov at the end
    # moov at the front (our encodes): truncation loses packets
    assert check_member("mp4", silent_clip) is None
    assert check_member("mp4", silent_clip[: len(silent_clip) * 2 // 3]) in ("video-decode", "video-truncated")
    assert check_member("txt", b"\xff\xfe") == "utf8"
    assert check_member("json", b"{") == "json"
    assert check_member("json.gz", b"not gzip") == "gzip"
    assert check_member("txt", b"ok") is None


def test_describe_image_jpeg_header_matches_pillow(sample_images):
    import io

    from PIL import Image

    from fgdata.media.image import _jpeg_header, describe_image

    cases = []
    for path in sample_images:
        im = Image.open(path)
        for mode in ("RGB", "L", "CMYK"):
            for progressive in (False, True):
                buf = io.BytesIO()
                im.convert(mode).save(buf, "JPEG", quality=80, progressive=progressive)
                cases.append(buf.getvalue())
    cases += [p.read_bytes() for p in sample_images if p.suffix == ".jpg"]
    for data in cases:
        pil = Image.open(io.BytesIO(data))
        facts = {"width": pil.width, "height": pil.height, "mode": pil.mode, "format": "JPEG"}
        head = _jpeg_header(data)
        assert head == {**facts, "orientation": 1, "icc_profile": pil.info.get("icc_profile")}
        assert describe_image(data) == facts
    png = sample_images[0].read_bytes()
    assert _jpeg_header(png) is None and describe_image(png)["format"] == "PNG"
