"""Shared rich rendering for the commands: consoles, progress bars, JSON output."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console

from fgdata.formatting import human_bytes, terminal_safe

__all__ = ["console", "err_console", "human_bytes", "phase_progress", "print_json", "printable", "progress",
           "terminal_safe", "wrap_tokens"]

if TYPE_CHECKING:
    from rich.progress import Progress
    from rich.text import Text


def printable(text: str) -> str:
    """``text`` as fgdata prints it: the credentials of every URL in it redacted
    (:func:`fgdata.storage.redact_text`), then :func:`terminal_safe`."""
    if "://" in text:
        from fgdata.storage.redact import redact_text  # imported on the first URL: --help stays fast

        text = redact_text(text)
    return terminal_safe(text)


class SafeConsole(Console):
    """A console that prints every string through :func:`printable`: whatever a command prints (table cells and
    titles, messages), a key or file name from the data cannot send the terminal a control sequence, and a URL
    never shows its credentials. Rich turns every ``str`` into text here, before measuring it, so tables stay
    aligned."""

    def render_str(self, text: str, **kwargs: Any) -> "Text":
        return super().render_str(printable(text), **kwargs)


console = SafeConsole()
err_console = SafeConsole(stderr=True)


def print_json(doc: Any) -> None:
    """Machine-readable output on stdout, nothing else (the credentials of its URLs redacted)."""
    text = json.dumps(doc, indent=1, default=str)
    if "://" in text:
        from fgdata.storage.redact import redact_text

        text = redact_text(text)
    sys.stdout.write(text + "\n")


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


@contextmanager
def phase_progress(*, enabled: bool = True) -> Iterator[Callable[[str, int, int], None]]:
    """``update(phase, done, total)`` for library jobs that report phases: one bar per phase, items/s (MiB/s
    for the download and unzip phases) and ETA; with ``enabled`` False nothing is drawn."""
    with progress(enabled=enabled) as bar:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total or None, rate="")
            speed = bar.tasks[tasks[phase]].speed
            in_bytes = phase in ("download", "unzip")
            rate = "" if not speed else f"{speed / 2**20:.1f} MiB/s" if in_bytes else f"{speed:.0f} img/s"
            bar.update(tasks[phase], completed=done, total=total or None, rate=rate)

        yield update


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
