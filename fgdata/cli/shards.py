"""``fgdata count-shards`` and ``fgdata inspect``: look at shards without training on them."""

from __future__ import annotations

import time
from typing import Any, Optional

import typer

from fgdata.cli.options import JSON, PROGRESS, QUIET, say_repeated, show_progress
from fgdata.cli.render import console, err_console, human_bytes, print_json, progress, wrap_tokens
from fgdata.formatting import dtype_shape, number


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

    Each folder is its own dataset: a folder given whole gets a count file that lists exactly its
    shards; counting single shards or a pattern updates their entries and keeps the others. Damaged shards count the samples readable before
    the damage; a shard that cannot be read gets no new count (its old entry is kept). Either way
    the exit code is then 1.
    """
    from fgdata.jobs.executor import thread_map
    from fgdata.shards import count_shards, resolve_shards, write_counts

    selection = resolve_shards(paths)
    say_repeated(selection, quiet=quiet)
    shards = selection.shards
    started = time.perf_counter()
    with progress(enabled=show_progress(progress_flag, quiet=quiet, json_out=json_out) and len(shards) > 1) as bar:
        task = bar.add_task("counting", total=len(shards), rate="")

        def tick(_row: object) -> None:
            done = bar.tasks[task].completed + 1
            bar.update(task, advance=1, rate=f"{done / max(time.perf_counter() - started, 1e-9):.0f} shards/s")

        rows = count_shards(selection, pool=thread_map(workers), progress=tick)
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
            "datasets": [{"path": folder, "shards": len(members),
                          "samples": sum(r.samples for r in rows if r.shard in members and not r.error)}
                         for folder, members in ((f, set(m)) for f, m in selection.datasets.items())],
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
            table.add_row(selection.label(r.shard), "?" if r.error else f"{r.samples:,}", human_bytes(r.bytes), status)
        console.print(table)
        for u in updates:
            if not quiet:
                console.print(f"wrote {u.path}")
    for u in updates:  # u.path names the dataset's count file
        for name, n in u.kept.items():
            err_console.print(f"[red]{name}: could not be read; {u.path} keeps its old count ({n:,})[/]", highlight=False)
        for name in u.uncounted:
            err_console.print(f"[red]{name}: could not be read; {u.path} has no count for it[/]", highlight=False)
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

    Several shards (a folder, a pattern) read as one: their extension sets and bytes summed, and the first --limit
    samples of them all, each with its shard.

    Members over 64 MiB are summarised from their headers, never loaded whole.
    """
    from fgdata.verify.inspect import combine, inspect_shards, score_records

    reports, tiles = inspect_shards(paths, limit=limit, key=key, preview=preview is not None)
    scores = score_records([r.shard for r in reports])
    drawn = 0
    if preview:
        from fgdata.report.build import write_contact_sheet

        drawn = write_contact_sheet(tiles, preview)
    if json_out:
        doc: dict[str, Any] = reports[0].to_json()
        if len(reports) > 1:
            whole = combine(reports).to_json()
            doc = {"shards": [r.to_json() for r in reports], "total_samples": whole["samples"],
                   **{k: whole[k] for k in ("extension_sets", "bytes_per_extension", "samples_shown")}}
        if preview:
            doc["preview"] = {"path": preview, "tiles": drawn}
        if scores:
            doc["scores"] = scores
        print_json(doc)
    else:
        _render_report(reports[0] if len(reports) == 1 else combine(reports))
        _render_scores(scores)
        if preview and not quiet:
            console.print(f"wrote preview {preview} ({drawn} tiles)")
    damaged = [r for r in reports if r.damage]
    for report in damaged:
        err_console.print(f"[red]{report.shard}: damaged after {report.samples} readable samples ({report.damage})[/]")
    if damaged:
        raise typer.Exit(1)


def _per_file(value: Any, cut: int | None) -> str:
    """A model record's value: null (weight-free), one string, or one per file (model signals: the CLIP and a head)."""
    if not value:
        return "-"
    if isinstance(value, dict):
        return "\n".join(f"{k}: {str(v)[:cut]}" for k, v in value.items())
    return str(value)[:cut]


