"""``encode latents``: media shards -> ``latent.pth`` in model space, batched, rank-owned, resumable.

Model space is what the network's own VAE encode leaves. fgdata reads the convention from the
VAE's config and records it in provenance:

- per-channel (``latents_mean``/``latents_std`` in the config; Wan 2.1/2.2 video VAEs):
  ``(z - latents_mean[c]) / latents_std[c] * scaling_factor`` (scaling_factor 1 when the config has none);
- global (``scaling_factor`` and optional ``shift_factor``; SD 1.x/2.x ``0.18215``, SDXL ``0.13025``,
  SD3/Flux with a shift, CogVideoX, HunyuanVideo): ``(z - shift_factor) * scaling_factor``.

``z`` is the posterior **mode** (mean) by default, so reruns are bit-identical; ``--posterior sample`` draws
``mean + std * eps`` with eps from a per-sample seed (global seed + key). Pixels come from the loaders' own
transforms (the reference image and video geometry, no flip): nothing random is baked into a latent.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fgdata.encode.jobs import batched_results, merged_json, sample_seed, task_samples, user_json
from fgdata.compute import autocast, check_dtype, prefetch_map, resolve_device, tensor_bytes
from fgdata.encode.vae import load_vae
from fgdata.errors import FgdataError, OptionError
from fgdata.jobs.summary import JobSummary
from fgdata.encode.tasks import Result, Task, TaskDefinition, TaskJob, same_place, shard_tasks
from fgdata.jobs.driver import RunSettings, run_job

KINDS = ("image", "video")
POSTERIORS = ("mode", "sample")
LATENT_EXT = "latent.pth"


def latent_space(vae: Any) -> dict[str, Any]:
    """How raw VAE latents become model space, read from the VAE's config (recorded in provenance)."""
    cfg = vae.config
    mean, std = cfg.get("latents_mean"), cfg.get("latents_std")
    scaling = cfg.get("scaling_factor")
    if mean is not None and std is not None:
        return {
            "normalization": "per-channel",
            "formula": "(z - latents_mean) / latents_std * scaling_factor",
            "latents_mean": [float(v) for v in mean],
            "latents_std": [float(v) for v in std],
            "scaling_factor": float(scaling) if scaling is not None else 1.0,
        }
    return {
        "normalization": "global",
        "formula": "(z - shift_factor) * scaling_factor",
        "scaling_factor": float(scaling) if scaling is not None else 1.0,
        "shift_factor": float(cfg.get("shift_factor") or 0.0),
    }


def to_model_space(z: Any, space: dict[str, Any]) -> Any:
    """Apply :func:`latent_space`'s formula to float32 latents ``[B, C, ...]``."""
    import torch

    if space["normalization"] == "per-channel":
        shape = (1, -1) + (1,) * (z.dim() - 2)
        mean = torch.tensor(space["latents_mean"], dtype=z.dtype, device=z.device).view(shape)
        std = torch.tensor(space["latents_std"], dtype=z.dtype, device=z.device).view(shape)
        return (z - mean) / std * space["scaling_factor"]
    return (z - space["shift_factor"]) * space["scaling_factor"]


def parse_size(text: str | int | tuple[int, int]) -> int | tuple[int, int]:
    """``256`` (shorter side, then a square centre crop) or ``WxH`` (exact width x height)."""
    if isinstance(text, (int, tuple)):
        return text
    t = str(text).lower().replace(",", "x")
    try:
        if "x" in t:
            w, h = (int(v) for v in t.split("x"))
            if w > 0 and h > 0:
                return (w, h)
        elif int(t) > 0:
            return int(t)
    except ValueError:
        pass
    raise OptionError(f"--size {text!r}: give N (shorter side, square crop) or WxH, e.g. 256 or 832x480")


def _media_ext(members: dict[str, bytes], kind: str, wanted: str | None) -> str | None:
    from fgdata.media.decode import member_kind

    if wanted:
        return wanted if wanted in members else None
    return next((e for e in sorted(members) if member_kind(e) == kind), None)


