"""``--overwrite`` replaces whatever DST holds (fgdata's outputs of any options, and foreign files), listing it;
``--no-resume`` replaces fgdata's outputs only; other tools' index files in DST are recognised, not foreign."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from PIL import Image

from fgdata.shards import load_index


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(9):
        Image.new("RGB", (8, 8), (25 * i, 100, 200)).save(src / f"img_{i}.png")
    return src


def _shard(cli, src, dest, *extra: str, expect: int = 0):
    return cli("shard", "images", src, dest, "--no-progress", *extra, expect=expect)


def test_overwrite_replaces_a_run_made_with_other_options(cli, photos, tmp_path, snapshot):
    dest = tmp_path / "out"
    _shard(cli, photos, dest, "--maxcount", "5")
    assert sorted(p.name for p in dest.glob("*.tar")) == ["00000.tar", "00001.tar"]
    result = _shard(cli, photos, dest, "--overwrite")
    assert "--overwrite: removing" in result.stderr and "00001.tar" in result.stderr
    fresh = tmp_path / "fresh"
    _shard(cli, photos, fresh)
    assert snapshot(dest) == snapshot(fresh)
    assert json.loads((dest / "shard_count.json").read_text()) == {"00000.tar": 9}


def test_overwrite_removes_foreign_files_and_no_resume_does_not(cli, photos, tmp_path, snapshot):
    dest = tmp_path / "out"
    _shard(cli, photos, dest, "--maxcount", "5")
    (dest / "notes.txt").write_text("someone else's\n")
    refused = _shard(cli, photos, dest, "--maxcount", "5", "--no-resume", expect=1)
    assert "notes.txt" in str(refused.exception) and (dest / "notes.txt").exists()
    result = _shard(cli, photos, dest, "--maxcount", "3", "--overwrite")
    assert "notes.txt" in result.stderr and not (dest / "notes.txt").exists()
    fresh = tmp_path / "fresh"
    _shard(cli, photos, fresh, "--maxcount", "3")
    assert snapshot(dest) == snapshot(fresh)


def _energon(dest: Path) -> list[str]:
    """What ``energon prepare`` leaves beside the shards: ``.nv-meta/`` and, per shard, ``NAME.tar.idx`` (the
    little-endian uint64 byte offset of each sample, then the end). Returns the per-shard index names."""
    meta = dest / ".nv-meta"
    meta.mkdir()
    (meta / "dataset.yaml").write_text("__module__: megatron.energon\n__class__: ImageWebdataset\n")
    counts = json.loads((dest / "shard_count.json").read_text())
    (meta / ".info.yaml").write_text("shard_counts:\n" + "".join(f"  {k}: {v}\n" for k, v in counts.items()))
    (meta / "split.yaml").write_text("split_parts:\n  train:\n" + "".join(f"  - {k}\n" for k in counts))
    (meta / "index.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(84))
    names = []
    for shard in sorted(dest.glob("*.tar")):
        scan = load_index(str(shard))
        assert scan is not None
        offsets = [s.start for s in scan.samples] + [scan.samples[-1].end]
        (dest / f"{shard.name}.idx").write_bytes(struct.pack(f"<{len(offsets)}Q", *offsets))
        names.append(f"{shard.name}.idx")
    (dest / "train.shardindex.json").write_text(json.dumps({"__kind__": "wids-shard-index-v1", "shardlist": []}))
    return names


def test_a_folder_energon_prepared_resumes_and_keeps_its_indexes(cli, photos, tmp_path):
    dest = tmp_path / "out"
    _shard(cli, photos, dest, "--maxcount", "3")
    indexes = _energon(dest)
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file() and ".fgdata" not in p.parts}
    result = _shard(cli, photos, dest, "--maxcount", "3")  # a resume: nothing to do, nothing foreign
    assert "removing" not in result.stderr
    assert {p: p.read_bytes() for p in before} == before and len(indexes) == 3


def test_a_rewritten_shard_loses_its_stale_index_and_the_others_keep_theirs(cli, photos, tmp_path):
    dest = tmp_path / "out"
    _shard(cli, photos, dest, "--maxcount", "3")
    _energon(dest)
    kept = {n: (dest / n).read_bytes() for n in ("00000.tar.idx", "00002.tar.idx")}
    Image.new("RGB", (8, 9), (1, 2, 3)).save(photos / "img_4.png")  # in shard 1, which is written again
    result = _shard(cli, photos, dest, "--maxcount", "3")
    assert "removing 1 file(s)" in result.stderr and "00001.tar.idx" in result.stderr
    assert not (dest / "00001.tar.idx").exists()
    assert {n: (dest / n).read_bytes() for n in kept} == kept
    assert ".nv-meta" in result.stderr and "regenerate" in result.stderr and (dest / ".nv-meta").is_dir()


def test_overwrite_keeps_other_tools_indexes_only_for_shards_that_stay(cli, photos, tmp_path):
    dest = tmp_path / "out"
    _shard(cli, photos, dest, "--maxcount", "3")
    indexes = _energon(dest)
    (dest / "stray.bin").write_bytes(b"\0")
    result = _shard(cli, photos, dest, "--maxcount", "5", "--overwrite")
    assert "stray.bin" in result.stderr and not (dest / "stray.bin").exists()
    for name in indexes:  # every shard was removed and written again: each index is stale, and said so
        assert name in result.stderr and not (dest / name).exists()
    assert (dest / ".nv-meta" / "dataset.yaml").exists() and (dest / "train.shardindex.json").exists()
    assert "regenerate" in result.stderr
    assert sorted(os.listdir(dest)) == [".fgdata", ".nv-meta", "00000.tar", "00000.tar.idx.json", "00001.tar",
                                        "00001.tar.idx.json", "failures.json", "shard_count.json", "shard_job.json",
                                        "train.shardindex.json"]


def test_verify_and_report_outputs_in_dst_are_fgdatas(cli, photos, tmp_path):
    """``verify --write-ignore DST/ignore.json`` and ``report -o DST/report.html`` (with its contact sheet): a rerun
    resumes and keeps them, ``--no-resume`` and ``--overwrite`` leave them too; edited afterwards, one is someone
    else's file again."""
    dest = tmp_path / "out"
    _shard(cli, photos, dest, "--maxcount", "3")
    cli("verify", dest, "--write-ignore", dest / "ignore.json", "-q")
    cli("report", dest, "-o", dest / "report.html", "--contact-sheet", dest / "sheet.png", "-q")
    mine = {n: (dest / n).read_bytes() for n in ("ignore.json", "report.html", "sheet.png")}
    doc = json.loads(_shard(cli, photos, dest, "--maxcount", "3", "--json").stdout)
    assert doc["resumed"] == 9 and doc["rewritten_shards"] == []
    for flag in ("--no-resume", "--overwrite"):
        result = _shard(cli, photos, dest, "--maxcount", "3", flag)
        assert not any(n in result.stderr for n in mine)
        assert {n: (dest / n).read_bytes() for n in mine} == mine
    (dest / "ignore.json").write_text('{"00000.tar": ["img_0"]}\n')  # the user's now
    refused = _shard(cli, photos, dest, "--maxcount", "3", expect=1)
    assert "did not write (ignore.json)" in str(refused.exception)
