"""Entry point of the ``fgdata`` command.

Start-up stays light: this module and the command modules import only typer,
rich and the standard library at top level; each command imports the heavy
libraries it needs (torch, av, webdataset, ray) inside its body.
"""

from __future__ import annotations

import importlib
import sys

import typer

from fgdata import __version__
from fgdata.cli.help import FgdataGroup, use_fgdata_help

# Each module defines ``register(app)`` and adds its commands to the app.
COMMAND_MODULES = [
    "fgdata.cli.shards",
    "fgdata.cli.quickstart",
    "fgdata.cli.prepare",
    "fgdata.cli.encode",
    "fgdata.cli.verify",
    "fgdata.cli.report",
    "fgdata.cli.shard",
    "fgdata.cli.fid",
]

app = typer.Typer(
    name="fgdata",
    help="Prepare, shard, precompute, verify and load data for fast diffusion generators.",
    no_args_is_help=True,
    cls=FgdataGroup,
    # --install-completion / --show-completion: Typer's completion for bash, zsh, fish and PowerShell.
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fgdata {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks on errors."),
) -> None:
    """Prepare, shard, precompute, verify and load data for fast diffusion generators."""
    _state["debug"] = debug


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)
use_fgdata_help(app)


def run() -> None:
    """Console-script entry: usage errors exit 2 (click), other errors print one line and exit 1.

    A traceback is shown only with ``--debug``.
    """
    from fgdata.errors import FgdataError

    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
        if _state["debug"] or "--debug" in sys.argv[1:]:
            raise
        text = str(exc).strip()
        message = text.splitlines()[0] if text else type(exc).__name__
        if not isinstance(exc, (FgdataError, OSError)):
            message = f"{type(exc).__name__}: {message}"
        from fgdata.cli.render import printable

        typer.secho(f"error: {printable(message)}", fg="red", err=True)
        sys.exit(1)


if __name__ == "__main__":
    run()
