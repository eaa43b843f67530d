"""Keys, member names, captions and file names from the data never reach the terminal as control sequences:
every command's terminal output writes them escaped (``\\x1b``), its --json output keeps JSON's own escaping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))  # faultkit, the fault-injection helpers

from faultkit import make_tar, png_bytes  # noqa: E402

TITLE = "\x1b]0;owned\x07"  # sets the terminal's title
CLEAR = "\x1b[2J"  # clears the screen
FGDATA = [sys.executable, "-m", "fgdata"]


def _fg(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}
    env.update(COLUMNS="200", TERM="dumb")
    return subprocess.run([*FGDATA, *args], capture_output=True, text=True, timeout=120, env=env)


def _no_raw_control(proc: subprocess.CompletedProcess) -> str:
    """Both streams, after checking that neither holds a raw escape, bell or carriage return."""
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text[-3000:]
    for raw in ("\x1b", "\x07", "\r", "\x9b"):
        assert raw not in text, (raw, text[-3000:])
    return text


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """A shard whose second sample's key and caption carry terminal escape sequences."""
    folder = tmp_path / "ds"
    folder.mkdir()
    key = f"sample_1{TITLE}"
    make_tar(folder / "00000.tar", [
        ("sample_0.png", png_bytes(0)), ("sample_0.txt", b"a plain caption"),
        (f"{key}.png", png_bytes(1)), (f"{key}.txt", f"{CLEAR}{TITLE}caption".encode()),
        (f"{key}.json", json.dumps({f"field{CLEAR}": 1}).encode()),
    ])
    return folder


def test_inspect_escapes_keys_and_captions(hostile: Path):
    text = _no_raw_control(_fg("inspect", str(hostile / "00000.tar"), "--limit", "2"))
    assert "sample_1\\x1b]0;owned\\x07" in text and "\\x1b[2J\\x1b]0;owned\\x07caption" in text


def test_inspect_json_keeps_json_escaping(hostile: Path):
    proc = _fg("inspect", str(hostile / "00000.tar"), "--limit", "2", "--json")
    assert "\\u001b" in proc.stdout and "\x1b" not in proc.stdout
    keys = [s["key"] for s in json.loads(proc.stdout)["samples_shown"]]
    assert keys == ["sample_0", f"sample_1{TITLE}"]


def test_verify_escapes_the_key_column(hostile: Path):
    proc = _fg("verify", str(hostile), "--require", "jpg")  # every sample is listed as missing its .jpg
    assert proc.returncode == 1
    assert "sample_1\\x1b]0;owned\\x07" in _no_raw_control(proc)


def test_report_summary_escapes_captions(hostile: Path, tmp_path: Path):
    proc = _fg("report", str(hostile), "-o", str(tmp_path / "r.html"))
    assert "\\x1b[2J" in _no_raw_control(proc)


def test_count_shards_and_errors_escape_file_names(hostile: Path, tmp_path: Path, short_tmp: Path):
    named = short_tmp / f"x{CLEAR}"  # a short path: the table's column holds it on one line
    named.mkdir()
    (named / "00000.tar").write_bytes((hostile / "00000.tar").read_bytes()[:1500])  # cut inside a member
    proc = _fg("count-shards", str(named), "--no-write")
    assert proc.returncode == 1 and "x\\x1b[2J" in _no_raw_control(proc)
    proc = _fg("inspect", str(tmp_path / f"missing{TITLE}.tar"))
    assert proc.returncode == 1 and "missing\\x1b]0;owned\\x07.tar" in _no_raw_control(proc)
