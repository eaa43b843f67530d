"""Every command, fed bad input, fails with a short message: no traceback, and no internal requirement codes
(short labels such as a capital, a hyphen and a number, or section signs, pointing into a document that users
do not have)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import typer.main

from fgdata.cli.main import app
from inprocess import fgdata

FGDATA = str(Path(sys.executable).with_name("fgdata"))
REPO = Path(__file__).resolve().parents[2]
# A requirement label is one or two capitals, a hyphen and one or two digits, standing alone; "CIFAR-10", "x-1",
# "H-264x" or a range end like "0..N-1" do not match. A section sign followed by a number is the other form.
CODE = re.compile(r"(?<![\w.-])[A-Z]{1,2}-\d{1,2}(?![\w-])|§\s?\d")


def test_the_pattern_finds_codes_and_spares_ordinary_words():
    for text in ("converted to RGB (Z-9)", "error (QZ-42)", "Z-1: crop", "see §9.9"):
        assert CODE.search(text), text
    for text in ("CIFAR-10", "imagenet-64", "a 4-D tensor", "UTF-8", "sd-vae-ft-mse", "-1 last hidden state",
                 "x-12", "H-264x", "ranks 0..N-1"):
        assert not CODE.search(text), text


def _leaf_commands() -> list[tuple[tuple[str, ...], object]]:
    root = typer.main.get_command(app)
    ctx = root.make_context("fgdata", [], resilient_parsing=True)
    out = []

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, path + (name,))
        else:
            out.append((path, cmd))

    walk(root, ())
    del ctx
    return out


# Commands whose first argument is where they write.
OUTPUT_FIRST = {("quickstart",)}
# Commands that read a folder of media files (the others read shards, files or names: a missing path and a
# garbage file cover them).
FOLDER_INPUT = {("shard", "images"), ("shard", "videos")}


def _argv(path: tuple[str, ...], cmd, bad: str, out: Path) -> list[str]:
    """The command with ``bad`` as its first argument, fresh output paths for the other arguments, and a
    plausible value for every required option (numbers get 2, names get ``bad``)."""
    argv = list(path)
    first = True
    for p in cmd.params:
        if getattr(p, "param_type_name", "") == "argument":
            argv.append(bad if first else str(out / f"out-{p.name}"))
            first = False
    for p in cmd.params:
        if getattr(p, "param_type_name", "") == "option" and p.required:
            label = str(p.display_type(None)) if hasattr(p, "display_type") else ""
            if "int" in label or "float" in label:
                value = "2"
            elif "out" in p.name:  # an output file: never the shared bad input itself
                value = str(out / f"out-{p.name}")
            else:
                value = bad
            argv += [p.opts[-1], value]
    return argv


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    garbage = root / "garbage.tar"
    garbage.write_bytes(b"not a tar, nor text: \x00\x9f\xff\xfe" * 40)
    undecodable = root / "undecodable"
    undecodable.mkdir()
    (undecodable / "fake.jpg").write_bytes(b"not a jpeg")
    (undecodable / "fake.mp4").write_bytes(b"not a video")
    (undecodable / "fake.txt").write_text("a caption")
    return {"missing": root / "does-not-exist", "garbage": garbage, "undecodable": undecodable}


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([FGDATA, *argv], capture_output=True, text=True, timeout=240, cwd=cwd, env=env)


def _reaches_workers(path: tuple[str, ...], kind: str) -> bool:
    """A job that gets as far as its workers runs as a real process: a worker's traceback goes to that
    process's stderr, which only a real process's capture sees. Every other case fails while parsing or
    checking its arguments, in the console entry that :func:`inprocess.fgdata` runs here."""
    return path in FOLDER_INPUT and kind != "missing"


def test_every_command_fails_cleanly_on_bad_input(bad_inputs, tmp_path):
    jobs = []
    for path, cmd in _leaf_commands():
        for kind, bad in bad_inputs.items():
            if path in OUTPUT_FIRST and kind != "garbage":  # a missing or plain folder is a fine place to write
                continue
            if kind == "undecodable" and path not in FOLDER_INPUT:
                continue
            out = tmp_path / "-".join(path) / kind
            out.mkdir(parents=True)
            jobs.append((path, kind, _argv(path, cmd, str(bad), out), out))
    assert len(jobs) >= 2 * 15
    assert 0 < sum(_reaches_workers(p, k) for p, k, _a, _o in jobs) < len(jobs)
    with ThreadPoolExecutor(max_workers=2) as pool:  # the real processes, while the others run here
        started = {i: pool.submit(_run, argv, out) for i, (path, kind, argv, out) in enumerate(jobs)
                   if _reaches_workers(path, kind)}
        results = [started[i].result() if i in started else fgdata(*argv, cwd=out, env={"COLUMNS": "200"})
                   for i, (_path, _kind, argv, out) in enumerate(jobs)]
    problems = []
    for (_path, kind, argv, _out), res in zip(jobs, results):
        text = res.stdout + res.stderr
        where = f"fgdata {' '.join(argv)} [{kind}] -> {res.returncode}"
        if res.returncode == 0:
            problems.append(f"{where}: exit 0 on bad input")
        if "Traceback" in text:
            problems.append(f"{where}: traceback\n{text[-2000:]}")
        if CODE.search(text):
            problems.append(f"{where}: requirement code {CODE.search(text).group()!r} in\n{text}")
        if res.returncode == 1 and not res.stderr.strip():
            problems.append(f"{where}: failed without saying why")
    assert not problems, "\n".join(problems)


def test_a_job_whose_every_input_failed_exits_1(bad_inputs, tmp_path):
    """Undecodable images only: the job reports them, writes the failures file, and exits 1."""
    res = _run(["shard", "images", str(bad_inputs["undecodable"]), str(tmp_path / "dst"), "--json"], tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["written"] == 0 and doc["failed"] == doc["seen"] == 1
    assert "nothing written" in res.stderr and "failures.json" in res.stderr


def test_no_requirement_codes_in_the_repository():
    """Code, comments, docs and tests state rules in the project's own words."""
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=REPO, check=True).stdout.split()
    hits = []
    for name in files:
        path = REPO / name
        if path == Path(__file__).resolve():  # the examples above
            continue
        if path.suffix not in {".py", ".md", ".toml", ".txt", ".json", ".yaml", ".yml", ".cfg", ".sh"} or \
                not path.is_file():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if CODE.search(line):
                hits.append(f"{name}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)
