"""Photos are sharded as a viewer shows them, and every reader decodes them that way (fgdata.media.display).

Each case is a real file made here with Pillow: a 16-bit PNG, an EXIF-6 JPEG, a CMYK JPEG, an RGBA PNG, a
palette PNG with transparency, a Display P3 JPEG (its profile built by tests/iccprofile.py: no P3 file ships
here). Each is sharded with the defaults, and its original bytes, as another tool's shards would hold them,
go through the loaders' fast path, the preview and ``verify --decode``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from display_photos import BLUE, CHANGES, GREEN, P3_COLOUR, PHOTOS, RED, png, rgb16_png
from iccprofile import DISPLAY_P3, rgb_profile
from PIL import Image, ImageCms
from reference_transforms import reference_image

from fgdata.media.image import decode_display, load_image_for_training
from fgdata.media.preview import thumbnail
from fgdata.shards import ShardWriter, discover_shards, iter_samples

@pytest.fixture
def photos(tmp_path: Path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for name, make in PHOTOS.items():
        (folder / name).write_bytes(make())
        (folder / name).with_suffix(".txt").write_text(f"a photo called {name}")
    return folder


def _by_source(dest: Path) -> dict[str, dict[str, bytes]]:
    samples = [s for shard in discover_shards(str(dest)) for s in iter_samples(shard)]
    return {json.loads(s.members["json"])["fgdata"]["source"]: s.members for s in samples}


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


def _p3_in_srgb() -> np.ndarray:
    src = Image.new("RGB", (1, 1), P3_COLOUR)
    profile = ImageCms.ImageCmsProfile(io.BytesIO(rgb_profile(DISPLAY_P3, "Display P3 (test)")))
    return np.asarray(ImageCms.profileToProfile(src, profile, ImageCms.createProfile("sRGB"),
                                                renderingIntent=ImageCms.Intent.PERCEPTUAL)).astype(int)[0, 0]


def _check_shown(name: str, rgb: np.ndarray, background=(255, 255, 255)) -> None:
    """``rgb`` (H, W, 3 ints) is what a viewer shows of PHOTOS[name], within JPEG error."""
    h, w, _ = rgb.shape
    if name == "grey16.png":
        ramp = np.linspace(0, 255, 48 * 64).reshape(48, 64)
        assert (h, w) == (48, 64) and np.abs(rgb[..., 0] - ramp).mean() < 3 and rgb.max() == 255 and rgb.min() <= 2
    elif name == "sideways.jpg":
        assert (h, w) == (64, 32)
        assert np.abs(rgb[4, 16] - RED).max() < 12 and np.abs(rgb[60, 16] - BLUE).max() < 12
    elif name == "cmyk.jpg":
        assert np.abs(rgb[15, 20] - (200, 30, 30)).max() < 12
    elif name in ("rgba.png", "palette.png"):
        assert np.abs(rgb[16, 4] - GREEN).max() < 12 and np.abs(rgb[16, 28] - background).max() < 12
    elif name == "p3.jpg":
        target = _p3_in_srgb()
        assert np.abs(target - P3_COLOUR).max() > 20  # the conversion really moves the colour
        assert np.abs(rgb[12, 12] - target).max() < 6


def test_each_photo_is_stored_as_a_viewer_shows_it(cli, photos: Path, tmp_path: Path):
    dest = tmp_path / "out"
    doc = json.loads(cli("shard", "images", photos, dest, "--json").stdout)
    assert doc["written"] == len(PHOTOS) and doc["failed"] == 0
    assert doc["normalised"] == {"8-bit": 1, "alpha": 2, "cmyk": 1, "icc": 1, "orientation": 1}
    samples = _by_source(dest)
    for name in PHOTOS:
        members = samples[name]
        meta = json.loads(members["json"])["fgdata"]
        assert set(members) == {"jpg", "json", "txt"} and members["txt"].decode() == f"a photo called {name}"
        assert meta.get("normalised") == CHANGES.get(name), name
        stored = Image.open(io.BytesIO(members["jpg"]))
        assert (meta["width"], meta["height"]) == stored.size and stored.mode in ("RGB", "L")
        assert 0x0112 not in stored.getexif() and not stored.info.get("icc_profile")
        _check_shown(name, _pixels(members["jpg"]))
    assert samples["plain.jpg"]["jpg"] == (photos / "plain.jpg").read_bytes()  # nothing to change: kept as is


def test_background_and_format_choices(cli, photos: Path, tmp_path: Path):
    dest = tmp_path / "png"
    cli("shard", "images", photos, dest, "--format", "png", "--background", "black", "--no-progress")
    samples = _by_source(dest)
    assert all(set(m) == {"png", "json", "txt"} for m in samples.values())
    for name in PHOTOS:
        _check_shown(name, _pixels(samples[name]["png"]), background=(0, 0, 0))
    assert json.loads(samples["rgba.png"]["json"])["fgdata"]["normalised"] == {"alpha": "#000000"}
    # The PNG from a 16-bit PNG is 8-bit and exact: round(x * 255 / 65535).
    ramp = np.linspace(0, 65535, 48 * 64).reshape(48, 64).astype(np.uint16)
    stored = Image.open(io.BytesIO(samples["grey16.png"]["png"]))
    assert stored.mode == "L" and np.array_equal(np.asarray(stored), np.round(ramp * (255 / 65535)).astype(np.uint8))


def test_keep_icc_keeps_a_wide_gamut_jpeg_byte_for_byte(cli, photos: Path, tmp_path: Path):
    dest = tmp_path / "out"
    cli("shard", "images", photos, dest, "--keep-icc", "--no-progress")
    samples = _by_source(dest)
    assert samples["p3.jpg"]["jpg"] == (photos / "p3.jpg").read_bytes()
    assert "normalised" not in json.loads(samples["p3.jpg"]["json"])["fgdata"]


def _animation(fmt: str, frames: int = 3) -> bytes:
    """``frames`` frames of 20 x 20, frame i grey level 80 * i (the first is black)."""
    images = [Image.new("RGB", (20, 20), (80 * i,) * 3) for i in range(frames)]
    buf = io.BytesIO()
    images[0].save(buf, fmt, save_all=True, append_images=images[1:], duration=100, loop=0)
    return buf.getvalue()


def test_format_keep_warns_once_counting_the_formats_written(cli, photos: Path, tmp_path: Path):
    """The warning counts what the dataset holds, not the inputs' names: a PNG named .webp is written as png, a
    GIF (which the loaders do not read) is encoded as PNG, a BMP is kept."""
    (photos / "extra.webp").write_bytes(png(Image.new("RGB", (8, 8))))
    (photos / "moving.gif").write_bytes(_animation("GIF"))
    Image.new("RGB", (8, 8), RED).save(photos / "still.bmp")
    result = cli("shard", "images", photos, tmp_path / "out", "--format", "keep", "--no-progress", "--json")
    doc = json.loads(result.stdout)
    assert doc["image_formats"] == {"png": 5, "jpg": 4, "bmp": 1} and doc["written"] == 10
    assert result.output.count("--format keep") == 1
    assert "3 image extensions (png 5, jpg 4, bmp 1)" in result.output and "misses 5 samples" in result.output
    formats = {name: set(m) - {"json", "txt"} for name, m in _by_source(tmp_path / "out").items()}
    assert formats["extra.webp"] == formats["moving.gif"] == {"png"} and formats["still.bmp"] == {"bmp"}
    one = tmp_path / "one"
    (one / "src").mkdir(parents=True)
    (one / "src" / "a.gif").write_bytes(_animation("GIF"))
    (one / "src" / "b.png").write_bytes(png(Image.new("RGB", (8, 8))))
    result = cli("shard", "images", one / "src", one / "out", "--format", "keep", "--no-progress")
    assert "--format keep" not in result.output  # a GIF written as png: one format, nothing to warn about


@pytest.mark.parametrize("image_format", ["jpg", "png", "webp", "keep"])
def test_an_animation_is_its_first_frame_in_every_format_and_is_counted(cli, tmp_path: Path, image_format: str):
    """Animated GIF, PNG (APNG) and WebP: every output format stores the first frame (what every loader reads),
    listed under "normalised" as ``animation: <frames>`` and counted in the summary; a still image is not."""
    src = tmp_path / "src"
    src.mkdir()
    for name, fmt in (("a.gif", "GIF"), ("a.png", "PNG"), ("a.webp", "WEBP")):
        (src / name).write_bytes(_animation(fmt))
    (src / "still.png").write_bytes(png(Image.new("RGB", (20, 20), RED)))
    doc = json.loads(cli("shard", "images", src, tmp_path / "out", "--format", image_format, "--no-progress",
                         "--json").stdout)
    assert doc["written"] == 4 and doc["normalised"] == {"animation": 3}
    for name, members in _by_source(tmp_path / "out").items():
        (ext,) = set(members) - {"json", "txt"}
        stored = Image.open(io.BytesIO(members[ext]))
        assert getattr(stored, "n_frames", 1) == 1, (name, ext)
        normalised = json.loads(members["json"])["fgdata"].get("normalised")
        if name == "still.png":
            assert normalised is None and np.abs(_pixels(members[ext])[0, 0] - RED).max() < 8
        else:
            assert normalised == {"animation": 3}, name
            assert np.abs(_pixels(members[ext])[10, 10]).max() < 8, name  # the first frame: black


def test_a_changed_background_or_format_is_refused_on_resume(cli, photos: Path, tmp_path: Path):
    dest = tmp_path / "out"
    cli("shard", "images", photos, dest, "--no-progress")
    for flags, named in ((["--background", "black"], "background was 'white', now 'black'"),
                         (["--format", "png"], "format was 'jpg', now 'png'"),
                         (["--quality", "80"], "quality was 95, now 80"), (["--keep-icc"], "keep-icc was False")):
        result = cli("shard", "images", photos, dest, *flags, "--no-progress", expect=1)
        assert named in str(result.exception)


def test_other_tools_shards_load_upright_and_unclipped(photos: Path, tmp_path: Path):
    """The original bytes in a shard fgdata did not write: the loaders' fast path, the preview tile,
    ``encode``'s decode and ``verify --decode`` all show them as a viewer does."""
    from fgdata.media.decode import check_member

    for name in PHOTOS:
        data = (photos / name).read_bytes()
        shown, changes = decode_display(data)
        assert changes == CHANGES.get(name, {}), name
        _check_shown(name, np.asarray(shown.convert("RGB")).astype(int))
        size = shown.size
        for fast_jpeg in (True, False):  # False: what ``encode latents`` decodes with
            tensor = load_image_for_training(data, (size[1], size[0]), simplejpeg=fast_jpeg)
            _check_shown(name, np.round((tensor.transpose(1, 2, 0) + 1) * 127.5).astype(int))
        tile = Image.open(io.BytesIO(thumbnail(data, "image")))
        assert tile.size == size  # smaller than the tile: not shrunk, upright
        _check_shown(name, np.asarray(tile.convert("RGB")).astype(int))
        assert check_member(name.rsplit(".", 1)[1], data) is None


