"""Video probe and clip decode, in two modes that share frame choice, geometry and float conversion.

``resize="fast"`` (the default) gets its speed from three things the reference does not do:
seek to the keyframe before the clip instead of decoding from the start; let libswscale
resize while converting YUV to planar RGB (``gbrp``, several times cheaper than packed
``rgb24`` at these sizes) instead of converting full-resolution frames and resizing tensors;
and convert each frame once, straight into its place in the clip (or batch) tensor.

``resize="reference"`` is the reference's transform: full-size ``rgb24`` frames, torch's
antialiased BICUBIC resize in float32, clamped and rounded back to uint8, the centre crop,
``x/127.5 - 1``. Its tensors are bit-identical to the reference loader's for the same frames.

Frame choice is pure arithmetic on the demuxed presentation timestamps, so the chosen source
indices (for camera slicing) are known before anything is decoded.
"""

from __future__ import annotations

import bisect
import io
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from fgdata.media.audio import decode_audio
from fgdata.media.errors import ClipTooShort, VideoDecodeError
from fgdata.media.geometry import ImageGeometry, video_transform_geometry
from fgdata.media.pixels import check_resize, video_frame_to_float

if TYPE_CHECKING:
    import av
    from PIL import Image

__all__ = [
    "Clip",
    "ClipTooShort",
    "VideoInfo",
    "decode_clip",
    "frames_shown_at",
    "probe_video",
    "select_frames",
]

# Timestamps are compared with this slack so a frame at 0.04 s counts as "at" t = 1/25.
_EPS = 1e-6
# Frames per torch resize call in reference mode: bounds memory (a whole 81-frame 720p clip
# in float32 is 900 MB) without changing a value (each frame is resized on its own).
REFERENCE_CHUNK = 8


@dataclass(frozen=True)
class VideoInfo:
    """What a demux pass (plus one decoded frame for rotation) says about a video."""

    duration: float  # seconds
    fps: float  # average_rate, falling back to guessed_rate
    frame_count: int
    width: int  # coded size, before rotation
    height: int
    codec: str
    keyframe_times: tuple[float, ...]  # seconds from the stream start
    rotation: int  # display rotation, degrees counter-clockwise (0, 90, 180, 270)
    audio_codec: str | None
    audio_sample_rate: int | None
    audio_channels: int | None
    # Presentation timestamps of every frame, in stream time_base units, sorted; frame index i
    # is the i-th frame shown. Kept out of to_dict() (it is per-frame, not a summary).
    frame_pts: tuple[int, ...] = field(repr=False)
    start_pts: int = field(repr=False)
    time_base: float = field(repr=False)

    def frame_time(self, i: int) -> float:
        """Seconds from the stream start at which frame ``i`` is shown."""
        return (self.frame_pts[i] - self.start_pts) * self.time_base

    def to_dict(self) -> dict:
        """JSON-ready summary for inspect and provenance."""
        d = asdict(self)
        for k in ("frame_pts", "start_pts", "time_base"):
            d.pop(k)
        d["keyframe_times"] = list(d["keyframe_times"])
        return d


@dataclass
class Clip:
    """A decoded training clip and everything needed to align side data with it."""

    video: np.ndarray  # float32 [C, T, H, W] in [-1, 1]
    cropping_params: dict[str, int]  # the offsets actually applied
    frame_indices: list[int]  # source frame index behind each output frame (the reference slicing)
    start_time: float
    fps: float  # target_fps if set, else the native rate
    audio: np.ndarray | None = None  # float32 [2, N] or None when there is no audio stream
    sample_rate: int | None = None


def _open(data_or_path: bytes | str | os.PathLike):
    import av

    src = io.BytesIO(data_or_path) if isinstance(data_or_path, (bytes, bytearray)) else str(data_or_path)
    try:
        return av.open(src)
    except av.error.FFmpegError as e:  # the current PyAV exception root
        raise VideoDecodeError(f"cannot open video: {e}") from e


