"""`fgdata report A B`: one page of both datasets' figures, but each folder checked as its own dataset (keys unique
within it, its own shard_count.json), with every row and problem naming the shard by its dataset's path."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

from fgdata.shards import ShardWriter
from inprocess import fgdata

def fg(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``fgdata ARGS`` in this process, run from ``cwd``."""
    return fgdata(*args, env={"COLUMNS": "400"}, cwd=cwd)


def png(shade: int) -> bytes:
    buf = io.BytesIO()
    arr = np.full((24, 32, 3), shade, np.uint8)
    arr[:, :8] = 255
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def dataset(dest: Path, n: int) -> None:
    """``n`` samples keyed sample_000000... in shards of 3, as every fgdata dataset numbers them."""
    with ShardWriter(str(dest), maxcount=3) as w:
        for i in range(n):
            w.write(f"sample_{i:06d}", {"png": png(10 * i), "txt": f"photo {i}".encode()})


def report(cwd: Path, *paths: str) -> tuple[dict, subprocess.CompletedProcess]:
    res = fg("report", *paths, "-o", "r.html", "--overwrite", "--json", "-w", "1", "--tiles", "4", cwd=cwd)
    assert "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout), res


def examples(doc: dict, kind: str) -> list[str]:
    return next((p["examples"] for p in doc["problems"] if p["kind"] == kind), [])


def test_two_healthy_datasets_are_two_datasets(tmp_path):
    dataset(tmp_path / "a", 6)
    dataset(tmp_path / "b", 4)
    doc, res = report(tmp_path, "a", "b")
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-2000:])
    assert doc["problems"] == []  # both number keys from sample_000000: no duplicates across datasets
    assert doc["total_samples"] == 10
    assert [(d["path"], d["shards"], d["samples"]) for d in doc["datasets"]] == [("a", 2, 6), ("b", 2, 4)]
    assert sum(d["bytes"] for d in doc["datasets"]) == doc["total_bytes"]
    assert [s["shard"] for s in doc["shards"]] == ["a/00000.tar", "a/00001.tar", "b/00000.tar", "b/00001.tar"]
    assert {t["shard"] for t in doc["contact_sheet"]} == {"a/00000.tar", "a/00001.tar", "b/00000.tar", "b/00001.tar"}
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "b/00001.tar" in page and "Datasets" in page
    text = fg("report", "a", "b", "-o", "r.html", "--overwrite", "-w", "1", cwd=tmp_path)
    assert text.returncode == 0 and "b: 4 samples in 2 shards" in text.stdout, text.stdout


def test_a_duplicate_and_a_wrong_count_inside_one_dataset_are_named_by_path(tmp_path):
    dataset(tmp_path / "a", 6)
    dataset(tmp_path / "b", 4)
    with tarfile.open(tmp_path / "b" / "00002.tar", "w") as tar:  # a third shard of b repeating b's first key
        info = tarfile.TarInfo("sample_000000.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"again"))
    (tmp_path / "a" / "shard_count.json").write_text(json.dumps({"00000.tar": 3, "00001.tar": 2}))
    doc, res = report(tmp_path, "a", "b")
    assert res.returncode == 1
    assert examples(doc, "duplicate-key") == ["b/00002.tar sample_000000: key also in b/00000.tar"]
    assert examples(doc, "counts-mismatch") == ["a/00001.tar: a/shard_count.json says 2, 3 readable"]
    assert examples(doc, "counts-missing") == ["b/00002.tar: b/shard_count.json does not list this shard"]
    # alone, b's duplicate is named as its rows are: by shard name
    alone, res = report(tmp_path / "b", ".")
    assert res.returncode == 1
    assert examples(alone, "duplicate-key") == ["00002.tar sample_000000: key also in 00000.tar"]


def test_datasets_of_one_format_each_are_not_mixed_but_a_mixed_one_is_named(tmp_path):
    """The one-format rule is per dataset: all-png A beside all-jpg B is no problem; C, holding both, is named with
    its own counts (not A's and B's)."""
    dataset(tmp_path / "a", 4)
    for name, exts in (("b", ["jpg"] * 3), ("c", ["png", "png", "jpg"])):
        with ShardWriter(str(tmp_path / name), maxcount=3) as w:
            for i, ext in enumerate(exts):
                buf = io.BytesIO()
                Image.open(io.BytesIO(png(10 * i))).save(buf, "JPEG" if ext == "jpg" else "PNG")
                w.write(f"sample_{i:06d}", {ext: buf.getvalue(), "txt": f"photo {i}".encode()})
    two = fg("report", "a", "b", "-o", "two.html", "--json", "--no-progress", cwd=tmp_path)
    assert not [p for p in json.loads(two.stdout)["problems"] if p["kind"] == "mixed image formats"], two.stdout
    three = fg("report", "a", "b", "c", "-o", "three.html", "--json", "--no-progress", cwd=tmp_path)
    (mixed,) = [p for p in json.loads(three.stdout)["problems"] if p["kind"] == "mixed image formats"]
    assert mixed["count"] == 1 and mixed["examples"][0].startswith("c: 2 image extensions (png 2, jpg 1)"), mixed
