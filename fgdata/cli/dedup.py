"""``fgdata dedup``: find exact, perceptual or semantic duplicates across datasets and write them as an ignore
index the loaders honour (nothing is deleted)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import typer

from fgdata.cli import options
from fgdata.cli.flaggroups import flag, flag_groups
from fgdata.cli.options import OutputFlags


@dataclass(frozen=True, kw_only=True)
class DedupFlags:
    """What ``dedup`` compares, how close counts as a copy, and which copy is kept."""

    output: str = flag(typer.Option(..., "--output", "-o", help="The ignore index to write (local or s3://); failures go to OUTPUT.failures.json."))
    by: str = flag(typer.Option("phash", "--by", help="sha256 (exact bytes, or pixels with --pixels), phash (DCT hash, Hamming distance), pdq (Facebook's 256-bit PDQ hash) or embedding (SemDeDup on a .npy member)."))
    bits: Optional[int] = flag(typer.Option(None, "--bits", help="phash size: 64 (default) or 256 bits."))
    max_distance: Optional[int] = flag(typer.Option(None, "--max-distance", help="phash, pdq: most differing bits of a copy (default 10 for 64-bit phash, 40 for 256, 31 for pdq)."))
    pixels: bool = flag(typer.Option(False, "--pixels", help="sha256: hash the decoded pixels, so re-encoded lossless copies match."))
    member: Optional[str] = flag(typer.Option(None, "--member", help="The member extension to hash (default: the first image member; the first .npy for --by embedding)."))
    keep: str = flag(typer.Option("first", "--keep", help="Which copy stays: first (input order) or highest:FIELD (a number in the sample's json)."))
    eps: float = flag(typer.Option(0.01, "--eps", help="embedding: drop at cosine >= 1 - eps to a kept sample of its cluster."))
    clusters: Optional[int] = flag(typer.Option(None, "--clusters", min=1, help="embedding: k-means clusters (default: one per 1,000 samples)."))
    workers: int = flag(typer.Option(1, "--workers", "-w", min=1, help="Shards hashed in parallel (local processes)."))
    engine: str = flag(typer.Option("local", "--engine", help="local (processes on this machine; under torchrun the ranks share the shards and rank 0 writes the index) or ray (one Ray task per shard)."))
    ray_address: Optional[str] = flag(typer.Option(None, "--ray-address", help="Ray cluster address, or auto to join the running one (default: RAY_ADDRESS, else start a private local one)."))
    resume: bool = flag(options.RESUME)


@flag_groups
def dedup_cmd(
    paths: list[str] = typer.Argument(..., help="Datasets: folders or s3:// / http(s):// prefixes of .tar shards, shards, or brace patterns."),
    *,
    dd: DedupFlags,
    out: OutputFlags,
) -> None:
    """Find duplicate samples across datasets and write them as an ignore index (shard -> key -> record naming
    the kept copy, the method and the distance). Nothing is deleted: loaders skip the listed samples.

    Example: fgdata dedup /data/laion /data/cc12m --by phash -o /data/dups.json
    """
    from fgdata.cli.jobrun import run_job
    from fgdata.cli.render import console, err_console, print_json
    from fgdata.dedup.job import DedupOptions, run_dedup
    from fgdata.jobs.driver import RunSettings

    opts = DedupOptions(by=dd.by, bits=dd.bits, max_distance=dd.max_distance, pixels=dd.pixels, member=dd.member,
                        keep=dd.keep, eps=dd.eps, clusters=dd.clusters)
    settings = RunSettings(engine=dd.engine, workers=dd.workers, ray_address=dd.ray_address, resume=dd.resume)
    started = time.perf_counter()
    result = run_job(lambda: run_dedup(paths, dd.output, opts, settings))
    doc = {"command": "dedup", "method": opts.method(), "seen": result.seen, "hashed": result.hashed,
           "failed": result.failed, "dropped": result.dropped, "kept": result.hashed - result.dropped,
           "resumed_shards": result.resumed, "output": result.output, "failures_file": result.failures_file,
           "seconds": round(time.perf_counter() - started, 3)}
    if result.world > 1:
        doc.update(rank=result.rank, world=result.world)
    if out.json_out:
        print_json(doc)
    elif not out.quiet and result.rank > 0:
        console.print(f"rank {result.rank} of {result.world}: {result.seen:,} samples seen, {result.hashed:,} hashed, "
                      f"{result.failed:,} failed; rank 0 writes {result.output}", highlight=False)
    elif not out.quiet:
        console.print(f"{result.seen:,} samples seen: {result.hashed:,} hashed, {result.failed:,} failed; "
                      f"{result.dropped:,} duplicate(s) listed in {result.output} ({opts.method()})", highlight=False)
        for f in result.failures[:10]:
            err_console.print(f"[red]failed[/] {f['input']}: {f['reason']}", highlight=False)
    if result.seen and not result.hashed:
        first = result.failures[0] if result.failures else None
        why = f" (first: {first['input']}: {first['reason']})" if first else ""
        err_console.print(f"[red]error[/]: no sample could be hashed{why}; see {result.failures_file}", highlight=False)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("dedup")(dedup_cmd)
