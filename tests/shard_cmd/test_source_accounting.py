"""Every file below SRC is an input or is listed as skipped, and every still-image format Pillow decodes is taken."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image, features

from fgdata.shards import discover_shards, iter_samples


def _samples(dest: Path) -> list:
    return [s for shard in discover_shards(str(dest)) for s in iter_samples(shard)]


def _report(dest: Path) -> dict:
    return json.loads((dest / "failures.json").read_text(encoding="utf-8"))


def _shard(cli, *args) -> dict:
    return json.loads(cli("shard", *[str(a) for a in args], "--no-progress", "--json").stdout)


def _jpeg(path: Path, colour=(200, 40, 30)) -> Path:
    Image.new("RGB", (48, 32), colour).save(path, "JPEG", quality=90)
    return path


@pytest.fixture
def mixed_folder(tmp_path: Path) -> Path:
    """JPEG under .jpg/.jfif/.jpe, an AVIF and a HEIC where this Pillow writes them, a TIFF, a BMP, an .xyz file,
    a FIFO, a folder reached through a symlink, and captions as sidecars (one orphan)."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    jpg = _jpeg(src / "a.jpg")
    shutil.copyfile(jpg, src / "b.jfif")
    shutil.copyfile(jpg, src / "c.jpe")
    Image.new("RGB", (40, 30), (10, 120, 200)).save(src / "sub" / "d.tiff")
    Image.new("RGB", (40, 30), (10, 200, 20)).save(src / "e.bmp")
    if features.check("avif"):
        Image.new("RGB", (40, 30), (250, 250, 10)).save(src / "f.avif")
    pytest.importorskip("pillow_heif").register_heif_opener()
    Image.new("RGB", (40, 30), (90, 10, 160)).save(src / "g.heic", "HEIF")
    for stem in ("a", "c", "f", "g"):
        (src / f"{stem}.txt").write_text(f"caption {stem}")
    (src / "orphan.txt").write_text("a caption of nothing")
    (src / "notes.xyz").write_text("not an image")
    (src / "more.xyz").write_text("not an image either")
    os.mkfifo(src / "pipe.jpg")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    _jpeg(outside / "linked.jpg", (1, 2, 3))
    (src / "link").symlink_to(outside, target_is_directory=True)
    return src


def test_every_file_is_an_input_or_skipped_and_listed(cli, mixed_folder, tmp_path):
    dest = tmp_path / "out"
    doc = _shard(cli, "images", mixed_folder, dest)
    taken = ["a.jpg", "b.jfif", "c.jpe", "e.bmp", "g.heic", "sub/d.tiff"] + (["f.avif"] if features.check("avif") else [])
    assert (doc["seen"], doc["written"], doc["failed"]) == (len(taken), len(taken), 0)
    report = _report(dest)
    assert report["seen"] == report["written"] + report["failed"]
    skipped = {s["input"]: s["reason"] for s in report["skipped"]}
    assert set(skipped) == {"link", "more.xyz", "notes.xyz", "orphan.txt", "pipe.jpg"}
    assert skipped["pipe.jpg"].startswith("special: a FIFO")
    assert skipped["link"].startswith("linked-folder: ") and "--follow-symlinks" in skipped["link"]
    assert skipped["notes.xyz"].startswith("extension: .xyz")
    assert skipped["orphan.txt"].startswith("sidecar: ")
    assert doc["skipped"] == 5
    for name in ("a.txt", "c.txt"):  # sidecars of a taken file are never skipped
        assert name not in skipped
    samples = _samples(dest)
    captions = {json.loads(s.members["json"])["fgdata"]["source"]: s.members.get("txt") for s in samples}
    assert captions["c.jpe"] == b"caption c" and captions["g.heic"] == b"caption g"
    for s in samples:  # every member is one the loaders read
        (ext,) = set(s.members) - {"json", "txt"}
        assert ext in {"jpg", "png", "bmp", "tiff"}
        Image.open(io.BytesIO(s.members[ext])).load()
    by_source = {json.loads(s.members["json"])["fgdata"]["source"]: s for s in samples}
    assert by_source["b.jfif"].members["jpg"] == (mixed_folder / "a.jpg").read_bytes()  # a JPEG passes through
    heic = Image.open(io.BytesIO(by_source["g.heic"].members["png"])).convert("RGB")
    assert max(abs(c - e) for c, e in zip(heic.getpixel((20, 15)), (90, 10, 160))) < 12


