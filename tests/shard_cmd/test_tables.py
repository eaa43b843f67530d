"""``shard images`` from Parquet and Arrow with the images inside, built with ``datasets`` as users build them:
the pixels written are the pixels the same photos give from a folder, every column is carried, counts add up."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fgdata.shards import discover_shards, iter_samples

datasets = pytest.importorskip("datasets")


def _dataset(sample_images: list[Path]):  # noqa: ANN202 - a datasets.Dataset
    rows = {"image": [{"bytes": p.read_bytes(), "path": p.name} for p in sample_images],
            "caption": [f"photo of {p.stem}" for p in sample_images],
            "aesthetic": [float("nan") if i == 1 else 5.0 + i for i in range(len(sample_images))],
            "meta": [{"source": "bundle", "n": i} for i in range(len(sample_images))]}
    return datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())


def _samples(dest: Path) -> list:
    return [s for shard in discover_shards(str(dest)) for s in iter_samples(shard)]


def _pixels(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


@pytest.fixture
def tables(tmp_path: Path, sample_images: list[Path]) -> dict[str, Path]:
    ds = _dataset(sample_images)
    hub = tmp_path / "hub"
    (hub / "data").mkdir(parents=True)
    half = len(sample_images) // 2  # two files: rows are numbered across them
    ds.select(range(half)).to_parquet(str(hub / "data" / "train-00000-of-00002.parquet"))
    ds.select(range(half, len(sample_images))).to_parquet(str(hub / "data" / "train-00001-of-00002.parquet"))
    ds.to_parquet(str(tmp_path / "one.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    return {"folder": hub, "parquet": tmp_path / "one.parquet", "saved": tmp_path / "saved"}


@pytest.mark.parametrize("source", ["parquet", "folder", "saved"])
def test_images_inside_tables_are_written_as_files_would_be(cli, tables, source, sample_images, tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    for p in sample_images:
        shutil.copyfile(p, photos / p.name)
    cli("shard", "images", photos, tmp_path / "from-files", "--format", "png", "--no-progress", "-q")
    by_name = {json.loads(s.members["json"])["fgdata"]["source"]: s for s in _samples(tmp_path / "from-files")}

    dest = tmp_path / "out"
    column = [] if source == "saved" else ["--image-column", "image"]  # save_to_disk declares its Image() column
    doc = json.loads(cli("shard", "images", tables[source], dest, *column, "--format", "png", "--no-progress",
                         "--json").stdout)
    assert (doc["seen"], doc["written"], doc["failed"]) == (len(sample_images),) * 2 + (0,)
    samples = _samples(dest)
    assert [s.key for s in samples] == [f"sample_{i:06d}" for i in range(len(sample_images))]
    for i, (s, photo) in enumerate(zip(samples, sample_images, strict=True)):
        meta = json.loads(s.members["json"])
        assert meta["fgdata"]["source"] == photo.name
        assert s.members["txt"].decode() == f"photo of {photo.stem}"
        assert meta["aesthetic"] == (None if i == 1 else 5.0 + i)  # NaN is written as null
        assert meta["meta"] == {"source": "bundle", "n": i}
        assert np.array_equal(_pixels(s.members["png"]), _pixels(by_name[photo.name].members["png"]))


def test_a_table_gives_the_bytes_a_folder_gives(cli, tables, sample_images, tmp_path):
    """Default format (JPEGs kept byte for byte unless they need normalising): the same bytes as from files."""
    photos = tmp_path / "photos"
    photos.mkdir()
    for p in sample_images:
        shutil.copyfile(p, photos / p.name)
    cli("shard", "images", photos, tmp_path / "from-files", "--no-progress", "-q")
    by_name = {json.loads(s.members["json"])["fgdata"]["source"]: s for s in _samples(tmp_path / "from-files")}
    dest = tmp_path / "out"
    cli("shard", "images", tables["parquet"], dest, "--image-column", "image", "--no-progress", "-q")
    for s, photo in zip(_samples(dest), sample_images, strict=True):
        assert s.members["jpg"] == by_name[photo.name].members["jpg"]


def test_where_selects_rows_of_a_save_to_disk_folder(cli, tables, sample_images, tmp_path):
    dest = tmp_path / "out"
    doc = json.loads(cli("shard", "images", tables["saved"], dest, "--where", "aesthetic >= 7 or meta.n = 0",
                         "--no-progress", "--json").stdout)
    expected = [0] + [i for i in range(len(sample_images)) if i != 1 and 5.0 + i >= 7]
    assert [s.key for s in _samples(dest)] == [f"sample_{i:06d}" for i in expected]
    assert doc["seen"] == doc["written"] + doc["filtered"] == len(sample_images)


def test_a_table_rerun_resumes_and_a_changed_image_is_written_again(cli, tables, sample_images, tmp_path, snapshot):
    dest = tmp_path / "out"
    args = ["shard", "images", tables["parquet"], dest, "--image-column", "image", "--maxcount", "2",
            "--no-progress"]
    cli(*args)
    first = snapshot(dest)
    again = json.loads(cli(*args, "--json").stdout)
    assert again["resumed"] == len(sample_images) and snapshot(dest) == first
    ds = _dataset(sample_images[::-1])  # other bytes under the same rows
    ds.to_parquet(str(tables["parquet"]))
    changed = json.loads(cli(*args, "--json").stdout)
    assert changed["changed_inputs"] and changed["written"] == len(sample_images)


def test_another_binary_column_is_refused_in_one_line(cli, sample_images, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"image": [p.read_bytes() for p in sample_images],
                      "mask": [b"\x00\x01" for _ in sample_images]})
    pq.write_table(table, tmp_path / "masks.parquet")
    result = cli("shard", "images", tmp_path / "masks.parquet", tmp_path / "out", "--image-column", "image",
                 expect=1)
    assert "column 'mask' holds binary data" in str(result.exception)
    assert not (tmp_path / "out").exists()


def test_a_struct_with_a_path_and_no_bytes_reads_the_file(cli, sample_images, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "t"
    folder.mkdir()
    for p in sample_images:
        shutil.copyfile(p, folder / p.name)
    cells = [{"bytes": None, "path": p.name} for p in sample_images] + [{"bytes": None, "path": None}]
    pq.write_table(pa.table({"image": cells}), folder / "paths.parquet")
    doc = json.loads(cli("shard", "images", folder / "paths.parquet", tmp_path / "out", "--image-column", "image",
                         "--no-progress", "--json").stdout)
    assert (doc["written"], doc["failed"], doc["failed_by_reason"]) == (len(sample_images), 1, {"missing-media": 1})
