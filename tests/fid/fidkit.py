"""Helpers for the fid-refs tests: random images, EDM zips, a float64 stand-in for Inception's 2048-d output."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def png(arr: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def random_images(n: int, size: int = 16, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def write_edm_zip(path: Path, images: list[np.ndarray]) -> Path:
    """An EDM dataset zip: numbered folders, uncompressed PNGs, dataset.json with labels."""
    path.parent.mkdir(parents=True, exist_ok=True)
    labels = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for i, arr in enumerate(images):
            name = f"{i // 1000:05d}/img{i:08d}.png"
            zf.writestr(name, png(arr))
            labels.append([name, i % 3])
        zf.writestr("dataset.json", json.dumps({"labels": labels}))
    return path


class TinyNet(torch.nn.Module):
    """uint8 [N,3,H,W] -> [N,2048], all in float64 so batch composition cannot change the features."""

    feature_dim = 2048

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, dtype=torch.float64)
        self.proj = torch.nn.Linear(32, 2048, dtype=torch.float64)

    def forward(self, images: torch.Tensor, return_features: bool = True) -> torch.Tensor:
        x = torch.relu(self.conv(images.to(torch.float64) / 255))
        return self.proj(F.adaptive_avg_pool2d(x, 2).flatten(1))
