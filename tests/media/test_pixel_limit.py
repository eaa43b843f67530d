"""Pillow's MAX_IMAGE_PIXELS is refused on every path: header fast paths, Pillow, prepare, loaders, verify, shard."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from fgdata.media import ImageDecodeError, check_member, decode_member, describe_image, load_image_for_training
from fgdata.media.image import image_size, open_image


LIMIT = "decompression bomb"  # our message, or Pillow's beyond twice the limit


@pytest.mark.parametrize("ext", ["jpg", "png"])
def test_every_decode_path_refuses_a_bomb(ext, bombs, tmp_path):
    data = bombs[ext]
    assert len(data) < 1000
    calls = [
        lambda: describe_image(data),
        lambda: image_size(data),
        lambda: open_image(data),
        lambda: load_image_for_training(data, 64),  # JPEG frame header + simplejpeg
        lambda: load_image_for_training(data, 64, simplejpeg=False),
        lambda: load_image_for_training(data, 64, resize="reference"),
        lambda: decode_member(ext, data),
    ]
    for call in calls:
        with pytest.raises(ImageDecodeError, match=LIMIT):
            call()
    assert check_member(ext, data) == "image-decode"  # verify --decode

    from fgdata.prepare.transforms import open_rgb

    path = tmp_path / "bomb.img"
    path.write_bytes(data)
    with pytest.raises(ImageDecodeError, match=LIMIT):
        open_rgb(str(path))


def test_the_class_loader_refuses_a_png_bomb_before_pyspng(tmp_path, sample_data, bombs):
    from fgdata.loaders.image_loader import ImageZipDataset

    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.open(sample_data / "chelsea.png").convert("RGB").resize((8, 8)).save(folder / "a.png")
    (folder / "b.png").write_bytes(bombs["png"])
    ds = ImageZipDataset(str(folder), use_labels=False, use_pyspng=True)
    assert ds[0]["real"].shape == (3, 8, 8)
    with pytest.raises(ImageDecodeError, match=LIMIT):
        ds[1]


def test_the_limit_is_pillows_own_setting_at_one_times(monkeypatch, sample_data, bombs):
    """Above 1x Pillow only warns; fgdata refuses. ``MAX_IMAGE_PIXELS = None`` turns the check off, as in Pillow."""
    data = (sample_data / "rocket.jpg").read_bytes()
    w, h = Image.open(io.BytesIO(data)).size
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", w * h - 1)
    for call in (lambda: describe_image(data), lambda: open_image(data), lambda: load_image_for_training(data, 32)):
        with pytest.raises(ImageDecodeError, match=f"{w}x{h}"):
            call()
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", w * h)
    assert describe_image(data)["width"] == w
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert image_size(bombs["jpg"]) == image_size(bombs["png"]) == (65000, 65000)  # header only: nothing decoded
