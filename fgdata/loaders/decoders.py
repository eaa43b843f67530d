"""Per-modality decoders that a :class:`~fgdata.loaders.builder.SampleBuilder` composes.

A decoder claims output keys (by the member's extension or by name), turns their members
into values and writes them into the sample dict. The builder hands each resolved key to
the first decoder that claims it, then runs the decoders in order, so a later decoder can
use what an earlier one decoded (the camera decoder slices its track to the video's clip).
:class:`MemberDecoder` (tensors, text, JSON, integers) comes last and claims the rest.

Each media decoder keeps its options in one place, so a new pixel option (another resize
path, say) is one field on :class:`ImageDecoder` or :class:`VideoDecoder`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fgdata.loaders.selection import LoaderConfigError
from fgdata.media.decode import decode_member, member_kind, unwrap_gz
from fgdata.media.errors import ClipTooShort
from fgdata.media.video import ClipSpec

#: Every image extension ``fgdata shard images`` can write, as ``key_map`` alternatives (JPEG first).
IMAGE_MEMBERS = "jpg;jpeg;png;webp;gif;bmp;tif;tiff"
#: Every video extension ``fgdata shard videos`` keeps, as ``key_map`` alternatives (MP4 first).
VIDEO_MEMBERS = "mp4;webm;mov;avi;mpg;ogv;wmv;h264;mjpeg"



def prefixed(prefix: str, alternatives: str) -> str:
    """``prefixed("src.", "jpg;png")`` -> ``"src.jpg;src.png"``."""
    return ";".join(prefix + a for a in alternatives.split(";"))


Items = dict[str, tuple[str, bytes]]
WarnOnce = Callable[[str, str], None]


class Decoder:
    """Claims keys and decodes their members into the sample dict."""

    def claims(self, key: str, ext: str) -> bool:
        raise NotImplementedError

    def decode(self, items: Items, ctx: Any, out: dict[str, Any], warn: WarnOnce) -> None:
        raise NotImplementedError

    def unstackable(self, samples: list[dict[str, Any]], warn: WarnOnce) -> dict[tuple[str, str], list]:
        """Fields (key, sub-key) that cannot stack in this batch, popped from the samples; none by default."""
        return {}


@dataclass
class MemberDecoder(Decoder):
    """Tensors (pth, npy, npz), text, JSON and integers by extension; anything else stays bytes."""

    txt_extensions: Sequence[str] = ("txt",)

    def claims(self, key: str, ext: str) -> bool:
        return True

    def decode(self, items: Items, ctx: Any, out: dict[str, Any], warn: WarnOnce) -> None:
        for key, (ext, data) in items.items():
            value = decode_member(ext, data, txt_extensions=self.txt_extensions)
            if isinstance(value, (bytes, bytearray)):
                warn(f"bytes:{key}", f"{key!r} ({ext!r}) is delivered as raw bytes: no decoder for that extension")
            out[key] = value


@dataclass
class ImageDecoder(Decoder):
    """Image members resized (short side ``input_res``), centre-cropped and normalised, ``[C,H,W]``."""

    input_res: int | tuple[int, int]
    norm_mean: tuple[float, ...]
    norm_std: tuple[float, ...]
    fast_jpeg: bool = True
    txt_extensions: Sequence[str] = ("txt",)
    resize: str = "fast"

    def claims(self, key: str, ext: str) -> bool:
        return member_kind(ext, self.txt_extensions) == "image"

    def _shape(self) -> tuple[int, int, int]:
        if isinstance(self.input_res, tuple):
            return (3, *self.input_res)
        return (3, self.input_res, self.input_res)

    def decode(self, items: Items, ctx: Any, out: dict[str, Any], warn: WarnOnce) -> None:
        from fgdata.media.image import load_image_for_training

        for key, (ext, data) in items.items():
            pixels = unwrap_gz(ext, data)[1]
            out[key] = load_image_for_training(pixels, self.input_res, self.norm_mean, self.norm_std, resize=self.resize,
                                               simplejpeg=self.fast_jpeg, out=ctx.out(key, self._shape()))


def is_video_spec(alternatives: Sequence[str]) -> bool:
    """True when every alternative of a key_map entry is a video extension."""
    return all(member_kind(a) == "video" for a in alternatives)


@dataclass
class VideoDecoder(Decoder):
    """Clips as ``spec`` says (``sequence_length`` frames at ``img_size`` = (W, H)) in [-1, 1], ``[C,T,H,W]``.

    With ``spec.with_audio`` each video key becomes ``{"video": ..., "audio": [2, N]}`` (``audio``
    omitted without an audio stream). Writes ``cropping_params`` (one video key) or
    ``<key>_cropping_params`` and records each clip in ``ctx.clips``.
    """

    video_keys: tuple[str, ...]
    spec: ClipSpec  # the clip every sample's video becomes

    def claims(self, key: str, ext: str) -> bool:
        return key in self.video_keys

    def _too_short(self, info: Any) -> str:
        """The reason a clip is too short, in the loader's terms (frames after target_fps)."""
        fps, length = self.spec.target_fps, self.spec.sequence_length
        if fps is None:
            return f"clip has {info.frame_count} frames, sequence_length={length}"
        frames = math.ceil(info.duration * fps - 1e-9)
        return (f"clip has {frames} frames at target_fps={fps:g} ({info.frame_count} at {info.fps:g} fps), "
                f"sequence_length={length}")

    def decode(self, items: Items, ctx: Any, out: dict[str, Any], warn: WarnOnce) -> None:
        from fgdata.media.video import decode_clip, probe_video

        (w, h), length = self.spec.img_size, self.spec.sequence_length
        for key, (ext, data) in items.items():
            payload = unwrap_gz(ext, data)[1]
            info = probe_video(payload)
            try:
                clip = decode_clip(payload, self.spec, rng=ctx.rng, info=info, out=ctx.out(key, (3, length, h, w)))
            except ClipTooShort as exc:
                raise ClipTooShort(self._too_short(info)) from exc
            ctx.clips[key] = (clip, info)
            if self.spec.with_audio:
                value: Any = {"video": clip.video}
                if clip.audio is not None:
                    value["audio"] = clip.audio
                out[key] = value
            else:
                out[key] = clip.video
            out["cropping_params" if len(self.video_keys) == 1 else f"{key}_cropping_params"] = dict(clip.cropping_params)

    def unstackable(self, samples: list[dict[str, Any]], warn: WarnOnce) -> dict[tuple[str, str], list]:
        """Audio of mixed presence or length stays a per-sample list of tensors (or None), with a warning."""
        if not self.spec.with_audio:
            return {}
        import torch

        loose: dict[tuple[str, str], list] = {}
        for key in self.video_keys:
            values = [s.get(key) for s in samples]
            shapes = {None if not isinstance(v, dict) or "audio" not in v else tuple(v["audio"].shape) for v in values}
            if len(shapes) > 1:
                warn(f"mixed:{key}", f"a batch of {key!r} mixes audio rates or presence ({shapes}); 'audio' is a list")
                audio = [v.pop("audio", None) if isinstance(v, dict) else None for v in values]
                loose[(key, "audio")] = [None if a is None else torch.as_tensor(a) for a in audio]
        return loose


