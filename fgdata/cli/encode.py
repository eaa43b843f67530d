"""``fgdata encode {latents,text,neg-prompt}`` and ``fgdata kd {pairs,paths}``: model-space data for training.

Only typer, rich and the standard library load at import; torch, diffusers and transformers load inside the
commands. Multi-GPU: launch under ``torchrun`` (each rank owns output shards ``i mod WORLD_SIZE``), or pass
``--engine ray --workers N`` (one Ray task per output shard, N at a time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Optional

import typer

from fgdata.cli.flaggroups import flag, flag_groups
from fgdata.cli.options import OutputFlags, TorchrunJobFlags, quiet_model_libraries

encode_app = typer.Typer(help="Precompute latents and text embeddings into shards.", no_args_is_help=True)
kd_app = typer.Typer(help="Knowledge-distillation shards from a diffusers teacher.", no_args_is_help=True)

DEVICE = typer.Option("cpu", "--device", help="cpu, cuda (this rank's LOCAL_RANK GPU under torchrun) or auto.")
DTYPE = typer.Option("float32", "--dtype", help="Compute dtype: float32, bfloat16 or float16.")
SAVE_DTYPE = typer.Option("float32", "--save-dtype", help="dtype of the stored .pth tensors.")
SUBFOLDER = typer.Option(None, "--subfolder", help="Encoder subfolder, e.g. text_encoder.")
TOKENIZER_SUBFOLDER = typer.Option(None, "--tokenizer-subfolder", help="e.g. tokenizer.")
HIDDEN_LAYER = typer.Option(-1, "--hidden-layer", help="-1 last hidden state, -2 penultimate, ...")


@dataclass(frozen=True, kw_only=True)
class DeviceFlags:
    """Where and in which dtype the model computes."""

    device: str = flag(DEVICE)
    dtype: str = flag(DTYPE)


@dataclass(frozen=True, kw_only=True)
class PrecisionFlags:
    """``encode latents`` and ``encode text``: autocast, and the dtype of the stored tensors."""

    use_autocast: bool = flag(typer.Option(False, "--autocast",
                                           help="Keep float32 weights and run under torch.autocast(--dtype)."))
    save_dtype: str = flag(SAVE_DTYPE)


@dataclass(frozen=True, kw_only=True)
class EngineFlags:
    """Where a model job runs: one process, torchrun ranks, or Ray workers."""

    engine: str = flag(typer.Option("local", "--engine", help="local (one process, or torchrun ranks) or ray."))
    workers: int = flag(typer.Option(1, "--workers", help="With --engine ray: output shards encoded at a time "
                                     "(one Ray task each; each worker process loads the model once)."))
    ray_address: Optional[str] = flag(typer.Option(
        None, "--ray-address", help="Ray cluster address, or auto to join the running one "
        "(default: RAY_ADDRESS, else start a private local one)."))


def _total(src: str) -> int | None:
    """Samples in the input shards, from their count file when there is one (cheap)."""
    from fgdata import storage
    from fgdata.shards import COUNT_FILE, read_shard_counts

    try:
        path = storage.join(src, COUNT_FILE)
        return sum(read_shard_counts(path).values()) if storage.exists(path) else None
    except Exception:  # noqa: BLE001 - only the bar's total
        return None


def _run(call: Callable[..., Any], source: str, device: str, engine: EngineFlags, job: TorchrunJobFlags,
         out: OutputFlags, *, label: str, total: int | None) -> None:
    """Run a library job (``call(run=RunSettings)``: its function with the command's arguments and typed options
    bound) with the shared flags (engine, workers, resume, overwrite, wait timeout, progress, quiet, json) and
    report it like every writing command."""
    from dataclasses import replace

    from fgdata.cli.jobrun import ShardsDone, finish_job, job_progress, notes, run_job
    from fgdata.compute import check_device
    from fgdata.jobs.ranks import dist_env
    from fgdata.jobs.summary import JobSummary
    from fgdata.jobs.driver import RunSettings

    say = notes(out.quiet)
    settings = RunSettings(engine=engine.engine, workers=engine.workers,
                           ray_address=engine.ray_address, num_gpus=1.0 if device.startswith("cuda") else 0.0,
                           resume=job.resume, overwrite=job.overwrite, wait_timeout=job.wait_timeout, log=say,
                           notify=say)
    check_device(device)
    bars = out.bars
    quiet_model_libraries(bars=bars and engine.engine == "local", quiet=out.quiet)
    started = time.perf_counter()
    rank, world = dist_env()
    bar_label = f"{label} [rank {rank}/{world}]" if world > 1 else label  # under torchrun each rank draws one

    def with_bar() -> JobSummary:
        with job_progress(bar_label, enabled=bars and engine.engine == "local", total=total) as bar:
            return call(run=replace(settings, progress=bar.advance))

    summary = run_job(with_bar)  # the bar is closed before an interrupt line is printed
    done = ShardsDone.of(summary, rate=True)
    finish_job(summary, source=source, seconds=time.perf_counter() - started, rows=done.rows(), details=done,
               quiet=out.quiet, json_out=out.json_out)


@dataclass(frozen=True, kw_only=True)
class LatentFlags:
    """``encode latents``: the VAE, the media and how they are read and sampled."""

    vae: str = flag(typer.Option(..., "--vae", help="diffusers VAE: hub id or directory saved by save_pretrained."))
    vae_subfolder: Optional[str] = flag(typer.Option(None, "--vae-subfolder", help="e.g. vae, for a pipeline repo."))
    kind: str = flag(typer.Option("image", "--kind", help="image (AutoencoderKL) or video (AutoencoderKLWan, ...)."))
    size: str = flag(typer.Option("256", "--size", help="N (shorter side, then centre crop) or WxH, e.g. 832x480."))
    frames: Optional[int] = flag(typer.Option(None, "--frames", help="Video: frames per clip (e.g. 81)."))
    fps: Optional[float] = flag(typer.Option(None, "--fps", help="Video: resample to this frame rate first."))
    media_ext: Optional[str] = flag(typer.Option(None, "--media-ext",
                                                 help="Member to encode (default: first image/video)."))
    keep_media: bool = flag(typer.Option(False, "--keep-media", help="Also keep the encoded media member."))
    posterior: str = flag(typer.Option("mode", "--posterior", help="mode (mean, deterministic) or sample (seeded)."))
    seed: int = flag(typer.Option(0, "--seed", help="Global seed for --posterior sample."))
    batch_size: int = flag(typer.Option(16, "--batch-size"))
    decode_workers: int = flag(typer.Option(4, "--decode-workers", help="CPU threads decoding ahead of the model."))


@encode_app.command("latents")
@flag_groups
def latents(
    src: str = typer.Argument(..., help="Input shards (directory or s3:// prefix) with jpg/png/... or mp4 members."),
    dst: str = typer.Argument(..., help="Output directory or s3:// prefix; shards keep their names and keys."),
    *, latent: LatentFlags, compute: DeviceFlags, precision: PrecisionFlags, engine: EngineFlags, job: TorchrunJobFlags,
    out: OutputFlags,
) -> None:
    """Encode media into latent.pth (model space, scaling from the VAE config); txt and json are kept.

    Example: fgdata encode latents /data/photos-wds /data/photo-latents --vae stabilityai/sd-vae-ft-mse --size 256 --device cuda --batch-size 64

    Video: --kind video --frames 81 --size 832x480 with a video VAE. Under torchrun each rank owns disjoint input shards.
    """
    from fgdata.encode.latents import LatentOptions, encode_latents

    options = LatentOptions(vae=latent.vae, vae_subfolder=latent.vae_subfolder, kind=latent.kind, size=latent.size,
                            frames=latent.frames, fps=latent.fps, media_ext=latent.media_ext,
                            keep_media=latent.keep_media, posterior=latent.posterior, seed=latent.seed,
                            dtype=compute.dtype, use_autocast=precision.use_autocast,
                            save_dtype=precision.save_dtype, batch_size=latent.batch_size)
    call = partial(encode_latents, src, dst, options, device=compute.device, decode_workers=latent.decode_workers)
    _run(call, src, compute.device, engine, job, out, label="latents", total=_total(src))


@dataclass(frozen=True, kw_only=True)
class TextFlags:
    """``encode text``: the encoder, tokenization and where the embeddings go."""

    encoder: str = flag(typer.Option(..., "--encoder", help="T5 / umT5 / CLIP text encoder: hub id or directory."))
    into: Optional[str] = flag(typer.Option(None, "--into",
                                            help="Merge into these shards (e.g. latents), matched by key."))
    subfolder: Optional[str] = flag(SUBFOLDER)
    tokenizer_subfolder: Optional[str] = flag(TOKENIZER_SUBFOLDER)
    max_length: Optional[int] = flag(typer.Option(None, "--max-length",
                                                  help="Tokens (default 512 T5/umT5, 77 CLIP)."))
    padding: Optional[str] = flag(typer.Option(None, "--padding", help="zero (T5 default) or keep (CLIP default)."))
    hidden_layer: int = flag(HIDDEN_LAYER)
    text_ext: str = flag(typer.Option("txt", "--text-ext"))
    batch_size: int = flag(typer.Option(32, "--batch-size"))


@encode_app.command("text")
@flag_groups
def text(
    src: str = typer.Argument(..., help="Shards with txt prompts."),
    dst: str = typer.Argument(..., help="Output shards (may equal --into to update them in place)."),
    *, encoding: TextFlags, compute: DeviceFlags, precision: PrecisionFlags, engine: EngineFlags, job: TorchrunJobFlags,
    out: OutputFlags,
) -> None:
    """Add txt_emb.pth (the encoder's hidden states per prompt) to every sample, keeping the other members.

    Example: fgdata encode text /data/prompts-wds /data/prompt-emb --encoder ./umt5-xxl --max-length 512

    T5/umT5: padded to --max-length, zero past the prompt's tokens; CLIP: 77 tokens. --into LATENTS merges by key.
    """
    from fgdata.encode.text import TextOptions, encode_text

    e = encoding
    options = TextOptions(encoder=e.encoder, into=e.into, subfolder=e.subfolder,
                          tokenizer_subfolder=e.tokenizer_subfolder, text_ext=e.text_ext, max_length=e.max_length,
                          padding=e.padding, hidden_layer=e.hidden_layer, dtype=compute.dtype,
                          use_autocast=precision.use_autocast, save_dtype=precision.save_dtype)
    call = partial(encode_text, src, dst, options, batch_size=e.batch_size, device=compute.device)
    _run(call, src, compute.device, engine, job, out, label="text", total=_total(e.into or src))


@dataclass(frozen=True, kw_only=True)
class NegPromptFlags:
    """``encode neg-prompt``: the encoder, the prompt and the output file."""

    encoder: str = flag(typer.Option(..., "--encoder", help="The same text encoder as the shards' txt_emb."))
    out: str = flag(typer.Option(..., "--out", "-o", help="Output .npy (plain float32 array, for files_map)."))
    preset: Optional[str] = flag(typer.Option(None, "--preset", help="A presets_map name, e.g. neg_prompt_wan."))
    text: Optional[str] = flag(typer.Option(None, "--text", help="A literal negative prompt."))
    subfolder: Optional[str] = flag(typer.Option(None, "--subfolder"))
    tokenizer_subfolder: Optional[str] = flag(typer.Option(None, "--tokenizer-subfolder"))
    max_length: Optional[int] = flag(typer.Option(None, "--max-length"))
    padding: Optional[str] = flag(typer.Option(None, "--padding"))
    hidden_layer: int = flag(typer.Option(-1, "--hidden-layer"))


@encode_app.command("neg-prompt")
@flag_groups
def neg_prompt(*, prompt: NegPromptFlags, compute: DeviceFlags, out: OutputFlags) -> None:
    """Write one negative-prompt embedding, shaped like one txt_emb, as neg_prompt_emb.npy (no pickle).

    Example: fgdata encode neg-prompt --preset neg_prompt_wan --encoder ./umt5-xxl -o /data/neg_prompt_emb.npy
    """
    from fgdata.cli.render import console, print_json
    from fgdata.compute import check_device
    from fgdata.encode.text import encode_neg_prompt

    p = prompt
    check_device(compute.device)
    quiet_model_libraries(bars=out.bars, quiet=out.quiet)
    record = encode_neg_prompt(p.out, encoder=p.encoder, preset=p.preset, text=p.text, device=compute.device,
                               dtype=compute.dtype, max_length=p.max_length, padding=p.padding,
                               hidden_layer=p.hidden_layer, subfolder=p.subfolder,
                               tokenizer_subfolder=p.tokenizer_subfolder)
    if out.json_out:
        print_json({"command": "encode neg-prompt", "output": p.out, "record": f"{p.out}.json", **record})
    elif not out.quiet:
        console.print(f"[green]wrote[/] {p.out}: {record['shape']} float32 ({record['source']}); record in "
                      f"{p.out}.json", highlight=False, soft_wrap=True)


def _kd(prompts: str, dst: str, options: Any, device: str, engine: EngineFlags, job: TorchrunJobFlags,
        out: OutputFlags) -> None:
    """Both kd commands: the CLI built the options; the library does the rest."""
    from fgdata import storage
    from fgdata.encode.kd import kd_run

    total = _total(prompts) if storage.is_dir(prompts) else None
    _run(partial(kd_run, prompts, dst, options, device=device), prompts, device, engine, job, out,
         label=f"kd {options.mode}", total=total)


@dataclass(frozen=True, kw_only=True)
class TeacherFlags:
    """Both kd commands: the prompts, the teacher, its sampling, and the output's shape and layout."""

    prompts: str = flag(typer.Option(..., "--prompts", help="Prompt shards (txt members; keys kept) or a text file, "
                                                           "one per line."))
    teacher: str = flag(typer.Option(..., "--teacher", help="diffusers pipeline id or directory (unet|transformer, "
                                                           "scheduler, text_encoder, tokenizer, vae)."))
    steps: int = flag(typer.Option(..., "--steps", help="Teacher sampling steps."))
    guidance_scale: float = flag(typer.Option(1.0, "--guidance-scale", help="Classifier-free guidance; 1 disables it."))
    negative_prompt: Optional[str] = flag(typer.Option(None, "--negative-prompt",
                                                       help="Unconditional text for CFG (default: empty string)."))
    negative_preset: Optional[str] = flag(typer.Option(None, "--negative-preset",
                                                       help="Or a presets_map name, e.g. neg_prompt_wan."))
    seed: int = flag(typer.Option(0, "--seed", help="Global seed; each sample's seed derives from it and its key."))
    latent_shape: Optional[str] = flag(typer.Option(None, "--latent-shape",
                                                    help="C,H,W or C,T,H,W (else from --size and the VAE config)."))
    size: Optional[str] = flag(typer.Option(None, "--size", help="Pixel size WxH (or N) to derive the latent shape."))
    frames: Optional[int] = flag(typer.Option(None, "--frames",
                                              help="Video teachers: pixel frames (latent T = (frames-1)/4+1)."))
    max_length: Optional[int] = flag(typer.Option(None, "--max-length", help="Text tokens (default by encoder family)."))
    per_shard: int = flag(typer.Option(1000, "--per-shard", help="Prompt files: samples per output shard."))
    batch_size: int = flag(typer.Option(8, "--batch-size"))
    save_dtype: str = flag(SAVE_DTYPE)

    def options(self, mode: str, dtype: str, path: PathFlags | None = None) -> Any:
        """The library's KdOptions for ``mode`` (``paths``: with its record and path steps, ``path``)."""
        from fgdata.encode.kd import KdOptions

        options = KdOptions(mode=mode, teacher=self.teacher, steps=self.steps, guidance_scale=self.guidance_scale,
                            negative_prompt=self.negative_prompt, negative_preset=self.negative_preset,
                            seed=self.seed, latent_shape=self.latent_shape, size=self.size, frames=self.frames,
                            max_length=self.max_length, per_shard=self.per_shard, batch_size=self.batch_size,
                            dtype=dtype, save_dtype=self.save_dtype)
        return options if path is None else replace(options, record_steps=path.record_steps,
                                                    path_steps=path.path_steps)


@dataclass(frozen=True, kw_only=True)
class PathFlags:
    """``kd paths``: which teacher states are recorded."""

    record_steps: Optional[str] = flag(typer.Option(None, "--record-steps",
                                                    help="Teacher step indices, e.g. 0,12,24,36."))
    path_steps: int = flag(typer.Option(4, "--path-steps", help="Without --record-steps: P evenly spaced states."))


@kd_app.command("pairs")
@flag_groups
def pairs(
    dst: str = typer.Argument(..., help="Output shards: noise.pth, latent.pth, txt_emb.pth, txt, json."),
    *, teacher: TeacherFlags, compute: DeviceFlags, engine: EngineFlags, job: TorchrunJobFlags, out: OutputFlags,
) -> None:
    """Single-step KD pairs: the teacher's x0 (latent.pth) from exactly the stored noise (noise.pth).

    Example: fgdata kd pairs /data/kd-pairs --prompts prompts.txt --teacher ./teacher --steps 50 --guidance-scale 5 --seed 0

    Per-sample seeds derive from --seed and the sample key, so any subset can be regenerated.
    """
    _kd(teacher.prompts, dst, teacher.options("pairs", compute.dtype), compute.device, engine, job, out)


@kd_app.command("paths")
@flag_groups
def paths(
    dst: str = typer.Argument(..., help="Output shards: path.pth [P,C,...], latent.pth, txt_emb.pth, txt, json."),
    *, teacher: TeacherFlags, path: PathFlags, compute: DeviceFlags, engine: EngineFlags, job: TorchrunJobFlags,
    out: OutputFlags,
) -> None:
    """Multi-step KD paths: the teacher's states by decreasing t (path[0] = start), clean end in latent.pth.

    Example: fgdata kd paths /data/kd-paths --prompts /data/prompts-wds --teacher ./teacher --steps 50 --path-steps 4 --seed 0

    The recorded timesteps go into each sample's json (path_timesteps) and into provenance.json.
    """
    options = teacher.options("paths", compute.dtype, path)
    _kd(teacher.prompts, dst, options, compute.device, engine, job, out)


def register(app: typer.Typer) -> None:
    app.add_typer(encode_app, name="encode")
    app.add_typer(kd_app, name="kd")
