"""Shared rich rendering for the commands: consoles, progress bars, JSON output."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress

console = Console()
err_console = Console(stderr=True)


def print_json(doc: Any) -> None:
    """Machine-readable output on stdout, nothing else."""
    sys.stdout.write(json.dumps(doc, indent=1, default=str) + "\n")


def progress(*, enabled: bool = True) -> "Progress":
    """A progress bar on stderr with rate and ETA; disabled bars draw nothing."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        disable=not enabled,
        transient=False,
    )


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"
