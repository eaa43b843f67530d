"""Existing shards as the source of ``shard images``: img2dataset's layout written with webdataset's ShardWriter
(jpg/png, txt, json with url/caption/status/sha256/width/height, a .parquet and _stats.json per shard beside), read
as a folder, a single tar, a brace pattern or a list; members and json carried, keys kept, counts add up."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from fgdata.shards import discover_shards, iter_samples

wds = pytest.importorskip("webdataset")


def _samples(dest: Path) -> list:
    return [s for shard in discover_shards(str(dest)) for s in iter_samples(shard)]


@pytest.fixture
def laion(tmp_path: Path, sample_images: list[Path]) -> tuple[Path, list[dict]]:
    """img2dataset output: 3 shards of 3 samples, one failed download per shard, parquet and stats beside."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "laion"
    folder.mkdir()
    photos = list(sample_images) + list(sample_images[:2])  # 9 successes with the failures: 3 shards of 3
    rows: list[dict] = []
    with wds.ShardWriter(str(folder / "%05d.tar"), maxcount=3, verbose=0) as sink:
        for i in range(9):
            failed = i % 3 == 1
            key = f"{i // 3:05d}{i % 3:04d}"
            meta = {"url": f"https://example.com/{i}.jpg", "caption": f"a photo {i}", "key": key,
                    "status": "failed_to_download" if failed else "success",
                    "error_message": "404" if failed else None}
            sample = {"__key__": key}
            if not failed:
                photo = photos[i]
                data = photo.read_bytes()
                meta.update(sha256=hashlib.sha256(data).hexdigest(), width=1, height=1, original_width=2)
                sample["jpg" if photo.suffix == ".jpg" else "png"] = data
                sample["txt"] = f"a photo {i}".encode()
                sample["cls"] = str(i).encode()
            sample["json"] = json.dumps(meta).encode()
            rows.append({**meta, "photo": None if failed else photos[i]})
            sink.write(sample)
    for n in range(3):
        part = [{k: v for k, v in r.items() if k != "photo"} for r in rows[3 * n:3 * n + 3]]
        pq.write_table(pa.Table.from_pylist(part), folder / f"{n:05d}.parquet")
        (folder / f"{n:05d}_stats.json").write_text(json.dumps({"count": 3, "successes": 2, "failed": 1}))
    return folder, rows


