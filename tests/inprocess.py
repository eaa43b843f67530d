"""``fgdata ARGS`` run in the test's own process, through the console entry (:func:`fgdata.cli.main.run`).

The same exit codes and one-line errors as a fresh ``fgdata`` process (the entry's own error handling runs),
without paying a new interpreter's imports for every call. Use it where a command's parsing, its output or its
exit code is what a test checks; start a real process (``faultkit.FGDATA``) where a signal, a process tree or
what outlives the command is.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path


@contextlib.contextmanager
def _environment(env: Mapping[str, str], cwd: Path | None) -> Iterator[None]:
    """``env`` set and ``cwd`` entered for the call only."""
    saved = {k: os.environ.get(k) for k in env}
    here = os.getcwd()
    os.environ.update(env)
    try:
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(here)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _consoles_sized_now() -> Iterator[None]:
    """fgdata's consoles as a fresh process makes them: as wide as ``COLUMNS`` says now. Rich reads ``COLUMNS``
    once, when a console is made, and the consoles are made by whichever call imported them first (under
    pytest-xdist, another test's, with another width)."""
    from fgdata.cli import render

    consoles = (render.console, render.err_console)
    saved = [c._width for c in consoles]
    columns = os.environ.get("COLUMNS", "")
    for c in consoles:
        c._width = int(columns) if columns.isdigit() else None  # None: measured at each use, 80 off a terminal
    try:
        yield
    finally:
        for c, width in zip(consoles, saved):
            c._width = width


def fgdata(*args: str | Path, env: Mapping[str, str] | None = None,
           cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``fgdata ARGS`` here; stdout, stderr and the exit status come back as from :func:`subprocess.run`."""
    from fgdata.cli import main

    argv = ["fgdata", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    code: int = 0
    # click names the program after ``__main__``'s package (``python -m pytest`` gives "pytest"), else argv[0]:
    # the console script's ``__main__`` has none
    entry = sys.modules["__main__"]
    saved_argv, saved_package, saved_debug = sys.argv, getattr(entry, "__package__", None), dict(main._state)
    try:
        with _environment(env or {}, cwd), _consoles_sized_now(), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            sys.argv, entry.__package__ = argv, None
            try:
                main.run()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv, entry.__package__ = saved_argv, saved_package
        main._state.update(saved_debug)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