def test_the_summary_line_counts_skipped_files_by_extension_and_kind(cli, mixed_folder, tmp_path):
    result = cli("shard", "images", str(mixed_folder), str(tmp_path / "out"), "--no-progress")
    text = " ".join(result.stdout.replace("│", " ").split())  # the table may wrap the row
    assert "skipped 5: .xyz ×2;" in text
    for part in ("1 linked folder,", "1 sidecar without media,", "1 special file", "(in failures.json)"):
        assert part in text


def test_follow_symlinks_walks_a_linked_folder_out_of_src(cli, mixed_folder, tmp_path):
    dest = tmp_path / "out"
    _shard(cli, "images", mixed_folder, dest, "--follow-symlinks")
    sources = {json.loads(s.members["json"])["fgdata"]["source"] for s in _samples(dest)}
    assert "link/linked.jpg" in sources
    assert "link" not in {s["input"] for s in _report(dest)["skipped"]}


def test_a_linked_folder_inside_src_is_listed_once_even_when_followed(cli, tmp_path):
    src = tmp_path / "src"
    (src / "real").mkdir(parents=True)
    _jpeg(src / "real" / "x.jpg")
    (src / "again").symlink_to(src / "real", target_is_directory=True)
    dest = tmp_path / "out"
    doc = _shard(cli, "images", src, dest, "--follow-symlinks")
    assert doc["seen"] == 1
    (entry,) = _report(dest)["skipped"]
    assert entry["input"] == "again" and "listed under its own name" in entry["reason"]


def test_a_folder_of_only_unreadable_entries_says_what_it_found(cli, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.xyz").write_text("x")
    result = cli("shard", "images", str(src), str(tmp_path / "out"), expect=1)
    message = str(result.exception)
    assert "no files with extensions the" in message and message.endswith("readable formats found; skipped 1: .xyz ×1")


def test_heic_without_pillow_heif_is_skipped_saying_what_to_install(tmp_path):
    """A machine without the heif extra (the package hidden from this process): HEIC files are listed, not lost."""
    src = tmp_path / "src"
    src.mkdir()
    _jpeg(src / "a.jpg")
    pytest.importorskip("pillow_heif").register_heif_opener()
    Image.new("RGB", (40, 30)).save(src / "phone.heic", "HEIF")
    code = ("import sys; sys.modules['pillow_heif'] = None; from fgdata.cli.main import run; "
            "sys.argv = ['fgdata', *sys.argv[1:]]; run()")
    run = subprocess.run([sys.executable, "-c", code, "shard", "images", str(src), str(tmp_path / "out"),
                          "--no-progress", "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["seen"] == 1
    (entry,) = _report(tmp_path / "out")["skipped"]
    assert entry == {"input": "phone.heic",
                     "reason": "extension: .heic (HEIC/HEIF) needs pillow-heif: pip install 'fgdata[heif]'"}


@pytest.mark.s3
def test_an_s3_source_lists_its_other_objects_as_skipped(cli, s3_bucket, tmp_path):
    from fgdata import storage

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (5, 6, 7)).save(buf, "JPEG")
    storage.write_bytes(f"{s3_bucket}/photos/a.jfif", buf.getvalue())
    storage.write_bytes(f"{s3_bucket}/photos/a.txt", b"a caption")
    storage.write_bytes(f"{s3_bucket}/photos/data.xyz", b"not an image")
    dest = tmp_path / "out"
    doc = _shard(cli, "images", f"{s3_bucket}/photos", dest)
    assert (doc["seen"], doc["written"], doc["skipped"]) == (1, 1, 1)
    assert _report(dest)["skipped"] == [{"input": "data.xyz",
                                         "reason": "extension: .xyz is not a format this command reads"}]
    assert _samples(dest)[0].members["txt"] == b"a caption"


def test_the_extension_shortcut_agrees_with_pillows_registry():
    """The common formats and sidecars are answered without importing every Pillow plugin: the same answers."""
    from fgdata.media.image import _COMMON_IMAGE_EXTS, _SIDECAR_EXTS, SourceImageExtensions, source_image_extensions

    derived = source_image_extensions()
    assert _COMMON_IMAGE_EXTS <= derived and not _SIDECAR_EXTS & derived
    assert set(SourceImageExtensions()) == derived and "mpg" not in derived and "h5" not in derived
