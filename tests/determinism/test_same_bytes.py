"""Same input, same options -> the same bytes, from every command that writes, a second apart.

Each command runs twice into fresh folders, once in a fresh process and once in the test's own (two processes:
output that depends on a hash seed, a pid or when the process started differs; the fresh process runs every
command's first run, one after another, paying torch's and transformers' imports once), the second starting in a
later second of the clock than the first ended (so anything that stamps the time of day, to the second, differs),
and every file it wrote is compared byte for byte: shards, indexes, zips, npz/pkl references and fgdata's own
records under ``.fgdata/``. The inputs are the repository's sample data plus photos that take every path of the
display rule (a Display P3 PNG and JPEG, an Adobe RGB JPEG, EXIF orientations, 16-bit greyscale and RGB, CMYK,
alpha, a palette with transparency, an animated GIF). Then an image job over the colour-profile photos is stopped at a point the
job signals, rerun, and compared with the uninterrupted run, ``.fgdata/`` included.

The one field that holds a time on purpose is ``generated`` in ``report``'s page and JSON (docs/FORMATS.md);
it is masked (samebytes.bytes_of), nowhere else. The inputs, arguments and file reading live in ``samebytes.py``,
shared with ``benchmarks/compare_outputs.py``.
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest
from samebytes import (READING_WRITERS, build_inputs, bytes_of, commands, copy_dataset, environment, run,
                       run_each_in_one_process, run_here)

from faultkit import FGDATA, stop_and_signal  # on sys.path once samebytes is imported

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _a_second_after(ended: float) -> None:
    """Wait until the clock's whole second is past the one ``ended`` (a run's end) fell in: a time of day stamped to
    the second by that run then differs from any stamped by a run started after this returns."""
    time.sleep(max(0.0, int(ended) + 1.01 - time.time()))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, sample_data: Path, sample_video: Path) -> dict[str, Path]:
    """Every command's inputs, built once."""
    return build_inputs(tmp_path_factory.mktemp("inputs"), sample_data, sample_video)


def _same(one: dict[str, bytes], two: dict[str, bytes], what: str) -> None:
    assert one.keys() == two.keys(), f"{what}: files differ: {sorted(one.keys() ^ two.keys())}"
    differ = [rel for rel in one if one[rel] != two[rel]]
    assert not differ, f"{what}: bytes differ in {differ}"


