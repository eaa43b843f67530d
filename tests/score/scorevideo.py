"""Videos for the score tests: frames written with PyAV, and the same frames read back independently of fgdata."""

from __future__ import annotations

import io

import numpy as np


def varied_frames(seconds: int = 3, fps: int = 10, size: tuple[int, int] = (96, 64)) -> list[np.ndarray]:
    """One second each of noise (sharp), a smooth gradient (soft, flat blocks) and near-black (dark), and so on."""
    w, h = size
    rng = np.random.default_rng(7)
    looks = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
             np.broadcast_to(np.linspace(40, 200, w, dtype=np.uint8)[None, :, None], (h, w, 3)).copy(),
             np.full((h, w, 3), 3, np.uint8)]
    return [looks[(i // fps) % len(looks)] for i in range(seconds * fps)]


def encode_frames(frames: list[np.ndarray], fps: int = 10, rotation: int = 0) -> bytes:
    """An h264 mp4 of ``frames`` (display rotation ``rotation`` degrees in its metadata)."""
    import av

    buf = io.BytesIO()
    h, w = frames[0].shape[:2]
    with av.open(buf, "w", format="mp4") as out:
        vs = out.add_stream("libx264", rate=fps, options={"preset": "ultrafast", "g": "12"})
        vs.width, vs.height, vs.pix_fmt = w, h, "yuv420p"
        if rotation:
            vs.set_display_rotation(rotation)
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24")
            vf.pts = i
            out.mux(vs.encode(vf))
        out.mux(vs.encode(None))
    return buf.getvalue()


def frames_at(data: bytes, indices: list[int], rotation: int = 0) -> list[np.ndarray]:
    """Frames ``indices`` (in presentation order) as RGB arrays a viewer sees: every frame decoded with PyAV,
    turned counter-clockwise by the display rotation."""
    import av

    with av.open(io.BytesIO(data)) as container:
        decoded = sorted(container.decode(video=0), key=lambda f: f.pts)
        return [np.rot90(decoded[i].to_ndarray(format="rgb24"), k=rotation // 90) for i in indices]
