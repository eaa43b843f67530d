"""One CLI: the shared flags have one definition each, `--help` reads well at 80 columns, completion works."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fgdata.cli import options
from fgdata.cli.main import app
from inprocess import fgdata

FGDATA = str(Path(sys.executable).with_name("fgdata"))
READ_COMMANDS = {("count-shards",), ("inspect",), ("verify",), ("quickstart",)}
LONG_READS = {("count-shards",), ("verify",), ("quickstart",)}
WRITE_COMMANDS = {("shard", "images"), ("shard", "videos"), ("shard", "prompts"), ("encode", "latents"),
                  ("encode", "text"), ("kd", "pairs"), ("kd", "paths"), ("prepare",)}


def _commands(group: typer.Typer, prefix: tuple[str, ...] = ()):
    """(path, callback) of every command, recursively."""
    for info in group.registered_commands:
        yield prefix + (info.name or info.callback.__name__.replace("_", "-"),), info.callback
    for sub in group.registered_groups:
        yield from _commands(sub.typer_instance, prefix + (sub.name,))


COMMANDS = dict(_commands(app))


def _flags(callback) -> dict[str, object]:
    """Flag spelling -> the parameter default object that declares it."""
    out = {}
    for p in inspect.signature(callback).parameters.values():
        for decl in getattr(p.default, "param_decls", None) or ():
            for spelling in decl.split("/"):
                out[spelling.strip()] = p.default
    return out


def _help(*name: str) -> str:
    """The help page as the console entry prints it (in this process: the page is what is tested)."""
    out = fgdata(*name, "--help", env={"COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"})
    assert out.returncode == 0, (name, out.stderr)
    return out.stdout


def test_the_command_lists_cover_the_cli():
    assert READ_COMMANDS | WRITE_COMMANDS <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS), ids=" ".join)
def test_shared_flags_come_from_options_module(name):
    """A command that has --json, --progress, -q, --resume or --overwrite uses options.py's object, so the
    spelling, default and help text are the same everywhere."""
    flags = _flags(COMMANDS[name])
    for spelling, shared in options.SHARED.items():
        if spelling in flags:
            assert flags[spelling] is shared, f"fgdata {' '.join(name)}: {spelling} is defined again"
    # spellings of the shared flags are not reused for something else (e.g. a private -q)
    for spelling, default in flags.items():
        if spelling in ("-q", "--no-progress", "--no-resume"):
            assert default in options.SHARED.values(), f"fgdata {' '.join(name)}: {spelling} is defined again"


@pytest.mark.parametrize("name", sorted(READ_COMMANDS), ids=" ".join)
def test_reading_commands_have_json_quiet_and_progress(name):
    flags = _flags(COMMANDS[name])
    assert flags.get("--json") is options.JSON and flags.get("-q") is options.QUIET
    if name in LONG_READS:
        assert flags.get("--progress") is options.PROGRESS


@pytest.mark.parametrize("name", sorted(WRITE_COMMANDS), ids=" ".join)
def test_writing_commands_resume_and_overwrite(name):
    flags = _flags(COMMANDS[name])
    missing = [s for s in ("--progress", "-q", "--json", "--resume", "--overwrite") if s not in flags]
    assert not missing, f"fgdata {' '.join(name)} lacks {missing}"


def test_shared_help_text_is_identical_in_every_help_page():
    """The rendered help shows the one help text (whitespace aside) wherever the flag appears."""
    texts = {s: " ".join(o.help.split()) for s, o in options.SHARED.items()}
    for name, callback in COMMANDS.items():
        flags = _flags(callback)
        if not any(s in flags for s in texts):
            continue
        page = " ".join(_help(*name).split())
        for spelling, text in texts.items():
            if spelling in flags:
                assert text in page, (name, spelling)


def test_progress_is_off_when_stderr_is_not_a_terminal():
    assert options.show_progress(None) is False  # pytest captures stderr: not a terminal
    assert options.show_progress(True) is True
    assert options.show_progress(True, quiet=True) is False
    assert options.show_progress(True, json_out=True) is False


@pytest.mark.parametrize("name", [(), *sorted(COMMANDS)], ids=lambda n: " ".join(n) or "fgdata")
def test_help_reads_well_at_80_columns(name):
    page = _help(*name)
    lines = page.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert not re.search(r"<(bool|str|int|float|int range|float range|Path)>", page)
    usage = lines[0]
    assert usage.startswith(f"Usage: fgdata {' '.join(name)}".rstrip()) and "{" not in usage
    for word in usage.split()[2 + len(name):]:
        assert word in ("[OPTIONS]", "COMMAND", "[ARGS]...") or word.strip("[].").isupper(), usage
    # option descriptions start in one column, at most 30 characters in, so they get 50 of 80
    in_options, starts = False, set()
    for line in lines:
        if line in ("Options", "Arguments", "Commands"):
            in_options = True
            continue
        if in_options and not line.strip():
            in_options = False
        if in_options and line.startswith("  ") and not line.startswith("   "):
            m = re.match(r"  (\S+(?: / \S+|, \S+| [A-Z\[]\S*)*)( {2,})(\S)", line)
            if m:
                starts.add(m.start(3))
    assert all(s <= 30 for s in starts), (name, starts)


def test_argument_errors_name_arguments_in_upper_case():
    out = subprocess.run([FGDATA, "verify"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "'PATH'" in out.stderr and "Usage: fgdata verify [OPTIONS] PATH..." in out.stderr


def test_shell_completion():
    script = subprocess.run([FGDATA, "--show-completion", "bash"], capture_output=True, text=True, timeout=60)
    assert script.returncode == 0 and "_FGDATA_COMPLETE" in script.stdout
    env = {**os.environ, "_FGDATA_COMPLETE": "complete_bash", "COMP_WORDS": "fgdata count", "COMP_CWORD": "1"}
    out = subprocess.run([FGDATA], capture_output=True, text=True, timeout=60, env=env)
    assert out.stdout.split() == ["count-shards"]
    env.update(COMP_WORDS="fgdata verify --no-", COMP_CWORD="2")
    out = subprocess.run([FGDATA], capture_output=True, text=True, timeout=60, env=env)
    assert "--no-progress" in out.stdout.split()


def test_in_process_help_matches():
    """CliRunner (what other tests use) renders through the same classes."""
    result = CliRunner().invoke(app, ["count-shards", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0 and "Usage: fgdata count-shards [OPTIONS] PATH" in result.output