@pytest.fixture(scope="module")
def first_runs(request, inputs: dict[str, Path], tmp_path_factory) -> tuple[Path, dict[str, str | None], float]:
    """The first run of each selected case of test_a_second_run_writes_the_same_bytes, all in one fresh process
    (not this one), each into its own folder: (the folders' root, each case's failure or None, when they ended)."""
    selected = [item.callspec.params["name"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_a_second_run_writes_the_same_bytes"]
    root = tmp_path_factory.mktemp("first")
    cases = commands(inputs)
    failed = run_each_in_one_process({name: (cases[name], root / _slug(name)) for name in selected})
    return root, failed, time.time()


def _slug(name: str) -> str:
    return name.replace(" ", "-")


@pytest.mark.parametrize("name", [
    "shard images", "shard images png max-side", "shard images webp", "shard images keep", "shard videos",
    "shard videos clips", "shard prompts", "encode latents", "encode text", "encode neg-prompt", "kd pairs", "kd paths", "prepare cifar10",
    "prepare imagenet-64", "prepare imagenet-256", "fid-refs", "fid-refs edm2 pkl"])
def test_a_second_run_writes_the_same_bytes(name: str, inputs: dict[str, Path], first_runs, tmp_path: Path):
    """The first run in a fresh process (``first_runs``, one for every case), the second in this one."""
    root, failed, ended = first_runs
    assert failed[name] is None, f"{name}, first run: {failed[name]}"
    _a_second_after(ended)
    run_here(commands(inputs)[name], tmp_path / "two")
    one, two = bytes_of(root / _slug(name)), bytes_of(tmp_path / "two")
    assert one, f"{name} wrote nothing"
    _same(one, two, name)


@pytest.mark.parametrize("name", sorted(READING_WRITERS))
def test_the_files_of_reading_commands_are_the_same_a_second_later(name: str, inputs: dict[str, Path],
                                                                    tmp_path: Path):
    """count-shards, verify, report, score and dedup write beside (or about) a dataset: copies of one, written
    twice in the same place (dedup's index names shards by their full path), each run's folder moved aside: the
    first run in a fresh process, the second in this one."""
    source = tmp_path / "dataset"
    run_here(commands(inputs)["shard images"], source)
    argv, expect = READING_WRITERS[name]
    for which, runner in (("one", run), ("two", run_here)):
        copy_dataset(source, tmp_path / "run")
        runner(argv, "ds", cwd=tmp_path / "run", expect=expect)
        (tmp_path / "run").rename(tmp_path / which)
        _a_second_after(time.time())
    _same(bytes_of(tmp_path / "one"), bytes_of(tmp_path / "two"), name)


def test_quickstart_writes_the_same_bytes_a_second_later(tmp_path: Path):
    """Its outputs name the inputs it copies into its own folder, so both runs use the same folder: the first
    run's (a fresh process's) files are moved aside before the second (in this process)."""
    run(["quickstart", "{out}"], tmp_path / "demo")
    ended = time.time()
    one = bytes_of(tmp_path / "demo")
    shutil.rmtree(tmp_path / "demo")
    _a_second_after(ended)
    run_here(["quickstart", "{out}"], tmp_path / "demo")
    assert any(rel.endswith(".zip") for rel in one) and "report.html" in one
    _same(one, bytes_of(tmp_path / "demo"), "quickstart")


@pytest.mark.parametrize(("image_format", "after", "sig"), [pytest.param("png", 1, signal.SIGKILL, id="png SIGKILL"),
                                                          pytest.param("keep", 2, signal.SIGTERM, id="keep SIGTERM")])
def test_a_stopped_image_job_resumes_to_the_same_bytes(image_format: str, after: int, sig: int,
                                                       inputs: dict[str, Path], tmp_path: Path):
    """The colour-profile photos, stopped after a shard and rerun: every file equals an uninterrupted run's,
    ``.fgdata/`` included. One stop per format, a different signal each. The stopped run is a real process; the
    uninterrupted run and the rerun, which no signal reaches, run in this one."""
    src = tmp_path / "src"
    src.mkdir()
    for p in inputs["photos"].iterdir():
        if p.stem.startswith(("cat_", "sideways", "cmyk", "grey16", "rgba", "turned", "chelsea", "coffee")):
            shutil.copyfile(p, src / p.name)
    argv = ["shard", "images", str(src), "{out}", "--maxcount", "2", "--workers", "2", "--format", image_format,
            "--max-side", "80"]
    run_here(argv, tmp_path / "clean")
    ended = time.time()
    reference = bytes_of(tmp_path / "clean")
    assert len([rel for rel in reference if rel.endswith(".tar")]) >= 4
    dest = tmp_path / "stopped"
    cmd = [*FGDATA, *[a.replace("{out}", str(dest)) for a in argv], "--no-progress"]
    stopped = stop_and_signal(cmd, after=after, sig=sig, env=environment())
    assert stopped.returncode == (-sig if sig == signal.SIGKILL else 128 + sig), stopped.stderr[-2000:]
    _a_second_after(ended)
    run_here(argv, dest)
    _same(reference, bytes_of(dest), f"stopped after {after} ({signal.Signals(sig).name}), rerun")


def _writing_commands() -> list[str]:
    """The CLI's writing commands: every command that takes ``--resume`` (a job that keeps what it finished)."""
    import typer

    from fgdata.cli.main import app

    found = []

    def walk(command, words: list[str]) -> None:  # noqa: ANN001 - a click command or group
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk(sub, [*words, name])
        elif any("--resume" in getattr(p, "opts", ()) for p in command.params):
            found.append(" ".join(words))

    walk(typer.main.get_command(app), [])
    return sorted(found)


def test_every_writing_command_runs_through_the_one_driver(inputs: dict[str, Path], tmp_path: Path, monkeypatch):
    """Each writing command the CLI lists runs once, and fgdata.jobs.driver.run_job notes its command in the
    file FGDATA_TEST_RUN_JOB_CALLS names: no command writes through a driver of its own. The commands run in this
    process: the driver reads the variable at each call, as a fresh process's would."""
    from fgdata.jobs.driver import CALLS_ENV

    writing = _writing_commands()
    assert {"shard images", "encode latents", "kd pairs"} <= set(writing)  # the listing itself sees the jobs
    cases = commands(inputs)
    dataset = tmp_path / "dataset"
    run_here(cases["shard images"], dataset)
    for command in writing:
        argv = next((a for a in cases.values() if " ".join(a[:len(command.split())]) == command), None)
        beside = READING_WRITERS.get(command)  # a command that writes beside a dataset: run on a copy of one
        assert argv is not None or beside is not None, f"{command}: a writing command with no case in _commands"
        calls = tmp_path / f"{command.replace(' ', '-')}.calls"
        monkeypatch.setenv(CALLS_ENV, str(calls))
        if argv is not None:
            run_here(argv, tmp_path / command.replace(" ", "-"))
        else:
            assert beside is not None
            copy_dataset(dataset, tmp_path / command)
            run_here(beside[0], "ds", cwd=tmp_path / command, expect=beside[1])
        noted = calls.read_text().split("\n")[:-1]
        # once, under its own name; a command whose argument names the dataset (prepare cifar10) runs a pass each
        assert noted == [command] or (noted and all(n.startswith(f"{command} ") for n in noted)), (command, noted)