def probe_video(data_or_path: bytes | str | Path) -> VideoInfo:
    """Demux every packet (no decode) for timestamps and keyframes; decode one frame for rotation."""
    import av

    with _open(data_or_path) as container:
        if not container.streams.video:
            raise VideoDecodeError("no video stream")
        vs = container.streams.video[0]
        rate = vs.average_rate or vs.guessed_rate or vs.base_rate
        fps = float(rate) if rate else 0.0
        tb = float(vs.time_base)
        pts: list[int] = []
        keys: list[int] = []
        try:
            for packet in container.demux(vs):
                if packet.size == 0 or packet.is_discard:
                    continue
                p = packet.pts if packet.pts is not None else packet.dts
                if p is None:
                    continue
                pts.append(p)
                if packet.is_keyframe:
                    keys.append(p)
            container.seek(0, stream=vs)
            first = next(container.decode(vs), None)
        except av.error.FFmpegError as e:
            raise VideoDecodeError(f"cannot demux video: {e}") from e
        pts.sort()
        start = pts[0] if pts else (vs.start_time or 0)
        if not fps and len(pts) > 1:
            fps = (len(pts) - 1) / ((pts[-1] - pts[0]) * tb)
        if vs.duration:
            duration = vs.duration * tb
        elif container.duration:
            duration = container.duration / av.time_base
        else:
            duration = len(pts) / fps if fps else 0.0
        rotation = round(first.rotation) % 360 if first is not None else 0
        audio = container.streams.audio[0] if container.streams.audio else None
        return VideoInfo(
            duration=float(duration),
            fps=fps,
            frame_count=len(pts),
            width=vs.codec_context.width,
            height=vs.codec_context.height,
            codec=vs.codec_context.name,
            keyframe_times=tuple((k - start) * tb for k in sorted(keys)),
            rotation=rotation,
            audio_codec=audio.codec_context.name if audio else None,
            audio_sample_rate=audio.sample_rate if audio else None,
            audio_channels=audio.channels if audio else None,
            frame_pts=tuple(pts),
            start_pts=start,
            time_base=tb,
        )


def select_frames(
    info: VideoInfo, sequence_length: int, start_time: float, target_fps: float | None
) -> list[int]:
    """Source frame index for each output frame; raises ClipTooShort.

    Native rate: the first ``sequence_length`` frames shown at or after ``start_time``.
    ``target_fps``: output frame k is the last frame shown at or before
    ``start_time + k/target_fps``, which duplicates or drops frames.
    """
    n = sequence_length
    times = [info.frame_time(i) for i in range(info.frame_count)]
    if target_fps is None:
        if info.frame_count < n:
            raise ClipTooShort(f"video has {info.frame_count} frames, need {n}")
        i0 = min(bisect.bisect_left(times, start_time - _EPS), info.frame_count - n)
        return list(range(i0, i0 + n))
    last_t = start_time + (n - 1) / target_fps
    if info.frame_count == 0 or last_t >= info.duration - _EPS:
        available = math.ceil(info.duration * target_fps - _EPS)
        raise ClipTooShort(f"video gives {available} frames at {target_fps} fps, need {n}")
    return [
        max(0, bisect.bisect_right(times, start_time + k / target_fps + _EPS) - 1)
        for k in range(n)
    ]


def frames_shown_at(data: bytes, times: Sequence[float], info: VideoInfo | None = None) -> list[Image.Image]:
    """The frame shown at each of ``times`` (seconds from the start: the last frame shown at or before it), as
    8-bit RGB images the way a player shows them (rotation applied), from one decoding pass over the video."""
    from PIL import Image

    info = info or probe_video(data)
    if not info.frame_count:
        raise VideoDecodeError("video has no frames")
    shown = [info.frame_time(i) for i in range(info.frame_count)]
    indices = [max(0, bisect.bisect_right(shown, t + _EPS) - 1) for t in times]
    turn = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_270}
    images: dict[int, Image.Image] = {}
    for i, frame in _decoded_frames(data, info, set(indices), seek=False):
        im = frame.to_image()
        images[i] = im.transpose(turn[info.rotation]) if info.rotation in turn else im
    missing = sorted(set(indices) - set(images))
    if missing:
        raise VideoDecodeError(f"could not decode frames {missing[:5]} of {info.frame_count}")
    return [images[i] for i in indices]


def _display_geometry(info: VideoInfo, img_size: tuple[int, int]) -> ImageGeometry:
    """The reference geometry in displayed (rotation-applied) pixels."""
    w, h = (info.height, info.width) if info.rotation in (90, 270) else (info.width, info.height)
    return video_transform_geometry(w, h, img_size[0], img_size[1])