def test_reference_resize_stays_the_reference_decode(photos: Path):
    """``resize="reference"`` is the reference loaders' decode bit for bit, sideways and clipped as theirs."""
    for name in ("sideways.jpg", "grey16.png"):
        data = (photos / name).read_bytes()
        ours = load_image_for_training(data, 16, resize="reference")
        np.testing.assert_array_equal(ours, reference_image(data, 16, rgb_first=True))
    grey = load_image_for_training((photos / "grey16.png").read_bytes(), 16, resize="reference")
    assert (grey == 1.0).mean() > 0.9  # the reference's clip at 255: what fgdata's shards avoid


def test_verify_and_report_flag_mixed_image_formats(cli, photos: Path, tmp_path: Path):
    dest = tmp_path / "mixed"
    dest.mkdir()
    with ShardWriter(str(dest)) as writer:
        for i, name in enumerate(sorted(PHOTOS)):
            writer.write(f"s{i:03d}", {name.rsplit(".", 1)[1]: (photos / name).read_bytes(), "txt": b"x"})
    verify = json.loads(cli("verify", dest, "--json").stdout)
    assert verify["ok"] and verify["warnings"] == [verify["warnings"][0]]
    assert "mixed image formats: 2 image extensions (jpg 4, png 3)" in verify["warnings"][0]
    report = json.loads(cli("report", dest, "-o", tmp_path / "r.html", "--json", "--no-progress", expect=1).stdout)
    mixed = [p for p in report["problems"] if p["kind"] == "mixed image formats"]
    assert mixed and mixed[0]["count"] == 3 and "{'real': 'jpg'} misses 3 samples" in mixed[0]["examples"][0]
    clean = tmp_path / "clean"
    cli("shard", "images", photos, clean, "--no-progress")
    assert json.loads(cli("verify", clean, "--json").stdout)["warnings"] == []


