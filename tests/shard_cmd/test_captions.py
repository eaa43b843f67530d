"""Captions are never lost with their image, nor the image with its caption."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from fgdata.shards import discover_shards, iter_samples


def _samples(dest: Path) -> dict[str, dict]:
    """Each sample's members by its source name, the json parsed."""
    out = {}
    for shard in discover_shards(str(dest)):
        for s in iter_samples(shard):
            doc = json.loads(s.members["json"])
            out[doc["fgdata"]["source"]] = {**s.members, "json": doc}
    return out


def _shard(cli, *args) -> dict:
    return json.loads(cli("shard", *[str(a) for a in args], "--no-progress", "--json").stdout)


def _photo(path: Path, colour=(120, 80, 40)) -> None:
    Image.new("RGB", (32, 24), colour).save(path, "JPEG", quality=90)


@pytest.fixture
def caption_folder(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for stem in ("utf8", "latin", "windows", "utf16", "utf32", "field", "text_field", "binary", "no_caption"):
        _photo(src / f"{stem}.jpg")
    (src / "utf8.txt").write_text("a café at night\n", encoding="utf-8")
    (src / "latin.txt").write_bytes("une crème brûlée".encode("latin-1"))
    (src / "windows.txt").write_bytes("the cat\u2019s \u201cbest\u201d side".encode("cp1252"))
    (src / "utf16.txt").write_bytes("\ufeffein Straßenbahn".encode("utf-16-le"))
    (src / "utf32.txt").write_text("a tram", encoding="utf-32")
    (src / "field.json").write_text(json.dumps({"caption": "from the json", "score": 6.5}))
    (src / "text_field.json").write_text(json.dumps({"text": "from the text field", "prompt": "not this"}))
    (src / "binary.txt").write_bytes(b"\x00\x01\x02garbage\x00")
    (src / "no_caption.json").write_text(json.dumps({"caption": ["a", "list"]}))
    return src


def test_captions_from_every_encoding_and_field(cli, caption_folder, tmp_path):
    dest = tmp_path / "out"
    doc = _shard(cli, "images", caption_folder, dest)
    assert (doc["seen"], doc["written"], doc["failed"]) == (9, 9, 0)  # no image lost with its caption
    samples = _samples(dest)
    expect = {"utf8.jpg": ("a café at night", None), "latin.jpg": ("une crème brûlée", "cp1252"),
              "windows.jpg": ("the cat\u2019s \u201cbest\u201d side", "cp1252"),
              "utf16.jpg": ("ein Straßenbahn", "utf-16"), "utf32.jpg": ("a tram", "utf-32")}
    for name, (caption, encoding) in expect.items():
        assert samples[name]["txt"].decode() == caption, name
        assert samples[name]["json"]["fgdata"].get("caption_encoding") == encoding, name
    assert samples["field.jpg"]["txt"] == b"from the json"
    assert samples["field.jpg"]["json"]["caption"] == "from the json"  # the user's metadata stays as given
    assert samples["field.jpg"]["json"]["fgdata"]["caption_field"] == "caption"
    assert samples["text_field.jpg"]["txt"] == b"from the text field"
    assert "txt" not in samples["binary.jpg"] and "txt" not in samples["no_caption.jpg"]

    report = json.loads((dest / "failures.json").read_text())
    warnings = {w["input"]: w["reason"] for w in report["warnings"]}
    assert set(warnings) == {"latin.jpg", "windows.jpg", "binary.jpg", "no_caption.jpg"}
    assert warnings["latin.jpg"] == "caption: latin.txt is not UTF-8; read as cp1252"
    assert warnings["binary.jpg"].endswith("; written without a caption")
    assert "'caption' of no_caption.json is not text" in warnings["no_caption.jpg"]
    assert report["failures"] == [] and doc["warnings"] == 4

    before = (dest / "failures.json").read_bytes()
    _shard(cli, "images", caption_folder, dest)  # a rerun resumes complete shards: the warnings come from them
    assert (dest / "failures.json").read_bytes() == before


def test_caption_field_chooses_the_fields_and_their_order(cli, caption_folder, tmp_path):
    dest = tmp_path / "out"
    _shard(cli, "images", caption_folder, dest, "--caption-field", "prompt,caption")
    samples = _samples(dest)
    assert samples["text_field.jpg"]["txt"] == b"not this"
    assert samples["field.jpg"]["txt"] == b"from the json"
    assert samples["utf8.jpg"]["txt"] == "a café at night".encode()  # NAME.txt comes first


def test_warnings_survive_shard_boundaries_and_resume(cli, caption_folder, tmp_path, snapshot):
    dest = tmp_path / "out"
    _shard(cli, "images", caption_folder, dest, "--maxcount", "2")
    first = snapshot(dest)
    (dest / "00004.tar").unlink()  # the last shard lost: the rerun writes it again, with its warning
    _shard(cli, "images", caption_folder, dest, "--maxcount", "2")
    assert snapshot(dest) == first


def test_a_manifest_row_takes_its_caption_from_a_caption_field_column(cli, tmp_path):
    _photo(tmp_path / "a.jpg")
    _photo(tmp_path / "b.jpg")
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,text,score\na.jpg,a red square,3\nb.jpg,,4\n", encoding="utf-8")
    dest = tmp_path / "out"
    doc = _shard(cli, "images", manifest, dest)
    assert (doc["seen"], doc["written"]) == (2, 2)
    samples = _samples(dest)
    assert samples["a.jpg"]["txt"] == b"a red square" and samples["a.jpg"]["json"]["fgdata"]["caption_field"] == "text"
    assert "txt" not in samples["b.jpg"]  # a blank cell of a caption field is no caption


def test_work_units_report_the_same_warnings_and_skipped_files(cli, caption_folder, tmp_path, ray_local):
    (caption_folder / "notes.xyz").write_text("not an image")
    local, units = tmp_path / "local", tmp_path / "units"
    _shard(cli, "images", caption_folder, local, "--maxcount", "2")
    doc = _shard(cli, "images", caption_folder, units, "--maxcount", "2", "--unit-size", "3", "--engine", "ray")
    assert (doc["warnings"], doc["skipped"]) == (4, 1)
    assert (units / "failures.json").read_bytes() == (local / "failures.json").read_bytes()


def test_the_summary_counts_samples_without_a_caption_and_require_caption_fails_them(cli, caption_folder, tmp_path):
    """2 of the 9 inputs end without a caption (a binary NAME.txt, a caption field that is a list) and one more has
    a blank NAME.txt: the summary says 3, in the table and the json, and counts them over the whole dataset on a
    rerun; ``--require-caption`` fails exactly those 3 (reason "caption", with why) and writes the other 6."""
    _photo(caption_folder / "blank.jpg")
    (caption_folder / "blank.txt").write_text("  \n")
    doc = _shard(cli, "images", caption_folder, tmp_path / "out")
    assert (doc["written"], doc["uncaptioned"]) == (10, 3)
    assert _shard(cli, "images", caption_folder, tmp_path / "out")["uncaptioned"] == 3  # resumed: still counted
    table = cli("shard", "images", caption_folder, tmp_path / "table", "--no-progress").output
    assert "no caption" in table and "3 of 10 written" in table and "--require-caption" in table

    strict = json.loads(cli("shard", "images", caption_folder, tmp_path / "strict", "--require-caption", "--no-progress",
                            "--json").stdout)
    assert (strict["seen"], strict["written"], strict["failed"], strict["uncaptioned"]) == (10, 7, 3, 0)
    assert strict["failed_by_reason"] == {"caption": 3}
    failures = {f["input"]: f["reason"] for f in json.loads((tmp_path / "strict" / "failures.json").read_text())["failures"]}
    assert set(failures) == {"binary.jpg", "no_caption.jpg", "blank.jpg"}
    assert all(r.startswith("caption: no caption") and r.endswith("--require-caption skips it") for r in failures.values())
    assert "binary.txt is not text" in failures["binary.jpg"]
    assert set(_samples(tmp_path / "strict")) == {f"{s}.jpg" for s in ("utf8", "latin", "windows", "utf16", "utf32",
                                                                        "field", "text_field")}
    again = cli("shard", "images", caption_folder, tmp_path / "strict", "--no-progress", expect=1)
    assert "require-caption was True, now not set" in str(again.exception)  # a byte option: a rerun must repeat it
