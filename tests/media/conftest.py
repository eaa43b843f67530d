"""Small synthetic videos for the media tests, encoded once per session (``encode_test_clip`` in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def silent_clip(clip_encoder) -> bytes:
    return clip_encoder()


@pytest.fixture(scope="session")
def mono_clip(clip_encoder) -> bytes:
    return clip_encoder(audio_channels=1)


@pytest.fixture(scope="session")
def bunny(sample_video) -> bytes:
    return sample_video.read_bytes()
