"""``kd pairs`` / ``kd paths``: knowledge-distillation shards from a diffusers teacher.

"Teacher" means the {denoiser, scheduler, text encoder + tokenizer} of one diffusers pipeline directory or hub
id (model_index.json layout: ``unet/`` or ``transformer/``, ``scheduler/``, ``text_encoder/``, ``tokenizer/``,
and ``vae/`` for the latent geometry). fgdata runs the sampler loop itself rather than a stock pipeline's
``__call__``, so it owns the starting noise and can record every state, for any denoiser whose forward takes
``(latents, timestep, encoder_hidden_states)`` (UNet2DConditionModel, WanTransformer3DModel, ...).

Per sample:

- ``noise.pth``: the unit Gaussian the teacher started from, drawn on the CPU from a per-sample seed
  (global seed + key), so any subset regenerates identically on any device; the sampler's first state is
  ``noise * scheduler.init_noise_sigma`` (1 for flow matching and DDIM).
- ``latent.pth``: the teacher's final output x0 from exactly this noise.
- ``path.pth`` (paths only): ``[P, C, ...]`` sampler states before the recorded teacher steps, by decreasing t;
  ``path[0]`` is the starting state and the clean end state is ``latent.pth``, not in ``path``.
- ``txt_emb.pth``: the teacher's text embedding of the prompt (the student's condition), ``txt`` and ``json``
  with ``path_timesteps`` (scheduler timesteps of the recorded states) and the sample's seed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fgdata import storage
from fgdata.encode.jobs import batched_results, merged_json, sample_seed, task_samples, user_json
from fgdata.jobs.summary import JobSummary
from fgdata.encode.tasks import Result, Task, TaskDefinition, TaskJob, same_place, shard_tasks
from fgdata.jobs.driver import RunSettings, run_job
from fgdata.compute import check_dtype, check_model, load_pretrained, resolve_device, tensor_bytes, torch_dtype
from fgdata.encode.text import TextEncoder, load_text_encoder
from fgdata.errors import FgdataError, OptionError

MODES = ("pairs", "paths")
DEFAULT_PATH_STEPS = 4


@dataclass
class Teacher:
    source: str
    denoiser: Any
    scheduler: Any
    text: TextEncoder
    vae_config: dict[str, Any]
    device: str
    dtype: str

    def info(self) -> dict[str, Any]:
        return {
            "teacher": self.source,
            "denoiser_class": type(self.denoiser).__name__,
            "denoiser_revision": getattr(self.denoiser.config, "_commit_hash", None),
            "scheduler_class": type(self.scheduler).__name__,
            "scheduler_config": {k: v for k, v in dict(self.scheduler.config).items() if not k.startswith("_")},
            **{f"text_{k}" if not k.startswith("text_") else k: v for k, v in self.text.info().items()},
            "compute_dtype": self.dtype,
        }


def _load_config(cls: Any, id_or_dir: str, subfolder: str | None) -> dict[str, Any]:
    """``cls.load_config`` (config JSON only, no weights) with the same one-line errors as loading a model."""

    class _ConfigOnly:
        @staticmethod
        def from_pretrained(source: str, **kw: Any) -> Any:
            return cls.load_config(source, **kw)

    return dict(load_pretrained(_ConfigOnly, id_or_dir, "config", "--teacher", subfolder))


def load_teacher(id_or_dir: str, *, device: str = "cpu", dtype: str = "float32", max_length: int | None = None,
                 padding: str | None = None) -> Teacher:
    """Denoiser, scheduler and text encoder from one pipeline directory or hub id."""
    import diffusers

    device = resolve_device(device)
    index = _load_config(diffusers.DiffusionPipeline, id_or_dir, None)
    denoiser_name = next((n for n in ("transformer", "unet") if n in index), None)
    if denoiser_name is None or "scheduler" not in index or "text_encoder" not in index:
        raise FgdataError(f"{id_or_dir}: the teacher needs transformer/ or unet/, scheduler/ and text_encoder/")
    denoiser = load_pretrained(diffusers.AutoModel, id_or_dir, "teacher denoiser", "--teacher", denoiser_name,
                               torch_dtype=torch_dtype(dtype))
    scheduler_cls = getattr(diffusers, str(index["scheduler"][-1]), None)
    if scheduler_cls is None:
        raise FgdataError(f"{id_or_dir}: unknown scheduler class {index['scheduler'][-1]!r}")
    scheduler = load_pretrained(scheduler_cls, id_or_dir, "teacher scheduler", "--teacher", "scheduler")
    text = load_text_encoder(id_or_dir, device=device, dtype=dtype, max_length=max_length, padding=padding,
                             subfolder="text_encoder", tokenizer_subfolder="tokenizer", flag="--teacher")
    vae_config = _load_config(diffusers.AutoencoderKL, id_or_dir, "vae") if "vae" in index else {}
    return Teacher(id_or_dir, denoiser.eval().requires_grad_(False).to(device), scheduler, text, vae_config, device, dtype)


def parse_latent_shape(shape: str) -> tuple[int, ...]:
    """``--latent-shape C,H,W`` or ``C,T,H,W`` (``x`` separates too), else a usage error."""
    try:
        dims = tuple(int(v) for v in shape.replace("x", ",").split(","))
    except ValueError:
        raise OptionError(f"--latent-shape {shape!r}: give C,H,W or C,T,H,W") from None
    if len(dims) not in (3, 4) or min(dims) < 1:
        raise OptionError(f"--latent-shape {shape!r}: give C,H,W or C,T,H,W")
    return dims


def latent_shape(teacher: Teacher, shape: str | None, size: str | None, frames: int | None) -> tuple[int, ...]:
    """``--latent-shape C,H,W`` / ``C,T,H,W``, or derived from ``--size WxH`` [+ ``--frames``] and the VAE config."""
    if shape:
        return parse_latent_shape(shape)
    if not size:
        raise FgdataError("give --latent-shape C,H,W (or C,T,H,W), or --size WxH with a teacher that has vae/")
    from fgdata.encode.latents import parse_size

    px = parse_size(size)
    w, h = (px, px) if isinstance(px, int) else px
    cfg = teacher.vae_config
    spatial = cfg.get("scale_factor_spatial") or 2 ** (len(cfg.get("block_out_channels") or [0] * 4) - 1)
    channels = int(teacher.denoiser.config.get("in_channels") or cfg.get("z_dim") or cfg.get("latent_channels") or 0)
    if not channels:
        raise FgdataError("the teacher declares no latent channel count (in_channels, z_dim or latent_channels)")
    if h % spatial or w % spatial:
        raise OptionError(f"--size {w}x{h} is not a multiple of the VAE's {spatial}x downsampling")
    if frames:
        temporal = int(cfg.get("scale_factor_temporal") or 4)
        return (channels, (frames - 1) // temporal + 1, h // spatial, w // spatial)
    return (channels, h // spatial, w // spatial)


def record_indices(steps: int, record: str | None, path_steps: int) -> list[int]:
    """Teacher step indices whose input states go into ``path`` (first must be 0: path[0] is the start)."""
    if record:
        try:
            idx = [int(v) for v in record.split(",") if v.strip()]
        except ValueError:
            raise OptionError(f"--record-steps {record!r}: give comma-separated step indices, e.g. 0,12,24,36") from None
    else:
        if not 1 <= path_steps <= steps:
            raise OptionError(f"--path-steps {path_steps} must be between 1 and --steps {steps}")
        idx = [round(k * steps / path_steps) for k in range(path_steps)]
    if not idx or idx[0] != 0 or any(b <= a for a, b in zip(idx, idx[1:])) or idx[-1] >= steps:
        raise OptionError(f"--record-steps {idx}: strictly increasing indices in [0, {steps}) starting at 0")
    return idx


def sample(teacher: Teacher, noise: Any, cond: Any, uncond: Any | None, *, steps: int, guidance: float,
           record: list[int]) -> tuple[Any, Any]:
    """Run the sampler from ``noise`` (float32 CPU ``[B, C, ...]``); return (x0, states ``[B, P, C, ...]``), CPU."""
    import torch

    dev, wdtype = teacher.device, next(teacher.denoiser.parameters()).dtype
    sched = teacher.scheduler
    sched.set_timesteps(steps, device=dev)
    timesteps = sched.timesteps
    x = noise.to(dev) * float(getattr(sched, "init_noise_sigma", 1.0))
    cfg = uncond is not None and guidance != 1.0
    context = torch.cat([uncond.expand_as(cond), cond]) if uncond is not None and cfg else cond
    context = context.to(dev, wdtype)
    states = []
    with torch.inference_mode():
        for i, t in enumerate(timesteps):
            if i in record:
                states.append(x.float().cpu())
            xin = torch.cat([x, x]) if cfg else x
            if hasattr(sched, "scale_model_input"):
                xin = sched.scale_model_input(xin, t)
            tb = t.expand(xin.shape[0]).to(dev)
            out = teacher.denoiser(xin.to(wdtype), tb, context, return_dict=False)[0].float()
            if cfg:
                u, c = out.chunk(2)
                out = u + guidance * (c - u)
            x = sched.step(out, t, x, return_dict=False)[0]
    path = torch.stack(states, dim=1) if states else None
    return x.float().cpu(), path


def _prompt_tasks(prompts: str, per_shard: int) -> list[Task]:
    """A directory of shards (keys and txt kept), or a UTF-8 file with one prompt per line (keys sample_%06d)."""
    if storage.is_dir(prompts):
        return shard_tasks(prompts)
    try:
        lines = [ln.strip() for ln in storage.read_text(prompts).splitlines()]
    except UnicodeDecodeError:
        raise FgdataError(f"{prompts}: not a UTF-8 text file") from None
    lines = [ln for ln in lines if ln]
    if not lines:
        raise FgdataError(f"{prompts}: no prompts")
    items = [(f"sample_{i:06d}", p) for i, p in enumerate(lines)]
    return [Task(f"{n:05d}.tar", None, tuple(items[n * per_shard:(n + 1) * per_shard]))
            for n in range((len(items) + per_shard - 1) // per_shard)]


def _task_prompts(task: Task, text_ext: str) -> Iterator[tuple[int, str, dict[str, bytes], str | None, str]]:
    """(pos, key, members to keep, prompt or None, failure reason)."""
    if task.source is None:
        for i, (key, given) in enumerate(task.items):
            yield i, key, {"txt": given.encode()}, given, ""
        return
    for s in task_samples(task):
        if isinstance(s, Result):
            yield s.pos, s.key, {}, None, s.reason
            continue
        kept = {e: d for e, d in s.members.items() if e in (text_ext, "json")}
        text: str | None
        try:
            user_json(kept.get("json"))
            text, reason = s.members[text_ext].decode("utf-8").strip(), ""
        except FgdataError as exc:
            text, reason = None, str(exc)
        except KeyError:
            text, reason = None, f"no {text_ext} member"
        except UnicodeDecodeError:
            text, reason = None, f".{text_ext} is not UTF-8"
        yield s.index, s.key, kept if text is not None else {}, text, reason


@dataclass(frozen=True)
class KdOptions:
    """``kd pairs|paths``: every option that changes the output bytes (the resume fingerprint)."""

    mode: str
    teacher: str
    steps: int
    guidance_scale: float = 1.0
    negative_prompt: str | None = None
    negative_preset: str | None = None
    record_steps: str | None = None
    path_steps: int = DEFAULT_PATH_STEPS
    seed: int = 0
    latent_shape: str | None = None
    size: str | None = None
    frames: int | None = None
    max_length: int | None = None
    text_ext: str = "txt"
    per_shard: int = 1000
    batch_size: int = 8
    dtype: str = "float32"
    save_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise OptionError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.steps < 1 or self.batch_size < 1 or self.per_shard < 1:
            raise OptionError("--steps, --batch-size and --per-shard must be at least 1")
        check_dtype(self.dtype, "--dtype")
        check_dtype(self.save_dtype, "--save-dtype")
        if self.latent_shape:
            parse_latent_shape(self.latent_shape)
        if self.mode == "pairs":  # path options mean nothing for pairs: one value, one fingerprint
            object.__setattr__(self, "record_steps", None)
            object.__setattr__(self, "path_steps", DEFAULT_PATH_STEPS)


def kd_run(prompts: str, dst: str, options: KdOptions, *, device: str = "cpu",
           run: RunSettings | None = None) -> JobSummary:
    """Write pair (noise, latent) or path (path, latent) shards with txt_emb, one output shard per prompt shard."""
    o = options
    mode, teacher, steps, guidance_scale, seed = o.mode, o.teacher, o.steps, o.guidance_scale, o.seed
    text_ext, batch_size, save_dtype = o.text_ext, o.batch_size, o.save_dtype
    record = record_indices(steps, o.record_steps, o.path_steps) if mode == "paths" else []
    check_model(teacher, "teacher", "--teacher", ("scheduler", "text_encoder", "tokenizer"))  # before any output
    neg_text = None
    if guidance_scale != 1.0:
        from fgdata.encode.text import neg_prompt_text

        neg_text = "" if o.negative_prompt is None and o.negative_preset is None else \
            neg_prompt_text(o.negative_preset, o.negative_prompt)[0]
    tasks = _prompt_tasks(prompts, o.per_shard)
    state: dict[str, Any] = {}

    def setup() -> dict[str, Any]:
        if not state:
            import torch

            t = load_teacher(teacher, device=device, dtype=o.dtype, max_length=o.max_length)
            state["teacher"] = t
            state["shape"] = latent_shape(t, o.latent_shape, o.size, o.frames)
            state["uncond"] = t.text.encode([neg_text]) if neg_text is not None else None
            t.scheduler.set_timesteps(steps, device="cpu")
            state["timesteps"] = [float(v) for v in t.scheduler.timesteps]
            sigmas = getattr(t.scheduler, "sigmas", None)
            state["sigmas"] = [float(v) for v in sigmas[:steps]] if isinstance(sigmas, torch.Tensor) else None
        return state

    def produce(task: Task) -> Iterator[Result]:
        import torch

        st = setup()
        t: Teacher = st["teacher"]

        def items() -> Iterator[Result | tuple[int, str, dict[str, bytes], str]]:
            for pos, key, kept, text, reason in _task_prompts(task, text_ext):
                yield Result(pos, key, None, reason) if text is None else (pos, key, kept, text)

        def run_batch(batch: list[tuple[int, str, dict[str, bytes], str]]) -> Iterator[Result]:
            seeds = [sample_seed(seed, key) for _, key, _, _ in batch]
            noise = torch.stack([torch.randn(st["shape"], generator=torch.Generator().manual_seed(s)) for s in seeds])
            cond = t.text.encode([text for *_, text in batch])
            x0, path = sample(t, noise, cond, st["uncond"], steps=steps, guidance=guidance_scale, record=record)
            for i, (pos, key, kept, text) in enumerate(batch):
                members = dict(kept)
                members.setdefault(text_ext, text.encode())
                members["latent.pth"] = tensor_bytes(x0[i], save_dtype)
                members["txt_emb.pth"] = tensor_bytes(cond[i], save_dtype)
                fields: dict[str, Any] = {"kd": {"teacher": teacher, "mode": mode, "seed": seeds[i], "steps": steps,
                                                 "guidance_scale": guidance_scale, "dtype": save_dtype}}
                if mode == "pairs":
                    members["noise.pth"] = tensor_bytes(noise[i], save_dtype)
                else:
                    members["path.pth"] = tensor_bytes(path[i], save_dtype)
                    fields["path_timesteps"] = [st["timesteps"][j] for j in record]
                    if st["sigmas"] is not None:
                        fields["path_sigmas"] = [st["sigmas"][j] for j in record]
                members["json"] = merged_json(kept.get("json"), fields)
                yield Result(pos, key, members)

        yield from batched_results(items(), batch_size, run_batch)

    def provenance() -> dict[str, Any]:
        st = setup()
        return {**st["teacher"].info(), "mode": mode, "sampler": type(st["teacher"].scheduler).__name__,
                "steps": steps, "timesteps": st["timesteps"], "sigmas": st["sigmas"], "guidance_scale": guidance_scale,
                "cfg": "uncond + g * (cond - uncond)" if guidance_scale != 1.0 else "none",
                "negative_prompt": neg_text, "record_steps": record,
                "path_timesteps": [st["timesteps"][j] for j in record] if record else None,
                "latent_shape": list(st["shape"]), "seed": seed,
                "seed_rule": "sha256(f'{seed}:{key}')[:8] little-endian & (2**63-1), torch CPU generator",
                "noise": "unit Gaussian; the sampler starts from noise * init_noise_sigma", "save_dtype": save_dtype}

    job = TaskJob(dest=dst, command=f"kd {mode}", tasks=tasks, options=o, produce=produce, provenance=provenance,
                  in_place=same_place(prompts, dst), sources=(prompts,))
    return run_job(TaskDefinition(job), run)
