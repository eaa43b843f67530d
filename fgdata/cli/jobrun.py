"""What every writing command does around its library call: the interrupt line and exit code, notices."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import typer

from fgdata.cli.render import err_console

T = TypeVar("T")


def notify(line: str) -> None:
    """Library notices (what is about to be deleted) go to stderr, one line each."""
    err_console.print(line, highlight=False, markup=False, soft_wrap=True)


def run_job(call: Callable[[], T]) -> T:
    """Run a job; on SIGINT/SIGTERM print how to continue and exit 130/143 (the job left only complete outputs)."""
    from fgdata.jobs.signals import Interrupted

    try:
        return call()
    except Interrupted as stop:
        err_console.print(stop.line(), highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(stop.exit_code) from None
