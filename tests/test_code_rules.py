"""House rules checked on the source itself: no long parameter lists.

Functions take at most 10 parameters (the public loader classes, whose constructors mirror the reference
loaders' keyword arguments, aside): a command's flags come in flag groups (fgdata.cli.flaggroups) and a
library call takes one options dataclass. A call passes at most 8 positional arguments: more are unreadable
at the call site (name them)."""

from __future__ import annotations

import ast
from pathlib import Path

import fgdata

ROOT = Path(fgdata.__file__).parent
MAX_PARAMS = 10
MAX_POSITIONAL = 8


def _exempt(tree: ast.Module, path: Path) -> set[ast.AST]:
    """The methods of the public classes of fgdata/loaders."""
    if path.relative_to(ROOT).parts[0] != "loaders":
        return set()
    return {item for node in tree.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
            for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Named parameters, not counting self/cls, *args or **kwargs."""
    a = fn.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
    first = (a.posonlyargs + a.args)[:1]
    return n - 1 if first and first[0].arg in ("self", "cls") else n


def _offenders(source: str, path: Path) -> list[str]:
    tree = ast.parse(source)
    exempt = _exempt(tree, path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node not in exempt:
            if _count(node) > MAX_PARAMS:
                out.append(f"{path}:{node.lineno} {node.name}() takes {_count(node)} parameters")
        if isinstance(node, ast.Call):
            positional = [a for a in node.args if not isinstance(a, ast.Starred)]
            if len(positional) > MAX_POSITIONAL:
                out.append(f"{path}:{node.lineno} {ast.unparse(node.func)}(...) gets {len(positional)} positional "
                           "arguments")
    return out


def test_no_long_parameter_lists():
    offenders = [o for path in sorted(ROOT.rglob("*.py")) for o in _offenders(path.read_text(), path)]
    assert not offenders, "\n".join(offenders)


def test_the_check_catches_both_kinds():
    """The scan sees a long signature and a long positional call, and exempts only public loader classes."""
    names = ", ".join(f"a{i}" for i in range(MAX_PARAMS + 1))
    source = f"def f(self, {names}):\n    g({names})\nclass Loader:\n    def __init__(self, {names}): ...\n"
    assert len(_offenders(source, ROOT / "cli" / "x.py")) == 3
    assert len(_offenders(source, ROOT / "loaders" / "x.py")) == 2  # Loader.__init__ is exempt there
    fits = ", ".join(f"a{i}" for i in range(MAX_PARAMS))
    call = ", ".join(f"a{i}" for i in range(MAX_POSITIONAL))
    assert _offenders(f"def f(self, {fits}, *args, **kw):\n    g(*args, {call}, x=1)\n", ROOT / "x.py") == []


def _imports_testhook(source: str) -> bool:
    """Whether a module imports :mod:`fgdata.jobs.testhook` (``import``, ``from fgdata.jobs import testhook`` or
    ``from fgdata.jobs.testhook import ...``), at its top or inside a function."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name == "fgdata.jobs.testhook" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module == "fgdata.jobs.testhook" or (
                node.module == "fgdata.jobs" and any(a.name == "testhook" for a in node.names))):
            return True
    return False


def test_only_the_job_core_calls_the_test_hooks():
    """Test hooks sit in one module that only the job core calls; producers outside it report through
    fgdata.jobs.outputs. The scan itself sees the three import forms."""
    assert all(_imports_testhook(src) for src in ("import fgdata.jobs.testhook", "from fgdata.jobs import testhook",
                                                  "def f():\n    from fgdata.jobs.testhook import hold\n"))
    assert not _imports_testhook("from fgdata.jobs import outputs\nimport fgdata.jobs.ranks")
    offenders = [str(p.relative_to(ROOT)) for p in sorted(ROOT.rglob("*.py"))
                 if p.relative_to(ROOT).parts[0] != "jobs" and _imports_testhook(p.read_text())]
    assert not offenders, offenders
