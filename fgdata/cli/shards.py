"""``fgdata count-shards`` and ``fgdata inspect``: look at shards without training on them."""

from __future__ import annotations

import time
from typing import Any, Optional

import typer

from fgdata.cli.options import JSON, PROGRESS, QUIET, show_progress
from fgdata.cli.render import console, err_console, human_bytes, print_json, progress, wrap_tokens
from fgdata.report.format import dtype_shape, number


def count_shards_cmd(
    paths: list[str] = typer.Argument(..., help="A folder or s3:// prefix of .tar shards, shards, or a brace pattern like 'data/{00000..00099}.tar'."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the counts here (local or s3://) instead of shard_count.json beside the shards."),
    workers: int = typer.Option(8, "--workers", "-w", min=1, help="Shards counted in parallel."),
    write: bool = typer.Option(True, "--write/--no-write", help="Write the shard-count file."),
    json_out: bool = JSON,
    progress_flag: Optional[bool] = PROGRESS,
    quiet: bool = QUIET,
) -> None:
    """Count the samples in every shard, reading tar headers only, and write shard_count.json.

    Example: fgdata count-shards /data/video_shards --workers 16

    A whole folder's count file lists exactly its shards; counting single shards or a pattern
    updates their entries and keeps the others. Damaged shards count the samples readable before
    the damage; a shard that cannot be read gets no new count (its old entry is kept). Either way
    the exit code is then 1.
    """
    from fgdata.shards import count_shards, resolve_shards, write_counts

    selection = resolve_shards(paths)
    shards = selection.shards
    started = time.perf_counter()
    with progress(enabled=show_progress(progress_flag, quiet=quiet, json_out=json_out) and len(shards) > 1) as bar:
        task = bar.add_task("counting", total=len(shards), rate="")

        def tick(_row: object) -> None:
            done = bar.tasks[task].completed + 1
            bar.update(task, advance=1, rate=f"{done / max(time.perf_counter() - started, 1e-9):.0f} shards/s")

        rows = count_shards(selection, workers=workers, progress=tick)
    updates = write_counts(rows, selection, output) if write else []
    damaged = [r for r in rows if r.damage]
    unreadable = [r for r in rows if r.error]
    total = sum(r.samples for r in rows if not r.error)
    label = " ".join(paths)
    if json_out:
        print_json({
            "path": label,
            "total_samples": total,
            "total_bytes": sum(r.bytes for r in rows),
            "shards": [{"shard": r.name, "path": r.shard, "samples": None if r.error else r.samples, "bytes": r.bytes,
                        "damage": r.damage, "error": r.error} for r in rows],
            "count_files": [{"path": u.path, "kept": u.kept, "uncounted": u.uncounted} for u in updates],
        })
    else:
        from rich.table import Table

        table = Table(title=label, show_footer=True)
        table.add_column("shard", footer="total")
        table.add_column("samples", justify="right", footer=f"{total:,}")
        table.add_column("bytes", justify="right", footer=human_bytes(sum(r.bytes for r in rows)))
        table.add_column("status")
        for r in rows:
            status = f"[red]unreadable: {r.error}[/]" if r.error else f"[red]damaged: {r.damage}[/]" if r.damage else "ok"
            table.add_row(r.name, "?" if r.error else f"{r.samples:,}", human_bytes(r.bytes), status)
        console.print(table)
        for u in updates:
            if not quiet:
                console.print(f"wrote {u.path}")
    for u in updates:
        for name, n in u.kept.items():
            err_console.print(f"[red]{name}: could not be read; {u.path} keeps its old count ({n:,})[/]")
        for name in u.uncounted:
            err_console.print(f"[red]{name}: could not be read; {u.path} has no count for it[/]")
    if damaged or unreadable:
        err_console.print(f"[red]{len(damaged)} damaged and {len(unreadable)} unreadable shard(s)[/]")
        raise typer.Exit(1)


def inspect_cmd(
    paths: list[str] = typer.Argument(..., help="A .tar shard (local or s3://), several, a folder, or a brace pattern."),
    limit: int = typer.Option(5, "--limit", "-n", min=0, help="How many samples to show (across all shards)."),
    key: Optional[str] = typer.Option(None, "--key", "-k", help="Show only this sample, in full."),
    preview: Optional[str] = typer.Option(None, "--preview", help="Write a contact sheet PNG of the images and first video frames."),
    json_out: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Show what a shard holds: samples, extension sets, bytes per extension and decoded members.

    Example: fgdata inspect /data/shards/00000.tar --limit 3 --preview sheet.png

    Members over 64 MiB are summarised from their headers, never loaded whole.
    """
    from fgdata.verify.inspect import inspect_shards, write_preview

    reports, tiles = inspect_shards(paths, limit=limit, key=key, preview=preview is not None)
    drawn = write_preview(tiles, preview) if preview else 0
    if json_out:
        doc: dict[str, Any] = reports[0].to_json() if len(reports) == 1 else {"shards": [r.to_json() for r in reports]}
        if preview:
            doc["preview"] = {"path": preview, "tiles": drawn}
        print_json(doc)
    else:
        for report in reports:
            _render_report(report)
        if preview and not quiet:
            console.print(f"wrote preview {preview} ({drawn} tiles)")
    damaged = [r for r in reports if r.damage]
    for report in damaged:
        err_console.print(f"[red]{report.shard}: damaged after {report.samples} readable samples ({report.damage})[/]")
    if damaged:
        raise typer.Exit(1)


def _render_report(report) -> None:
    from rich.table import Table

    console.print(f"[bold]{report.shard}[/]: {report.samples:,} samples")
    sets = Table(title="extension sets")
    sets.add_column("extensions")
    sets.add_column("samples", justify="right")
    for exts, n in report.ext_sets.items():
        sets.add_row(exts, f"{n:,}")
    console.print(sets)
    sizes = Table(title="bytes per extension")
    sizes.add_column("extension")
    sizes.add_column("bytes", justify="right")
    for ext, n in report.bytes_per_ext.items():
        sizes.add_row(ext, human_bytes(n))
    console.print(sizes)
    samples = Table(title="samples")
    samples.add_column("key")
    samples.add_column("member")
    samples.add_column("bytes", justify="right")
    samples.add_column("summary", overflow="fold")
    for s in report.shown:
        for i, (ext, summary) in enumerate(s["members"].items()):
            detail = {k: v for k, v in summary.items() if k != "bytes"}
            samples.add_row(s["key"] if i == 0 else "", ext, human_bytes(summary["bytes"]), _one_line(detail))
    console.print(samples)


def _one_line(detail: dict) -> str:
    parts = []
    for k, v in detail.items():
        if isinstance(v, dict):
            v = "{" + ", ".join(f"{a}={b}" for a, b in v.items()) + "}"
        elif isinstance(v, float):
            v = f"{v:.4g}"
        elif isinstance(v, list) and len(v) > 8:
            v = f"[{len(v)} values]"
        parts.append(f"{k}={v}")
    return " ".join(parts)


def register(app: typer.Typer) -> None:
    app.command("count-shards")(count_shards_cmd)
    app.command("inspect")(inspect_cmd)
