"""House rules checked on the source itself: no long parameter lists, layers that point one way.

Functions take at most 10 parameters (the public loader classes, whose constructors mirror the reference
loaders' keyword arguments, aside): a command's flags come in flag groups (fgdata.cli.flaggroups) and a
library call takes one options dataclass. A call passes at most 8 positional arguments: more are unreadable
at the call site (name them).

Some packages never import others (at any depth, function-local imports included), so that each layer can be
read, tested and changed without the one above it: what both sides need lives below both (``fgdata.catalog``,
``fgdata.media``, ``fgdata.workers``, ``fgdata.formatting``, ``fgdata.compute``, ``fgdata.workitem``). The job core
(``fgdata.jobs``) loads no command's package, checked on what importing it really loads."""

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


#: The packages of the commands: the job core (``fgdata/jobs``) imports none of them; a command's job definition lives
#: with its command and the engine does not know about it.
COMMAND_PACKAGES = ("producers", "encode", "prepare", "fid", "sources", "media", "verify", "report", "loaders",
                    "configs", "cli", "score", "dedup")

# (package under fgdata/, a package it never imports)
LAYER_RULES = [
    *((p, "fgdata.jobs") for p in ("shards", "producers", "loaders", "configs")),  # formats, transforms and readers
    # know nothing of the job that writes them
    *(("jobs", f"fgdata.{p}") for p in COMMAND_PACKAGES),
    ("shards", "fgdata.media"),  # the tar format decodes nothing (``inspect`` decodes, in fgdata.verify)
    ("shards", "fgdata.cli"),
    ("shards", "fgdata.score"),  # score files are a format (fgdata.shards.scores); the scoring job sits above
    ("storage", "fgdata.shards"),  # storage moves bytes; it knows no format
    ("media", "fgdata.storage"),  # media functions are pure: bytes in, bytes out
    # the loaders and configs read what the writing side wrote, through formats and fgdata.catalog only; their
    # messages quote data through fgdata.formatting
    *((p, f"fgdata.{q}") for p in ("loaders", "configs") for q in ("cli", "encode", "prepare", "report")),
    ("prepare", "fgdata.loaders"),  # the writing side and the reading side share only fgdata.catalog
    ("encode", "fgdata.loaders"),
    ("verify", "fgdata.report"),  # inspect's previews come from fgdata.media
    ("report", "fgdata.loaders"),  # the score filter's rule and default come from fgdata.catalog
    ("report", "fgdata.jobs"),  # a job's failures.json and shard_stats.json are named in fgdata.catalog
    ("fid", "fgdata.prepare"),  # zip names from fgdata.catalog, the worker count from fgdata.workers
    ("fid", "fgdata.encode"),  # model loading, devices, batches and decode-ahead come from fgdata.compute
    ("fid", "fgdata.loaders"),
    ("producers", "fgdata.sources"),  # the item a source yields is fgdata.workitem's
    ("loaders", "fgdata.score"),  # the loaders join score files through fgdata.shards.scores only
    ("score", "fgdata.loaders"),
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


_LOADED = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def _commands_loaded(*modules: str) -> list[str]:
    """The command packages' modules loaded by importing ``modules`` in a fresh interpreter (so that what this
    process imported before hides nothing): what importing really loads, not only what the sources name."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _LOADED, *modules], capture_output=True, text=True, check=True,
                         cwd=ROOT.parent)
    return sorted(m for m in json.loads(out.stdout) for p in COMMAND_PACKAGES
                  if m == f"fgdata.{p}" or m.startswith(f"fgdata.{p}."))


def _engine_modules() -> list[str]:
    return [f"fgdata.jobs.{p.stem}" for p in sorted((ROOT / "jobs").glob("*.py")) if p.stem != "__init__"]


def test_importing_the_engine_imports_no_command():
    """``import fgdata.jobs`` and every engine module together load no command package (one interpreter for all:
    if their union loads none, none of them does)."""
    modules = ["fgdata.jobs", *_engine_modules()]
    assert len(modules) > 10
    assert _commands_loaded(*modules) == []


def test_the_import_check_sees_a_command_loaded():
    """A module that imports a command package at its top is seen (here the folder source's)."""
    assert "fgdata.sources.folder" in _commands_loaded("fgdata.workitem", "fgdata.sources.folder")


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


# Where a pool may be made: the job core's executors. Everything else runs its work through them (directly, or
# through an OrderedMap its caller hands down), so a worker that dies or a stop ends every command the same way.
EXECUTOR_MODULES = {"jobs/local.py", "jobs/executor.py", "jobs/ray_executor.py"}
_POOL_MODULES = {"concurrent.futures", "concurrent.futures.process", "concurrent.futures.thread", "multiprocessing",
                 "multiprocessing.pool", "multiprocessing.dummy"}
_POOL_NAMES = {"ProcessPoolExecutor", "ThreadPoolExecutor", "Pool", "ThreadPool"}
_POOL_SUBMODULES = {("multiprocessing", "pool"), ("multiprocessing", "dummy"), ("concurrent.futures", "process"),
                    ("concurrent.futures", "thread")}


def private_pools(source: str) -> list[str]:
    """Each place ``source`` makes or imports a pool of its own: ``concurrent.futures``' executors (imported or
    reached as attributes), ``multiprocessing.Pool`` / ``multiprocessing.pool`` / ``multiprocessing.dummy``, and
    ``.Pool`` of a multiprocessing context in a module that imports multiprocessing."""
    tree = ast.parse(source)
    uses_mp = any((isinstance(n, ast.Import) and any(a.name.split(".")[0] == "multiprocessing" for a in n.names))
                  or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "multiprocessing")
                  for n in ast.walk(tree))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name in _POOL_MODULES - {"concurrent.futures", "multiprocessing"}]
        elif isinstance(node, ast.ImportFrom) and node.module in _POOL_MODULES:
            found += [f"{node.module}.{a.name}" for a in node.names
                      if a.name in _POOL_NAMES or (node.module, a.name) in _POOL_SUBMODULES]
        elif isinstance(node, ast.Attribute) and (node.attr in ("ProcessPoolExecutor", "ThreadPoolExecutor")
                                                  or (uses_mp and node.attr in ("Pool", "ThreadPool"))):
            found.append(ast.unparse(node))
    return found