def test_float_and_32bit_images_are_scaled_not_clipped(tmp_path: Path):
    """Float images from 0..1 (or their own wider range); 32-bit integers beyond 16 bits by their range."""
    ramp = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)
    wide = (ramp * 65535 * 4).astype(np.int32)  # up to 4 x 65535: scaled by its own maximum
    cases = {"F": (ramp, np.round(ramp * 255)), "F-wide": (ramp * 4 - 1, np.round(ramp * 255)),
             "I": (wide, np.round(wide * (255 / wide.max())))}
    for label, (array, expected) in cases.items():
        path = tmp_path / f"{label}.tiff"
        Image.fromarray(array).save(path)
        shown, changes = decode_display(path.read_bytes())
        assert changes == {"8-bit": Image.open(path).mode} and shown.mode == "L", label
        np.testing.assert_array_equal(np.asarray(shown), expected.astype(np.uint8), err_msg=label)


def test_max_side_shrinks_the_upright_image(cli, photos: Path, tmp_path: Path):
    dest = tmp_path / "small"
    cli("shard", "images", photos, dest, "--max-side", "16", "--no-progress")
    members = _by_source(dest)["sideways.jpg"]
    meta = json.loads(members["json"])["fgdata"]
    assert (meta["width"], meta["height"]) == (8, 16) and meta["normalised"] == {"orientation": 6}
    rgb = _pixels(members["jpg"])
    assert np.abs(rgb[1, 4] - RED).max() < 40 and np.abs(rgb[14, 4] - BLUE).max() < 40


