"""``fgdata count-shards`` and ``fgdata inspect``: look at shards without training on them."""

from __future__ import annotations

import time
from typing import Optional

import typer

from fgdata.cli.render import console, err_console, human_bytes, print_json, progress


def count_shards_cmd(
    path: str = typer.Argument(..., help="Directory or s3:// prefix holding the .tar shards."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the counts here (local or s3://) instead of PATH/shard_count.json."),
    json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table."),
    workers: int = typer.Option(8, "--workers", "-w", min=1, help="Shards counted in parallel."),
    write: bool = typer.Option(True, "--write/--no-write", help="Write the shard-count file."),
) -> None:
    """Count the samples in every shard, reading tar headers only, and write shard_count.json.

    Example: fgdata count-shards /data/video_shards --workers 16

    Damaged shards are listed with the samples readable before the damage; the exit code is then 1.
    """
    from fgdata import storage
    from fgdata.shards import COUNT_FILE, count_shards, require_shards, write_shard_counts

    shards = require_shards(path)
    started = time.perf_counter()
    with progress(enabled=not json_out and len(shards) > 1) as bar:
        task = bar.add_task("counting", total=len(shards), rate="")

        def tick(_row: object) -> None:
            done = bar.tasks[task].completed + 1
            bar.update(task, advance=1, rate=f"{done / max(time.perf_counter() - started, 1e-9):.0f} shards/s")

        rows = count_shards(path, workers=workers, progress=tick)
    counts = {r.name: r.samples for r in rows}
    target = output or storage.join(path, COUNT_FILE)
    if write:
        write_shard_counts(target, counts)
    damaged = [r for r in rows if r.damage]
    total = sum(counts.values())
    if json_out:
        print_json({
            "path": path,
            "total_samples": total,
            "total_bytes": sum(r.bytes for r in rows),
            "shards": [{"shard": r.name, "samples": r.samples, "bytes": r.bytes, "damage": r.damage} for r in rows],
            "count_file": target if write else None,
        })
    else:
        from rich.table import Table

        table = Table(title=f"{path}", show_footer=True)
        table.add_column("shard", footer="total")
        table.add_column("samples", justify="right", footer=f"{total:,}")
        table.add_column("bytes", justify="right", footer=human_bytes(sum(r.bytes for r in rows)))
        table.add_column("status")
        for r in rows:
            table.add_row(r.name, f"{r.samples:,}", human_bytes(r.bytes), f"[red]damaged: {r.damage}[/]" if r.damage else "ok")
        console.print(table)
        if write:
            console.print(f"wrote {target}")
    if damaged:
        err_console.print(f"[red]{len(damaged)} damaged shard(s)[/]")
        raise typer.Exit(1)


def inspect_cmd(
    shard: str = typer.Argument(..., help="A .tar shard, local or s3://."),
    limit: int = typer.Option(5, "--limit", "-n", min=0, help="How many samples to show."),
    key: Optional[str] = typer.Option(None, "--key", "-k", help="Show only this sample, in full."),
    json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    preview: Optional[str] = typer.Option(None, "--preview", help="Write a contact sheet PNG of the images and first video frames."),
) -> None:
    """Show what a shard holds: samples, extension sets, bytes per extension and decoded members.

    Example: fgdata inspect /data/shards/00000.tar --limit 3 --preview sheet.png
    """
    from fgdata.shards.inspect import inspect_shard, write_preview

    report, samples = inspect_shard(shard, limit=limit, key=key)
    tiles = write_preview(samples, preview) if preview else 0
    if json_out:
        doc = report.to_json()
        if preview:
            doc["preview"] = {"path": preview, "tiles": tiles}
        print_json(doc)
    else:
        _render_report(report)
        if preview:
            console.print(f"wrote preview {preview} ({tiles} tiles)")
    if report.damage:
        err_console.print(f"[red]{shard}: damaged after {report.samples} readable samples ({report.damage})[/]")
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
