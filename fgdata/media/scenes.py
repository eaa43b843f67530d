"""Shots and motion of a video from ONE low-resolution decode: content scores, cuts, fades, dissolves.

:func:`analyse_video` reads the video's packets for every frame's time, then decodes the video once: of
codecs whose decoder exports motion vectors, the reference frames only (``skip_frame=NONREF``: the
non-reference B-frames, about 45 % of x264's default output, are not decoded; one decoder thread, loop
filter skipped, the codec's motion vectors exported) and keeps, per decoded
frame, a ~64 px wide YUV thumbnail (every ``width // 64``-th pixel of the decoded planes, as
video2dataset downscales for PySceneDetect; no scaler pass over the full frame) and, about 8 times a
second, the frame's motion vectors. Everything after is pure numpy over those arrays:

- **content score** (:func:`content_scores`): PySceneDetect's ``content_val``, the mean absolute change
  of hue, saturation and value between consecutive thumbnails (0-255 scale);
- **hard cuts** (:func:`detect_transitions`): PySceneDetect's ``AdaptiveDetector`` rule (ratio >=
  ``adaptive_threshold`` and score >= ``min_content``), but against the mean of the quieter side's
  ``window`` neighbours rather than both sides' (so a cut into or out of fast motion is found); a cut
  closer than ``min_scene_seconds`` to the previous one is dropped;
- **flash suppression**: a spike whose content returns within two frames (the frame after the flash
  is close to the frame before it) is not a cut;
- **fades**: a run of dark frames with the ramps down to it and up from it is one transition; its frames
  belong to neither neighbouring shot;
- **dissolves**: a sustained run of moderate change whose middle frame is the average of its ends (a
  cross-fade, unlike a pan or zoom, blends the two shots) is one transition with its span;
- **motion** (:func:`motion_scores`): NeMo Curator's two figures over the codec's motion vectors,
  or over frame differences at the analysis size for intra-only streams (no motion vectors).

For ``--cut-detector transnetv2`` the same decode (``network_frames``) decodes every frame and also scales
each to TransNetV2's 48x27 RGB input; :mod:`fgdata.media.transnet` finds the transitions from those.

Frame ``i`` is the ``i``-th frame in presentation order; :class:`Analysis` keeps each frame's time so
callers cut by seconds, and which frames were decoded (``sample``): the rules run over the decoded frames.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fgdata.media.errors import VideoDecodeError

#: Analysis thumbnails are this wide (video2dataset's downscale for PySceneDetect: width // 64).
ANALYSIS_WIDTH = 64
#: NeMo Curator's patch size for the per-patch motion minimum, in source pixels.
PATCH = 256
#: A frame with at most 5 % of its pixels' luma (Y, 16-235) above this is black, for fades.
DARK_LUMA = 36.0
#: Motion vectors are read from about this many frames per second.
MV_RATE = 8.0
#: Decoders that export motion vectors: only these skip non-reference frames, so that the frame-difference
#: motion of the others (intra-only, HEVC, VP9) stays a difference between consecutive frames.
MV_CODECS = frozenset({"h264", "mpeg1video", "mpeg2video", "mpeg4", "h263"})
#: TransNetV2's input frames (W, H), scaled as its reference pipeline does (ffmpeg ``-s 48x27``: bicubic, RGB).
NET_SIZE = (48, 27)


@dataclass(frozen=True)
class CutSettings:
    """The detector's settings (PySceneDetect's AdaptiveDetector defaults, its best published mean F1)."""

    adaptive_threshold: float = 3.5
    window: int = 3
    min_content: float = 15.0
    min_scene_seconds: float = 0.6

    def to_json(self) -> dict[str, Any]:
        return {"adaptive_threshold": self.adaptive_threshold, "window_width": self.window,
                "min_content_val": self.min_content, "min_scene_seconds": self.min_scene_seconds}


@dataclass
class Analysis:
    """What one decode says: per-frame times, thumbnails and motion, and the coded size."""

    times: np.ndarray  # float64 [N] seconds from the first frame
    thumbs: np.ndarray  # uint8 [M, h, w, 3] YUV of the decoded frames, every (width // ANALYSIS_WIDTH)-th pixel
    width: int  # coded size
    height: int
    fps: float
    codec: str
    sample: np.ndarray  # int64 [M] ascending: the frame each thumbnail shows (all N when none was skipped)
    # per frame: mean and per-256-px-patch mean of |motion vector| / (H + W); NaN where the frame has none
    mv_mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mv_patches: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    has_mvs: bool = False
    pts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # each frame's pts (stream time_base)
    time_base: float = 0.0
    rotation: int = 0  # display rotation, degrees counter-clockwise
    declared_frames: int = 0  # the container's frame count (0: not given); fewer frames means truncation
    # uint8 [N, 27, 48, 3] RGB of every frame, TransNetV2's input (``analyse_video(network_frames=True)``)
    net_frames: np.ndarray = field(default_factory=lambda: np.zeros((0, *NET_SIZE[::-1], 3), np.uint8))

    def frame_seconds(self) -> float:
        """One frame's duration (1 / fps)."""
        return 1.0 / (self.fps or 25.0)