def test_no_pool_outside_the_job_core_executors():
    """verify, report, count-shards and every writing command run their work on the job core's pools (a worker
    that dies is one line, not a hang); a private pool elsewhere is a finding."""
    found = {str(p.relative_to(ROOT)): private_pools(p.read_text()) for p in sorted(ROOT.rglob("*.py"))}
    offenders = {path: pools for path, pools in found.items()
                 if pools and path not in EXECUTOR_MODULES}
    assert not offenders, offenders


def test_the_pool_check_sees_every_form():
    """Imported executors, attribute access, multiprocessing's pools and a context's Pool are caught; the job
    core's Pool executor description and threads that are not pools are not."""
    caught = ["from concurrent.futures import ThreadPoolExecutor", "from concurrent.futures import ProcessPoolExecutor",
              "import concurrent.futures\nconcurrent.futures.ThreadPoolExecutor(2)",
              "from concurrent import futures\nfutures.ProcessPoolExecutor()",
              "def f():\n    from multiprocessing import Pool", "import multiprocessing\nmultiprocessing.Pool(2)",
              "import multiprocessing\nctx = multiprocessing.get_context('spawn')\nctx.Pool(2)",
              "from multiprocessing.pool import ThreadPool", "import multiprocessing.dummy",
              "from concurrent.futures import thread"]
    for source in caught:
        assert private_pools(source), source
    allowed = ["from fgdata.jobs.executor import Pool, run_units\nrun_units(f, [], Pool(2))",
               "import threading\nthreading.Thread(target=print)", "from concurrent.futures import Future",
               "from fgdata.jobs.executor import process_map, thread_map",
               "from multiprocessing.connection import wait"]
    for source in allowed:
        assert private_pools(source) == [], source