def _pixels(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def test_img2dataset_shards_are_resharded_with_every_member_and_field(cli, laion, tmp_path):
    folder, rows = laion
    dest = tmp_path / "out"
    doc = json.loads(cli("shard", "images", folder, dest, "--format", "png", "--maxcount", "4", "--no-progress",
                         "--json").stdout)
    good = [r for r in rows if r["status"] == "success"]
    assert (doc["seen"], doc["written"], doc["failed"], doc["filtered"]) == (9, len(good), 0, 9 - len(good))
    assert doc["filtered_by_reason"] == {"status": 3}
    assert list(doc["counts"].values()) == [4, 2]
    samples = _samples(dest)
    assert [s.key for s in samples] == [r["key"] for r in good]
    for s, row in zip(samples, good, strict=True):
        meta = json.loads(s.members["json"])
        assert {k: meta[k] for k in ("url", "caption", "status", "sha256", "width", "height", "original_width")} \
            == {k: row[k] for k in ("url", "caption", "status", "sha256", "width", "height", "original_width")}
        assert meta["fgdata"]["source"].startswith(f"{row['key'][:5]}.tar#{row['key']}.")
        assert s.members["txt"] == row["caption"].encode() and s.members["cls"] == str(rows.index(row)).encode()
        assert np.array_equal(_pixels(s.members["png"]), _pixels(_reference_png(cli, row["photo"], tmp_path)))


def _reference_png(cli, photo: Path, tmp_path: Path) -> bytes:
    """What the same photo gives as a file (the one-format rule's display conversions: alpha on white, ...)."""
    src = tmp_path / f"ref-{photo.stem}"
    src.mkdir(exist_ok=True)
    shutil.copyfile(photo, src / photo.name)
    cli("shard", "images", src, src / "out", "--format", "png", "--no-progress", "-q")
    return _samples(src / "out")[0].members["png"]


@pytest.mark.parametrize("spelling", ["tar", "pattern", "list"])
def test_every_spelling_of_the_source_gives_the_same_bytes(cli, laion, tmp_path, spelling, snapshot):
    folder, _ = laion
    cli("shard", "images", folder, tmp_path / "a", "--no-progress", "-q")
    if spelling == "tar":
        one = tmp_path / "one"
        one.mkdir()
        shutil.copyfile(folder / "00001.tar", one / "00001.tar")
        cli("shard", "images", one / "00001.tar", tmp_path / "b", "--no-progress", "-q")
        assert [s.key for s in _samples(tmp_path / "b")] == ["000010000", "000010002"]
        return
    if spelling == "pattern":
        src = f"{folder}/{{00000..00002}}.tar"
    else:
        listing = tmp_path / "shards.txt"
        listing.write_text("# img2dataset output\n" + "".join(f"{folder}/{n:05d}.tar\n" for n in range(3)))
        src = str(listing)
    cli("shard", "images", src, tmp_path / "b", "--no-progress", "-q")
    a, b = snapshot(tmp_path / "a"), snapshot(tmp_path / "b")
    assert {k: v for k, v in a.items() if k != "failures.json"} == {k: v for k, v in b.items() if k != "failures.json"}


def test_rekey_numbers_the_samples_in_source_order(cli, laion, tmp_path):
    folder, rows = laion
    cli("shard", "images", folder, tmp_path / "out", "--rekey", "--no-progress", "-q")
    assert [s.key for s in _samples(tmp_path / "out")] == \
        [f"sample_{i:06d}" for i, r in enumerate(rows) if r["status"] == "success"]


def test_where_reads_the_json_fields_of_the_samples(cli, laion, tmp_path):
    folder, rows = laion
    doc = json.loads(cli("shard", "images", folder, tmp_path / "out", "--where", "url in ('https://example.com/0.jpg', "
                         "'https://example.com/5.jpg')", "--no-progress", "--json").stdout)
    assert [s.key for s in _samples(tmp_path / "out")] == [rows[0]["key"], rows[5]["key"]]
    assert doc["filtered_by_reason"] == {"status": 3, "where": 4}
    report = json.loads((tmp_path / "out" / "failures.json").read_text())
    assert (report["seen"], report["filtered"], report["filtered_by_reason"]) == (9, 7, {"status": 3, "where": 4})
    shown = json.loads(cli("report", tmp_path / "out", "--output", tmp_path / "report.html", "--json").stdout)
    assert shown["selection"]["filtered_by_reason"] == {"status": 3, "where": 4}
    bad = cli("shard", "images", folder, tmp_path / "bad", "--where", "aesthetic > 5", expect=2)
    assert "no field 'aesthetic'" in bad.output and not (tmp_path / "bad").exists()


def test_a_changed_source_shard_is_written_again_and_the_others_resume(cli, laion, tmp_path, snapshot):
    folder, _ = laion
    dest = tmp_path / "out"
    args = ["shard", "images", folder, dest, "--maxcount", "2", "--unit-size", "2", "--no-progress"]
    cli(*args)
    first = snapshot(dest)
    again = json.loads(cli(*args, "--json").stdout)
    assert again["resumed"] == 6 and snapshot(dest) == first
    shard = folder / "00002.tar"
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the same bytes, a new modification time
    changed = json.loads(cli(*args, "--json").stdout)
    assert changed["resumed"] == 4 and changed["changed_inputs"]
    assert snapshot(dest) == first


def test_a_sample_without_media_fails_with_its_members_named(cli, tmp_path, sample_images):
    folder = tmp_path / "s"
    folder.mkdir()
    with wds.TarWriter(str(folder / "00000.tar")) as sink:
        sink.write({"__key__": "a", "jpg": sample_images[3].read_bytes() if sample_images[3].suffix == ".jpg"
                    else sample_images[-1].read_bytes(), "json": b'{"k": 1}'})
        sink.write({"__key__": "b", "txt": b"only text", "npy": b"\x93NUMPY"})
    doc = json.loads(cli("shard", "images", folder, tmp_path / "out", "--no-progress", "--json").stdout)
    assert (doc["written"], doc["failed"], doc["failed_by_reason"]) == (1, 1, {"missing-media": 1})
    report = json.loads((tmp_path / "out" / "failures.json").read_text())
    assert report["failures"][0]["reason"].endswith("(members: npy, txt)")


@pytest.fixture
def served(laion):
    """The img2dataset folder over http on loopback."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    folder, _ = laion

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _shards_only(snap: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in snap.items() if k.endswith(".tar") or k == "shard_count.json"}


def test_shards_over_http_and_s3_give_the_bytes_of_local_ones(cli, laion, served, s3_bucket, tmp_path, snapshot):
    from fgdata import storage

    folder, _ = laion
    cli("shard", "images", folder, tmp_path / "local", "--no-progress", "-q")
    expected = _shards_only(snapshot(tmp_path / "local"))
    cli("shard", "images", f"{served}/{{00000..00002}}.tar", tmp_path / "http", "--no-progress", "-q",
        "--allow-private-network")  # the test server is on loopback
    assert _shards_only(snapshot(tmp_path / "http")) == expected
    stats = json.loads((tmp_path / "http" / "shard_stats.json").read_text())  # (for the failed downloads left out)
    assert stats["downloads"] is False  # samples of a shard read over http are no URLs
    assert stats == json.loads((tmp_path / "local" / "shard_stats.json").read_text())
    for n in range(3):
        storage.write_bytes(f"{s3_bucket}/laion/{n:05d}.tar", (folder / f"{n:05d}.tar").read_bytes())
    storage.write_bytes(f"{s3_bucket}/laion/00000.parquet", (folder / "00000.parquet").read_bytes())
    cli("shard", "images", f"{s3_bucket}/laion", tmp_path / "s3", "--no-progress", "-q")
    assert _shards_only(snapshot(tmp_path / "s3")) == expected


def test_the_driver_holds_references_to_a_local_shards_media_not_its_bytes(laion):
    """Items of a local shard carry their media member's offset and size (the worker reads them); the bytes there
    are the photo's."""
    from collections import Counter

    from fgdata.sources.shards import iter_shard_items

    folder, rows = laion
    filtered: Counter[str] = Counter()
    shards = [str(p) for p in sorted(folder.glob("*.tar"))]
    items = list(iter_shard_items(shards, {"jpg", "png"}, False, filtered))
    good = [r for r in rows if r["status"] == "success"]
    assert len(items) == len(good) and filtered == {"status": 3}
    for item, row in zip(items, good, strict=True):
        assert item.data is None and item.data_at is not None
        offset, size = item.data_at
        with open(item.path, "rb") as f:
            f.seek(offset)
            assert f.read(size) == row["photo"].read_bytes()
        assert item.members is not None and set(item.members) == {"cls"} and item.caption == row["caption"]


def test_the_ray_engine_writes_the_bytes_of_the_process_pool(cli, laion, tmp_path, snapshot, ray_local):
    """Source shards under ``--engine ray`` (each unit a task that reads its samples' media from the source shards
    and writes its own shards) and under the local pool: the same files, byte for byte, and the same accounting."""
    folder, rows = laion
    args = ["--maxcount", "2", "--unit-size", "3", "--no-progress"]
    pool = json.loads(cli("shard", "images", folder, tmp_path / "pool", *args, "--workers", "2", "--json").stdout)
    ray = json.loads(cli("shard", "images", folder, tmp_path / "ray", *args, "--engine", "ray", "--json").stdout)
    assert (ray["seen"], ray["written"], ray["filtered_by_reason"]) == (9, 6, {"status": 3})
    assert {k: ray[k] for k in ("seen", "written", "failed", "filtered", "samples")} == \
        {k: pool[k] for k in ("seen", "written", "failed", "filtered", "samples")}
    assert [Path(s).name for s in ray["shards"]] == [Path(s).name for s in pool["shards"]]
    written = snapshot(tmp_path / "ray")
    assert written == snapshot(tmp_path / "pool") and sum(k.endswith(".tar") for k in written) == 4
    assert [s.key for s in _samples(tmp_path / "ray")] == [r["key"] for r in rows if r["status"] == "success"]
