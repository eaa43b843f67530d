"""Every command documents itself: `--help` works everywhere and shows an example."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from fgdata.cli.main import app


def _commands(group: typer.Typer, prefix: tuple[str, ...] = ()):
    for info in group.registered_commands:
        yield prefix + (info.name or info.callback.__name__.replace("_", "-"),)
    for sub in group.registered_groups:
        yield from _commands(sub.typer_instance, prefix + (sub.name,))


def test_every_command_has_help_with_an_example():
    runner = CliRunner()
    names = list(_commands(app))
    assert len(names) >= 2
    for name in names:
        result = runner.invoke(app, [*name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "Example" in result.output, f"`fgdata {' '.join(name)} --help` shows no example"
