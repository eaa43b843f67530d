"""House rules checked on the source itself: no long parameter lists, layers that point one way.

Functions take at most 10 parameters (the public loader classes, whose constructors mirror the reference
loaders' keyword arguments, aside): a command's flags come in flag groups (fgdata.cli.flaggroups) and a
library call takes one options dataclass. A call passes at most 8 positional arguments: more are unreadable
at the call site (name them).

Some packages never import others (at any depth, function-local imports included), so that each layer can be
read, tested and changed without the one above it: what both sides need lives below both (``fgdata.catalog``,
``fgdata.media``, ``fgdata.workers``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
    """Test hooks are called from one module, fgdata.jobs.outputs: the driver, the sinks and producers outside
    the core report there. The scan itself sees the three import forms."""
    assert all(_imports_testhook(src) for src in ("import fgdata.jobs.testhook", "from fgdata.jobs import testhook",
                                                  "def f():\n    from fgdata.jobs.testhook import hold\n"))
    assert not _imports_testhook("from fgdata.jobs import outputs\nimport fgdata.jobs.ranks")
    callers = [str(p.relative_to(ROOT)) for p in sorted(ROOT.rglob("*.py")) if _imports_testhook(p.read_text())]
    assert callers == ["jobs/outputs.py"], callers


# (package under fgdata/, a package it never imports)
LAYER_RULES = [
    ("verify", "fgdata.report"),  # inspect's previews come from fgdata.media
    ("report", "fgdata.loaders"),  # the score filter's rule and default come from fgdata.catalog
    ("fid", "fgdata.prepare"),  # zip names from fgdata.catalog, the worker count from fgdata.workers
    ("fid", "fgdata.loaders"),  # zips and folders are read by fgdata.media.imagefiles, below both
    ("prepare", "fgdata.loaders"),  # the writing side and the reading side share only fgdata.catalog
    ("encode", "fgdata.loaders"),
    ("configs", "fgdata.prepare"),
    ("shards", "fgdata.jobs"),  # the tar format knows nothing of the job that writes it
    ("shards", "fgdata.score"),  # score files are a format (fgdata.shards.scores); the scoring job sits above
    ("loaders", "fgdata.score"),  # the loaders join score files through fgdata.shards.scores only
    ("score", "fgdata.loaders"),
    ("jobs", "fgdata.dedup"),  # the dedup command's job lives with its command (fgdata.dedup.job)
    ("dedup", "fgdata.cli"),
]


def imported_modules(source: str, module: str) -> set[str]:
    """Every module the source of ``module`` (dotted name) imports, at any depth: ``import a.b``, ``from a import
    b`` (a and a.b), relative imports resolved, and ``importlib.import_module("a.b")`` with a literal name."""
    package = module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
            name = ".".join(p for p in (base, node.module or "") if p)
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and ast.unparse(node.func) in ("importlib.import_module", "import_module")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
    return found


def layer_offenders(package: str, forbidden: str, files: dict[Path, str] | None = None) -> list[str]:
    """``path imports module`` for each import of ``forbidden`` (or below it) by a module under fgdata/``package``."""
    if files is None:
        files = {path: path.read_text() for path in sorted((ROOT / package).rglob("*.py"))}
    out = []
    for path, source in files.items():
        module = ".".join(("fgdata", *path.relative_to(ROOT).with_suffix("").parts))
        bad = sorted(m for m in imported_modules(source, module) if m == forbidden or m.startswith(forbidden + "."))
        out += [f"{path.relative_to(ROOT)} imports {m}" for m in bad]
    return out


@pytest.mark.parametrize(("package", "forbidden"), LAYER_RULES)
def test_layers_point_one_way(package, forbidden):
    assert (ROOT / package).is_dir()
    assert layer_offenders(package, forbidden) == []


def test_the_layer_check_sees_every_form_of_import():
    """Top-level, function-local, ``from fgdata import x``, relative and importlib imports are all caught."""
    path = ROOT / "verify" / "x.py"
    forms = ["import fgdata.report.collect", "from fgdata.report.collect import Tile", "from fgdata import report",
             "from ..report import collect", "from ..report.collect import Tile",
             "def f():\n    from fgdata.report import collect",
             "import importlib\nimportlib.import_module('fgdata.report.collect')"]
    for source in forms:
        assert layer_offenders("verify", "fgdata.report", {path: source}), source
    allowed = ["from fgdata.reporting import x", "from fgdata.verify import report", "from . import report",
               "import fgdata.media.preview"]
    for source in allowed:
        assert layer_offenders("verify", "fgdata.report", {path: source}) == [], source
