"""Cut and transcode videos with PyAV: keyframe-aligned stream copy, or exact re-encoded clips.

Two ways to cut a video into ``clip_seconds`` pieces:

- **stream copy** (default): a clip starts at a keyframe, so its packets are copied without
  decoding. Cuts fall on the first keyframe at least ``clip_seconds`` after the previous cut,
  so clips are at least that long (a video with one keyframe stays one clip).
- **re-encode** (``exact``, or any of ``fps`` / ``max_side``): clips are exactly
  ``[k*S, (k+1)*S)``; frames are decoded once, in order, and encoded with libx264 (one
  thread, so the bytes do not depend on the machine) plus AAC stereo audio.

A final piece shorter than half a clip is dropped (unless it is the only one). Every clip
knows which source frames it shows (``frame_indices``), so camera tracks can be sliced to it.
"""

from __future__ import annotations

import bisect
import io
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from fgdata.media import VideoInfo
from fgdata.media.audio import decode_audio
from fgdata.media.errors import VideoDecodeError

_EPS = 1e-6
AUDIO_RATE = 48000
X264_OPTIONS = {"preset": "veryfast", "crf": "23"}


@dataclass
class ClipOut:
    data: bytes
    start: float  # seconds in the source
    end: float
    frame_indices: list[int]  # source frame shown by each output frame


def clip_bounds(info: VideoInfo, clip_seconds: float, exact: bool) -> list[tuple[float, float]]:
    """``(start, end)`` seconds of each clip (see the module docstring for the rule)."""
    if clip_seconds <= 0:
        raise ValueError("clip_seconds must be > 0")
    duration = info.duration
    if exact:
        n = max(1, math.ceil(duration / clip_seconds - _EPS))
        cuts = [k * clip_seconds for k in range(n)]
    else:
        cuts = [0.0]
        for t in info.keyframe_times:
            if t >= cuts[-1] + clip_seconds - _EPS:
                cuts.append(t)
    bounds = [(a, b) for a, b in zip(cuts, cuts[1:] + [duration])]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < clip_seconds / 2 - _EPS:
        bounds.pop()
    return bounds


def _frames_in(info: VideoInfo, start: float, end: float) -> list[int]:
    times = [info.frame_time(i) for i in range(info.frame_count)]
    return list(range(bisect.bisect_left(times, start - _EPS), bisect.bisect_left(times, end - _EPS)))


def _container_format(ext: str) -> str:
    return "webm" if ext == "webm" else "mp4"


def copy_clips(data: bytes, info: VideoInfo, bounds: list[tuple[float, float]], ext: str) -> list[ClipOut]:
    """Stream-copy the packets of each keyframe-aligned clip (video and first audio track)."""
    import av

    starts = [a for a, _ in bounds]
    clips: list[tuple[list, list]] = [([], []) for _ in bounds]
    try:
        with av.open(io.BytesIO(data), "r") as src:
            vs = src.streams.video[0]
            aud = src.streams.audio[0] if src.streams.audio else None
            streams = [vs] + ([aud] if aud is not None else [])
            current = 0
            for packet in src.demux(*streams):
                if packet.dts is None and packet.pts is None:
                    continue
                if packet.stream is vs:
                    ts = packet.pts if packet.pts is not None else packet.dts
                    assert ts is not None  # packets with neither were skipped above
                    t = (ts - info.start_pts) * info.time_base
                    while packet.is_keyframe and current + 1 < len(starts) and t >= starts[current + 1] - _EPS:
                        current += 1
                    if t < bounds[-1][1] - _EPS or current < len(bounds) - 1:
                        clips[current][0].append(packet)
                elif aud is not None and aud.time_base is not None:
                    t = float(((packet.pts or 0) - (aud.start_time or 0)) * aud.time_base)
                    c = bisect.bisect_right(starts, t + _EPS) - 1
                    if 0 <= c < len(bounds) and t < bounds[c][1] - _EPS:
                        clips[c][1].append(packet)
            out = []
            for (start, end), (vpackets, apackets) in zip(bounds, clips):
                if not vpackets:
                    continue
                v0 = min(p.dts if p.dts is not None else p.pts for p in vpackets)
                a0 = min(p.dts if p.dts is not None else p.pts for p in apackets) if aud is not None and apackets else 0
                data_out = mux_packets([(vs, vpackets, v0), (aud, apackets, a0)], _container_format(ext))
                out.append(ClipOut(data_out, start, end, _frames_in(info, start, end)))
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"cannot copy video clips: {e}") from e
    return out


