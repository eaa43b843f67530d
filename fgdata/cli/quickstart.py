"""``fgdata quickstart``: the main jobs end to end on the bundled sample media."""

from __future__ import annotations

import typer

from fgdata.cli.render import console


def quickstart_cmd(
    outdir: str = typer.Argument("fgdata-quickstart", help="Where to write the demo outputs."),
) -> None:
    """Shard the bundled photos and clip, count and inspect the shards, load batches, build a dataset zip.

    Example: fgdata quickstart /tmp/fgdata-demo

    Needs no network: it uses the sample media under examples/data.
    """
    from fgdata.quickstart import run_quickstart

    def log(step: str, result: dict) -> None:
        detail = ", ".join(f"{k}={v}" for k, v in result.items())
        console.print(f"[green]✓[/] [bold]{step}[/]: {detail}")

    console.print(f"fgdata quickstart → {outdir}")
    run_quickstart(outdir, log)
    console.print(f"[bold]done.[/] Outputs are under {outdir}; try `fgdata inspect {outdir}/image_shards/00000.tar`.")


def register(app: typer.Typer) -> None:
    app.command("quickstart")(quickstart_cmd)
