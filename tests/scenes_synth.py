"""Synthetic videos with known shots, built with PyAV from the sample photos: ground truth for the scene
tests and benchmarks/bench_scenes.py.

A video is a list of segments; each yields frames (uint8 RGB, H x W x 3) and the generator records
where every hard cut, fade and dissolve is, in frames.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass, field
from fractions import Fraction
import numpy as np

from fgdata.catalog import SAMPLE_DATA as DATA
PHOTOS = ("chelsea.png", "coffee.png", "horse.png", "rocket.jpg", "grace_hopper.jpg", "camera.png")


@functools.lru_cache(maxsize=16)
def photo(k: int, size: tuple[int, int]) -> np.ndarray:
    """Sample photo ``k`` (cycled) as RGB, resized so that it covers ``size`` = (W, H) twice over (room to pan)."""
    from PIL import Image

    im = Image.open(DATA / PHOTOS[k % len(PHOTOS)]).convert("RGB")
    w, h = size
    s = max(2 * w / im.width, 2 * h / im.height)
    return np.asarray(im.resize((round(im.width * s) + 1, round(im.height * s) + 1), Image.Resampling.BILINEAR))


def view(img: np.ndarray, size: tuple[int, int], x: float, y: float, zoom: float = 1.0) -> np.ndarray:
    """A W x H window of ``img`` at (x, y), ``zoom`` > 1 magnifying (nearest neighbour: cheap, sharp)."""
    w, h = size
    if zoom == 1.0 and 0 <= x and x + w <= img.shape[1] and 0 <= y and y + h <= img.shape[0]:
        return img[int(y) : int(y) + h, int(x) : int(x) + w].copy()  # the same pixels, without an index pass
    xs = np.clip((x + np.arange(w) / zoom).astype(int), 0, img.shape[1] - 1)
    ys = np.clip((y + np.arange(h) / zoom).astype(int), 0, img.shape[0] - 1)
    return img[ys][:, xs]


@dataclass
class Truth:
    frames: list[np.ndarray] = field(default_factory=list)
    hard: list[int] = field(default_factory=list)  # first frame of each new shot after a hard cut
    soft: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, first, last) transition frames
    flashes: list[int] = field(default_factory=list)


def shot(img: np.ndarray, size: tuple[int, int], n: int, speed: float = 0.5, zoom_to: float = 1.0,
         t0: int = 0) -> list[np.ndarray]:
    """Frames ``t0..t0+n-1`` of a shot panning ``speed`` px/frame (and zooming from 1 to ``zoom_to``) over
    ``img``."""
    out = []
    for t in range(t0, t0 + n):
        z = 1.0 + (zoom_to - 1.0) * t / max(1, n - 1)
        out.append(view(img, size, 4 + speed * t, 4 + 0.25 * speed * t, z))
    return out


def build(size: tuple[int, int], plan: list[tuple], seed: int = 0) -> Truth:
    """Frames from ``plan``: ("shot", photo, n, speed[, zoom_to[, t0]]), ("cut",), ("flash", brightness),
    ("dissolve", n), ("fade", down, dark, up). A transition uses the shots before and after it."""
    truth = Truth()
    pending: tuple | None = None
    for step in plan:
        kind = step[0]
        if kind == "shot":
            frames = shot(photo(step[1], size), size, step[2], step[3], *step[4:])
            if pending is not None and pending[0] == "dissolve":
                n = pending[1]
                prev = truth.frames[-1].astype(np.float32)
                first = len(truth.frames)
                for k in range(1, n + 1):
                    a = k / (n + 1)
                    truth.frames.append(((1 - a) * prev + a * frames[0].astype(np.float32)).round().astype(np.uint8))
                truth.soft.append(("dissolve", first, len(truth.frames) - 1))
            elif pending is not None and pending[0] == "fade":
                _, down, dark, up = pending
                prev = truth.frames[-1].astype(np.float32)
                first = len(truth.frames)
                for k in range(1, down + 1):
                    truth.frames.append((prev * (1 - k / (down + 1))).round().astype(np.uint8))
                truth.frames += [np.zeros_like(frames[0])] * dark
                nxt = frames[0].astype(np.float32)
                for k in range(1, up + 1):
                    truth.frames.append((nxt * k / (up + 1)).round().astype(np.uint8))
                truth.soft.append(("fade", first, len(truth.frames) - 1))
            elif pending is not None and pending[0] == "cut" and truth.frames:
                truth.hard.append(len(truth.frames))
            pending = None
            truth.frames += frames
        elif kind == "flash":
            f = truth.frames[-1].astype(np.float32)
            truth.flashes.append(len(truth.frames))
            truth.frames.append((f + (255 - f) * step[1]).round().astype(np.uint8))
        else:
            pending = step
    return truth


def encode(frames: list[np.ndarray], fps: int = 25, codec: str = "libx264", gop: int = 50,
           rotate: int = 0, times: list[float] | None = None, audio: bool = False, preset: str = "medium") -> bytes:
    """An mp4 (or MJPEG .avi for ``codec="mjpeg"``) of ``frames``; ``times``: per-frame seconds (variable
    frame rate); ``rotate``: display rotation written in the stream's metadata."""
    import av

    buf = io.BytesIO()
    h, w = frames[0].shape[:2]
    fmt = "avi" if codec == "mjpeg" else "mp4"
    with av.open(buf, "w", format=fmt) as out:
        vs = out.add_stream(codec, rate=fps, options={"g": str(gop), "preset": preset} if codec == "libx264" else {})
        vs.width, vs.height = w, h
        vs.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        vs.codec_context.thread_count = 1
        tb = Fraction(1, 1000) if times is not None else Fraction(1, fps)
        vs.codec_context.time_base = tb
        if rotate and codec == "libx264":
            vs.set_display_rotation(rotate)
        aus = out.add_stream("aac", rate=48000, layout="stereo") if audio else None
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24")
            vf.pts = round(times[i] * 1000) if times is not None else i
            vf.time_base = tb
            out.mux(vs.encode(vf))
        out.mux(vs.encode(None))
        if aus is not None:
            n = round(len(frames) / fps * 48000)
            t = np.arange(n) / 48000
            wave = (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
            samples = np.stack([wave, wave])
            for off in range(0, n, 1024):
                af = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, off:off + 1024]), format="fltp",
                                                layout="stereo")
                af.sample_rate, af.pts, af.time_base = 48000, off, Fraction(1, 48000)
                out.mux(aus.encode(af))
            out.mux(aus.encode(None))
    return buf.getvalue()


