"""``fgdata score``: per-sample scores written beside each shard, joined by the loaders as flat json fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import typer

from fgdata.cli.flaggroups import flag, flag_groups
from fgdata.cli.options import OutputFlags, TorchrunJobFlags
from fgdata.cli.render import console, err_console, print_json

if TYPE_CHECKING:
    from fgdata.jobs.driver import RunSettings
    from fgdata.jobs.summary import JobSummary
    from fgdata.score.job import ScoreOptions, ScoreSummary


@dataclass(frozen=True, kw_only=True)
class ScoreFlags:
    """What ``score`` computes and how."""

    signals: str = flag(typer.Option(..., "--with", help="Comma-separated signals: size (width, height, aspect), sharpness, exposure, uniformity, caption (basic = all of these); clip (clip_score), aesthetic, nsfw (p_nsfw, p_safe), watermark (p_watermark, p_no_watermark) need --model-dir."))
    model_dir: Optional[str] = flag(typer.Option(None, "--model-dir", help="Folder with the model files for clip, aesthetic, nsfw and watermark: a CLIP model (Hugging Face or open_clip layout), the heads' files, watermark_model_v1.pt; nothing is downloaded."))
    device: str = flag(typer.Option("cpu", "--device", help="Model signals: cpu, cuda (this rank's LOCAL_RANK GPU under torchrun) or auto."))
    batch_size: int = flag(typer.Option(32, "--batch-size", min=1, help="Model signals: images per forward pass."))
    text_ext: str = flag(typer.Option("txt", "--text-ext", help="The caption member's extension."))
    image_ext: Optional[str] = flag(typer.Option(None, "--image-ext", help="The member to score (default: the sample's first image member, else its first video member, scored on 1 frame per second: mean and _min of each field)."))
    workers: int = flag(typer.Option(1, "--workers", "-w", min=1, help="Shards scored in parallel (local processes)."))
    engine: str = flag(typer.Option("local", "--engine", help="local (processes on this machine; under torchrun each rank scores its share of the shards) or ray (one Ray task per shard)."))
    ray_address: Optional[str] = flag(typer.Option(None, "--ray-address", help="Ray cluster address, or auto to join the running one (default: RAY_ADDRESS, else start a private local one)."))
    into: bool = flag(typer.Option(False, "--into", help="Write the scores into each sample's json member instead (the shards of the one folder given are rewritten in place, resumable; every other member kept)."))


@flag_groups
def score_cmd(
    paths: list[str] = typer.Argument(..., help="Folders or s3:// prefixes of .tar shards, shards, or brace patterns."),
    *,
    opts: ScoreFlags,
    job: TorchrunJobFlags,
    out: OutputFlags,
) -> None:
    """Compute per-sample scores and write them beside each shard as SHARD.tar.scores.jsonl (the shard is never
    rewritten); the loaders join them into each sample's json as flat fields, so presets_filter and key_map see them.

    Example: fgdata score /data/shards --with basic
    Example: fgdata score /data/shards --with clip,aesthetic,nsfw --model-dir /models/clip-vit-l-14 --device auto

    Scoring again with another signal adds its fields; a rerun skips shards already scored with these signals
    (--resume, the default; a run stopped at any point resumes to the same bytes), --no-resume scores every shard
    again, --overwrite first removes the shards' score files (every signal's fields). FOLDER/scores.json records
    what each signal is (preprocessing, scale, model). Exit code 1 when a shard could not be read.
    """
    import dataclasses

    from fgdata.cli.jobrun import job_progress, notes, run_job
    from fgdata.jobs.driver import RunSettings
    from fgdata.score.job import ScoreOptions, parse_signals, score_datasets

    options = ScoreOptions(parse_signals(opts.signals), text_ext=opts.text_ext.lower().lstrip("."),
                           image_ext=opts.image_ext.lower().lstrip(".") if opts.image_ext else None,
                           model_dir=opts.model_dir, device=opts.device, batch_size=opts.batch_size)
    settings = RunSettings(engine=opts.engine, workers=opts.workers, ray_address=opts.ray_address,
                           num_gpus=1.0 if opts.device.startswith("cuda") else 0.0, resume=job.resume,
                           overwrite=job.overwrite, wait_timeout=job.wait_timeout)
    if opts.into:
        _into(paths, options, settings, out)
        return
    say = notes(out.quiet)

    def call() -> ScoreSummary:
        with job_progress("scoring", enabled=out.bars) as bar:
            return score_datasets(paths, options, dataclasses.replace(settings, progress=bar.advance, notify=say,
                                                                      log=say))

    summary = run_job(call)
    if out.json_out:
        print_json(summary.to_json())
    elif not out.quiet:
        skipped = sum(s.skipped for s in summary.shards)
        share = f" (rank {summary.rank} of {summary.world})" if summary.world > 1 else ""
        console.print(f"scored {summary.samples:,} samples in {len(summary.shards):,} shard(s){share} "
                      f"({skipped} already scored) with {', '.join(options.signals)}; "
                      f"{summary.failed:,} sample(s) could not be scored", highlight=False)
    for s in summary.failed_shards:
        err_console.print(f"[red]error[/]: {s.shard}: {s.error}", highlight=False)
    if summary.failed_shards:
        raise typer.Exit(1)


def _into(paths: list[str], options: ScoreOptions, settings: RunSettings, out: OutputFlags) -> None:
    """``--into``: the scores in each sample's json, the shards rewritten in place by the job core."""
    import dataclasses
    import time

    from fgdata.cli.jobrun import ShardsDone, finish_job, job_progress, notes, run_job
    from fgdata.errors import OptionError
    from fgdata.score.job import score_into

    if len(paths) != 1:
        raise OptionError("--into rewrites one folder of shards in place: give exactly one")
    say = notes(out.quiet)
    started = time.perf_counter()

    def call() -> JobSummary:
        with job_progress("scoring", enabled=out.bars, total=None) as bar:
            return score_into(paths[0], options, dataclasses.replace(settings, log=say, notify=say,
                                                                     progress=bar.advance))

    summary = run_job(call)
    done = ShardsDone.of(summary, rate=False)
    finish_job(summary, source=paths[0], seconds=time.perf_counter() - started, rows=done.rows(), details=done,
               quiet=out.quiet, json_out=out.json_out)


def register(app: typer.Typer) -> None:
    app.command("score")(score_cmd)
