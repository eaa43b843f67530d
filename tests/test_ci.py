"""CI runs the README's test command, so the figure the README gives for it is what CI measures."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    """The arguments after ``.venv/bin/python`` in the README's set-up line that runs the whole suite."""
    [line] = [ln for ln in (REPO / "README.md").read_text().splitlines()
              if ".[all,test]" in ln and "-m pytest" in ln]
    return line.split(".venv/bin/python ", 2)[-1].strip()


def test_ci_runs_the_readme_test_command():
    command = _readme_test_command()
    assert command.startswith("-m pytest -q"), command
    runs = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines() if "-m pytest" in ln]
    assert runs == [f'"$venv/bin/python" {command}'], runs


def test_the_test_extra_installs_what_the_command_needs():
    """``-n`` is pytest-xdist's option: a fresh clone's install must bring it."""
    [extra] = [ln for ln in (REPO / "pyproject.toml").read_text().splitlines() if ln.startswith("test = [")]
    if re.search(r"(^|\s)-n\s", _readme_test_command()):
        assert '"pytest-xdist' in extra, extra