#: Hard cuts (one into a fast pan), a 1-frame and a 2-frame white flash, a 12-frame dissolve, a fade to black
#: and back, a fast pan and a zoom with no cut inside.
EDITED = [("shot", 0, 40, 1.0), ("cut",), ("shot", 1, 20, 0.5), ("flash", 0.9), ("shot", 1, 15, 0.5, 1.0, 21),
          ("flash", 1.0), ("flash", 1.0), ("shot", 1, 15, 0.5, 1.0, 38),
          ("dissolve", 12), ("shot", 2, 40, 0.7), ("fade", 8, 4, 8), ("shot", 3, 40, 0.3), ("cut",),
          ("shot", 4, 45, 8.0), ("cut",), ("shot", 5, 45, 0.5, 1.8), ("cut",), ("shot", 1, 30, 0.0)]


def check_transitions(truth: Truth, transitions: list) -> None:
    """The scene tests' gate: every hard cut within one frame, none on flashes, pans or zooms; each fade and
    dissolve once, within its span."""
    hard = [t.first for t in transitions if t.kind == "hard"]
    assert len(hard) == len(truth.hard), (hard, truth.hard)  # none on flashes, pans or zooms
    for want, got in zip(truth.hard, hard):
        assert abs(want - got) <= 1, (want, got)
    soft = [t for t in transitions if t.kind != "hard"]
    assert [t.kind for t in soft] == [kind for kind, _, _ in truth.soft]
    for t, (_, first, last) in zip(soft, truth.soft):  # once each, within its span (one frame of slack)
        assert first - 1 <= t.first and t.last <= last + 1 and t.first <= t.last
