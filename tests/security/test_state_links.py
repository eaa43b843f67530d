"""Nothing below a job's state folder may be a symbolic link: a link at any depth of ``DST/.fgdata`` (or of an
s3:// DST's local staging copy) is refused before the job writes or removes anything, and a victim folder outside
DST is left exactly as it was, on a plain rerun as with ``--no-resume``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image


def _cli(*args: object, expect: int = 0):
    from typer.testing import CliRunner

    from fgdata.cli.main import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == expect, (result.output, result.exception)
    return result


def _tree(root: Path) -> dict[str, tuple[str, bytes | str | None, int]]:
    """Every entry below ``root`` (links not followed): kind, bytes or link target, modification time."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if path.is_symlink():
            out[str(path.relative_to(root))] = ("link", os.readlink(path), st.st_mtime_ns)
        elif path.is_dir():
            out[str(path.relative_to(root))] = ("dir", None, st.st_mtime_ns)
        else:
            out[str(path.relative_to(root))] = ("file", path.read_bytes(), st.st_mtime_ns)
    return out


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A finished shard job (eight units of one photo each) and a victim folder shaped like its state folder."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        Image.new("RGB", (8, 8), (30 * i, 90, 200)).save(src / f"img_{i}.png")
    dest = tmp_path / "dst"
    _cli("shard", "images", src, dest, "--maxcount", "1", "--no-progress")
    victim = tmp_path / "victim"
    (victim / "000000").mkdir(parents=True)
    (victim / "000000" / "precious.tar").write_bytes(b"not fgdata's")
    for n in (1, 7):
        (victim / f"00000{n}.json").write_text('{"mine": true}\n')
    return src, dest, victim


def _plant(state: Path, where: str, victim: Path) -> Path:
    """Replace ``state/where`` by a link into the victim folder."""
    path = state / where
    if path.is_dir():
        for child in sorted(path.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
        path.rmdir()
    elif path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    target = victim / "000001.json" if where.endswith(".json") else victim / "000000" if where.count("/") else victim
    path.symlink_to(target)
    return path


@pytest.mark.parametrize("resume", ["--resume", "--no-resume", "--overwrite"])
@pytest.mark.parametrize("where", ["units", "work", "work/000000", "units/000001.json", "units/000007.json"])
def test_a_link_anywhere_in_the_state_folder_is_refused(job, where, resume):
    src, dest, victim = job
    planted = _plant(dest / ".fgdata", where, victim)
    before = (_tree(victim), _tree(dest))
    refused = _cli("shard", "images", src, dest, "--maxcount", "1", "--no-progress", resume, expect=1)
    message = str(refused.exception)
    assert str(planted) in message and "symbolic link" in message and "\n" not in message
    assert (_tree(victim), _tree(dest)) == before


@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_a_link_in_an_s3_dsts_staging_folder_is_refused(tmp_path, s3_bucket, monkeypatch):
    """An s3:// DST's job state lives in this host's cache (the lock, the units' work folders): the same rule."""
    monkeypatch.setenv("FGDATA_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        Image.new("RGB", (8, 8), (60 * i, 90, 200)).save(src / f"img_{i}.png")
    url = f"{s3_bucket}/out"
    _cli("shard", "images", src, url, "--maxcount", "1", "--no-progress")
    states = sorted((tmp_path / "cache").rglob(".fgdata"))
    assert len(states) == 1
    victim = tmp_path / "victim"
    (victim / "000000").mkdir(parents=True)
    (victim / "000000" / "precious.tar").write_bytes(b"not fgdata's")
    planted = _plant(states[0], "work", victim)
    before = _tree(victim)
    for resume in ("--resume", "--no-resume"):
        refused = _cli("shard", "images", src, url, "--maxcount", "1", "--no-progress", resume, expect=1)
        assert str(planted) in str(refused.exception)
        assert _tree(victim) == before