def mux_packets(tracks: list[tuple[Any, list[Any], int]], container_format: str) -> bytes:
    """Stream-copy packets into a new container: per track (template stream, packets, offset), a stream like
    the template (none for a missing template or no packets), each packet's timestamps less ``offset``.
    The packets' timestamps are restored after muxing: a packet may serve a later, overlapping clip."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format=container_format) as dst:
        outs = [dst.add_stream_from_template(t) if t is not None and packets else None for t, packets, _ in tracks]
        for (_, packets, offset), stream in zip(tracks, outs):
            if stream is None:
                continue
            for p in packets:
                if p.pts is not None:
                    p.pts -= offset
                if p.dts is not None:
                    p.dts -= offset
                p.stream = stream
                dst.mux(p)
                if p.pts is not None:
                    p.pts += offset
                if p.dts is not None:
                    p.dts += offset
    return buf.getvalue()


def add_clip_streams(dst: Any, rate: Fraction, width: int, height: int, audio: bool) -> tuple[Any, Any]:
    """The clip encoder of ``shard videos`` (exact and re-encoded clips): libx264 with X264_OPTIONS on one
    thread (the bytes do not depend on the machine), yuv420p at ``rate``; AAC stereo at AUDIO_RATE with
    ``audio``. Returns (video stream, audio stream or None)."""
    vs = dst.add_stream("libx264", rate=rate, options=dict(X264_OPTIONS))
    vs.width, vs.height, vs.pix_fmt = width, height, "yuv420p"
    vs.codec_context.thread_count = 1
    vs.codec_context.time_base = Fraction(1) / rate
    aus = dst.add_stream("aac", rate=AUDIO_RATE, layout="stereo") if audio else None
    return vs, aus


def finish_clip(dst: Any, vs: Any, aus: Any, sound: np.ndarray | None) -> None:
    """Flush the video encoder, then encode ``sound`` ([channels, samples] float at AUDIO_RATE) on ``aus``."""
    import av

    dst.mux(vs.encode(None))
    if aus is None or sound is None:
        return
    samples = np.ascontiguousarray(sound, dtype=np.float32)
    for off in range(0, samples.shape[1], 1024):
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, off : off + 1024]), format="fltp",
                                           layout="stereo")
        frame.sample_rate, frame.pts, frame.time_base = AUDIO_RATE, off, Fraction(1, AUDIO_RATE)
        dst.mux(aus.encode(frame))
    dst.mux(aus.encode(None))


def _output_size(info: VideoInfo, max_side: int | None) -> tuple[int, int]:
    w, h = info.width, info.height
    if max_side and max(w, h) > max_side:
        s = max_side / max(w, h)
        w, h = max(2, round(w * s)), max(2, round(h * s))
    return w - w % 2, h - h % 2


def _select(info: VideoInfo, start: float, end: float, fps: float | None) -> list[int]:
    """Source frames for one clip: every frame in [start, end), or the last frame shown at each 1/fps tick."""
    if not fps:
        return _frames_in(info, start, end)
    times = [info.frame_time(i) for i in range(info.frame_count)]
    n = max(1, math.ceil((end - start) * fps - _EPS))
    return [max(0, bisect.bisect_right(times, start + k / fps + _EPS) - 1) for k in range(n)]


def encode_clips(
    data: bytes,
    info: VideoInfo,
    bounds: list[tuple[float, float]],
    *,
    fps: float | None = None,
    max_side: int | None = None,
) -> list[ClipOut]:
    """Decode once and encode each clip to h264 (+ AAC stereo) mp4 at ``fps`` and ``max_side``."""
    import av

    out_fps = fps or info.fps
    if not out_fps:
        raise VideoDecodeError("video has no frame rate")
    rate = Fraction(out_fps).limit_denominator(1001)
    width, height = _output_size(info, max_side)
    selections = [_select(info, a, b, fps) for a, b in bounds]
    needed: dict[int, list[tuple[int, int]]] = {}
    for c, sel in enumerate(selections):
        for k, i in enumerate(sel):
            needed.setdefault(i, []).append((c, k))
    buffers = [io.BytesIO() for _ in bounds]
    outputs: dict[int, tuple] = {}
    remaining = [len(sel) for sel in selections]

    def open_clip(c: int) -> tuple:
        dst = av.open(buffers[c], "w", format="mp4")
        audio = decode_audio(data, bounds[c][0], bounds[c][1] - bounds[c][0], AUDIO_RATE) if info.audio_codec else None
        vs, aus = add_clip_streams(dst, rate, width, height, audio is not None)
        return dst, vs, aus, audio

    def finish(c: int) -> None:
        dst, vs, aus, audio = outputs.pop(c)
        finish_clip(dst, vs, aus, audio[0] if audio is not None else None)
        dst.close()

    try:
        with av.open(io.BytesIO(data), "r") as src:
            vsrc = src.streams.video[0]
            vsrc.thread_count = 1
            last = max(needed) if needed else -1
            for i, frame in enumerate(src.decode(vsrc)):
                if i > last:
                    break
                for c, k in needed.get(i, ()):
                    if c not in outputs:
                        outputs[c] = open_clip(c)
                    dst, vs, _, _ = outputs[c]
                    small = frame.reformat(width=width, height=height, format="yuv420p", interpolation="BICUBIC")
                    small.pts = k
                    small.time_base = vs.codec_context.time_base
                    dst.mux(vs.encode(small))
                    remaining[c] -= 1
                    if remaining[c] == 0:
                        finish(c)
        if any(remaining):
            raise VideoDecodeError(f"video ended early: decoded fewer than {info.frame_count} frames")
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"cannot transcode video: {e}") from e
    finally:
        for c in list(outputs):
            outputs.pop(c)[0].close()
    return [ClipOut(buf.getvalue(), a, b, sel) for buf, (a, b), sel in zip(buffers, bounds, selections)]
