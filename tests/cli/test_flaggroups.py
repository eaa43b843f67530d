"""Flag groups: a command takes frozen dataclasses of options; Typer sees one option per field."""

from __future__ import annotations

import inspect
from dataclasses import FrozenInstanceError, dataclass
from typing import Optional

import pytest
import typer
from typer.testing import CliRunner

from fgdata.cli import options
from fgdata.cli.flaggroups import flag, flag_groups
from fgdata.cli.options import JobFlags, OutputFlags

LEVEL = typer.Option(3, "--level", "-l", min=1, help="How hard to try.")


@dataclass(frozen=True, kw_only=True)
class TryFlags:
    name: str = flag(typer.Option(..., "--name", help="Required."))
    level: int = flag(LEVEL)
    tags: list[str] = flag(typer.Option([], "--tag", help="Repeatable."))
    note: Optional[str] = flag(typer.Option(None, "--note"))


@dataclass(frozen=True, kw_only=True)
class Clash:
    quiet: bool = flag(typer.Option(False, "--silent"))


@dataclass(frozen=True, kw_only=True)
class Loose:
    level: int = 3


def _app() -> tuple[typer.Typer, list]:
    app = typer.Typer()
    seen: list = []

    @app.command()
    @flag_groups
    def run(src: str = typer.Argument(..., help="Input."), *, tries: TryFlags, job: JobFlags,
            out: OutputFlags) -> None:
        """Run."""
        seen.append((src, tries, job, out))

    @app.command()
    def other() -> None:  # a second command, so that "run" is a subcommand
        """Other."""

    return app, seen


def test_groups_expand_into_typer_options_in_order():
    app, _ = _app()
    run = app.registered_commands[0].callback
    params = inspect.signature(run).parameters
    assert list(params) == ["src", "name", "level", "tags", "note", "resume", "overwrite", "progress", "quiet",
                            "json_out"]
    # the Typer-facing default is the one typer.Option object, so shared flags stay one definition
    assert params["level"].default is LEVEL and params["resume"].default is options.RESUME
    assert params["quiet"].default is options.QUIET and params["src"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    assert [(p.name, p.opts, p.secondary_opts) for p in command.params] == [
        ("src", ["src"], []), ("name", ["--name"], []), ("level", ["--level", "-l"], []), ("tags", ["--tag"], []),
        ("note", ["--note"], []), ("resume", ["--resume"], ["--no-resume"]), ("overwrite", ["--overwrite"], []),
        ("progress", ["--progress"], ["--no-progress"]), ("quiet", ["--quiet", "-q"], []),
        ("json_out", ["--json"], [])]


def test_values_are_regrouped_into_the_dataclasses():
    app, seen = _app()
    result = CliRunner().invoke(app, ["run", "in.txt", "--name", "x", "-l", "5", "--tag", "a", "--tag", "b",
                                      "--no-resume", "-q", "--json"])
    assert result.exit_code == 0, result.output
    [(src, tries, job, out)] = seen
    assert src == "in.txt"
    assert tries == TryFlags(name="x", level=5, tags=["a", "b"], note=None)
    assert job == JobFlags(resume=False, overwrite=False)
    assert out == OutputFlags(progress=None, quiet=True, json_out=True) and not out.bars
    with pytest.raises(FrozenInstanceError):
        tries.level = 1  # type: ignore[misc]


def test_defaults_and_usage_errors_are_typers():
    app, seen = _app()
    assert CliRunner().invoke(app, ["run", "in.txt", "--name", "x"]).exit_code == 0
    assert seen[0][1] == TryFlags(name="x") and seen[0][2] == JobFlags() and seen[0][3] == OutputFlags()
    missing = CliRunner().invoke(app, ["run", "in.txt"])
    assert missing.exit_code == 2 and "--name" in missing.output
    low = CliRunner().invoke(app, ["run", "in.txt", "--name", "x", "--level", "0"])
    assert low.exit_code == 2 and "--level" in low.output
    assert len(seen) == 1


def test_a_fresh_list_per_group():
    assert TryFlags(name="a").tags == [] and TryFlags(name="a").tags is not TryFlags(name="b").tags


def test_duplicate_field_names_are_refused():
    def cmd(*, clash: Clash, out: OutputFlags) -> None: ...

    with pytest.raises(TypeError, match="'quiet' of OutputFlags is also in Clash"):
        flag_groups(cmd)

    def plain(name: str = typer.Option("x", "--name"), *, tries: TryFlags) -> None: ...

    with pytest.raises(TypeError, match="'name' of TryFlags is also in plain's own parameters"):
        flag_groups(plain)


def test_fields_must_be_declared_with_flag():
    def cmd(*, loose: Loose) -> None: ...

    with pytest.raises(TypeError, match="Loose.level is not declared with flag"):
        flag_groups(cmd)
