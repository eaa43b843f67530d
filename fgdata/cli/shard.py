"""``fgdata shard images|videos|prompts`` and ``fgdata camera estimate``: media into WebDataset shards."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Optional

import typer

from fgdata.cli import options
from fgdata.cli.flaggroups import flag, flag_groups
from fgdata.cli.options import JobFlags, OutputFlags, TorchrunJobFlags
from fgdata.cli.render import console, human_bytes
from fgdata.cli.selectflags import ImageTableFlags, SelectFlags, VideoTableFlags

if TYPE_CHECKING:
    from fgdata.jobs.summary import JobSummary
    from fgdata.sharding.job import ClipTally, ShardFigures

shard_app = typer.Typer(
    help="Turn folders or manifests of media into WebDataset shards (atomic, resumable, deterministic).",
    no_args_is_help=True,
)
camera_app = typer.Typer(help="Camera tracks for camera-conditioned video shards.", no_args_is_help=True)

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_bytes(text: Optional[str]) -> Optional[int]:
    """``"64MB"`` -> 64000000; ``None`` stays None."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise typer.BadParameter(f"{text!r} is not a size (e.g. 3GB, 512MB, 1000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


SRC = typer.Argument(..., help="A folder (recursive, local or s3://), a manifest (.csv, .jsonl, .parquet) or a "
                                "Parquet/Arrow dataset with the media inside (see --image-column), or existing shards (a .tar, "
                                "a folder of them, a brace pattern, a .txt listing them).")
DST = typer.Argument(..., help="Output folder or s3:// prefix for the shards.")
MAX_SIDE = typer.Option(None, "--max-side", min=2, help="Re-encode, shrinking the longer side to N px.")


@dataclass(frozen=True, kw_only=True)
class SourceFlags:
    """Where a media shard command finds its inputs' paths and captions, and whether it follows symlinks."""

    path_column: str = flag(typer.Option("path", "--path-column", help="Manifest column with the media path or s3:// URL."))
    caption_column: str = flag(typer.Option("caption", "--caption-column", help="Manifest column with the caption."))
    caption_field: str = flag(typer.Option(
        "caption,text,prompt", "--caption-field",
        help="Fields of NAME.json (or manifest columns) tried in order for the caption when there is no NAME.txt."))
    require_caption: bool = flag(typer.Option(
        False, "--require-caption",
        help="Fail inputs without a caption (reason 'caption', in failures.json) instead of writing them uncaptioned."))
    follow_symlinks: bool = flag(options.FOLLOW_SYMLINKS)
    allow_local_paths: bool = flag(typer.Option(
        False, "--allow-local-paths",
        help="Let a manifest read from s3:// or http(s):// name local files (its rows must be URLs otherwise)."))


@dataclass(frozen=True, kw_only=True)
class ShardingFlags:
    """How inputs become shards: their size and order."""

    maxcount: int = flag(typer.Option(1000, "--maxcount", min=1, help="Samples per shard at most."))
    maxsize: Optional[str] = flag(typer.Option(None, "--maxsize", help="Bytes per shard at most (e.g. 1GB)."))
    shuffle_seed: Optional[int] = flag(typer.Option(None, "--shuffle-seed", help="Write the inputs of each work unit in a seeded random order."))


@dataclass(frozen=True, kw_only=True)
class ScaleFlags:
    """Where a media shard job runs: local processes, torchrun ranks or Ray."""

    workers: int = flag(typer.Option(1, "--workers", "-w", min=1,
                                     help="Local worker processes (the output does not depend on it)."))
    engine: str = flag(typer.Option("local", "--engine", help="local (process pool, or torchrun ranks) or ray."))
    ray_address: Optional[str] = flag(typer.Option(None, "--ray-address",
                                                   help="Ray cluster address, or auto to join the running one "
                                                        "(default: RAY_ADDRESS, else start a private local one)."))
    unit_size: Optional[int] = flag(typer.Option(None, "--unit-size", min=1,
                                                 help="Inputs per work unit: a unit writes its own shards and is redone whole after a stop (default: --maxcount)."))


@dataclass(frozen=True, kw_only=True)
class ImageFlags:
    """``shard images``: one output format, re-encoding, and how images are normalised for display."""

    max_side: Optional[int] = flag(typer.Option(
        None, "--max-side", min=2,
        help="Re-encode, shrinking the longer side to N px (--resize-mode keep_ratio_largest that never enlarges)."))
    resize_mode: Optional[str] = flag(typer.Option(
        None, "--resize-mode",
        help="img2dataset's resize to --image-size: no, keep_ratio (shorter side to N), keep_ratio_largest (longer side "
             "to N), center_crop (shorter side to N, centre N x N), border (inside N x N, padded with --background). "
             "Smaller images are enlarged."))
    image_size: Optional[int] = flag(typer.Option(None, "--image-size", min=2, help="The N of --resize-mode."))
    min_image_size: Optional[int] = flag(typer.Option(
        None, "--min-image-size", min=1, help="Fail images whose smaller side is below N px as 'filtered'."))
    max_image_area: Optional[int] = flag(typer.Option(
        None, "--max-image-area", min=1, help="Fail images of more than N pixels (width x height) as 'filtered'."))
    max_aspect_ratio: Optional[float] = flag(typer.Option(
        None, "--max-aspect-ratio", help="Fail images whose longer side / shorter side is above R as 'filtered'."))
    image_format: str = flag(typer.Option(
        "jpg", "--format",
        help="jpg (JPEG inputs kept byte for byte, others encoded at --quality), png, webp, or keep (each input's "
             "own format: other readers may miss samples)."))
    quality: int = flag(typer.Option(95, "--quality", min=1, max=100, help="JPEG/WebP quality when encoding."))
    background: str = flag(typer.Option("white", "--background",
                                        help="Composite transparent images on white, black, gray or #rrggbb."))
    keep_icc: bool = flag(typer.Option(False, "--keep-icc",
                                       help="Keep wide-gamut ICC profiles (Display P3, Adobe RGB) instead of converting to sRGB."))
    max_pixels: Optional[int] = flag(options.MAX_PIXELS)
    dedupe: Optional[str] = flag(typer.Option(None, "--dedupe", help="sha256: keep the first of inputs with the same bytes; the others fail as 'duplicate' (one stream: not with --engine ray or torchrun)."))


@dataclass(frozen=True, kw_only=True)
class VideoFlags:
    """``shard videos``: clipping (fixed lengths, or single shots) and re-encoding (the container bytes are kept by
    default)."""

    clip_seconds: Optional[float] = flag(typer.Option(None, "--clip-seconds", help="Cut each video into clips of S seconds."))
    exact: bool = flag(typer.Option(False, "--exact", help="Exact clip bounds (re-encodes); default cuts at keyframes."))
    fps: Optional[float] = flag(typer.Option(None, "--fps", help="Re-encode at this frame rate."))
    max_side: Optional[int] = flag(MAX_SIDE)
    # --split scenes: single-shot clips from one analysis decode per video
    split: str = flag(typer.Option("fixed", "--split", help="fixed (--clip-seconds, or whole videos) or scenes (one clip per shot: hard cuts, fades and dissolves found in one low-resolution decode)."))
    cut_detector: str = flag(typer.Option("adaptive", "--cut-detector", help="--split scenes: adaptive (content change against its quieter neighbours, flashes suppressed) or transnetv2 (the TransNetV2 network, extra scenes-ml; every frame decoded)."))
    cut_threshold: Optional[float] = flag(typer.Option(None, "--cut-threshold", help="--split scenes: adaptive: a cut is a change this many times its neighbours' mean (default 3.5); transnetv2: a transition is a frame the network gives at least this probability (default 0.5)."))
    min_scene_seconds: float = flag(typer.Option(0.6, "--min-scene-seconds", help="--split scenes: no cut closer than this to the previous one."))
    min_clip_seconds: float = flag(typer.Option(0.0, "--min-clip-seconds", help="--split scenes: shorter clips are dropped, counted as filtered (too-short)."))
    max_clip_seconds: Optional[float] = flag(typer.Option(None, "--max-clip-seconds", help="--split scenes: longer shots are cut into equal pieces no longer than this."))
    trim_seconds: float = flag(typer.Option(0.0, "--trim-seconds", help="--split scenes: margin removed at both ends of each shot."))
    clip_mode: str = flag(typer.Option("copy", "--clip-mode", help="--split scenes: copy (stream copy from the first keyframe in the shot; the span written is recorded) or exact (frame-exact re-encode)."))
    min_motion: Optional[float] = flag(typer.Option(None, "--min-motion", help="--split scenes: drop clips whose motion_mean is below this (filtered)."))
    max_motion: Optional[float] = flag(typer.Option(None, "--max-motion", help="--split scenes: drop clips whose motion_mean is above this (filtered)."))
    device: str = flag(typer.Option("cpu", "--device", help="--cut-detector transnetv2: cpu, cuda, cuda:N or auto (CUDA when present)."))

    def scene_options(self) -> Any:  # a SceneOptions, or None for --split fixed
        from fgdata.errors import OptionError
        from fgdata.producers.scenes import SPLITS, SceneOptions

        if self.split not in SPLITS:
            raise OptionError(f"--split must be one of {', '.join(SPLITS)}, not {self.split!r}")
        if self.split == "fixed":
            return None
        return SceneOptions(cut_detector=self.cut_detector, cut_threshold=self.cut_threshold,
                            min_scene_seconds=self.min_scene_seconds, min_clip_seconds=self.min_clip_seconds,
                            max_clip_seconds=self.max_clip_seconds, trim_seconds=self.trim_seconds,
                            clip_mode=self.clip_mode, min_motion=self.min_motion, max_motion=self.max_motion,
                            device=self.device)


@dataclass(frozen=True, kw_only=True)
class DownloadFlags:
    """How http(s) URLs in a manifest are fetched (see "From a URL list" in the README)."""

    fetch_threads: int = flag(typer.Option(32, "--fetch-threads", min=1, help="URL inputs: requests in flight per worker process."))
    per_host: int = flag(typer.Option(16, "--per-host", min=1, help="URL inputs: requests in flight to one host, per worker."))
    connect_timeout: float = flag(typer.Option(10.0, "--connect-timeout", help="Seconds to connect (DNS included)."))
    stall_timeout: float = flag(typer.Option(20.0, "--stall-timeout", help="Seconds without a byte before a request times out."))
    timeout: float = flag(typer.Option(60.0, "--timeout", help="Seconds for one whole try of a URL: connect, headers and body, redirects included."))
    retries: int = flag(typer.Option(2, "--retries", min=0, help="Extra tries after a timeout, a dropped connection, 429 or 5xx (with backoff, honouring Retry-After up to 30 s)."))
    max_download_size: str = flag(typer.Option("50MB", "--max-download-size", help="Largest body accepted (e.g. 20MB)."))
    max_redirects: int = flag(typer.Option(5, "--max-redirects", min=0, help="Redirects followed at most."))
    user_agent_token: Optional[str] = flag(typer.Option(None, "--user-agent-token", help="Appended to fgdata's User-Agent: a contact (email or URL) for site owners."))
    honour_opt_out: bool = flag(typer.Option(True, "--honour-opt-out/--ignore-opt-out", help="Skip URLs whose X-Robots-Tag says noai, noimageai, noindex or none (default), or fetch them anyway."))
    allow_private_network: bool = flag(typer.Option(
        False, "--allow-private-network",
        help="Let URLs (and their redirects) reach loopback, private, link-local and other non-public addresses, "
             "for an internal mirror (refused by default: a URL list is untrusted input; also "
             "FGDATA_ALLOW_PRIVATE_NETWORK=1)."))
    retry_failed: bool = flag(typer.Option(False, "--retry-failed", help="Rerun of a URL job: fetch again the inputs that failed for a retryable reason (timeout, dropped connection, 429, 5xx), rewriting the work units that hold one; ends as a fresh run in which they answered."))

    def options(self) -> Any:  # a DownloadOptions
        from fgdata.storage.http import DownloadOptions

        return DownloadOptions(connect_timeout=self.connect_timeout, stall_timeout=self.stall_timeout,
                               timeout=self.timeout, retries=self.retries,
                               max_bytes=parse_bytes(self.max_download_size), max_redirects=self.max_redirects,
                               per_host=self.per_host, threads=self.fetch_threads,
                               user_agent_token=self.user_agent_token, honour_opt_out=self.honour_opt_out,
                               allow_private_network=self.allow_private_network)


@dataclass(frozen=True)
class ShardDetails:
    """``shard``'s own fields of its ``--json`` document, from the job's summary and its figures."""

    report: JobSummary
    figures: ShardFigures

    def to_json(self) -> dict[str, object]:
        report, figures, diff = self.report, self.figures, self.figures.inputs
        doc: dict[str, object] = {
            "samples": report.samples, "failed_by_reason": report.failed_by_reason, "shards": report.shards,
            "counts": report.counts, "resumed": report.resumed, "nbytes": figures.nbytes,
            "warnings": figures.warned, "skipped": len(figures.skipped),
            "changed_inputs": diff.changed.names if diff else [], "added_inputs": diff.added.names if diff else [],
            "removed_inputs": diff.removed.names if diff else [], "rewritten_shards": figures.rewritten,
            "normalised": figures.normalised, "retried": figures.retried, "recovered": figures.recovered,
            "restarted_units": report.restarted, "uncaptioned": figures.uncaptioned,
            "image_formats": figures.formats, "filtered": report.filtered,
            "filtered_by_reason": report.filtered_by_reason}
        if report.selection:
            doc["selection"] = report.selection
        if figures.clips is not None:
            doc["clips"] = figures.clips.to_json()
        if figures.stats_path:
            doc["stats"] = figures.stats_path
        return doc


def _run(what: tuple[Any, Any], out: OutputFlags) -> None:
    """Run ``what`` (a ShardJob and its RunSettings) and report it."""
    from dataclasses import replace

    from fgdata.cli.jobrun import finish_job, job_progress, notes, run_job
    from fgdata.jobs.ranks import dist_env
    from fgdata.jobs.summary import payload_of
    from fgdata.sharding.job import ShardFigures, run_shard
    from fgdata.sources.folder import Skipped, skip_summary

    def categories(by_reason: dict[str, int]) -> str:
        return ", ".join(f"{category} {n:,}" for category, n in by_reason.items())

    job, settings = what
    say = notes(out.quiet)
    started = time.perf_counter()
    rank, world = dist_env()
    label = f"shard {job.options.kind}" + (f" [rank {rank}/{world}]" if world > 1 else "")  # one bar per rank

    def shard() -> JobSummary:
        with job_progress(label, enabled=out.bars) as bar:
            return run_shard(job, replace(settings, progress=bar.advance, on_start=bar.total, notify=say, log=say))

    report = run_job(shard)  # the bar is closed before an interrupt line is printed
    figures = payload_of(report, ShardFigures)
    rows = [(f"  {reason}", f"{n:,}") for reason, n in report.failed_by_reason.items()]
    if report.filtered:
        rows.append(("filtered", f"{report.filtered:,}: {categories(report.filtered_by_reason)}"))
    if report.selection and "threshold" in report.selection:
        cut = report.selection
        rows.append(("keep-top", f"{cut['kept']:,} of {cut['rows']:,} by {cut['by']} (threshold {cut['threshold']})"))
    if report.samples != report.written:
        rows.append(("samples (clips)", f"{report.samples:,}"))
    if figures.clips is not None:
        rows += _clip_rows(figures.clips)
    if figures.normalised:
        rows.append(("normalised", ", ".join(f"{change} {n:,}" for change, n in figures.normalised.items())))
    if figures.uncaptioned:
        rows.append(("no caption", f"[yellow]{figures.uncaptioned:,} of {report.written:,} written "
                     "(--require-caption skips them)[/]"))
    rows.append(("shards", f"{len(report.shards):,}"))
    if report.resumed:
        rows.append(("resumed after", f"{report.resumed:,} inputs"))
    if report.restarted:
        rows.append(("restarted", f"{report.restarted:,} work unit(s) an earlier run stopped half-way"))
    if figures.retried:
        rows.append(("retried", f"{figures.retried:,} retryable failure(s): {figures.recovered:,} now written"))
    diff = figures.inputs
    if diff is not None and (diff.added.count or diff.removed.count or diff.changed.count):
        rows.append(("since the earlier run", f"{diff.added.count:,} added, {diff.removed.count:,} removed, "
                     f"{diff.changed.count:,} changed inputs: wrote {len(figures.rewritten):,} shard(s) again"))
    rows.append(("read", human_bytes(figures.nbytes)))
    if figures.warned:
        rows.append(("warnings", f"{figures.warned:,}: {categories(figures.warned_by_reason)} (in failures.json)"))
    if figures.skipped:
        rows.append(("skipped", f"{len(figures.skipped):,}: {skip_summary([Skipped(f.input, f.reason) for f in figures.skipped])} (in failures.json)"))
    if figures.stats_path:
        rows.append(("per-shard stats", figures.stats_path))
    finish_job(report, source=job.src, seconds=time.perf_counter() - started, rows=rows,
               details=ShardDetails(report, figures), quiet=out.quiet, json_out=out.json_out)


def _clip_rows(clips: ClipTally) -> list[tuple[str, str]]:
    """``--clip-seconds``: the clips this run wrote, and those keyframes made longer than asked."""
    rows = [("clips written", f"{clips.written:,}")]
    if clips.longer:
        rows.append((f"  longer than {clips.asked:g} s", f"[yellow]{clips.longer:,} (keyframes; longest "
                     f"{clips.longest:.2f} s; --exact cuts exactly)[/]"))
    return rows


def _job(what, src: str, dest: str, sharding: ShardingFlags, job: JobFlags, *,  # noqa: ANN001, ANN202
         source: SourceFlags | None = None, scale: ScaleFlags | None = None, fetch: DownloadFlags | None = None,
         caption_column: str = "caption", select: SelectFlags | None = None):
    """The ShardJob from the command's own transform options (``what``, a ShardOptions) and its typed flag groups
    (a group a command lacks keeps the job's defaults), and how it runs."""
    from fgdata.errors import OptionError
    from fgdata.jobs.driver import RunSettings
    from fgdata.sharding.job import ShardJob

    if source is not None:  # the transform reads NAME.json, so the caption's fields are a transform option
        what = replace(what, caption_field=tuple(name.strip() for name in source.caption_field.split(",")),
                       require_caption=True if source.require_caption else None)
    if scale is not None and scale.engine not in ("local", "ray"):
        raise OptionError(f"--engine must be 'local' or 'ray', not {scale.engine!r}")
    settings = RunSettings(engine="ray" if scale and scale.engine == "ray" else "local",
                           workers=scale.workers if scale else 1, ray_address=scale.ray_address if scale else None,
                           resume=job.resume, overwrite=job.overwrite,
                           wait_timeout=job.wait_timeout if isinstance(job, TorchrunJobFlags) else None)
    return ShardJob(
        src=src, dest=dest, options=what,
        path_column=source.path_column if source else "path",
        caption_column=source.caption_column if source else caption_column,
        follow_symlinks=source.follow_symlinks if source else False,
        allow_local_paths=source.allow_local_paths if source else False,
        maxcount=sharding.maxcount, maxsize=parse_bytes(sharding.maxsize), shuffle_seed=sharding.shuffle_seed,
        unit_size=scale.unit_size if scale else None,
        download=fetch.options() if fetch else None, retry_failed=fetch.retry_failed if fetch else False,
        where=select.where if select else None, keep_top=select.keep_top if select else None,
        by=select.by if select else None, media_column=select.media()[0] if select else None,
        rekey=select.media()[1] if select else False), settings


@shard_app.command("images")
@flag_groups
def images_cmd(src: str = SRC, dst: str = DST, *, image: ImageFlags, source: SourceFlags, select: ImageTableFlags,
               sharding: ShardingFlags, scale: ScaleFlags, fetch: DownloadFlags, job: TorchrunJobFlags, out: OutputFlags) -> None:
    """Shard images with captions (NAME.txt) and metadata (NAME.json), all in one image format (JPEG by default).

    Example: fgdata shard images ./photos s3://bucket/photos-wds --maxcount 1000 --workers 8

    From a URL list: fgdata shard images laion.parquet ./laion-wds --path-column url --caption-column caption --workers 4 (each URL is fetched with the download flags below; every URL ends written or in failures.json with its reason).

    Many processes or nodes: torchrun --nproc-per-node 8 -m fgdata.cli.main shard images SRC DST --unit-size 10000 (each rank writes the work units u with u mod WORLD_SIZE == rank under names fixed by the unit; rank 0 waits for the others and writes the counts and reports: the same files as one process or --engine ray).

    Each sample holds the image, a json (your metadata as given, with fgdata's source, width, height and mode under its "fgdata" key) and a txt caption (NAME.txt, else the --caption-field of NAME.json or the manifest row). Undecodable images, names that are not UTF-8 and symlinks out of SRC go to DST/failures.json, with captions that cannot be read (warnings: the image is still written) and the files of SRC that are not inputs (skipped). The summary counts the samples written without a caption ("no caption"); --require-caption fails those inputs instead.

    Images are stored as a viewer shows them: EXIF orientation applied, 16-bit and float scaled to 8 bits, CMYK to RGB, transparency on --background, wide-gamut ICC to sRGB, an animation (GIF, APNG, WebP) to its first frame; each change is listed under "normalised" in the json and counted in the summary. JPEGs that need none of it are kept byte for byte.
    """
    from fgdata.producers.media import ShardOptions

    what = ShardOptions(kind="images", max_side=image.max_side, image_format=image.image_format,
                        quality=image.quality, background=image.background, keep_icc=image.keep_icc,
                        max_pixels=image.max_pixels, dedupe=image.dedupe, resize_mode=image.resize_mode,
                        image_size=image.image_size, min_image_size=image.min_image_size,
                        max_image_area=image.max_image_area, max_aspect_ratio=image.max_aspect_ratio)
    _run(_job(what, src, dst, sharding, job, source=source, scale=scale, fetch=fetch, select=select), out)


@shard_app.command("videos")
@flag_groups
def videos_cmd(src: str = SRC, dst: str = DST, *, video: VideoFlags, source: SourceFlags, select: VideoTableFlags,
               sharding: ShardingFlags, scale: ScaleFlags, fetch: DownloadFlags, job: TorchrunJobFlags, out: OutputFlags) -> None:
    """Shard videos (audio kept) with probe metadata, captions and camera tracks.

    Example: fgdata shard videos ./clips ./clips-wds --clip-seconds 5 --workers 4

    The container bytes are kept unless --clip-seconds, --fps or --max-side is given. The json member records duration, fps, frame_count, size, codec, keyframe_times and the audio track under its "fgdata" key, beside your own metadata.

    NAME.poses.npy [T,4,4] and NAME.intrinsics.npy [T,4] are checked against the frame count and stored as poses.npy / intrinsics.npy (sliced and rescaled with each clip).

    Training clips: fgdata shard videos ./raw ./clips-wds --split scenes --min-clip-seconds 2 --max-clip-seconds 10 --min-motion 0.001 (one clip per shot, with clip_start_s, cut_before, motion_mean... flat in the json).
    """
    from fgdata.producers.media import ShardOptions

    what = ShardOptions(kind="videos", clip_seconds=video.clip_seconds, exact_clips=video.exact, fps=video.fps,
                        max_side=video.max_side, scenes=video.scene_options())
    _run(_job(what, src, dst, sharding, job, source=source, scale=scale, fetch=fetch, select=select), out)


@shard_app.command("prompts")
@flag_groups
def prompts_cmd(
    file: str = typer.Argument(..., help="A text file (one prompt per line) or a manifest (.csv, .jsonl, .parquet)."),
    dst: str = DST,
    caption_column: str = typer.Option("caption", "--caption-column", help="Manifest column with the prompt."),
    *,
    select: SelectFlags,
    sharding: ShardingFlags,
    job: JobFlags,
    out: OutputFlags,
) -> None:
    """Write prompts as txt-only shards, for prompt-only (data-free) training.

    Example: fgdata shard prompts prompts.txt ./prompt-shards --maxcount 10000
    """
    from fgdata.producers.media import ShardOptions

    _run(_job(ShardOptions(kind="prompts"), file, dst, sharding, job, caption_column=caption_column, select=select),
         out)


@camera_app.command("estimate")
def estimate_cmd(
    video: str = typer.Argument(..., help="The video to estimate camera poses for."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Folder for NAME.poses.npy and NAME.intrinsics.npy (default: beside the video)."),
) -> None:
    """Estimate per-frame camera poses and intrinsics with VIPE, as shard sidecars.

    Example: fgdata camera estimate clips/walk.mp4

    Writes walk.poses.npy [T,4,4] (camera-to-world, OpenCV) and walk.intrinsics.npy [T,4] (fx, fy, cx, cy), checked against the video's frame count, so `fgdata shard videos` picks them up.
    """
    from fgdata.producers.camera import estimate_camera

    poses, intrinsics = estimate_camera(video, output)
    console.print(f"wrote {poses} and {intrinsics}")


def register(app: typer.Typer) -> None:
    app.add_typer(shard_app, name="shard")
    app.add_typer(camera_app, name="camera")
