"""``fgdata encode {latents,text,neg-prompt}`` and ``fgdata kd {pairs,paths}``: model-space data for training.

Only typer, rich and the standard library load at import; torch, diffusers and transformers load inside the
commands. Multi-GPU: launch under ``torchrun`` (each rank owns output shards ``i mod WORLD_SIZE``), or pass
``--engine ray --workers N``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import typer

from fgdata.cli import options

encode_app = typer.Typer(help="Precompute latents and text embeddings into shards.", no_args_is_help=True)
kd_app = typer.Typer(help="Knowledge-distillation shards from a diffusers teacher.", no_args_is_help=True)

DEVICE = typer.Option("cpu", "--device", help="cpu, cuda (this rank's LOCAL_RANK GPU under torchrun) or auto.")
DTYPE = typer.Option("float32", "--dtype", help="Compute dtype: float32, bfloat16 or float16.")
AUTOCAST = typer.Option(False, "--autocast", help="Keep float32 weights and run under torch.autocast(--dtype).")
SAVE_DTYPE = typer.Option("float32", "--save-dtype", help="dtype of the stored .pth tensors.")
ENGINE = typer.Option("local", "--engine", help="local (one process, or torchrun ranks) or ray.")
WORKERS = typer.Option(1, "--workers", help="With --engine ray: number of Ray workers (ranks).")
RAY_ADDRESS = typer.Option(None, "--ray-address", help="Ray cluster address (default: RAY_ADDRESS, or start a local one).")
RESUME = options.RESUME
OVERWRITE = options.OVERWRITE
WAIT = options.WAIT_TIMEOUT
QUIET = options.QUIET
PROGRESS = options.PROGRESS
JSON_OUT = options.JSON


def _total(src: str) -> int | None:
    """Samples in the input shards, from their count file when there is one (cheap)."""
    from fgdata import storage
    from fgdata.shards import COUNT_FILE, read_shard_counts

    try:
        path = storage.join(src, COUNT_FILE)
        return sum(read_shard_counts(path).values()) if storage.exists(path) else None
    except Exception:  # noqa: BLE001 - only the bar's total
        return None


def _quiet_model_libraries(bars: bool, quiet: bool) -> None:
    """transformers, diffusers and the hub draw their own bars (loading weights, downloads) and advisories on
    stderr: without our bars theirs go too, and ``-q`` keeps only their errors."""
    import importlib

    for name in ("transformers.utils.logging", "diffusers.utils.logging"):
        try:
            hf_logging: Any = importlib.import_module(name)
        except ImportError:  # an extra that is not installed: nothing of it to silence
            continue
        if not bars:
            hf_logging.disable_progress_bar()
        if quiet:
            hf_logging.set_verbosity_error()
    if not bars:
        try:
            from huggingface_hub.utils import disable_progress_bars
        except ImportError:
            return
        disable_progress_bars()


def _run(fn: Callable[..., Any], args: dict[str, Any], flags: dict[str, Any], *, label: str,
         total: int | None) -> None:
    """Run a library job with the shared flags (engine, workers, resume, overwrite, progress, quiet, json, wait
    timeout) and report it like every writing command."""
    from dataclasses import replace

    from fgdata.cli.jobrun import Outcome, finish, job_progress, notes, run_job
    from fgdata.errors import FgdataError
    from fgdata.jobs.ranks import dist_env
    from fgdata.jobs.tasks import RunSettings, run_on_ray

    quiet, json_out = flags["quiet"], flags["json"]
    bars = options.show_progress(flags["progress"], quiet=quiet, json_out=json_out)
    _quiet_model_libraries(bars and flags["engine"] == "local", quiet)
    say = notes(quiet)
    settings = RunSettings(resume=flags["resume"], overwrite=flags["overwrite"], wait_timeout=flags["wait_timeout"],
                           log=say, notify=say)
    started = time.perf_counter()
    if flags["engine"] == "ray":
        gpus = 1.0 if str(args.get("device", "cpu")).startswith("cuda") else 0.0
        summary = run_job(lambda: run_on_ray(fn, args, settings, flags["workers"], gpus, flags.get("ray_address")))
    elif flags["engine"] == "local":
        rank, world = dist_env()
        bar_label = f"{label} [rank {rank}/{world}]" if world > 1 else label  # under torchrun each rank draws one

        def local() -> Any:
            with job_progress(bar_label, enabled=bars, total=total) as bar:
                return fn(**args, run=replace(settings, progress=bar.advance))

        summary = run_job(local)  # the bar is closed before an interrupt line is printed
    else:
        raise FgdataError(f"--engine {flags['engine']!r} is not one of local, ray")
    rows = [("output shards written", f"{summary.shards_done:,}"),
            ("output shards resumed", f"{summary.shards_skipped:,}")]
    details: dict[str, Any] = {"shards_written": summary.shards_done, "shards_resumed": summary.shards_skipped,
                               "samples_per_second": round(summary.rate, 2)}
    if summary.not_updated:  # --into in place: failed samples kept as they were
        rows.insert(0, ("  not updated (kept)", f"{summary.not_updated:,}"))
        details["not_updated"] = summary.not_updated
    if not summary.finalized:  # a torchrun rank other than 0: its own share; rank 0 reports the job
        details |= {"rank": summary.rank, "world": summary.world}
        rows.insert(0, ("rank", f"{summary.rank} of {summary.world} (its share only)"))
    source = str(args.get("src") or args.get("prompts"))
    finish(Outcome(command=summary.command, source=source, output=summary.dest,
                   seen=summary.written + summary.failed, written=summary.written, failed=summary.failed,
                   failures_file=summary.failures_path, seconds=time.perf_counter() - started, details=details,
                   rows=rows, whole_job=summary.finalized),
           quiet=quiet, json_out=json_out)


@encode_app.command("latents")
def latents(
    src: str = typer.Argument(..., help="Input shards (directory or s3:// prefix) with jpg/png/... or mp4 members."),
    dst: str = typer.Argument(..., help="Output directory or s3:// prefix; shards keep their names and keys."),
    vae: str = typer.Option(..., "--vae", help="diffusers VAE: hub id or directory saved by save_pretrained."),
    vae_subfolder: Optional[str] = typer.Option(None, "--vae-subfolder", help="e.g. vae, for a pipeline repo."),
    kind: str = typer.Option("image", "--kind", help="image (AutoencoderKL) or video (AutoencoderKLWan, ...)."),
    size: str = typer.Option("256", "--size", help="N (shorter side, then centre crop) or WxH, e.g. 832x480."),
    frames: Optional[int] = typer.Option(None, "--frames", help="Video: frames per clip (e.g. 81)."),
    fps: Optional[float] = typer.Option(None, "--fps", help="Video: resample to this frame rate first."),
    media_ext: Optional[str] = typer.Option(None, "--media-ext", help="Member to encode (default: first image/video)."),
    keep_media: bool = typer.Option(False, "--keep-media", help="Also keep the encoded media member."),
    posterior: str = typer.Option("mode", "--posterior", help="mode (mean, deterministic) or sample (seeded)."),
    seed: int = typer.Option(0, "--seed", help="Global seed for --posterior sample."),
    batch_size: int = typer.Option(16, "--batch-size"),
    decode_workers: int = typer.Option(4, "--decode-workers", help="CPU threads decoding ahead of the model."),
    device: str = DEVICE,
    dtype: str = DTYPE,
    use_autocast: bool = AUTOCAST,
    save_dtype: str = SAVE_DTYPE,
    engine: str = ENGINE,
    workers: int = WORKERS,
    ray_address: Optional[str] = RAY_ADDRESS,
    resume: bool = RESUME,
    overwrite: bool = OVERWRITE,
    wait_timeout: Optional[float] = WAIT,
    show_progress: Optional[bool] = PROGRESS,
    quiet: bool = QUIET,
    json_out: bool = JSON_OUT,
) -> None:
    """Encode media into latent.pth (model space, scaling from the VAE config); txt and json are kept.

    Example: fgdata encode latents /data/photos-wds /data/photo-latents --vae stabilityai/sd-vae-ft-mse --size 256 --device cuda --batch-size 64

    Video: --kind video --frames 81 --size 832x480 with a video VAE. Under torchrun each rank owns disjoint input shards.
    """
    from fgdata.encode.latents import LatentOptions, encode_latents

    options = LatentOptions(vae=vae, vae_subfolder=vae_subfolder, kind=kind, size=size, frames=frames, fps=fps,
                            media_ext=media_ext, keep_media=keep_media, posterior=posterior, seed=seed,
                            dtype=dtype, use_autocast=use_autocast, save_dtype=save_dtype, batch_size=batch_size)
    args = {"src": src, "dst": dst, "options": options, "device": device, "decode_workers": decode_workers}
    flags = {"engine": engine, "workers": workers, "ray_address": ray_address, "resume": resume, "overwrite": overwrite,
             "wait_timeout": wait_timeout, "quiet": quiet,
             "progress": show_progress, "json": json_out}
    _run(encode_latents, args, flags, label="latents", total=_total(src))


@encode_app.command("text")
def text(
    src: str = typer.Argument(..., help="Shards with txt prompts."),
    dst: str = typer.Argument(..., help="Output shards (may equal --into to update them in place)."),
    encoder: str = typer.Option(..., "--encoder", help="T5 / umT5 / CLIP text encoder: hub id or directory."),
    into: Optional[str] = typer.Option(None, "--into", help="Merge into these shards (e.g. latents), matched by key."),
    subfolder: Optional[str] = typer.Option(None, "--subfolder", help="Encoder subfolder, e.g. text_encoder."),
    tokenizer_subfolder: Optional[str] = typer.Option(None, "--tokenizer-subfolder", help="e.g. tokenizer."),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="Tokens (default 512 T5/umT5, 77 CLIP)."),
    padding: Optional[str] = typer.Option(None, "--padding", help="zero (T5 default) or keep (CLIP default)."),
    hidden_layer: int = typer.Option(-1, "--hidden-layer", help="-1 last hidden state, -2 penultimate, ..."),
    text_ext: str = typer.Option("txt", "--text-ext"),
    batch_size: int = typer.Option(32, "--batch-size"),
    device: str = DEVICE,
    dtype: str = DTYPE,
    use_autocast: bool = AUTOCAST,
    save_dtype: str = SAVE_DTYPE,
    engine: str = ENGINE,
    workers: int = WORKERS,
    ray_address: Optional[str] = RAY_ADDRESS,
    resume: bool = RESUME,
    overwrite: bool = OVERWRITE,
    wait_timeout: Optional[float] = WAIT,
    show_progress: Optional[bool] = PROGRESS,
    quiet: bool = QUIET,
    json_out: bool = JSON_OUT,
) -> None:
    """Add txt_emb.pth (the encoder's hidden states per prompt) to every sample, keeping the other members.

    Example: fgdata encode text /data/prompts-wds /data/prompt-emb --encoder ./umt5-xxl --max-length 512

    T5/umT5: padded to --max-length, zero past the prompt's tokens; CLIP: 77 tokens. --into LATENTS merges by key.
    """
    from fgdata.encode.text import TextOptions, encode_text

    options = TextOptions(encoder=encoder, into=into, subfolder=subfolder, tokenizer_subfolder=tokenizer_subfolder,
                          text_ext=text_ext, max_length=max_length, padding=padding, hidden_layer=hidden_layer,
                          dtype=dtype, use_autocast=use_autocast, save_dtype=save_dtype)
    args = {"src": src, "dst": dst, "options": options, "batch_size": batch_size, "device": device}
    flags = {"engine": engine, "workers": workers, "ray_address": ray_address, "resume": resume, "overwrite": overwrite,
             "wait_timeout": wait_timeout, "quiet": quiet,
             "progress": show_progress, "json": json_out}
    _run(encode_text, args, flags, label="text", total=_total(into or src))


@encode_app.command("neg-prompt")
def neg_prompt(
    encoder: str = typer.Option(..., "--encoder", help="The same text encoder as the shards' txt_emb."),
    out: str = typer.Option(..., "--out", "-o", help="Output .npy (plain float32 array, for files_map)."),
    preset: Optional[str] = typer.Option(None, "--preset", help="A presets_map name, e.g. neg_prompt_wan."),
    text_: Optional[str] = typer.Option(None, "--text", help="A literal negative prompt."),
    subfolder: Optional[str] = typer.Option(None, "--subfolder"),
    tokenizer_subfolder: Optional[str] = typer.Option(None, "--tokenizer-subfolder"),
    max_length: Optional[int] = typer.Option(None, "--max-length"),
    padding: Optional[str] = typer.Option(None, "--padding"),
    hidden_layer: int = typer.Option(-1, "--hidden-layer"),
    device: str = DEVICE,
    dtype: str = DTYPE,
) -> None:
    """Write one negative-prompt embedding, shaped like one txt_emb, as neg_prompt_emb.npy (no pickle).

    Example: fgdata encode neg-prompt --preset neg_prompt_wan --encoder ./umt5-xxl -o /data/neg_prompt_emb.npy
    """
    from rich.console import Console

    from fgdata.encode.text import encode_neg_prompt

    record = encode_neg_prompt(out, encoder=encoder, preset=preset, text=text_, device=device, dtype=dtype,
                               max_length=max_length, padding=padding, hidden_layer=hidden_layer, subfolder=subfolder,
                               tokenizer_subfolder=tokenizer_subfolder)
    Console().print(f"[green]wrote[/] {out}: {record['shape']} float32 ({record['source']}); record in {out}.json")


def _kd(prompts: str, dst: str, options: Any, device: str, flags: dict[str, Any]) -> None:
    """Both kd commands: the CLI built the options; the library does the rest."""
    from fgdata import storage
    from fgdata.encode.kd import kd_run

    total = _total(prompts) if storage.is_dir(prompts) else None
    args = {"prompts": prompts, "dst": dst, "options": options, "device": device}
    _run(kd_run, args, flags, label=f"kd {options.mode}", total=total)


_PROMPTS = typer.Option(..., "--prompts", help="Prompt shards (txt members; keys kept) or a text file, one per line.")
_TEACHER = typer.Option(..., "--teacher", help="diffusers pipeline id or directory (unet|transformer, scheduler, "
                                               "text_encoder, tokenizer, vae).")
_STEPS = typer.Option(..., "--steps", help="Teacher sampling steps.")
_GUIDANCE = typer.Option(1.0, "--guidance-scale", help="Classifier-free guidance; 1 disables it.")
_NEG = typer.Option(None, "--negative-prompt", help="Unconditional text for CFG (default: empty string).")
_NEG_PRESET = typer.Option(None, "--negative-preset", help="Or a presets_map name, e.g. neg_prompt_wan.")
_SEED = typer.Option(0, "--seed", help="Global seed; each sample's seed derives from it and its key.")
_SHAPE = typer.Option(None, "--latent-shape", help="C,H,W or C,T,H,W (else from --size and the VAE config).")
_SIZE = typer.Option(None, "--size", help="Pixel size WxH (or N) to derive the latent shape.")
_FRAMES = typer.Option(None, "--frames", help="Video teachers: pixel frames (latent T = (frames-1)/4+1).")
_MAXLEN = typer.Option(None, "--max-length", help="Text tokens (default by encoder family).")
_PER_SHARD = typer.Option(1000, "--per-shard", help="Prompt files: samples per output shard.")


@kd_app.command("pairs")
def pairs(
    dst: str = typer.Argument(..., help="Output shards: noise.pth, latent.pth, txt_emb.pth, txt, json."),
    prompts: str = _PROMPTS, teacher: str = _TEACHER, steps: int = _STEPS, guidance_scale: float = _GUIDANCE,
    negative_prompt: Optional[str] = _NEG, negative_preset: Optional[str] = _NEG_PRESET, seed: int = _SEED,
    latent_shape: Optional[str] = _SHAPE, size: Optional[str] = _SIZE, frames: Optional[int] = _FRAMES,
    max_length: Optional[int] = _MAXLEN, per_shard: int = _PER_SHARD, batch_size: int = typer.Option(8, "--batch-size"),
    device: str = DEVICE, dtype: str = DTYPE, save_dtype: str = SAVE_DTYPE, engine: str = ENGINE,
    workers: int = WORKERS, ray_address: Optional[str] = RAY_ADDRESS, resume: bool = RESUME, overwrite: bool = OVERWRITE,
    wait_timeout: Optional[float] = WAIT, show_progress: Optional[bool] = PROGRESS,
    quiet: bool = QUIET, json_out: bool = JSON_OUT,
) -> None:
    """Single-step KD pairs: the teacher's x0 (latent.pth) from exactly the stored noise (noise.pth).

    Example: fgdata kd pairs /data/kd-pairs --prompts prompts.txt --teacher ./teacher --steps 50 --guidance-scale 5 --seed 0

    Per-sample seeds derive from --seed and the sample key, so any subset can be regenerated.
    """
    from fgdata.encode.kd import KdOptions

    options = KdOptions(mode="pairs", teacher=teacher, steps=steps, guidance_scale=guidance_scale,
                        negative_prompt=negative_prompt, negative_preset=negative_preset, seed=seed,
                        latent_shape=latent_shape, size=size, frames=frames, max_length=max_length,
                        per_shard=per_shard, batch_size=batch_size, dtype=dtype, save_dtype=save_dtype)
    _kd(prompts, dst, options, device, {"engine": engine, "workers": workers, "ray_address": ray_address, "resume": resume,
                                        "overwrite": overwrite, "wait_timeout": wait_timeout, "quiet": quiet,
                                        "progress": show_progress, "json": json_out})


@kd_app.command("paths")
def paths(
    dst: str = typer.Argument(..., help="Output shards: path.pth [P,C,...], latent.pth, txt_emb.pth, txt, json."),
    prompts: str = _PROMPTS, teacher: str = _TEACHER, steps: int = _STEPS, guidance_scale: float = _GUIDANCE,
    negative_prompt: Optional[str] = _NEG, negative_preset: Optional[str] = _NEG_PRESET,
    record_steps: Optional[str] = typer.Option(None, "--record-steps", help="Teacher step indices, e.g. 0,12,24,36."),
    path_steps: int = typer.Option(4, "--path-steps", help="Without --record-steps: P evenly spaced states."),
    seed: int = _SEED, latent_shape: Optional[str] = _SHAPE, size: Optional[str] = _SIZE,
    frames: Optional[int] = _FRAMES, max_length: Optional[int] = _MAXLEN, per_shard: int = _PER_SHARD,
    batch_size: int = typer.Option(8, "--batch-size"), device: str = DEVICE, dtype: str = DTYPE,
    save_dtype: str = SAVE_DTYPE, engine: str = ENGINE, workers: int = WORKERS, ray_address: Optional[str] = RAY_ADDRESS,
    resume: bool = RESUME,
    overwrite: bool = OVERWRITE, wait_timeout: Optional[float] = WAIT, show_progress: Optional[bool] = PROGRESS,
    quiet: bool = QUIET, json_out: bool = JSON_OUT,
) -> None:
    """Multi-step KD paths: the teacher's states by decreasing t (path[0] = start), clean end in latent.pth.

    Example: fgdata kd paths /data/kd-paths --prompts /data/prompts-wds --teacher ./teacher --steps 50 --path-steps 4 --seed 0

    The recorded timesteps go into each sample's json (path_timesteps) and into provenance.json.
    """
    from fgdata.encode.kd import KdOptions

    options = KdOptions(mode="paths", teacher=teacher, steps=steps, guidance_scale=guidance_scale,
                        negative_prompt=negative_prompt, negative_preset=negative_preset, record_steps=record_steps,
                        path_steps=path_steps, seed=seed, latent_shape=latent_shape, size=size, frames=frames,
                        max_length=max_length, per_shard=per_shard, batch_size=batch_size, dtype=dtype,
                        save_dtype=save_dtype)
    _kd(prompts, dst, options, device, {"engine": engine, "workers": workers, "ray_address": ray_address, "resume": resume,
                                        "overwrite": overwrite, "wait_timeout": wait_timeout, "quiet": quiet,
                                        "progress": show_progress, "json": json_out})


def register(app: typer.Typer) -> None:
    app.add_typer(encode_app, name="encode")
    app.add_typer(kd_app, name="kd")