def test_a_16bit_rgb_png_is_stored_as_8bit_even_in_its_own_format(cli, tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    rgb = np.zeros((8, 8, 3), np.uint16)
    rgb[..., 0], rgb[..., 1] = 65535, 32896  # 32896 = 128 * 257
    (src / "deep.png").write_bytes(rgb16_png(rgb))
    dest = tmp_path / "out"
    cli("shard", "images", src, dest, "--format", "png", "--no-progress")
    members = _by_source(dest)["deep.png"]
    assert json.loads(members["json"])["fgdata"]["normalised"] == {"8-bit": "16-bit PNG"}
    assert members["png"][24] == 8 and np.array_equal(_pixels(members["png"])[0, 0], (255, 128, 0))


@pytest.mark.parametrize("image_format", ["png", "jpg", "webp"])
def test_a_converted_photo_carries_no_profile_and_lcms_pixels(cli, tmp_path: Path, image_format: str):
    """lcms stamps the time into the sRGB profile it makes, which Pillow would embed in a PNG: a converted image
    carries no profile in any format (sRGB is implied), and its pixels are exactly lcms's conversion."""
    rng = np.random.default_rng(0)
    src = Image.fromarray(rng.integers(0, 256, (16, 24, 3), dtype=np.uint8))
    p3 = rgb_profile(DISPLAY_P3, "Display P3 (test)")
    shown, changes = decode_display(png(src, icc_profile=p3))
    assert changes == {"icc": "Display P3 (test)"} and "icc_profile" not in shown.info
    lcms = ImageCms.profileToProfile(src, ImageCms.ImageCmsProfile(io.BytesIO(p3)), ImageCms.createProfile("sRGB"),
                                     renderingIntent=ImageCms.Intent.PERCEPTUAL)
    assert np.array_equal(np.asarray(shown), np.asarray(lcms))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "p3.png").write_bytes(png(src, icc_profile=p3))
    cli("shard", "images", tmp_path / "src", tmp_path / "out", "--format", image_format, "--no-progress")
    members = _by_source(tmp_path / "out")["p3.png"]
    stored = Image.open(io.BytesIO(members[image_format]))
    assert "icc_profile" not in stored.info and json.loads(members["json"])["fgdata"]["normalised"] == changes
    if image_format == "png":
        assert np.array_equal(np.asarray(stored), np.asarray(lcms))
