"""Manifests (CSV, JSONL, Parquet) for images, and prompt shards."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fgdata.shards import discover_shards, iter_samples


def _samples(dest: Path) -> list:
    return [s for shard in discover_shards(str(dest)) for s in iter_samples(shard)]


def _rows(sample_images: list[Path]) -> list[dict]:
    rows = [{"file": p.name if i % 2 else str(p), "text": f"photo {i}", "score": i / 2, "id": f"00{i}"}
            for i, p in enumerate(sample_images)]
    rows.append({"file": "missing.jpg", "text": "gone", "score": 0.0, "id": "x"})
    return rows


def _write(fmt: str, rows: list[dict], folder: Path) -> Path:
    path = folder / f"manifest.{fmt}"
    if fmt == "csv":
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_manifest_columns_become_caption_and_metadata(cli, fmt, sample_images, sample_data, tmp_path):
    import shutil

    folder = tmp_path / "m"
    folder.mkdir()
    for p in sample_images:  # relative rows resolve against the manifest's folder
        shutil.copyfile(p, folder / p.name)
    rows = _rows(sample_images)
    manifest = _write(fmt, rows, folder)
    dest = tmp_path / "out"
    result = cli("shard", "images", manifest, dest, "--path-column", "file", "--caption-column", "text",
                 "--no-progress", "--json")
    doc = json.loads(result.stdout)
    assert (doc["seen"], doc["written"], doc["failed"]) == (len(rows), len(rows) - 1, 1)
    assert doc["failed_by_reason"] == {"read": 1}
    samples = _samples(dest)
    for i, s in enumerate(samples):
        meta = json.loads(s.members["json"])
        assert s.members["txt"] == f"photo {i}".encode()
        assert meta["score"] == i / 2 and meta["id"] == f"00{i}"  # numbers stay numbers, "007" stays text
        assert "file" not in meta and "text" not in meta


def test_manifest_without_the_path_column_is_an_error(cli, sample_images, tmp_path):
    manifest = _write("jsonl", _rows(sample_images), tmp_path)
    result = cli("shard", "images", manifest, tmp_path / "out", expect=1)
    assert "no column 'path'" in str(result.exception)


def test_prompts_from_text_and_manifest(cli, tmp_path, snapshot):
    text = tmp_path / "prompts.txt"
    text.write_text("a cat on a mat\n\n  a dog in fog  \nsnow on a hill\n")
    dest = tmp_path / "p"
    cli("shard", "prompts", text, dest, "--maxcount", "2", "--no-progress")
    samples = _samples(dest)
    assert [s.members for s in samples] == [{"txt": b"a cat on a mat"}, {"txt": b"a dog in fog"}, {"txt": b"snow on a hill"}]
    assert [s.key for s in samples] == ["sample_000000", "sample_000001", "sample_000002"]
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["a cat on a mat", "a dog in fog", "snow on a hill"]))
    dest2 = tmp_path / "p2"
    cli("shard", "prompts", jsonl, dest2, "--caption-column", "prompt", "--maxcount", "2", "--no-progress")
    assert [s.members for s in _samples(dest2)] == [s.members for s in samples]
    assert {k: v for k, v in snapshot(dest2).items() if k.endswith(".tar")} == \
        {k: v for k, v in snapshot(dest).items() if k.endswith(".tar")}