def _render_scores(scores: dict[str, dict[str, Any]]) -> None:
    """What each score of each folder is (FOLDER/scores.json): fields, model and its sha256, preprocessing, scale."""
    from rich.table import Table

    for folder, signals in scores.items():
        table = Table(title=f"scores ({folder})")
        for column in ("signal", "fields", "model", "sha256", "preprocessing", "scale"):
            table.add_column(column)
        for name, info in signals.items():
            table.add_row(name, ", ".join(info.get("fields", [])), _per_file(info.get("model"), None),
                          _per_file(info.get("model_sha256"), 16), str(info.get("preprocessing", "")),
                          str(info.get("scale", "")))
        console.print(table)


def _render_report(report) -> None:
    from rich.markup import escape
    from rich.table import Table

    console.print(f"[bold]{report.shard}[/]: {report.samples:,} samples", highlight=False, soft_wrap=True)
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
    if not report.shown:
        return
    # One block per sample; each member on a line of its own, facts wrapped whole under the summary column.
    member_w = max(len(ext) for s in report.shown for ext in s["members"])
    indent = 2 + member_w + 2 + 9 + 2
    width = max(console.width - indent, 24)
    console.print("[bold]samples[/]")
    for s in report.shown:
        where = f"[dim]{escape(s['shard'])}[/] " if "shard" in s else ""
        console.print(f"{where}[bold cyan]{s['key']}[/]", highlight=False, soft_wrap=True)
        for ext, summary in s["members"].items():
            lines = wrap_tokens(_facts(summary), width) or [""]
            head = f"  {ext:<{member_w}}  {human_bytes(summary['bytes']):>9}  "
            console.print(head + lines[0], highlight=False, markup=False, soft_wrap=True)
            for line in lines[1:]:
                console.print(" " * indent + line, highlight=False, markup=False, soft_wrap=True)


def _tensor_facts(t: Any, name: str = "") -> list[str]:
    """``float32[3,17,29]  min -4.603  max 3.676  mean 0.003121`` for a tensor summary, recursively."""
    prefix = f"{name}: " if name else ""
    if isinstance(t, dict) and "dtype" in t and "shape" in t:
        facts = [prefix + dtype_shape(t["dtype"], t["shape"])]
        return facts + [f"{k} {number(t[k])}" for k in ("min", "max", "mean") if k in t]
    if isinstance(t, dict):
        return [f for k, v in t.items() for f in _tensor_facts(v, f"{name}.{k}" if name else str(k))]
    if isinstance(t, list):
        return [f for i, v in enumerate(t) for f in _tensor_facts(v, f"{name}[{i}]")]
    return [f"{prefix}{t}"]


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _facts(summary: dict) -> list[str]:
    """What ``fgdata inspect`` says about one member, as short tokens that are never split across lines."""
    s = {k: v for k, v in summary.items() if k not in ("bytes", "not_loaded")}
    note = [f"(not loaded: {summary['not_loaded']})"] if "not_loaded" in summary else []
    if "error" in s:
        return [f"error: {s['error']}", *note]
    return ((_member_facts(s) if s else []) + note) or ["–"]


def _member_facts(s: dict) -> list[str]:
    if "tensor" in s:
        return _tensor_facts(s["tensor"])
    if "codec" in s:  # a video probe
        facts = [f"{s['codec']} {s['width']}×{s['height']}", f"{number(float(s['duration']))} s",
                 f"{number(float(s['fps']))} fps", _count(s["frame_count"], "frame"),
                 _count(len(s.get("keyframe_times") or []), "keyframe")]
        if s.get("rotation"):
            facts.append(f"rotated {s['rotation']}°")
        if s.get("audio_codec"):
            facts.append(f"audio {s['audio_codec']} {number((s.get('audio_sample_rate') or 0) / 1000)} kHz "
                         f"{s.get('audio_channels')} ch")
        else:
            facts.append("no audio")
        return facts
    if "format" in s and "width" in s:  # an image header
        return [f"{s['format']} {s['width']}×{s['height']}", str(s.get("mode", ""))]
    if "chars" in s:
        text = " ".join(str(s.get("text", "")).split())
        more = "…" if s["chars"] > len(s.get("text", "")) else ""
        return [_count(s["chars"], "char"), f'"{text}{more}"']
    if "keys" in s:
        return [f"keys: {', '.join(s['keys'])}" if s["keys"] else "no keys"]
    return [f"{k} {number(v) if isinstance(v, (int, float)) else v}" for k, v in s.items()]


def register(app: typer.Typer) -> None:
    app.command("count-shards")(count_shards_cmd)
    app.command("inspect")(inspect_cmd)
