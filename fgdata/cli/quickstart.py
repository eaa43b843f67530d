"""``fgdata quickstart``: the main jobs end to end on the bundled sample media."""

from __future__ import annotations

import os
import shutil
import time

import typer

from fgdata.cli.options import (
    JSON,
    OVERWRITE,
    PROGRESS,
    QUIET,
    say_removed,
    show_progress,
)
from fgdata.cli.render import console, err_console, print_json, progress


def quickstart_cmd(
    outdir: str | None = typer.Argument(
        None, show_default=False, help="Where to write the demo outputs (default: a new folder in the system temp folder)."),
    overwrite: bool = OVERWRITE,
    json_out: bool = JSON,
    progress_flag: bool | None = PROGRESS,
    quiet: bool = QUIET,
) -> None:
    """Shard the bundled photos and clip, count, inspect and load them, build a dataset zip and a report.

    Example: fgdata quickstart /tmp/fgdata-demo

    Needs no network: it uses the sample media that ships inside the package. Ends with a table of what each step did and
    the paths of the contact sheet and the report page it wrote.
    """
    from fgdata.errors import FgdataError
    from fgdata.quickstart import default_outdir, existing_outputs, steps

    if outdir is None:
        outdir = default_outdir()
    else:
        stale = existing_outputs(outdir)
        if stale and not overwrite:
            raise FgdataError(f"{outdir}: holds the outputs of an earlier quickstart ({', '.join(stale)}); "
                              "pass --overwrite to replace them")
        for path in say_removed(stale, quiet=quiet):
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    plan = steps(outdir)
    results: dict[str, dict] = {}
    rows: list[tuple[str, str, float]] = []
    bars = show_progress(progress_flag, quiet=quiet, json_out=json_out)
    if not (quiet or json_out):
        err_console.print(f"fgdata quickstart → {outdir}", highlight=False)
    with progress(enabled=bars) as bar:
        task = bar.add_task("quickstart", total=len(plan), rate="")
        for step in plan:
            bar.update(task, description=step.name)
            started = time.perf_counter()
            result, summary = step.run()
            seconds = time.perf_counter() - started
            results[step.name] = {**result, "seconds": round(seconds, 3)}
            rows.append((step.name, summary, seconds))
            bar.advance(task)
            if not (bars or quiet or json_out):
                err_console.print(f"[green]✓[/] {step.name} ({seconds:.1f} s)", highlight=False)
    if json_out:
        print_json({"outdir": outdir, "steps": results})
        return
    from rich.table import Table

    table = Table(title=f"fgdata quickstart → {outdir}", title_justify="left")
    table.add_column("step", style="bold", no_wrap=True)
    table.add_column("result")
    table.add_column("time", justify="right", no_wrap=True)
    for name, summary, seconds in rows:
        table.add_row(name, summary, f"{seconds:.1f} s")
    console.print(table)
    console.print(f"outputs:       {outdir}", highlight=False, soft_wrap=True)
    console.print(f"contact sheet: {results['report']['contact_sheet']}", highlight=False, soft_wrap=True)
    console.print(f"report:        {results['report']['html']}", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("quickstart")(quickstart_cmd)
