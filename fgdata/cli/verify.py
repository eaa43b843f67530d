"""``fgdata verify``: check every shard, report problems by reason, write an ignore index and readable counts."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import typer

from fgdata.cli.flaggroups import flag, flag_groups
from fgdata.cli.options import OutputFlags, say_repeated
from fgdata.cli.render import console, err_console, human_bytes, print_json, progress

_TABLE_ROWS = 50
_LISTED_SAMPLES = 20


def _reasons(by_reason: dict) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in sorted(by_reason.items())) or "ok"


def _render(report) -> None:  # noqa: ANN001 - fgdata.verify.VerifyReport, imported lazily
    from rich.table import Table

    shown = report.shards if len(report.shards) <= _TABLE_ROWS else [s for s in report.shards if not s.ok]
    table = Table(title=f"{report.path}{' (decoded)' if report.decode else ''}", show_footer=True)
    table.add_column("shard", footer="total")
    table.add_column("bytes", justify="right", footer=human_bytes(sum(s.size or 0 for s in report.shards)))
    table.add_column("samples", justify="right", footer=f"{report.samples:,}")
    table.add_column("readable", justify="right", footer=f"{report.readable:,}")
    table.add_column("bad", justify="right", footer=f"{report.bad_samples:,}")
    table.add_column("problems by reason", footer=_reasons(report.by_reason))
    for s in shown:
        readable = "?" if s.readable is None else f"{s.readable:,}"
        status = _reasons(s.by_reason)
        table.add_row(report.label(s), human_bytes(s.size or 0), f"{s.samples:,}", readable, f"{len(s.bad_keys):,}",
                      status if s.ok else f"[red]{status}[/]")
    console.print(table)
    if report.several:
        for dataset in report.dataset_summaries():
            state = "ok" if dataset["ok"] else f"[red]problems, {dataset['bad_samples']:,} bad sample(s)[/]"
            console.print(f"{dataset['path']}: {dataset['shards']:,} shard(s), {dataset['samples']:,} samples, {state}",
                          highlight=False)
    if len(shown) < len(report.shards):
        console.print(f"{len(report.shards) - len(shown)} clean shard(s) not shown")
    for p in report.problems:
        console.print(f"[red]{p.reason}[/]: {p.detail}")
    for line in report.warnings:
        console.print(f"[yellow]warning[/]: {line}", highlight=False)
    notes = [(s, n) for s in report.shards for n in s.notes]
    for s, n in notes[:_LISTED_SAMPLES]:
        console.print(f"[yellow]{n.reason}[/] {report.label(s)} {n.key}: {n.detail}", highlight=False)
    if len(notes) > _LISTED_SAMPLES:
        console.print(f"... {len(notes) - _LISTED_SAMPLES} more notes in --json")
    listed = 0
    for s in report.shards:
        for p in s.problems:
            if listed == _LISTED_SAMPLES:
                console.print("... (all problems are in --json)")
                return
            where = f"{report.label(s)} {p.key}" if p.key is not None else report.label(s)
            console.print(f"[red]{p.reason}[/] {where}: {p.detail}", markup=True, highlight=False)
            listed += 1


@dataclass(frozen=True, kw_only=True)
class VerifyFlags:
    """What ``verify`` checks and what it writes."""

    decode: bool = flag(typer.Option(False, "--decode", help="Also decode every member by its extension (images, videos, audio, npy/npz, pth weights-only, json, text)."))
    require: Optional[str] = flag(typer.Option(None, "--require", help="Comma-separated extensions every sample must have, e.g. jpg,txt."))
    workers: int = flag(typer.Option(4, "--workers", "-w", min=1, help="Shards checked in parallel (processes when decoding)."))
    write_ignore: Optional[str] = flag(typer.Option(None, "--write-ignore", help="Write an ignore index of the bad samples here (local or s3://)."))
    write_counts: bool = flag(typer.Option(False, "--write-counts", help="Rewrite shard_count.json with the readable samples of each shard."))
    counts_output: Optional[str] = flag(typer.Option(None, "--counts-output", help="Write the readable counts here instead (implies --write-counts)."))
    count_file: Optional[str] = flag(typer.Option(None, "--count-file", help="Check this shard-count file instead of PATH/shard_count.json."))


@flag_groups
def verify_cmd(
    paths: list[str] = typer.Argument(..., help="A folder or s3:// prefix of .tar shards, shards, or a brace pattern like 'data/{00000..00099}.tar'."),
    *,
    check: VerifyFlags,
    out: OutputFlags,
) -> None:
    """Check every shard: tar integrity, truncation, duplicate or non-adjacent keys, the key rule, required members,
    and whether shard_count.json and the offset indexes agree; with --decode, decode every member too.

    Example: fgdata verify /data/shards --decode --require jpg,txt --write-ignore /data/shards/ignore.json --write-counts

    The ignore index lists the bad samples and the counts are the samples physically present and readable; loaders subtract the first from the second, so a verified dataset trains without drops.
    Each folder is its own dataset (keys unique within it, its own shard_count.json); with several, rows name shards by path and the ignore index keys them by absolute path.
    Exit code 1 when problems were found.
    """
    from fgdata.jobs.dest import note_output
    from fgdata.verify import verify_dataset, write_counts, write_ignore

    exts = [e for e in (check.require or "").split(",") if e.strip()]
    started = time.perf_counter()
    with progress(enabled=out.bars) as bar:
        task = bar.add_task("verifying", total=None, rate="")

        def tick(_result: object) -> None:
            done = bar.tasks[task].completed + 1
            bar.update(task, advance=1, rate=f"{done / max(time.perf_counter() - started, 1e-9):.1f} shards/s")

        report = verify_dataset(paths, decode=check.decode, require=exts, workers=check.workers,
                                count_file=check.count_file, progress=tick,
                                on_start=lambda n: bar.update(task, total=n))
    say_repeated(report.selection, quiet=out.quiet)
    written: dict[str, str] = {}
    if check.write_ignore:
        write_ignore(report, check.write_ignore)
        note_output(check.write_ignore, "verify")  # written into a job's DST: the job's reruns take it as fgdata's
        written["ignore"] = check.write_ignore
    if check.write_counts or check.counts_output:
        written["counts"] = write_counts(report, check.counts_output)
    if out.json_out:
        doc = report.to_json()
        doc["written"] = written
        print_json(doc)
    else:
        _render(report)
        for what, where in written.items():
            if not out.quiet:
                console.print(f"wrote {what}: {where}")
    if not report.ok:
        err_console.print(f"[red]{report.bad_samples} bad sample(s), {sum(report.by_reason.values())} problem(s)[/]")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("verify")(verify_cmd)