@dataclass(frozen=True)
class LatentOptions:
    """``encode latents``: every option that changes the output bytes (the resume fingerprint)."""

    vae: str
    vae_subfolder: str | None = None
    kind: str = "image"
    size: int | tuple[int, int] | str = 256  # "N" or "WxH" become int / (w, h)
    frames: int | None = None
    fps: float | None = None
    media_ext: str | None = None
    keep_media: bool = False
    posterior: str = "mode"
    seed: int = 0
    dtype: str = "float32"
    use_autocast: bool = False
    save_dtype: str = "float32"
    batch_size: int = 16

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", parse_size(self.size))
        if self.kind not in KINDS:
            raise OptionError(f"--kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.posterior not in POSTERIORS:
            raise OptionError(f"--posterior {self.posterior!r} is not one of {', '.join(POSTERIORS)}")
        if self.kind == "video" and not self.frames:
            raise OptionError("--kind video needs --frames (e.g. 81 for Wan 2.1)")
        if self.batch_size < 1:
            raise OptionError("--batch-size must be at least 1")
        check_dtype(self.dtype, "--dtype")
        check_dtype(self.save_dtype, "--save-dtype")


class LatentEncoder:
    """A loaded VAE plus the pixel transform: decode in threads, encode in batches."""

    def __init__(self, options: LatentOptions, device: str = "cpu", channels_last: bool | None = None):
        o = options
        self.kind, self.frames, self.fps = o.kind, o.frames, o.fps
        self.size = parse_size(o.size)
        self.device = resolve_device(device)
        self.dtype, self.use_autocast = o.dtype, o.use_autocast
        self.posterior, self.seed, self.save_dtype = o.posterior, o.seed, o.save_dtype
        self.vae_id = o.vae
        self.vae = load_vae(o.vae, self.device, "float32" if o.use_autocast else o.dtype, kind=o.kind,
                            subfolder=o.vae_subfolder)
        if channels_last is None:
            channels_last = self.device.startswith("cuda") and o.kind == "image"
        self.channels_last = channels_last
        if channels_last:
            import torch

            self.vae = self.vae.to(memory_format=torch.channels_last)
        self.space = latent_space(self.vae)

    # -- pixels ----------------------------------------------------------------

    def pixels(self, data: bytes) -> tuple[Any, dict[str, Any]]:
        """Media bytes -> float32 ``[3, H, W]`` / ``[3, T, H, W]`` in [-1, 1], and per-sample crop facts."""
        if self.kind == "image":
            from fgdata.media.image import load_image_for_training

            res = self.size if isinstance(self.size, int) else (self.size[1], self.size[0])
            return load_image_for_training(data, res, simplejpeg=False), {}
        from fgdata.media.video import ClipSpec, decode_clip

        w, h = (self.size, self.size) if isinstance(self.size, int) else self.size
        clip = decode_clip(data, ClipSpec(sequence_length=int(self.frames or 0), img_size=(w, h), decoder_type="full",
                                          target_fps=self.fps))
        facts = {"cropping_params": clip.cropping_params, "first_frame": clip.frame_indices[0],
                 "start_time": round(clip.start_time, 6), "fps": clip.fps}
        return clip.video, facts

    # -- model -----------------------------------------------------------------

    def encode(self, arrays: list[Any], keys: list[str]) -> Any:
        """Stacked pixels -> float32 model-space latents on the CPU, ``[B, C, ...]``."""
        import numpy as np
        import torch

        x = torch.from_numpy(np.stack(arrays)).to(self.device, non_blocking=True)
        param = next(self.vae.parameters())
        x = x.to(param.dtype)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast(self.device, self.dtype, self.use_autocast):
            dist = self.vae.encode(x).latent_dist
            z = dist.mean.float()
            if self.posterior == "sample":
                eps = torch.stack([
                    torch.randn(z.shape[1:], generator=torch.Generator().manual_seed(sample_seed(self.seed, k)))
                    for k in keys
                ]).to(z.device)
                z = z + dist.std.float() * eps
            return to_model_space(z, self.space).cpu()

    def info(self) -> dict[str, Any]:
        from fgdata.encode.vae import vae_info

        info = vae_info(self.vae, self.vae_id)
        return {
            **info,
            "vae_class": type(self.vae).__name__,
            "kind": self.kind,
            "latent_space": self.space,
            "stores": f"posterior {self.posterior}" + (" (mean + std * eps, eps per-sample seed)" if self.posterior == "sample" else " (mean)"),
            "seed": self.seed if self.posterior == "sample" else None,
            "compute_dtype": self.dtype,
            "autocast": self.use_autocast,
            "channels_last": self.channels_last,
            "save_dtype": self.save_dtype,
            "crop": ("RGB first, bicubic resize of the shorter side, centre crop at round-half-even offsets"
                     if self.kind == "image" else
                     "first --frames frames (full decode), antialiased bicubic cover-resize, centre crop"),
            "size": list(self.size) if isinstance(self.size, tuple) else self.size,
            "frames": self.frames,
            "target_fps": self.fps,
            "flip": "none (no random flip is baked into latents)",
            "pixel_range": "[-1, 1]",
        }


def encode_latents(src: str, dst: str, options: LatentOptions, *, device: str = "cpu", decode_workers: int = 4,
                   channels_last: bool | None = None, run: RunSettings | None = None) -> JobSummary:
    """Encode the media of every sample of ``src``'s shards into ``dst`` (same shard names, same keys)."""
    from fgdata.compute import check_model

    check_model(options.vae, "VAE", "--vae", (options.vae_subfolder,))  # before any output
    state: dict[str, LatentEncoder] = {}

    def encoder() -> LatentEncoder:
        if "enc" not in state:
            state["enc"] = LatentEncoder(options, device=device, channels_last=channels_last)
        return state["enc"]

    def produce(task: Task) -> Iterator[Result]:
        enc = encoder()

        def decode(sample: Any) -> Any:
            if isinstance(sample, Result):
                return sample
            user_json(sample.members.get("json"))  # a json member fgdata cannot add to fails before the VAE runs
            ext = _media_ext(sample.members, options.kind, options.media_ext)
            if ext is None:
                raise FgdataError(f"no {options.media_ext or options.kind} member")
            return ext, *enc.pixels(sample.members[ext])

        decoded = prefetch_map(decode, task_samples(task), decode_workers, ahead=2 * options.batch_size)
        yield from _encode_batches(enc, decoded, options.batch_size, options.keep_media)

    job = TaskJob(dest=dst, command="encode latents", tasks=shard_tasks(src), options=options, produce=produce,
                  provenance=lambda: encoder().info(), in_place=same_place(src, dst), sources=(src,))
    return run_job(TaskDefinition(job), run)


def _encode_batches(enc: LatentEncoder, decoded: Iterable[tuple[Any, Any]], batch_size: int,
                    keep_media: bool) -> Iterator[Result]:
    from fgdata.media.decode import member_kind

    def checked() -> Iterator[Result | tuple[Any, Any]]:
        for sample, value in decoded:
            if isinstance(sample, Result):
                yield sample
            elif isinstance(value, BaseException):
                yield Result(sample.index, sample.key, None, str(value).splitlines()[0] or type(value).__name__,
                             original=sample.members)
            else:
                yield sample, value

    def encode(batch: list[tuple[Any, Any]]) -> Iterator[Result]:
        latents = enc.encode([v[1] for _, v in batch], [s.key for s, _ in batch])
        for (sample, (ext, _, facts)), z in zip(batch, latents):
            members = {e: d for e, d in sample.members.items()
                       if keep_media or (e != ext and member_kind(e) not in ("image", "video"))}
            members[LATENT_EXT] = tensor_bytes(z, enc.save_dtype)
            members["json"] = merged_json(sample.members.get("json"), {"latent": {
                "vae": enc.vae_id, "space": enc.space["formula"], "posterior": enc.posterior,
                "dtype": enc.save_dtype, "shape": list(z.shape), "source_member": ext, "flip": False, **facts}})
            yield Result(sample.index, sample.key, members)

    yield from batched_results(checked(), batch_size, encode)