MAX_UNTYPED_RECORDS = 6  # the JSON documents the engine writes: a marker's command payload, failures.json, provenance


def _untyped(annotation: ast.expr | None) -> bool:
    """Whether an annotation is an untyped record: ``dict`` (bare, or of ``Any``/``object`` values), ``Any``
    (alone or ``| None``), or a container of one (``list[dict]``, ``dict[str, dict[str, Any]]``)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Name):
        return annotation.id in ("dict", "Any")
    if isinstance(annotation, ast.BinOp):  # X | None
        return _untyped(annotation.left) or _untyped(annotation.right)
    if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name):
        args = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if annotation.value.id == "dict" and isinstance(args[-1], ast.Name) and args[-1].id in ("Any", "object"):
            return True
        if annotation.value.id in ("dict", "list", "Sequence", "Iterable", "Iterator", "Mapping"):
            return _record(args[-1])  # a container's values (not its keys): a record, not any value
    return False


def _record(annotation: ast.expr) -> bool:
    return not (isinstance(annotation, ast.Name) and annotation.id == "Any") and _untyped(annotation)


def untyped_records(source: str) -> list[str]:
    """Each parameter, return and annotated name (field or variable) whose annotation is an untyped record."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if a is not None and _untyped(a.annotation):
                    found.append(f"{node.lineno}: {node.name}({a.arg})")
            if _untyped(node.returns):
                found.append(f"{node.lineno}: {node.name} returns")
        elif isinstance(node, ast.AnnAssign) and _untyped(node.annotation):
            found.append(f"{node.lineno}: {ast.unparse(node.target)}")
    return found


def test_the_engine_passes_typed_records():
    """Plans, markers, units, unit calls and their results cross the engine as typed values; the few untyped
    records left are the JSON documents it reads and writes."""
    found = [f"jobs/{path.name}:{where}" for path in sorted((ROOT / "jobs").glob("*.py"))
             for where in untyped_records(path.read_text())]
    assert len(found) <= MAX_UNTYPED_RECORDS, found


def test_the_record_check_sees_every_form():
    caught = ["def f(x: dict) -> None: ...", "def f(x: dict[str, Any]) -> None: ...", "def f() -> Any: ...",
              "def f(*, x: list[dict[str, Any]] | None) -> None: ...", "x: dict[str, object] = {}",
              "class C:\n    doc: dict[str, dict[str, Any]]", "def f(x: Any | None) -> None: ..."]
    for source in caught:
        assert len(untyped_records(source)) == 1, source
    allowed = ["def f(x: dict[str, int]) -> list[str]: ...", "def f(fn: Callable[..., Any]) -> None: ...",
               "x: dict[int, tuple[int, str]] = {}", "def f(x: Unit[Any]) -> None: ...", "refs: dict[Any, int] = {}",
               "handles: list[Any] = []"]
    for source in allowed:
        assert untyped_records(source) == [], source


def options_from_dicts(source: str) -> list[str]:
    """Each ``SomethingOptions(**...)``: an options object built from a dict of keywords, not its typed fields."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and any(k.arg is None for k in node.keywords):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name.endswith("Options"):
                found.append(f"{node.lineno}: {name}(**...)")
    return found


def test_the_cli_builds_options_from_typed_flag_groups():
    """An options object is built field by field from the command's typed flag groups, so a renamed flag or
    field fails in mypy, not at run time."""
    found = [f"{path.relative_to(ROOT)}:{where}" for path in sorted((ROOT / "cli").rglob("*.py"))
             for where in options_from_dicts(path.read_text())]
    assert found == []


def test_the_options_check_sees_every_form():
    for source in ["KdOptions(**kwargs)", "options.RefOptions(steps=2, **extra)", "x = ShardOptions(**{'a': 1})"]:
        assert len(options_from_dicts(source)) == 1, source
    for source in ["KdOptions(steps=2)", "cls(**{name: kwargs[name] for name in names})", "dict(**a)"]:
        assert options_from_dicts(source) == [], source
