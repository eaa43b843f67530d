"""``shard videos --split scenes``: one analysis decode per video, then single-shot clips with their fields.

The analysis (:mod:`fgdata.media.scenes`) finds the shots and the motion; the clips are then written
without decoding the video again for analysis:

- ``copy`` (default): one demux pass; a clip starts at the first keyframe at or after its start and runs,
  in decode order, until the first packet shown at or after its end (so every frame kept can be decoded:
  a B-frame whose reference lies past the end is not kept); the span actually written is recorded;
- ``exact``: the clip's span only is decoded (seek to the keyframe before it) and encoded with the settings
  of ``shard videos --exact`` (libx264, one thread; AAC stereo).

Audio is cut to the span written. Clips shorter than ``min_clip_seconds`` or outside the motion limits are
dropped and accounted (``Outcome.warnings`` with the category ``filtered``; a video that keeps no clip
fails as ``filtered``).
"""

from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

from fgdata.catalog import RUNTIME
from fgdata.errors import OptionError

SPLITS = ("fixed", "scenes")
CLIP_MODES = ("copy", "exact")
DETECTORS = ("adaptive", "transnetv2")
#: ``--cut-threshold``'s default per detector: the adaptive ratio, TransNetV2's transition probability.
DEFAULT_THRESHOLDS = {"adaptive": 3.5, "transnetv2": 0.5}
#: The clip fields written flat at the top level of the sample's json (docs/FORMATS.md).
CLIP_FIELDS = ("source", "clip_index", "clip_start_s", "clip_end_s", "clip_frames", "fps", "width", "height",
               "keyframe_aligned", "cut_before", "cut_after", "motion_mean", "motion_min_patch", "scenes_meta")
_EPS = 1e-6


@dataclass(frozen=True)
class SceneOptions:
    """``--split scenes`` settings; part of the job record."""

    cut_detector: str = "adaptive"
    # adaptive: a frame's change / its quieter neighbours' mean; transnetv2: a probability; None: the default
    cut_threshold: float | None = None
    min_scene_seconds: float = 0.6
    min_clip_seconds: float = 0.0
    max_clip_seconds: float | None = None
    trim_seconds: float = 0.0
    clip_mode: str = "copy"
    min_motion: float | None = None
    max_motion: float | None = None
    device: str = field(default="cpu", metadata=RUNTIME)  # where TransNetV2 runs

    def __post_init__(self) -> None:
        if self.cut_detector not in DETECTORS:
            raise OptionError(f"--cut-detector must be one of {', '.join(DETECTORS)}, not {self.cut_detector!r}")
        if self.clip_mode not in CLIP_MODES:
            raise OptionError(f"--clip-mode must be one of {', '.join(CLIP_MODES)}, not {self.clip_mode!r}")
        if self.cut_threshold is None:
            object.__setattr__(self, "cut_threshold", DEFAULT_THRESHOLDS[self.cut_detector])
        if self.cut_detector == "transnetv2":
            self._check_transnet()
        elif self.threshold <= 1:
            raise OptionError("--cut-threshold must be > 1 (a frame's change over its neighbours' mean)")
        elif self.device != "cpu":
            raise OptionError("--device is for --cut-detector transnetv2 (the adaptive detector runs on the CPU)")
        for name, value in (("--min-scene-seconds", self.min_scene_seconds), ("--min-clip-seconds", self.min_clip_seconds),
                            ("--trim-seconds", self.trim_seconds)):
            if value < 0:
                raise OptionError(f"{name} must be >= 0")
        if self.max_clip_seconds is not None and self.max_clip_seconds <= 0:
            raise OptionError("--max-clip-seconds must be > 0")
        if self.max_clip_seconds is not None and self.max_clip_seconds < self.min_clip_seconds:
            raise OptionError("--max-clip-seconds must be at least --min-clip-seconds")
        if self.min_motion is not None and self.max_motion is not None and self.min_motion > self.max_motion:
            raise OptionError("--min-motion must be at most --max-motion")

    def _check_transnet(self) -> None:
        """Before anything is read: the extra is installed, the threshold is a probability, the device a name."""
        from fgdata.compute import check_device, resolve_device
        from fgdata.media import transnet

        if not transnet.available():
            raise OptionError(transnet.EXTRA_MESSAGE)
        if not 0 < self.threshold < 1:
            raise OptionError("--cut-threshold for --cut-detector transnetv2 is a probability, between 0 and 1")
        if check_device(self.device) != "cpu":
            resolve_device(self.device)  # CUDA asked for and absent: one line now, not a failure per video

    @property
    def threshold(self) -> float:
        """``cut_threshold`` once resolved (never None after ``__post_init__``)."""
        assert self.cut_threshold is not None
        return self.cut_threshold

    def settings(self) -> Any:  # a CutSettings
        from fgdata.media.scenes import CutSettings

        return CutSettings(adaptive_threshold=self.threshold, min_scene_seconds=self.min_scene_seconds)

    def detector_json(self) -> dict[str, Any]:
        """The detector's settings as ``scenes_meta`` records them (TransNetV2: its package and weights too)."""
        if self.cut_detector == "adaptive":
            return dict(self.settings().to_json())
        from fgdata.media import transnet

        return {"threshold": self.threshold, "soft_frames": transnet.SOFT_FRAMES,
                "min_scene_seconds": self.min_scene_seconds, "window": transnet.WINDOW, "context": transnet.CONTEXT,
                "package": f"{transnet.PACKAGE}=={transnet.package_version()}",
                "weights_sha256": transnet.weights_sha256()}

    def transitions(self, analysis: Any) -> list[Any]:
        """The analysed video's transitions, by the chosen detector."""
        from fgdata.media.scenes import detect_transitions

        if self.cut_detector == "adaptive":
            return detect_transitions(analysis, self.settings())
        from fgdata.compute import resolve_device
        from fgdata.media import transnet

        return transnet.detect_transitions(analysis, self.threshold, self.min_scene_seconds,
                                           resolve_device(self.device))


