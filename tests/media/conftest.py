"""Small synthetic videos for the media tests, encoded once per session with PyAV (ultrafast)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def encode_clip(
    path: Path,
    *,
    frames: int = 48,
    fps: int = 24,
    size: tuple[int, int] = (64, 48),
    audio_channels: int | None = None,
    rotation: int | None = None,
) -> bytes:
    """Encode an h264 mp4 whose frame i is filled with grey level 4*i (frames are identifiable)."""
    import av

    w, h = size
    with av.open(str(path), "w") as out:
        vs = out.add_stream("libx264", rate=fps, options={"preset": "ultrafast", "g": "12"})
        vs.width, vs.height, vs.pix_fmt = w, h, "yuv420p"
        if rotation is not None:
            vs.set_display_rotation(rotation)
        aus = None
        if audio_channels:
            aus = out.add_stream("aac", rate=48000)
            aus.layout = "mono" if audio_channels == 1 else "stereo"
        for i in range(frames):
            img = np.full((h, w, 3), (4 * i) % 256, np.uint8)
            img[:, : w // 4] = 255  # asymmetric marker: left quarter white
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts = i
            for p in vs.encode(f):
                out.mux(p)
        for p in vs.encode():
            out.mux(p)
        if aus is not None:
            n = int(48000 * frames / fps)
            t = np.arange(n) / 48000
            wave = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
            wave = np.tile(wave, (audio_channels, 1))
            for s in range(0, n, 1024):
                af = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(wave[:, s : s + 1024]),
                    format="fltp",
                    layout=aus.layout.name,
                )
                af.sample_rate, af.pts = 48000, s
                for p in aus.encode(af):
                    out.mux(p)
            for p in aus.encode():
                out.mux(p)
    return path.read_bytes()


@pytest.fixture(scope="session")
def silent_clip(tmp_path_factory) -> bytes:
    return encode_clip(tmp_path_factory.mktemp("v") / "silent.mp4")


@pytest.fixture(scope="session")
def mono_clip(tmp_path_factory) -> bytes:
    return encode_clip(tmp_path_factory.mktemp("v") / "mono.mp4", audio_channels=1)


@pytest.fixture(scope="session")
def bunny(sample_video) -> bytes:
    return sample_video.read_bytes()


@pytest.fixture(scope="session")
def make_clip():
    """The encoder itself, for tests that need a clip with particular properties."""
    return encode_clip