def _decoded_frames(
    data: bytes, info: VideoInfo, wanted: set[int], seek: bool
) -> Iterator[tuple[int, av.VideoFrame]]:
    """(source index, frame) for each wanted frame, in presentation order; seek first when allowed."""
    import av

    by_pts = {info.frame_pts[i]: i for i in wanted}
    first_pts = info.frame_pts[min(wanted)]
    last_pts = info.frame_pts[max(wanted)]
    with _open(data) as container:
        vs = container.streams.video[0]
        try:
            if seek and first_pts > info.frame_pts[0]:
                container.seek(first_pts, stream=vs, backward=True, any_frame=False)
            for frame in container.decode(vs):
                if frame.pts is None:
                    continue
                if frame.pts > last_pts:
                    break
                i = by_pts.get(frame.pts)
                if i is not None:
                    yield i, frame
        except av.error.FFmpegError as e:
            raise VideoDecodeError(f"cannot decode video: {e}") from e


def _plane(frame: av.VideoFrame, k: int) -> np.ndarray:
    """Plane ``k`` of a planar 8-bit frame as an (h, w) uint8 view (row padding cut off)."""
    p = frame.planes[k]
    return np.frombuffer(memoryview(p), np.uint8).reshape(p.height, p.line_size)[:, : p.width]


def _crop(a: np.ndarray, g: ImageGeometry) -> np.ndarray:
    return a[g.crop_y0 : g.crop_y0 + g.crop_h, g.crop_x0 : g.crop_x0 + g.crop_w]


def _place(out: np.ndarray, targets: list[int], planes: list[np.ndarray]) -> None:
    """Convert one frame into ``out[:, t]`` for its first output position; copy to repeats."""
    first = out[:, targets[0]]
    video_frame_to_float(planes, first)
    for t in targets[1:]:
        out[:, t] = first


def _fill_fast(
    frames: Iterator[tuple[int, av.VideoFrame]],
    geom: ImageGeometry,
    rot_k: int,
    targets: dict[int, list[int]],
    out: np.ndarray,
) -> set[int]:
    """libswscale resizes and converts to planar RGB in one call; each plane is cropped and
    converted straight into ``out``. Returns the source indices written."""
    from av.video.reformatter import VideoReformatter

    # libswscale works on coded pixels, so a 90/270 rotation swaps the resize target.
    rw, rh = (geom.resize_h, geom.resize_w) if rot_k % 2 else (geom.resize_w, geom.resize_h)
    # One reformatter for the whole clip keeps its SwsContext: building one per frame costs
    # more than the scaling itself.
    reformatter = VideoReformatter()
    done: set[int] = set()
    for i, frame in frames:
        rgb = reformatter.reformat(frame, width=rw, height=rh, format="gbrp", interpolation="BICUBIC")
        g, b, r = (_plane(rgb, k) for k in range(3))  # gbrp stores G, B, R
        planes = [r, g, b]
        if rot_k:
            planes = [np.rot90(p, k=rot_k) for p in planes]
        _place(out, targets[i], [_crop(p, geom) for p in planes])
        done.add(i)
    return done


def _fill_reference(
    frames: Iterator[tuple[int, av.VideoFrame]],
    geom: ImageGeometry,
    rot_k: int,
    targets: dict[int, list[int]],
    out: np.ndarray,
) -> set[int]:
    """Full-size rgb24 frames, resized as the reference does: a [T, H, W, C] uint8 tensor viewed
    as [T, C, H, W], cast to float32, antialiased bicubic, clamped to [0, 255], rounded, uint8;
    then the crop and ``x/127.5 - 1``. Returns the source indices written."""
    import torch
    import torch.nn.functional as F

    done: set[int] = set()
    chunk: list[tuple[int, np.ndarray]] = []

    def flush() -> None:
        x = torch.from_numpy(np.stack([f for _, f in chunk])).permute(0, 3, 1, 2).to(torch.float32)
        if tuple(x.shape[-2:]) != (geom.resize_h, geom.resize_w):  # an equal size is left as is
            x = F.interpolate(
                x, size=(geom.resize_h, geom.resize_w), mode="bicubic", align_corners=False, antialias=True
            )
        pixels = x.clamp_(0, 255).round_().to(torch.uint8).numpy()
        for k, (i, _) in enumerate(chunk):
            _place(out, targets[i], [_crop(p, geom) for p in pixels[k]])
            done.add(i)
        chunk.clear()

    for i, frame in frames:
        rgb = frame.to_ndarray(format="rgb24")
        chunk.append((i, np.rot90(rgb, k=rot_k) if rot_k else rgb))
        if len(chunk) == REFERENCE_CHUNK:
            flush()
    if chunk:
        flush()
    return done