@dataclass(frozen=True)
class PlannedClip:
    """A clip to write: source frames ``first..last`` (presentation order) and its bounds' kinds."""

    first: int
    last: int
    before: str
    after: str
    motion_mean: float
    motion_min_patch: float


def plan_clips(analysis: Any, options: SceneOptions) -> tuple[list[PlannedClip], list[str], str]:
    """The clips of an analysed video, the reasons of those dropped (``"too-short ..."`` etc.) and the
    motion method."""
    from fgdata.media.scenes import motion_scores, scenes_from

    times = analysis.times
    frame = analysis.frame_seconds()
    n = len(times)
    kept: list[PlannedClip] = []
    dropped: list[str] = []
    method = "motion-vectors" if analysis.has_mvs else "frame-diff"
    for scene in scenes_from(options.transitions(analysis), n):
        first, last = scene.first, scene.last
        if options.trim_seconds:
            while first <= last and times[first] < times[scene.first] + options.trim_seconds - _EPS:
                first += 1
            while last >= first and times[last] > times[scene.last] - options.trim_seconds + _EPS:
                last -= 1
        length = times[last] - times[first] + frame if last >= first else 0.0
        if last < first or length < options.min_clip_seconds - _EPS:
            dropped.append(f"too-short: {max(length, 0.0):.2f} s at {times[scene.first]:.2f} s "
                           f"(--min-clip-seconds {options.min_clip_seconds:g})")
            continue
        spans = _pieces(first, last, length, frame, options)
        if spans[-1][1] < last:  # the rest after pieces of the maximum length
            rest = times[last] - times[spans[-1][1] + 1] + frame
            dropped.append(f"too-short: {rest:.2f} s at {times[spans[-1][1] + 1]:.2f} s (the rest of a shot cut into "
                           f"--max-clip-seconds pieces)")
        for k, (a, b) in enumerate(spans):
            piece = times[b] - times[a] + frame
            if piece < options.min_clip_seconds - _EPS:
                dropped.append(f"too-short: {piece:.2f} s at {times[a]:.2f} s "
                               f"(--min-clip-seconds {options.min_clip_seconds:g})")
                continue
            mean, low, method = motion_scores(analysis, a, b)
            why = _motion_filtered(mean, options)
            if why:
                dropped.append(f"{why} at {times[a]:.2f} s")
                continue
            kept.append(PlannedClip(a, b, scene.before if k == 0 else "split",
                                    scene.after if b == last else "split", mean, low))
    return kept, dropped, method