@dataclass(frozen=True)
class Transition:
    """A change of shot between frames: ``first..last`` (inclusive) belong to neither shot; a hard cut has
    ``first == last + 1`` (no frame in between: the new shot starts at ``first``)."""

    kind: str  # "hard", "fade" or "dissolve"
    first: int
    last: int


def _open(src: bytes | str | os.PathLike):  # noqa: ANN202 - an av container
    import av

    try:
        return av.open(io.BytesIO(src) if isinstance(src, (bytes, bytearray)) else str(src))
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"cannot open video: {e}") from e


def _patch_grid(width: int, height: int) -> tuple[int, int]:
    return max(1, -(-height // PATCH)), max(1, -(-width // PATCH))


#: The fields of FFmpeg's motion vectors that the motion figures read.
MV_FIELDS = ("motion_x", "motion_y", "motion_scale", "dst_x", "dst_y")


def _motion_vectors(frame: Any) -> dict[str, np.ndarray] | None:
    """The frame's exported motion vectors (MV_FIELDS, copied), None when it has none.

    Read through a side-data container of our own: ``frame.side_data`` caches one on the frame, a reference
    cycle that keeps each decoded picture out of the decoder's buffer pool until the garbage collector runs
    (a fresh zeroed 720p picture per frame: a tenth of the analysis' instructions). The fields are copied
    for the same reason (the array's base holds the frame); copying the whole structured array would cost
    more than the decode of the frame."""
    from av.sidedata.sidedata import SideDataContainer

    sd = SideDataContainer(frame).get("MOTION_VECTORS")  # type: ignore[call-arg]  # the stub omits __init__
    if sd is None:
        return None
    arr = sd.to_ndarray()
    return {k: arr[k].copy() for k in MV_FIELDS} if len(arr) else None


def _mv_field(mvs: dict[str, np.ndarray], width: int, height: int) -> tuple[float, np.ndarray]:
    """NeMo's per-frame figures from one frame's motion vectors: mean magnitude over the frame (16x16 grid,
    blocks without a vector count as still) and the mean of each 256-px patch, normalised by (H + W)."""
    gh, gw = -(-height // 16), -(-width // 16)
    scale = np.maximum(mvs["motion_scale"].astype(np.float32), 1.0)
    mag = np.hypot(mvs["motion_x"], mvs["motion_y"]).astype(np.float32) / scale / (height + width)
    gx = np.clip(mvs["dst_x"].astype(np.intp) // 16, 0, gw - 1)
    gy = np.clip(mvs["dst_y"].astype(np.intp) // 16, 0, gh - 1)
    flat = np.zeros(gh * gw, np.float32)
    np.maximum.at(flat, gy * gw + gx, mag)  # a flat index: ufunc.at over a tuple of indices is ten times slower
    grid = flat.reshape(gh, gw)
    ph, pw = _patch_grid(width, height)
    sums = np.zeros((ph * 16, pw * 16), np.float32)
    sums[:gh, :gw] = grid
    counts = np.zeros_like(sums)
    counts[:gh, :gw] = 1.0
    patches = sums.reshape(ph, 16, pw, 16).sum((1, 3)) / counts.reshape(ph, 16, pw, 16).sum((1, 3))
    return float(grid.mean()), patches.ravel()


def _packet_times(container: Any, vs: Any) -> list[int] | None:
    """Every frame's pts from one pass over the video packets (no decode), sorted: presentation order; None
    when a packet has no pts or two share one (then no frame may be skipped: a skipped frame's place would
    be unknown)."""
    times: list[int] = []
    for packet in container.demux(vs):
        if packet.size == 0:
            continue
        if packet.pts is None:
            times = []
            break
        times.append(packet.pts)
    container.seek(0, stream=vs, backward=True, any_frame=False)
    return sorted(times) if times and len(set(times)) == len(times) else None


def analyse_video(src: bytes | str | os.PathLike, *, motion: bool = True, network_frames: bool = False) -> Analysis:
    """Decode ``src`` once: thumbnails for the cut detector and, with ``motion``, the codec's motion vectors;
    with ``network_frames``, every frame (none skipped: TransNetV2 reads each frame and its neighbours) also
    scaled to 48x27 RGB for :mod:`fgdata.media.transnet`, in the same pass.

    Where the decoder exports motion vectors (MV_CODECS), only the reference frames are decoded
    (``skip_frame=NONREF``: x264's default preset leaves about 45 % of the frames unreferenced, B-frames no
    other frame predicts from); the detector runs on those and maps
    what it finds back to source frames (:func:`detect_transitions`). The frames' times come from a pass
    over the packets before the decode, so the skipped frames keep theirs."""
    import av

    thumbs: list[np.ndarray] = []
    small: list[np.ndarray] = []
    shown: list[int] = []
    missing = False  # a decoded frame without pts (only where none is skipped): times from the frame rate
    rotation = 0
    with _open(src) as container:
        if not container.streams.video:
            raise VideoDecodeError("no video stream")
        vs = container.streams.video[0]
        try:
            every = _packet_times(container, vs)
        except av.error.FFmpegError as e:
            raise VideoDecodeError(f"cannot read video packets: {e}") from e
        # FFmpeg's frame threads export motion vectors racily (h264 exports a picture's vectors when it is
        # output, in a later frame's thread: a rerun gave other vectors for a few frames, so other motion
        # fields and other bytes); slice threads gain nothing on x264's one slice per frame and cost their
        # wake-ups: with motion, one decoder thread
        vs.thread_type = "SLICE" if motion else "AUTO"
        if motion:
            vs.thread_count = 1
        if motion:
            vs.codec_context.options = {"flags2": "+export_mvs", "skip_loop_filter": "all"}
        else:
            vs.codec_context.options = {"skip_loop_filter": "all"}
        cc = vs.codec_context
        if every and (not motion or cc.name in MV_CODECS) and not network_frames:
            cc.skip_frame = "NONREF"
        width, height = cc.width, cc.height
        rate = vs.average_rate or vs.guessed_rate
        step = max(1, width // ANALYSIS_WIDTH)  # video2dataset's downscale factor for PySceneDetect
        tw, th = -(-width // step), -(-height // step)
        mv_every = max(1, round((float(rate) if rate else 25.0) / MV_RATE))
        tb = float(vs.time_base) if vs.time_base else 0.0
        declared = vs.frames or 0
        vectors: list[tuple[int, dict[str, np.ndarray]]] = []  # (position in decode output, motion vectors)
        try:
            for frame in container.decode(vs):
                thumbs.append(_thumbnail(frame, step, tw, th))
                if network_frames:
                    small.append(frame.reformat(width=NET_SIZE[0], height=NET_SIZE[1], format="rgb24",
                                                interpolation="BICUBIC").to_ndarray())
                if not thumbs[1:]:
                    rotation = round(frame.rotation) % 360
                shown.append(frame.pts if frame.pts is not None else -1)
                missing = missing or frame.pts is None
                fields = _motion_vectors(frame) if motion else None
                if fields is not None:
                    vectors.append((len(thumbs) - 1, fields))
        except av.error.FFmpegError as e:
            raise VideoDecodeError(f"cannot decode video: {e}") from e
    if not thumbs:
        raise VideoDecodeError("no video frames")
    if every:  # the decoded frames' places among all frames
        raw_pts = np.array(every, np.int64)
        sample = np.searchsorted(raw_pts, np.array(shown, np.int64))
        if missing or not np.array_equal(raw_pts[np.minimum(sample, len(raw_pts) - 1)], shown):
            raise VideoDecodeError("the decoded frames' times are not those of the video's packets")
    else:
        raw_pts = np.array(shown, np.int64)
        sample = np.arange(len(shown))
    sample_of = sample  # by decode output position
    order = np.argsort(sample, kind="stable")
    sample = sample[order]
    n = len(raw_pts)
    ph, pw = _patch_grid(width, height)
    mv_mean = np.full(n, np.nan, np.float64)
    mv_patches = np.full((n, ph * pw), np.nan, np.float32)
    due = 0  # motion vectors of the first decoded frame at or after every mv_every-th frame
    for frame_index, arr in sorted(((int(sample_of[k]), arr) for k, arr in vectors), key=lambda v: v[0]):
        if frame_index >= due:
            mv_mean[frame_index], mv_patches[frame_index] = _mv_field(arr, width, height)
            due = frame_index + mv_every
    fps = float(rate) if rate else 0.0
    times = raw_pts * tb if tb and not missing else np.arange(n) / (fps or 25.0)
    times = times - times[0]
    if not fps and n > 1 and times[-1] > 0:
        fps = (n - 1) / times[-1]
    return Analysis(times=times.astype(np.float64), thumbs=np.stack(thumbs)[order], width=width, height=height,
                    fps=fps, codec=cc.name, sample=sample, mv_mean=mv_mean, mv_patches=mv_patches,
                    has_mvs=bool((~np.isnan(mv_mean)).any()), pts=raw_pts, time_base=tb, rotation=rotation,
                    declared_frames=declared, **({"net_frames": np.stack(small)[order]} if small else {}))


def _thumbnail(frame: Any, step: int, tw: int, th: int) -> np.ndarray:
    """Every ``step``-th pixel of each plane (the chroma planes of 4:2:0 at half the step) as an [h, w, 3]
    uint8 YUV thumbnail: no scaler pass over the full frame."""
    if frame.format.name not in ("yuv420p", "yuvj420p") or step % 2:
        small = frame.reformat(width=tw, height=th, format="yuv444p", interpolation="POINT")
        return np.stack([_plane(small, k) for k in range(3)], -1)
    y = _plane(frame, 0)[::step, ::step]
    out = np.empty((*y.shape, 3), np.uint8)  # filled plane by plane: np.stack's own overhead is as large
    out[..., 0] = y
    out[..., 1] = _plane(frame, 1)[:: step // 2, :: step // 2][: y.shape[0], : y.shape[1]]
    out[..., 2] = _plane(frame, 2)[:: step // 2, :: step // 2][: y.shape[0], : y.shape[1]]
    return out


def _plane(frame: Any, k: int) -> np.ndarray:
    p = frame.planes[k]
    return np.frombuffer(memoryview(p), np.uint8).reshape(p.height, p.line_size)[:, : p.width]


def _rgb(yuv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BT.601 limited-range YUV thumbnails [N, h, w, 3] -> float32 R, G, B planes [N, h*w] (0-255).
    Channel planes keep every numpy pass elementwise and contiguous."""
    n = len(yuv)
    planes = yuv.reshape(n, -1, 3).transpose(2, 0, 1).astype(np.float32)
    y = (planes[0] - 16.0) * 1.164
    u, v = planes[1] - 128.0, planes[2] - 128.0
    return (np.clip(y + 1.596 * v, 0, 255), np.clip(y - 0.392 * u - 0.813 * v, 0, 255), np.clip(y + 2.017 * u, 0, 255))


def _hsv(rgb: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """R, G, B planes (0-255) -> float32 HSV [3, N, P] on OpenCV's 8-bit scales (H 0-179, S and V 0-255), as
    PySceneDetect's detector sees frames."""
    r, g, b = rgb
    v = np.maximum(np.maximum(r, g), b)
    delta = v - np.minimum(np.minimum(r, g), b)
    s = 255.0 * delta / np.maximum(v, 1e-6)
    d = np.maximum(delta, 1e-6)
    h = np.where(v == r, 60.0 * (g - b) / d, np.where(v == g, 120.0 + 60.0 * (b - r) / d, 240.0 + 60.0 * (r - g) / d))
    h = np.where(delta > 0, np.mod(h, 360.0), 0.0) / 2.0
    return np.stack([h.astype(np.float32), s, v])


def _content(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mean |dH|, |dS|, |dV| between HSV stacks ``a`` and ``b`` ([3, N, P]; one value per frame pair)."""
    return np.abs(a - b).mean(axis=2).mean(axis=0)


def content_scores(hsv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per frame ``i`` of HSV thumbnails: content change against frame ``i-1``, ``i-2`` and ``i-3`` (0 where
    there is none)."""
    out = []
    n = hsv.shape[1]
    for k in (1, 2, 3):
        s = np.zeros(n, np.float64)
        if n > k:
            s[k:] = _content(hsv[:, k:], hsv[:, :-k])
        out.append(s)
    return out[0], out[1], out[2]


def _fades(luma: np.ndarray, dark: np.ndarray) -> list[Transition]:
    """Each run of ``dark`` (black) frames with the ramps of mean brightness (``luma``) into and out of it:
    one fade."""
    out: list[Transition] = []
    n = len(luma)
    for a, b in true_runs(dark):
        while a > 0 and luma[a - 1] > luma[a] + 1.0:  # the ramp down
            a -= 1
        while b + 1 < n and luma[b + 1] > luma[b] + 1.0:  # the ramp up
            b += 1
        # a ramp's last frame is the first of the next shot once it stops brightening
        out.append(Transition("fade", a, b))
    return out


def true_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The first and last index of each run of True in ``mask``, in order."""
    padded = np.concatenate(([False], np.asarray(mask, dtype=bool), [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2])]


def black_fades(thumbs: np.ndarray) -> list[Transition]:
    """The fades to black of consecutive YUV thumbnails: a frame is black when at most 5 % of its luma is
    above DARK_LUMA (:func:`_fades`)."""
    grey = thumbs[..., 0].astype(np.float32)
    return _fades(grey.mean(axis=(1, 2)), (grey > DARK_LUMA).mean(axis=(1, 2)) <= 0.05)


def _dissolves(hsv: np.ndarray, d1: np.ndarray, taken: np.ndarray, fps: float) -> list[Transition]:
    """Cross-fades: runs (at most 2 s) of frames changing more than twice the video's median change, whose
    ends differ as a cut does (>= 15) and whose middle frame is within a quarter of that of the average of
    the ends (a blend; a pan's or zoom's middle frame is not)."""
    out: list[Transition] = []
    n = hsv.shape[1]
    base = np.median(d1[1:]) if n > 1 else 0.0
    active = (d1 > max(2.0 * base, 1.5)) & ~taken
    i = 1
    longest = max(6, round(2.0 * (fps or 25.0)))
    while i < n:
        if not active[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and active[j + 1] and j + 1 - i < longest:
            j += 1
        a, b = i - 1, j  # the last frame of the old shot, the first frame of the new one
        if b - a >= 4:
            first, after = hsv[:, a], hsv[:, b]
            whole = float(np.abs(after - first).mean())
            blend = float(np.abs(hsv[:, (a + b) // 2] - (first + after) / 2).mean())
            if whole >= 15.0 and blend <= 0.25 * whole:
                out.append(Transition("dissolve", a + 1, b - 1))
        i = j + 1
    return out


def detect_transitions(analysis: Analysis, settings: CutSettings) -> list[Transition]:
    """Hard cuts, fades and dissolves in frame order (see the module docstring for the rules), found over
    the decoded frames as if they were consecutive, then placed among all frames: a hard cut on the middle
    of the frames skipped before the first decoded frame of the new shot (within one frame of the true cut
    where at most two frames in a row are skipped, as in x264's output), a fade or dissolve on the decoded
    frames it spans."""
    sample = analysis.sample
    found = _transitions(analysis.thumbs, analysis.fps * len(sample) / max(1, len(analysis.times)), settings)
    out = []
    for t in found:
        if t.kind == "hard":
            before, first = int(sample[t.first - 1]), int(sample[t.first])
            cut = before + 1 + (first - before - 1) // 2
            out.append(Transition("hard", cut, cut - 1))
        else:
            out.append(Transition(t.kind, int(sample[t.first]), int(sample[t.last])))
    return out


def _transitions(thumbs: np.ndarray, fps: float, settings: CutSettings) -> list[Transition]:
    """:func:`detect_transitions` over consecutive thumbnails at ``fps``."""
    n = len(thumbs)
    if n < 2:
        return []
    hsv = _hsv(_rgb(thumbs))
    d1, d2, d3 = content_scores(hsv)
    soft = black_fades(thumbs)
    taken = np.zeros(n, bool)
    for t in soft:
        taken[max(0, t.first) : min(n, t.last + 2)] = True
    soft += _dissolves(hsv, d1, taken, fps)
    for t in soft:
        taken[max(0, t.first) : min(n, t.last + 2)] = True
    w = settings.window
    min_gap = max(1, round(settings.min_scene_seconds * (fps or 25.0)))
    hard: list[Transition] = []
    last_cut = 0
    for i in range(1, n):
        if taken[i] or d1[i] < settings.min_content:
            continue
        # PySceneDetect averages both sides; the quieter side is used here, so a cut into (or out of) fast
        # motion still stands out, while motion on both sides (a pan, a zoom) does not
        before, after = d1[max(1, i - w) : i], d1[i + 1 : i + 1 + w]
        sides = [float(x.mean()) for x in (before, after) if len(x)]
        avg = min(sides) if sides else 0.0
        if d1[i] < settings.adaptive_threshold * max(avg, 1e-3):
            continue
        # a flash: the content one or two frames on is back to what it was before the spike (or this frame
        # is that return)
        back = 0.5 * settings.min_content
        if (i + 1 < n and d2[i + 1] < back) or (i + 2 < n and d3[i + 2] < back) or d2[i] < back or d3[i] < back:
            continue
        if i - last_cut < min_gap and (hard or last_cut):
            continue
        hard.append(Transition("hard", i, i - 1))
        last_cut = i
    return sorted(hard + soft, key=lambda t: t.first)


@dataclass(frozen=True)
class Scene:
    """Frames ``first..last`` (inclusive) of one shot and what bounds it on each side."""

    first: int
    last: int
    before: str  # "start", "hard", "fade", "dissolve"
    after: str  # "end", "hard", "fade", "dissolve"


def scenes_from(transitions: list[Transition], n: int) -> list[Scene]:
    """The shots between transitions (a transition's frames belong to no shot)."""
    scenes: list[Scene] = []
    first, before = 0, "start"
    for t in transitions:
        if t.first - 1 >= first:
            scenes.append(Scene(first, t.first - 1, before, t.kind))
        first, before = t.last + 1, t.kind
    if first <= n - 1:
        scenes.append(Scene(first, n - 1, before, "end"))
    return scenes


def motion_scores(analysis: Analysis, first: int, last: int) -> tuple[float, float, str]:
    """``(motion_mean, motion_min_patch, method)`` over frames ``first..last``: NeMo's ``global_mean`` and
    ``per_patch_min_256`` from the codec's motion vectors (the frames of the clip read at MV_RATE per second,
    magnitudes / (H + W)); streams without motion vectors (intra-only) use the mean absolute luma
    difference between consecutive analysis frames (0-1), method ``frame-diff``."""
    idx = np.arange(first, last + 1)
    if len(idx) == 0:
        return 0.0, 0.0, "none"
    if analysis.has_mvs:
        means = analysis.mv_mean[idx]
        patches = analysis.mv_patches[idx]
        ok = ~np.isnan(means)
        if ok.any():
            return float(means[ok].mean()), float(np.nanmin(np.nanmean(patches[ok], axis=0))), "motion-vectors"
    idx = np.flatnonzero((analysis.sample >= first) & (analysis.sample <= last))  # the clip's decoded frames
    if len(idx) < 2:
        return 0.0, 0.0, "frame-diff"
    y = analysis.thumbs[idx][..., 0].astype(np.float32) / 255.0
    diff = np.abs(y[1:] - y[:-1])  # one fewer than the frames, h, w
    # patches of 256 source px on the thumbnail grid
    ph, pw = _patch_grid(analysis.width, analysis.height)
    rows = np.array_split(np.arange(diff.shape[1]), ph)
    cols = np.array_split(np.arange(diff.shape[2]), pw)
    per = [float(diff[:, r][:, :, c].mean()) for r in rows for c in cols if len(r) and len(c)]
    return float(diff.mean()), float(min(per)), "frame-diff"
