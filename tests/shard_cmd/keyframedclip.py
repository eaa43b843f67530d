"""A small real clip with known keyframes, for the shard command tests (its own module: test files import it by a
name no other folder's conftest shares)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np


def make_clip(path: Path, seconds: int = 3, fps: int = 24, gop: int = 12, size: int = 64) -> Path:
    """A small h264 + AAC stereo clip with a keyframe every ``gop`` frames (ENVIRONMENT)."""
    import av

    with av.open(str(path), "w") as c:
        vs = c.add_stream("libx264", rate=fps, options={"preset": "ultrafast", "g": str(gop)})
        vs.width = vs.height = size
        vs.pix_fmt = "yuv420p"
        aus = c.add_stream("aac", rate=48000, layout="stereo")
        for i in range(seconds * fps):
            frame = av.VideoFrame.from_ndarray(np.full((size, size, 3), (i * 7) % 255, np.uint8), format="rgb24")
            frame.pts = i
            c.mux(vs.encode(frame))
        c.mux(vs.encode(None))
        n = 48000 * seconds
        tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(n) / 48000)).astype(np.float32)
        stereo = np.stack([tone, tone])
        for off in range(0, n, 1024):
            af = av.AudioFrame.from_ndarray(np.ascontiguousarray(stereo[:, off : off + 1024]), format="fltp", layout="stereo")
            af.sample_rate = 48000
            af.pts = off
            af.time_base = Fraction(1, 48000)
            c.mux(aus.encode(af))
        c.mux(aus.encode(None))
    return path