def _pieces(first: int, last: int, length: float, frame: float, options: SceneOptions) -> list[tuple[int, int]]:
    """A shot's frames cut into equal pieces no longer than ``max_clip_seconds``; when equal pieces would be
    shorter than ``min_clip_seconds``, as many pieces of the maximum length as fit, from the start."""
    count = last - first + 1
    top = options.max_clip_seconds
    if top is None or length <= top + _EPS:
        return [(first, last)]
    pieces = min(count, math.ceil(length / top - _EPS))
    if length / pieces < options.min_clip_seconds - _EPS:
        size = max(1, math.floor(top / frame + _EPS))
        return [(first + k * size, first + (k + 1) * size - 1) for k in range(count // size)]
    return [(first + k * count // pieces, first + (k + 1) * count // pieces - 1) for k in range(pieces)]


def _motion_filtered(mean: float, options: SceneOptions) -> str | None:
    if options.min_motion is not None and mean < options.min_motion:
        return f"motion-below-min: motion_mean {mean:.6f} < --min-motion {options.min_motion:g}"
    if options.max_motion is not None and mean > options.max_motion:
        return f"motion-above-max: motion_mean {mean:.6f} > --max-motion {options.max_motion:g}"
    return None


@dataclass
class WrittenClip:
    data: bytes
    first: int  # source frames actually written (presentation order)
    last: int
    keyframe_aligned: bool


def _packet_time(packet: Any) -> int:
    """A packet's pts, else its dts (packets with neither are skipped when demuxed)."""
    t = packet.pts if packet.pts is not None else packet.dts
    return int(t) if t is not None else 0


def copy_clips(data: bytes, analysis: Any, clips: list[PlannedClip], container_format: str) -> list[WrittenClip | None]:
    """Stream-copy each clip from the first keyframe at or after its first frame (one demux pass, no decode);
    None for a clip with no keyframe inside it."""
    import av

    from fgdata.media.errors import VideoDecodeError
    from fgdata.producers.transcode import mux_packets

    pts = analysis.pts
    index = {int(p): i for i, p in enumerate(pts)}
    try:
        with av.open(io.BytesIO(data), "r") as src:
            vs = src.streams.video[0]
            aud = src.streams.audio[0] if src.streams.audio else None
            video: list[Any] = []
            audio: list[Any] = []
            for packet in src.demux(*([vs] + ([aud] if aud is not None else []))):
                if packet.size == 0 or (packet.pts is None and packet.dts is None):
                    continue
                (video if packet.stream is vs else audio).append(packet)
            origin = float(pts[0] * analysis.time_base)
            # each audio packet's time, once (exact Fractions: per clip, they cost more than the muxing)
            heard = ([float(_packet_time(p) * aud.time_base) - origin for p in audio]
                     if aud is not None and aud.time_base is not None else [])
            out: list[WrittenClip | None] = []
            for clip in clips:
                start = next((i for i, p in enumerate(video) if p.is_keyframe and p.pts is not None
                              and clip.first <= index.get(p.pts, -1) <= clip.last), None)
                if start is None:
                    out.append(None)
                    continue
                end_pts = int(pts[clip.last])
                first_pts = video[start].pts
                chosen = []
                for p in video[start:]:
                    t = _packet_time(p)
                    if t > end_pts:
                        break
                    if t >= first_pts:
                        chosen.append(p)
                shown = sorted(index[p.pts] for p in chosen if p.pts in index)
                a, b = shown[0], shown[-1]
                t0 = float(analysis.times[a])
                t1 = float(analysis.times[b]) + analysis.frame_seconds()
                sounds = [p for p, ta in zip(audio, heard) if t0 - _EPS <= ta < t1 - _EPS]
                tracks = [(vs, chosen, min(_packet_time(p) for p in chosen)),
                          (aud, sounds, min(_packet_time(p) for p in sounds) if sounds else 0)]
                out.append(WrittenClip(mux_packets(tracks, container_format), a, b, True))
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"cannot copy video clips: {e}") from e
    return out


def exact_clips(data: bytes, analysis: Any, clips: list[PlannedClip]) -> list[WrittenClip | None]:
    """Decode only each clip's span (seek to the keyframe before it) and encode it frame-exact with
    ``shard videos --exact``'s settings (libx264 one thread, AAC stereo)."""
    import av

    from fgdata.media.audio import decode_audio
    from fgdata.media.errors import VideoDecodeError
    from fgdata.producers.transcode import AUDIO_RATE, add_clip_streams, finish_clip

    rate = Fraction(analysis.fps or 25.0).limit_denominator(1001)
    width, height = analysis.width - analysis.width % 2, analysis.height - analysis.height % 2
    out: list[WrittenClip | None] = []
    try:
        with av.open(io.BytesIO(data), "r") as src:
            vsrc = src.streams.video[0]
            vsrc.thread_count = 1
            has_audio = bool(src.streams.audio)
            for clip in clips:
                first_pts, last_pts = int(analysis.pts[clip.first]), int(analysis.pts[clip.last])
                t0 = float(analysis.times[clip.first])
                seconds = float(analysis.times[clip.last]) - t0 + analysis.frame_seconds()
                sound = decode_audio(data, t0, seconds, AUDIO_RATE) if has_audio else None
                src.seek(first_pts, stream=vsrc, backward=True, any_frame=False)
                buf = io.BytesIO()
                with av.open(buf, "w", format="mp4") as dst:
                    vs, aus = add_clip_streams(dst, rate, width, height, sound is not None)
                    if analysis.rotation:
                        vs.set_display_rotation(analysis.rotation)
                    k = 0
                    for frame in src.decode(vsrc):
                        if frame.pts is None or frame.pts < first_pts:
                            continue
                        if frame.pts > last_pts:
                            break
                        small = frame.reformat(width=width, height=height, format="yuv420p")
                        small.pts, small.time_base = k, vs.codec_context.time_base
                        dst.mux(vs.encode(small))
                        k += 1
                    finish_clip(dst, vs, aus, sound[0] if sound is not None else None)
                out.append(WrittenClip(buf.getvalue(), clip.first, clip.first + k - 1, False) if k else None)
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"cannot encode video clips: {e}") from e
    return out


def clip_fields(source: str, index: int, analysis: Any, clip: PlannedClip, written: WrittenClip,
                options: SceneOptions, method: str) -> dict[str, Any]:
    """The flat json fields of one clip (docs/FORMATS.md, "Scene clips")."""
    from fgdata import __version__

    w, h = analysis.width, analysis.height
    if analysis.rotation in (90, 270):
        w, h = h, w
    return {
        "source": source,
        "clip_index": index,
        "clip_start_s": round(float(analysis.times[written.first]), 6),
        "clip_end_s": round(float(analysis.times[written.last]) + analysis.frame_seconds(), 6),
        "clip_frames": written.last - written.first + 1,
        "fps": round(float(analysis.fps), 6),
        "width": int(w),
        "height": int(h),
        "keyframe_aligned": written.keyframe_aligned,
        "cut_before": clip.before,
        "cut_after": clip.after,
        "motion_mean": round(clip.motion_mean, 9),
        "motion_min_patch": round(clip.motion_min_patch, 9),
        "scenes_meta": {"detector": options.cut_detector, "settings": {**options.detector_json(),
                                                                        **_clip_settings(options)},
                        "motion_method": method, "fgdata_version": __version__},
    }


def _clip_settings(options: SceneOptions) -> dict[str, Any]:
    d = asdict(options)
    for k in ("cut_detector", "cut_threshold", "min_scene_seconds", "device"):
        d.pop(k)
    return d
