"""Weight-free signals against independent numpy computations on the decoded pixels."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fgdata.score import signals as sg


def _jpeg(arr: np.ndarray, quality: int = 95) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG" if quality == 0 else "JPEG", quality=quality)
    return buf.getvalue()


def _luma(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601 luma rounded to 8 bits, as Pillow's "L" conversion does."""
    r, g, b = (rgb[..., i].astype(np.int64) for i in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.float64)


def _reference(luma: np.ndarray) -> dict:
    lap = np.zeros((luma.shape[0] - 2, luma.shape[1] - 2))
    for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        lap += luma[1 + dy: luma.shape[0] - 1 + dy, 1 + dx: luma.shape[1] - 1 + dx]
    lap -= 4 * luma[1:-1, 1:-1]
    flat = []
    for y in range(0, luma.shape[0] - sg.BLOCK + 1, sg.BLOCK):
        for x in range(0, luma.shape[1] - sg.BLOCK + 1, sg.BLOCK):
            flat.append(luma[y: y + sg.BLOCK, x: x + sg.BLOCK].std() < sg.FLAT_STD)
    return {"sharpness": lap.var(), "exposure_dark": np.mean(luma <= sg.DARK_MAX),
            "exposure_bright": np.mean(luma >= sg.BRIGHT_MIN), "uniformity": np.mean(flat)}


def _check(fields: dict, want: dict, rel: float = 1e-9) -> None:
    for name, value in want.items():
        assert fields[name] == pytest.approx(value, rel=rel, abs=1e-12), name
        assert isinstance(fields[name], float)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_small_images_match_numpy(sample_images, index):
    """A photo under the analysis size: the statistics equal numpy's on the decoded luma, exactly."""
    data = sample_images[index].read_bytes()
    rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    if max(rgb.shape[:2]) > sg.ANALYSIS_SIZE:
        rgb = rgb[: sg.ANALYSIS_SIZE, : sg.ANALYSIS_SIZE]
        data = _jpeg(rgb, 0)
    a = sg.analyse(data)
    fields = sg.image_fields(a, frozenset(sg.IMAGE_SIGNALS))
    h, w = rgb.shape[:2]
    assert (fields["width"], fields["height"]) == (w, h)
    assert fields["aspect"] == pytest.approx(max(w, h) / min(w, h))
    assert fields["aspect"] >= 1
    _check(fields, _reference(_luma(rgb)))


def test_large_image_is_box_shrunk_to_the_analysis_size():
    """1024x768 -> 512x384: each analysis pixel is the rounded mean of a 2x2 block."""
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (768, 1024, 3), dtype=np.uint8)
    rgb[:200] = 0  # a dark, flat band
    rgb[-100:] = 255  # a bright, flat band
    fields = sg.image_fields(sg.analyse(_jpeg(rgb, 0)), frozenset(sg.IMAGE_SIGNALS))
    luma = _luma(rgb)
    shrunk = np.floor(luma.reshape(384, 2, 512, 2).mean(axis=(1, 3)) + 0.5)
    assert (fields["width"], fields["height"], fields["aspect"]) == (1024, 768, pytest.approx(4 / 3))
    _check(fields, _reference(shrunk), rel=1e-3)
    assert fields["exposure_dark"] >= 200 / 768 and fields["exposure_bright"] >= 100 / 768
    assert fields["uniformity"] >= 300 / 768 - 0.05


def test_sharpness_orders_blur():
    """A blurred copy is less sharp; a flat image has zero sharpness and full uniformity."""
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (128, 160, 3), dtype=np.uint8)
    blurred = np.asarray(Image.fromarray(rgb).resize((40, 32)).resize((160, 128), Image.Resampling.BILINEAR))
    flat = np.full((128, 160, 3), 90, np.uint8)
    s = [sg.image_fields(sg.analyse(_jpeg(x, 0)), frozenset({"sharpness", "uniformity"})) for x in (rgb, blurred, flat)]
    assert s[0]["sharpness"] > s[1]["sharpness"] > s[2]["sharpness"] == 0.0
    assert s[2]["uniformity"] == 1.0


def test_caption_fields():
    assert sg.caption_fields("  a red  fox\njumps ") == {"caption_words": 4, "caption_chars": len("a red  fox\njumps")}
    assert sg.caption_fields(None) == {"caption_words": 0, "caption_chars": 0}
    assert sg.caption_fields("café") == {"caption_words": 1, "caption_chars": 4}


def test_video_times_cover_the_duration_at_one_frame_per_second():
    assert sg.video_times(3.0) == [0.5, 1.5, 2.5]
    assert sg.video_times(0.4) == [0.2]  # a clip under a second: its middle
    long = sg.video_times(100.0)
    assert len(long) == sg.VIDEO_MAX_FRAMES and long[0] == pytest.approx(100 / 32) and long[-1] < 100


@pytest.mark.parametrize("rotation", [0, 90])
def test_a_video_is_scored_on_its_frames_mean_and_min(rotation):
    """Three seconds (noise, gradient, near-black) at 10 fps: frames 5, 15, 25 are scored, as a player shows them;
    each field is their mean and ``FIELD_min`` their smallest, against numpy on an independent decode."""
    from scorevideo import encode_frames, frames_at, varied_frames

    from fgdata.score.job import ScoreOptions, sample_scores

    data = encode_frames(varied_frames(), fps=10, rotation=rotation)
    fields = sample_scores({"mp4": data, "txt": b"a clip"}, ScoreOptions(signals=tuple(sg.WEIGHT_FREE)))
    frames = frames_at(data, [5, 15, 25], rotation)
    per_frame = [_reference(_luma(f)) for f in frames]
    h, w = frames[0].shape[:2]
    assert (fields["width"], fields["height"], fields["score_frames"]) == (w, h, 3)
    assert (w, h) == ((64, 96) if rotation == 90 else (96, 64))
    for name in ("sharpness", "exposure_dark", "exposure_bright", "uniformity"):
        values = [f[name] for f in per_frame]
        assert fields[name] == pytest.approx(np.mean(values), rel=1e-9, abs=1e-12), name
        assert fields[f"{name}_min"] == pytest.approx(min(values), rel=1e-9, abs=1e-12), name
    assert fields["sharpness_min"] < fields["sharpness"]  # the frames differ: the reductions are not the same
    assert (fields["caption_words"], fields["caption_chars"]) == (2, 6)


def test_an_undecodable_video_is_reported_not_scored():
    from fgdata.score.job import ScoreOptions, sample_scores

    fields = sample_scores({"mp4": b"not a video", "txt": b"x"}, ScoreOptions(signals=("sharpness", "caption")))
    assert fields["score_error"].startswith(".mp4:") and "sharpness" not in fields
    assert fields["caption_words"] == 1
