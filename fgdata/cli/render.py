"""Shared rich rendering for the commands: consoles, progress bars, JSON output."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console

from fgdata.report.format import human_bytes

__all__ = ["console", "err_console", "human_bytes", "print_json", "progress", "wrap_tokens"]

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


def wrap_tokens(tokens: list[str], width: int) -> list[str]:
    """Pack tokens into lines of at most ``width`` characters, two spaces apart, never splitting a token;
    a token longer than a line is cut with an ellipsis."""
    lines: list[str] = []
    line = ""
    for token in tokens:
        if len(token) > width:
            token = token[: max(width - 1, 1)] + "…"
        if line and len(line) + 2 + len(token) > width:
            lines.append(line)
            line = ""
        line = f"{line}  {token}" if line else token
    if line:
        lines.append(line)
    return lines