@dataclass
class CameraDecoder(Decoder):
    """Camera poses ``[T,4,4]`` and intrinsics ``[T,4]`` sliced to the decoded frames of ``video_key``.

    Intrinsics are rescaled and shifted for that clip's resize and crop (principal point from
    the top-left corner, OpenCV; see :mod:`fgdata.media.camera`).
    """

    pose_key: str
    intrinsics_key: str
    video_key: str

    def claims(self, key: str, ext: str) -> bool:
        return key in (self.pose_key, self.intrinsics_key)

    def decode(self, items: Items, ctx: Any, out: dict[str, Any], warn: WarnOnce) -> None:
        from fgdata.media.camera import slice_camera, transform_intrinsics

        for key, (ext, data) in items.items():
            out[key] = decode_member(ext, data)
        if self.pose_key not in items or self.intrinsics_key not in items or self.video_key not in ctx.clips:
            return
        clip, info = ctx.clips[self.video_key]
        poses, intrinsics = slice_camera(out[self.pose_key], out[self.intrinsics_key], clip.frame_indices)
        # Intrinsics describe the displayed frame, which is the coded frame turned by the rotation tag.
        src_w, src_h = (info.height, info.width) if info.rotation in (90, 270) else (info.width, info.height)
        out[self.pose_key] = poses
        out[self.intrinsics_key] = transform_intrinsics(intrinsics, src_w, src_h, clip.cropping_params)


def camera_keys(keys: dict[str, tuple[str, ...]]) -> tuple[str, str]:
    """The output keys mapped to ``poses.npy`` and ``intrinsics.npy``."""
    by_ext = {a.removesuffix(".gz"): k for k, alts in keys.items() for a in alts}
    if "poses.npy" not in by_ext or "intrinsics.npy" not in by_ext:
        raise LoaderConfigError("key_map must map one output key to 'poses.npy' and one to 'intrinsics.npy'")
    return by_ext["poses.npy"], by_ext["intrinsics.npy"]
