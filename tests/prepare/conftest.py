"""Fixtures for class-conditional preparation: a CIFAR-format tarball, an ImageNet-style tree, a tiny VAE."""

from __future__ import annotations

import io
import pickle
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))  # faultkit, the fault-injection helpers


def cifar_rows(sample_images: list[Path], n: int, seed: int = 0) -> np.ndarray:
    """``n`` CIFAR rows (3072 bytes, planar RGB) cut from the bundled photos."""
    rng = np.random.default_rng(seed)
    photos = [np.asarray(Image.open(p).convert("RGB")) for p in sample_images]
    rows = np.empty((n, 3072), np.uint8)
    for i in range(n):
        img = photos[i % len(photos)]
        y, x = rng.integers(0, img.shape[0] - 32), rng.integers(0, img.shape[1] - 32)
        rows[i] = img[y:y + 32, x:x + 32].transpose(2, 0, 1).reshape(-1)
    return rows


def build_cifar_tarball(path: Path, sample_images: list[Path], per_batch: int = 40) -> tuple[np.ndarray, list[int]]:
    """A tarball in the CIFAR-10 python layout (pickled dict batches); returns the training rows and labels."""
    rows = cifar_rows(sample_images, per_batch * 6)
    labels = [(i * 7 + 6) % 10 for i in range(len(rows))]
    with tarfile.open(path, "w:gz") as tar:
        for b, name in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
            sl = slice(b * per_batch, (b + 1) * per_batch)
            batch = {"batch_label": name, "labels": labels[sl], "data": rows[sl],
                     "filenames": [f"{name}_{i}.png" for i in range(per_batch)]}
            data = pickle.dumps(batch, protocol=2)  # the format under test is a pickle
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    n = per_batch * 5
    return rows[:n].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels[:n]


@pytest.fixture(scope="session")
def cifar_tarball(tmp_path_factory, sample_images):
    path = tmp_path_factory.mktemp("cifar") / "cifar-10-python.tar.gz"
    images, labels = build_cifar_tarball(path, sample_images)
    return path, images, labels


def build_imagenet_tree(root: Path, sample_images: list[Path]) -> Path:
    """A Kaggle-shaped tree with three class folders and varied sizes and modes (RGB, L, CMYK, P, RGBA, LA)."""
    train = root / "ILSVRC" / "Data" / "CLS-LOC" / "train"
    photos = [Image.open(p).convert("RGB") for p in sample_images]
    variants = [
        ("n01440764", "a.JPEG", lambda im: im.resize((500, 375)), "JPEG"),
        ("n01440764", "b.JPEG", lambda im: im.resize((333, 501)), "JPEG"),
        ("n01440764", "c.JPEG", lambda im: im.convert("L").resize((250, 199)), "JPEG"),
        ("n01443537", "d.JPEG", lambda im: im.convert("CMYK").resize((301, 257)), "JPEG"),
        ("n01443537", "e.png", lambda im: im.convert("P").resize((129, 97)), "PNG"),
        ("n01443537", "f.png", lambda im: im.convert("RGBA").resize((64, 64)), "PNG"),
        ("n01484850", "g.png", lambda im: im.convert("LA").resize((140, 260)), "PNG"),
        ("n01484850", "h.JPEG", lambda im: im.resize((1000, 700)), "JPEG"),
        ("n01484850", "i.png", lambda im: im.convert("L").resize((77, 63)), "PNG"),
        ("n01484850", "j.JPEG", lambda im: im.resize((255, 383)), "JPEG"),
    ]
    for k, (wnid, name, make, fmt) in enumerate(variants):
        (train / wnid).mkdir(parents=True, exist_ok=True)
        make(photos[k % len(photos)]).save(train / wnid / name, format=fmt)
    return root


@pytest.fixture(scope="session")
def imagenet_root(tmp_path_factory, sample_images) -> Path:
    return build_imagenet_tree(tmp_path_factory.mktemp("imagenet"), sample_images)


