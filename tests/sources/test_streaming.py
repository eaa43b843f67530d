"""Streamed sources: manifests read row by row (CSV, JSONL, Parquet, and their .gz and .zst forms) and folders
walked one folder at a time give the items a whole listing gives, in the same order, in bounded memory."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import tracemalloc
from pathlib import Path

import pytest

from fgdata.errors import FgdataError
from fgdata.sources.folder import list_folder, walk_folder
from fgdata.workitem import WorkItem
from fgdata.sources.manifest import iter_manifest, iter_prompts, read_manifest, read_prompts

IMAGE_EXTS = {"jpg", "png"}


def _rows(n: int) -> list[dict]:
    return [{"path": f"img/{i:05d}.jpg", "caption": f"photo number {i}", "score": i / 4, "id": f"00{i}"}
            for i in range(n)]


def _table_bytes(fmt: str, rows: list[dict]) -> bytes:
    if fmt == "csv":
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        return text.getvalue().encode()
    if fmt == "jsonl":
        return "".join(json.dumps(row) + "\n" for row in rows).encode()
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out, row_group_size=max(1, len(rows) // 3))
    return out.getvalue()


def _compressed(suffix: str, data: bytes) -> bytes:
    """``data`` as two gzip members or two zstd frames (as pigz and pzstd write), so every part must be read."""
    half = len(data) // 2
    if suffix == ".gz":
        return gzip.compress(data[:half], mtime=0) + gzip.compress(data[half:], mtime=0)
    zstandard = pytest.importorskip("zstandard")
    return zstandard.ZstdCompressor().compress(data[:half]) + zstandard.ZstdCompressor().compress(data[half:])


def _expected_items(manifest: Path, rows: list[dict]) -> list[WorkItem]:
    return [WorkItem(index=i, name=row["path"], path=str(manifest.parent / row["path"]), caption=row["caption"],
                     metadata={"score": row["score"], "id": row["id"]}) for i, row in enumerate(rows)]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_every_manifest_form_streams_the_items_of_its_rows(fmt, suffix, tmp_path):
    rows = _rows(20_000 if fmt == "parquet" else 500)  # Parquet: more rows than one batch
    data = _table_bytes(fmt, rows)
    manifest = tmp_path / f"list.{fmt}{suffix}"
    manifest.write_bytes(_compressed(suffix, data) if suffix else data)
    streamed = iter_manifest(str(manifest))
    assert not isinstance(streamed, list)
    items = list(streamed)
    assert items == _expected_items(manifest, rows)  # CSV numbers become numbers, compressed or not
    assert read_manifest(str(manifest)) == items
    prompts = list(iter_prompts(str(manifest)))
    assert [(p.index, p.caption) for p in prompts] == [(i, row["caption"]) for i, row in enumerate(rows)]
    assert read_prompts(str(manifest)) == prompts


def test_jsonl_lines_are_counted_as_the_whole_file_would_be_and_bad_lines_fail_alone(tmp_path):
    lines = [json.dumps({"path": "a.jpg"}), "", '{"path": "torn.jpg", ', "[1, 2]", json.dumps({"path": "b.jpg"}),
             json.dumps({"path": "c.jpg"})]
    data = (lines[0] + "\r\n" + lines[1] + "\n" + lines[2] + "\r" + lines[3] + "\n" + lines[4] + "\r" + lines[5]).encode()
    numbered = {n: line for n, line in enumerate(data.splitlines(), 1) if line.strip()}
    for name, raw in (("m.jsonl", data), ("m.jsonl.gz", _compressed(".gz", data)), ("m.jsonl.zst", _compressed(".zst", data))):
        manifest = tmp_path / name
        manifest.write_bytes(raw)
        items = list(iter_manifest(str(manifest)))
        assert [item.index for item in items] == list(range(len(numbered)))
        bad = {item.name: item.refused for item in items if item.refused}
        torn, listed = (n for n, line in numbered.items() if line.startswith((b'{"path": "torn', b"[")))
        assert set(bad) == {f"{name}:{torn}", f"{name}:{listed}"}
        assert bad[f"{name}:{torn}"].startswith(f"manifest: line {torn} of {name} is not valid JSON (")
        assert bad[f"{name}:{listed}"] == f"manifest: line {listed} of {name} holds a list, not a JSON object"
        assert [item.name for item in items if not item.refused] == ["a.jpg", "b.jpg", "c.jpg"]


def test_prompt_lines_are_cut_as_splitlines_cuts_the_whole_text(tmp_path):
    text = "\ufeffa cat\n\n  a dog \r\na bird\ra fish\x0ba frog\u2028an owl\n   \nthe end"
    prompts = tmp_path / "p.txt"
    prompts.write_bytes(text.encode("utf-8"))
    expected = [(f"p.txt:{n}", line.strip()) for n, line in enumerate(text[1:].splitlines(), 1) if line.strip()]
    items = list(iter_prompts(str(prompts)))
    assert [(item.name, item.caption) for item in items] == expected
    assert [item.index for item in items] == list(range(len(expected)))
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(FgdataError, match="no prompts"):
        list(iter_prompts(str(tmp_path / "empty.txt")))


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_a_truncated_compressed_manifest_is_one_error_never_a_shorter_list(suffix, tmp_path):
    rows = _rows(2000)
    packed = _compressed(suffix, _table_bytes("jsonl", rows))
    for cut in (len(packed) - 7, len(packed) // 2 + 5):  # inside the last part, and inside the first
        manifest = tmp_path / f"cut{cut}.jsonl{suffix}"
        manifest.write_bytes(packed[:cut])
        seen = []
        with pytest.raises(FgdataError) as error:
            seen.extend(iter_manifest(str(manifest)))
        assert len(seen) < len(rows)
        message = str(error.value)
        assert "\n" not in message and manifest.name in message
        assert ("truncated zstd file" if suffix == ".zst" else "not a readable gzip file") in message


def test_an_empty_stream_and_a_missing_column_are_errors_decided_while_streaming(tmp_path):
    empty = tmp_path / "empty.jsonl.gz"
    empty.write_bytes(gzip.compress(b"\n\n", mtime=0))
    with pytest.raises(FgdataError, match="the manifest has no rows"):
        list(iter_manifest(str(empty)))
    header_only = tmp_path / "header.csv.zst"
    header_only.write_bytes(_compressed(".zst", b"path,caption\n"))
    with pytest.raises(FgdataError, match="the manifest has no rows"):
        list(iter_manifest(str(header_only)))
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"file": "a.jpg", "text": "x"}) + "\n" + "not json\n" * 3)
    with pytest.raises(FgdataError, match=r"no column 'path' \(columns: file, text\)"):
        next(iter_manifest(str(wrong)))  # on the first row, before the rest is read
    assert [item.caption for item in iter_prompts(str(wrong), caption_column="text")][0] == "x"


def _peak_bytes(consume) -> int:
    tracemalloc.start()
    try:
        consume()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.slow  # end to end, several seconds
def test_streaming_a_large_manifest_holds_one_row_not_the_file(suffix, tmp_path):
    """80,000 rows (about 10 MB of JSONL): reading them all holds less memory than a tenth of the file.

    Streaming holds a few hundred KB whatever the length (gzip's window and read buffers); a reader that
    held the file would hold ten times the limit, so a larger file would prove nothing more."""
    caption = "a long caption that makes each row weigh about a hundred and thirty bytes"
    data = b"".join(json.dumps({"path": f"img/{i:07d}.jpg", "caption": caption, "n": i}).encode() + b"\n"
                    for i in range(80_000))
    manifest = tmp_path / f"big.jsonl{suffix}"
    manifest.write_bytes(gzip.compress(data, compresslevel=1, mtime=0) if suffix else data)
    # The first read of a process imports and caches (some 2.4 MB, once): done on one row, outside the measure.
    warm = tmp_path / f"warm.jsonl{suffix}"
    warm.write_bytes(gzip.compress(data[: data.index(b"\n") + 1], mtime=0) if suffix else data[: data.index(b"\n") + 1])
    assert len(list(iter_manifest(str(warm)))) == 1
    counted = []

    def consume() -> None:
        last = None
        for item in iter_manifest(str(manifest)):
            last = item.index
        counted.append(last)

    peak = _peak_bytes(consume)
    assert counted == [79_999]
    assert len(data) > 9 * 2**20
    assert peak < len(data) // 10, peak


def _touch(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _media_below(root: Path, exts: set[str]) -> list[str]:
    """The oracle: every visible file below ``root`` with one of ``exts``, as sorted relative paths (os.walk)."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        rel = os.path.relpath(folder, root)
        for name in files:
            if not name.startswith(".") and name.rpartition(".")[2].lower() in exts and "." in name:
                found.append(name if rel == "." else f"{rel}/{name}")
    return sorted(found)


def test_a_folder_walk_gives_sorted_relative_paths_with_sidecars_in_their_folder(tmp_path):
    root = tmp_path / "src"
    for rel in ("a-b.jpg", "a/x.jpg", "a/x.txt", "a.b/y.png", "a b.jpg", "a0.png", "a/b/z.jpg", "a/b.jpg",
                "a/b.txt", "a/b.json", "b.jpg", "b.poses.npy", "b.intrinsics.npy", "b.txt", "b/x.jpg",
                "B.JPG", "é.jpg", "z/zz/zzz/deep.png", ".hidden.jpg", ".cache/c.jpg", "a/.x.txt", "notes.txt",
                "a/b/z.json", "data.xyz"):
        _touch(root / rel)
    skipped: list = []
    items = list(walk_folder(str(root), IMAGE_EXTS, skipped=skipped))
    assert [item.name for item in items] == _media_below(root, IMAGE_EXTS)
    assert [item.index for item in items] == list(range(len(items)))
    by_name = {item.name: item for item in items}
    assert by_name["a/x.jpg"].caption_path == str(root / "a/x.txt")
    assert by_name["a/b.jpg"].caption_path == str(root / "a/b.txt")  # not a/b/'s files
    assert by_name["a/b.jpg"].metadata_path == str(root / "a/b.json")
    assert by_name["a/b/z.jpg"].metadata_path == str(root / "a/b/z.json") and by_name["a/b/z.jpg"].caption_path is None
    assert (by_name["b.jpg"].poses_path, by_name["b.jpg"].intrinsics_path) == (str(root / "b.poses.npy"),
                                                                              str(root / "b.intrinsics.npy"))
    assert by_name["b/x.jpg"].caption_path is None and by_name["a-b.jpg"].caption_path is None
    assert [(s.name, s.reason.partition(":")[0]) for s in skipped] == [("data.xyz", "extension"),
                                                                       ("notes.txt", "sidecar")]
    listing = list_folder(str(root), IMAGE_EXTS)
    assert (listing.items, listing.skipped) == (items, skipped)


def test_a_folder_walk_lists_each_folder_when_it_gets_there(tmp_path):
    """Streaming, not a listing taken first: a file added below a folder the walk has not reached yet is found."""
    root = tmp_path / "src"
    _touch(root / "a" / "1.jpg")
    _touch(root / "c" / "3.jpg")
    walk = walk_folder(str(root), IMAGE_EXTS)
    assert next(walk).name == "a/1.jpg"
    _touch(root / "c" / "2.jpg")  # c/ is listed after a/ is done
    _touch(root / "b" / "2.jpg")  # the root was listed before this folder was made
    assert [item.name for item in walk] == ["c/2.jpg", "c/3.jpg"]


def test_links_and_special_files_in_a_walk(tmp_path):
    root, outside = tmp_path / "src", tmp_path / "outside"
    _touch(root / "in" / "a.jpg")
    _touch(outside / "o.jpg")
    _touch(outside / "o.txt")
    _touch(outside / "sub" / "s.png")
    (root / "link-in.jpg").symlink_to(root / "in" / "a.jpg")
    (root / "link-out.jpg").symlink_to(outside / "o.jpg")
    (root / "in" / "a.txt").symlink_to(outside / "o.txt")  # a sidecar leading out refuses its media file
    (root / "out-folder").symlink_to(outside)
    (root / "in-folder").symlink_to(root / "in")
    (root / "broken.jpg").symlink_to(tmp_path / "nothing")
    os.mkfifo(root / "pipe.jpg")
    skipped: list = []
    items = {item.name: item for item in walk_folder(str(root), IMAGE_EXTS, skipped=skipped)}
    assert list(items) == ["in/a.jpg", "link-in.jpg", "link-out.jpg"]
    assert items["link-in.jpg"].refused is None and items["link-in.jpg"].path == str(root / "link-in.jpg")
    assert items["link-out.jpg"].refused.startswith("symlink: link-out.jpg points to ")
    assert items["in/a.jpg"].refused.startswith("symlink: a.txt points to ")
    assert [(s.name, s.reason.partition(":")[0]) for s in skipped] == [
        ("broken.jpg", "broken-link"), ("in-folder", "linked-folder"), ("out-folder", "linked-folder"),
        ("pipe.jpg", "special")]
    followed = [item.name for item in walk_folder(str(root), IMAGE_EXTS, follow_symlinks=True)]
    assert followed == ["in/a.jpg", "link-in.jpg", "link-out.jpg", "out-folder/o.jpg", "out-folder/sub/s.png"]


def test_a_walk_without_media_ends_in_the_listing_error(tmp_path):
    _touch(tmp_path / "src" / "a" / "notes.txt")
    _touch(tmp_path / "src" / "b.xyz")
    with pytest.raises(FgdataError) as error:
        list(walk_folder(str(tmp_path / "src"), IMAGE_EXTS))
    assert "no files with extensions jpg, png found; skipped 2: .xyz ×1; 1 sidecar without media" in str(error.value)


@pytest.mark.s3
def test_s3_manifests_and_folders_stream_like_local_ones(s3_bucket, tmp_path, monkeypatch):
    from fgdata import storage

    cache = tmp_path / "cache"
    monkeypatch.setenv("FGDATA_CACHE", str(cache))
    rows = _rows(300)
    for name, data in (("list.parquet", _table_bytes("parquet", rows)),
                       ("list.jsonl.zst", _compressed(".zst", _table_bytes("jsonl", rows)))):
        storage.write_bytes(f"{s3_bucket}/lists/{name}", data)
        (tmp_path / name).write_bytes(data)
        stream = iter_manifest(f"{s3_bucket}/lists/{name}")
        remote = [next(stream)]
        assert [p.name[:10] for p in cache.iterdir() if p.name.startswith(".")] == [".manifest-"]  # read from a copy
        remote += stream
        local = list(iter_manifest(str(tmp_path / name)))
        assert [(i.name, i.caption, i.metadata) for i in remote] == [(i.name, i.caption, i.metadata) for i in local]
        assert remote[0].path == f"{s3_bucket}/lists/img/00000.jpg"
        assert [p for p in cache.iterdir() if p.name.startswith(".")] == []  # and the copy is gone
    keys = ["a-b.jpg", "a/x.jpg", "a/x.txt", "a/b/z.png", "a0.jpg", ".hidden/h.jpg", "b.jpg", "b.txt", "c.xyz"]
    for key in keys:
        storage.write_bytes(f"{s3_bucket}/photos/{key}", b"x")
        _touch(tmp_path / "photos" / key)
    skipped: list = []
    items = list(walk_folder(f"{s3_bucket}/photos", IMAGE_EXTS, skipped=skipped))
    assert [item.name for item in items] == _media_below(tmp_path / "photos", IMAGE_EXTS)
    assert {item.name: item.caption_path for item in items}["a/x.jpg"] == f"{s3_bucket}/photos/a/x.txt"
    assert [s.name for s in skipped] == ["c.xyz"]
