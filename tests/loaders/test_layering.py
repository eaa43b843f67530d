"""The writing side (prepare, encode) and the reading side (loaders, configs) never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import fgdata

ROOT = Path(fgdata.__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def offenders(packages: list[str], forbidden: str) -> list[str]:
    out = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            bad = sorted(m for m in imported_modules(path) if m == forbidden or m.startswith(forbidden + "."))
            out += [f"{path.relative_to(ROOT)} imports {m}" for m in bad]
    return out


def test_prepare_and_encode_do_not_import_the_loaders():
    assert offenders(["prepare", "encode"], "fgdata.loaders") == []


def test_configs_do_not_import_prepare():
    assert offenders(["configs"], "fgdata.prepare") == []


def test_preset_texts_are_one_object_on_both_sides():
    from fgdata.catalog import PRESET_CONSTANTS
    from fgdata.encode.text import neg_prompt_text
    from fgdata.loaders import PRESET_CONSTANTS as loader_presets

    assert loader_presets is PRESET_CONSTANTS
    assert neg_prompt_text("neg_prompt_wan", None) == (PRESET_CONSTANTS["neg_prompt_wan"], "preset:neg_prompt_wan")