def _decode_into(
    data: bytes, info: VideoInfo, indices: list[int], geom: ImageGeometry, resize: str, out: np.ndarray, seek: bool
) -> set[int]:
    targets: dict[int, list[int]] = {}
    for t, i in enumerate(indices):
        targets.setdefault(i, []).append(t)
    fill = _fill_reference if resize == "reference" else _fill_fast
    return fill(_decoded_frames(data, info, set(targets), seek), geom, info.rotation // 90, targets, out)


def _choose_start(
    info: VideoInfo,
    sequence_length: int,
    fps: float,
    decoder_type: str,
    rng: np.random.Generator | None,
    start_time: float | None,
) -> float:
    """Uniform start in [0, duration - (n+1)/fps] for segments, else 0."""
    if decoder_type == "full":
        return 0.0
    if start_time is not None:
        return float(start_time)
    span = info.duration - (sequence_length + 1) / fps
    if span <= 0:
        return 0.0
    return float((rng or np.random.default_rng()).uniform(0.0, span))


@dataclass(frozen=True)
class ClipSpec:
    """What clip to make: ``sequence_length`` frames at ``img_size`` = (W, H), checked once when built.

    ``decoder_type``: ``segment`` seeks to the keyframe before the start; ``full`` decodes from the
    beginning and takes the first frames (after fps resampling). ``target_fps`` resamples the frame
    rate; ``with_audio`` adds the audio of the same span, at ``target_sample_rate`` when given;
    ``resize`` picks the mode (module docstring).
    """

    sequence_length: int
    img_size: tuple[int, int]
    decoder_type: Literal["segment", "full"] = "segment"
    target_fps: float | None = None
    with_audio: bool = False
    target_sample_rate: int | None = None
    resize: str = "fast"

    def __post_init__(self) -> None:
        if self.decoder_type not in ("segment", "full"):
            raise ValueError(f"decoder_type must be 'segment' or 'full', not {self.decoder_type!r}")
        check_resize(self.resize)


def decode_clip(
    data: bytes,
    spec: ClipSpec,
    *,
    rng: np.random.Generator | None = None,
    start_time: float | None = None,
    info: VideoInfo | None = None,
    out: np.ndarray | None = None,
) -> Clip:
    """Decode one training clip as ``spec`` says, starting at ``start_time`` (random from ``rng`` when None).

    Both decoder types limit work by frame count, never by wall-clock. Pass ``info`` to reuse a
    probe. Audio starts at the same time and lasts ``sequence_length / fps`` s. ``out`` (float32
    ``[3, T, H, W]``, e.g. a slot of a preallocated batch) receives the pixels, so each frame is
    converted once, in place; ``Clip.video`` is then ``out``.
    """
    sequence_length, target_fps, resize = spec.sequence_length, spec.target_fps, spec.resize
    info = info or probe_video(data)
    if not info.fps:
        raise VideoDecodeError("video has no frame rate")
    fps = float(target_fps) if target_fps else info.fps
    t0 = _choose_start(info, sequence_length, fps, spec.decoder_type, rng, start_time)
    indices = select_frames(info, sequence_length, t0, target_fps)
    if target_fps is None:
        t0 = info.frame_time(indices[0])  # the clip starts at its first frame, audio with it
    geom = _display_geometry(info, spec.img_size)
    shape = (3, sequence_length, geom.crop_h, geom.crop_w)
    if out is None:
        out = np.empty(shape, np.float32)
    elif out.shape != shape or out.dtype != np.float32:
        raise ValueError(f"out is {out.dtype} {tuple(out.shape)}, need float32 {shape}")
    done = _decode_into(data, info, indices, geom, resize, out, seek=spec.decoder_type == "segment")
    if len(done) < len(set(indices)) and spec.decoder_type == "segment":
        done = _decode_into(data, info, indices, geom, resize, out, seek=False)  # inexact seek: retry
    missing = sorted(set(indices) - done)
    if missing:
        raise VideoDecodeError(f"could not decode frames {missing[:5]} of {info.frame_count}")
    clip = Clip(
        video=out,
        cropping_params=geom.as_dict(),
        frame_indices=indices,
        start_time=t0,
        fps=fps,
    )
    if spec.with_audio:
        decoded = decode_audio(data, t0, sequence_length / fps, spec.target_sample_rate)
        if decoded is not None:
            clip.audio, clip.sample_rate = decoded
    return clip
