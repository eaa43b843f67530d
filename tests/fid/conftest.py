"""Fixtures: small EDM zips, the stand-in detector's weights, a tiny DINOv2 saved with save_pretrained, and
random weights of the real Inception-v3 layout. The stand-in loads through the same state-dict loader as the
real weights; nothing of fgdata is mocked.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from fidkit import TinyNet, random_images, write_edm_zip

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))  # faultkit, the fault-injection helpers


@pytest.fixture(scope="session")
def tiny_net():
    return TinyNet


@pytest.fixture(scope="session")
def tiny_inception_weights(tmp_path_factory, tiny_net) -> Path:
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-inception") / "tiny.safetensors"
    save_file(tiny_net().state_dict(), str(path))
    return path


@pytest.fixture(scope="session")
def tiny_dinov2(tmp_path_factory) -> Path:
    import torch
    from transformers import Dinov2Config, Dinov2Model

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-dinov2")
    Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             patch_size=14, image_size=56)).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def inception_weights(tmp_path_factory) -> Path:
    """Random weights of the real Inception-v3 FID layout, as safetensors."""
    import torch
    from safetensors.torch import save_file

    from fgdata.fid.inception import InceptionV3

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("inception") / "inception-random.safetensors"
    save_file(InceptionV3().state_dict(), str(path))
    return path


@pytest.fixture
def edm_zip(tmp_path) -> tuple[Path, list[np.ndarray]]:
    images = random_images(11)
    return write_edm_zip(tmp_path / "data" / "set-16x16.zip", images), images
