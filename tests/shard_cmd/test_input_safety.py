"""Inputs that used to abort a job, leak a file or lose a field: each is now one reported failure, or kept."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest

from fgdata.shards import discover_shards, iter_samples


def _samples(dest: Path) -> list:
    return [s for shard in discover_shards(str(dest)) for s in iter_samples(shard)]


def _report(dest: Path) -> dict:
    return json.loads((dest / "failures.json").read_text(encoding="utf-8"))


def _shard(cli, *args) -> dict:
    return json.loads(cli("shard", *[str(a) for a in args], "--no-progress", "--json").stdout)


def test_a_file_name_that_is_not_utf8_is_one_failure_named_with_escapes(cli, image_folder, tmp_path):
    bad = os.fsencode(image_folder) + b"/bad\xff name.jpg"
    shutil.copyfile(image_folder / "chelsea.png", bad)
    shutil.copyfile(image_folder / "chelsea.txt", os.fsencode(image_folder) + b"/bad\xff name.txt")
    n = sum(1 for p in os.listdir(os.fsencode(image_folder)) if p.endswith((b".jpg", b".png")))
    n += len(list((image_folder / "sub").glob("*.jpg")))
    dest = tmp_path / "out"
    doc = _shard(cli, "images", image_folder, dest)
    assert (doc["seen"], doc["written"], doc["failed"]) == (n, n - 1, 1)
    (entry,) = _report(dest)["failures"]
    assert entry["input"] == "bad\\xff name.jpg" and entry["reason"].startswith("name: ")
    assert len(_samples(dest)) == n - 1
    markers = [json.loads(p.read_text()) for p in (dest / ".fgdata" / "units").glob("*.json")]
    assert sum(m["count"] for m in markers) == n and "bad\\xff name.jpg" in [x for m in markers for x in m["names"]]


def test_a_csv_caption_over_128_kib_is_stored_whole(cli, sample_images, tmp_path):
    caption = "a very long caption " * 10_000  # 200 KB, past the csv module's default field limit
    manifest = tmp_path / "m.csv"
    with open(manifest, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "caption", "score"])
        writer.writerow([str(sample_images[0]), caption, "7"])
        writer.writerow([str(sample_images[1]), "short", "1e3"])
    dest = tmp_path / "out"
    doc = _shard(cli, "images", manifest, dest)
    assert (doc["seen"], doc["written"], doc["failed"]) == (2, 2, 0)
    first, second = _samples(dest)
    assert first.members["txt"].decode() == caption
    assert json.loads(first.members["json"])["score"] == 7 and json.loads(second.members["json"])["score"] == 1000.0


def test_csv_rows_with_extra_cells_fail_naming_the_row(cli, sample_images, tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text(f"path,caption\n{sample_images[0]},ok\n{sample_images[1]},too,many\n", encoding="utf-8")
    dest = tmp_path / "out"
    doc = _shard(cli, "images", manifest, dest)
    assert (doc["seen"], doc["written"], doc["failed"]) == (2, 1, 1)
    (entry,) = _report(dest)["failures"]
    assert entry["index"] == 1 and entry["reason"] == "manifest: row 1 of m.csv has more cells than the header"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_captions_that_are_not_text_are_warnings_and_never_a_repr(cli, fmt, sample_images, tmp_path):
    rows = [{"path": str(p), "caption": c}
            for p, c in zip(sample_images, [["a", "list"], "plain text", ["x"], "more text"])]
    if fmt == "jsonl":
        rows[2]["caption"] = {"an": "object"}
        rows.append({"path": str(sample_images[4]), "caption": 42})
        manifest = tmp_path / "m.jsonl"
        manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:  # a Parquet column has one type: make it a list column with one text row left out
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        rows = [{"path": r["path"], "caption": r["caption"] if isinstance(r["caption"], list) else None} for r in rows]
        manifest = tmp_path / "m.parquet"
        pq.write_table(pa.Table.from_pylist(rows), manifest)
    dest = tmp_path / "out"
    doc = _shard(cli, "images", manifest, dest)
    report = _report(dest)
    warnings = {w["index"]: w["reason"] for w in report["warnings"]}
    assert doc["seen"] == doc["written"] == len(rows) and report["failures"] == []  # the images are kept
    lost = "; written without a caption"
    if fmt == "jsonl":
        assert warnings == {
            0: "caption: column 'caption' in row 0 of m.jsonl holds a list, not text" + lost,
            2: "caption: column 'caption' in row 2 of m.jsonl holds an object, not text" + lost,
            4: "caption: column 'caption' in row 4 of m.jsonl holds a number, not text" + lost,
        }
    else:
        assert set(warnings) == {0, 2} and all("holds a list, not text" in r for r in warnings.values())
    samples = _samples(dest)
    assert sum("txt" in s.members for s in samples) == sum(isinstance(r["caption"], str) for r in rows)
    for s in samples:
        text = s.members.get("txt", b"").decode()
        assert "[" not in text and "{" not in text  # nothing stored as a Python repr


def test_prompt_manifest_captions_that_are_not_text_fail(cli, tmp_path):
    manifest = tmp_path / "p.jsonl"
    manifest.write_text('{"caption": "a cat"}\n{"caption": ["a", "dog"]}\n{"caption": "a bird"}\n')
    dest = tmp_path / "out"
    doc = _shard(cli, "prompts", manifest, dest)
    assert (doc["seen"], doc["written"], doc["failed"]) == (3, 2, 1)
    assert [s.members["txt"] for s in _samples(dest)] == [b"a cat", b"a bird"]
    (entry,) = _report(dest)["failures"]
    assert entry["input"] == "p.jsonl:row 1" and "holds a list" in entry["reason"]


def test_symlinks_out_of_the_source_folder_are_refused_unless_followed(cli, image_folder, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    outside_image = tmp_path / "outside.jpg"
    shutil.copyfile(image_folder / "hubble_deep_field.jpg", outside_image)  # kept byte for byte (sRGB)
    (image_folder / "coffee.txt").unlink()
    (image_folder / "coffee.txt").symlink_to(secret)  # a caption sidecar pointing out of SRC
    (image_folder / "linked.jpg").symlink_to(outside_image)  # a media file pointing out of SRC
    (image_folder / "inside.jpg").symlink_to(image_folder / "hubble_deep_field.jpg")  # stays inside: fine
    dest = tmp_path / "out"
    doc = _shard(cli, "images", image_folder, dest)
    failures = {f["input"]: f["reason"] for f in _report(dest)["failures"]}
    assert set(failures) == {"coffee.png", "linked.jpg"} and doc["failed"] == 2
    assert failures["coffee.png"] == (f"symlink: coffee.txt points to {secret}, outside the source folder; "
                                      "pass --follow-symlinks to read it")
    assert all(b"host secret" not in s.members.get("txt", b"") for s in _samples(dest))
    assert any(s.members.get("jpg") == outside_image.read_bytes() for s in _samples(dest))  # inside.jpg's bytes

    followed = tmp_path / "followed"
    doc = _shard(cli, "images", image_folder, followed, "--follow-symlinks")
    assert doc["failed"] == 0 and doc["written"] == doc["seen"]
    assert any(s.members.get("txt") == b"host secret" for s in _samples(followed))


def test_fgdata_never_overwrites_the_users_json_fields(cli, image_folder, tmp_path):
    (image_folder / "chelsea.json").write_text('{"source": "flickr", "width": "wide", "mode": 3, "score": 9}')
    (image_folder / "coffee.json").write_text('{"fgdata": "mine"}')
    dest = tmp_path / "out"
    doc = _shard(cli, "images", image_folder, dest)
    (entry,) = _report(dest)["failures"]
    assert entry["input"] == "coffee.png" and entry["reason"].startswith("metadata: coffee.png: the field 'fgdata'")
    assert doc["failed"] == 1
    by_source = {}
    for s in _samples(dest):
        meta = json.loads(s.members["json"])
        by_source[meta["fgdata"]["source"]] = meta
    chelsea = by_source["chelsea.png"]
    assert {k: chelsea[k] for k in ("source", "width", "mode", "score")} == {
        "source": "flickr", "width": "wide", "mode": 3, "score": 9}
    assert chelsea["fgdata"]["width"] == 451 and chelsea["fgdata"]["mode"] == "RGB"
    # verify and the loaders read the shards as before; the user's score still drives presets_filter
    cli("verify", dest, "--decode")
    from fgdata.loaders import WDSLoader

    loader = WDSLoader(["WDS:" + str(dest)], batch_size=1, key_map={"meta": "json"}, train=False, num_workers=0,
                       presets_filter={"score": {"threshold": 8}})
    wanted = sorted(name for name, meta in by_source.items() if meta.get("score", 8) >= 8)
    metas = [batch["meta"] for _, batch in zip(range(len(wanted)), loader)]
    assert "sub/rocket.jpg" not in wanted and sorted(m["fgdata"]["source"][0] for m in metas) == wanted
    assert [m["source"] for m in metas if "score" in m] == [["flickr"]]


@pytest.mark.parametrize("reencode", [[], ["--max-side", "64"]], ids=["pass-through", "re-encode"])
def test_a_decompression_bomb_is_one_failure_on_every_shard_path(cli, reencode, image_folder, bombs, tmp_path):
    (image_folder / "bomb.jpg").write_bytes(bombs["jpg"])
    (image_folder / "bomb.png").write_bytes(bombs["png"])
    dest = tmp_path / "out"
    doc = _shard(cli, "images", image_folder, dest, *reencode)
    failures = {f["input"]: f["reason"] for f in _report(dest)["failures"]}
    assert set(failures) == {"bomb.jpg", "bomb.png"} and doc["failed"] == 2 and doc["written"] == doc["seen"] - 2
    assert all(r.startswith("image-decode: ") and "decompression bomb" in r for r in failures.values())


def test_verify_decode_flags_a_bomb_in_a_shard(cli, bombs, tmp_path):
    from fgdata.shards import ShardWriter

    dest = tmp_path / "s"
    with ShardWriter(str(dest)) as w:
        w.write("ok", {"txt": b"fine"})
        w.write("bomb", {"jpg": bombs["jpg"]})
    result = cli("verify", dest, "--decode", "--json", expect=1)
    assert "image-decode" in result.stdout


def test_a_jsonl_line_that_is_not_json_fails_alone_naming_file_and_line(cli, sample_images, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"path": str(sample_images[0]), "caption": "first"}) + "\n"
                        + '{"path": "broken.jpg", "caption": \n'  # a torn line
                        + "\n"  # blank lines are skipped, not counted as rows
                        + '["a", "list"]\n'
                        + json.dumps({"path": str(sample_images[1]), "caption": "last"}) + "\n")
    dest = tmp_path / "out"
    doc = _shard(cli, "images", manifest, dest)
    assert (doc["seen"], doc["written"], doc["failed"]) == (4, 2, 2)
    failures = {f["input"]: f["reason"] for f in _report(dest)["failures"]}
    assert set(failures) == {"m.jsonl:2", "m.jsonl:4"}
    assert failures["m.jsonl:2"].startswith("manifest: line 2 of m.jsonl is not valid JSON (")
    assert failures["m.jsonl:4"] == "manifest: line 4 of m.jsonl holds a list, not a JSON object"
    assert [s.members["txt"] for s in _samples(dest)] == [b"first", b"last"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"caption": "a cat"}\n{"caption": "a dog"\n{"caption": "a bird"}\n')
    doc = _shard(cli, "prompts", prompts, tmp_path / "prompts")
    assert (doc["seen"], doc["written"], doc["failed"]) == (3, 2, 1)
    assert [f["input"] for f in _report(tmp_path / "prompts")["failures"]] == ["p.jsonl:2"]


def test_json_python_cannot_take_fails_as_metadata(cli, sample_images, tmp_path):
    """Sidecars nested past the recursion limit, or holding NaN or Infinity (the json member is strict JSON),
    fail their input as ``metadata``; a manifest line nested too deeply is a ``manifest`` failure."""
    src = tmp_path / "photos"
    src.mkdir()
    sidecars = {"deep": "[" * 100_000 + "]" * 100_000, "nan": '{"score": NaN}', "inf": '{"score": 1e999}',
                "fine": '{"score": 1.5}'}
    for stem, text in sidecars.items():
        shutil.copyfile(sample_images[0], src / f"{stem}.jpg")
        (src / f"{stem}.json").write_text(text)
    dest = tmp_path / "out"
    doc = _shard(cli, "images", src, dest)
    assert (doc["seen"], doc["written"], doc["failed"]) == (4, 1, 3)
    reasons = {f["input"]: f["reason"] for f in _report(dest)["failures"]}
    assert reasons == {"deep.jpg": "metadata: deep.json: nested too deeply to parse",
                       "inf.jpg": "metadata: inf.json: the number 1e999 is out of range (not a finite float)",
                       "nan.jpg": "metadata: nan.json: NaN is not valid JSON"}

    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"path": str(sample_images[0])}) + "\n" + "[" * 100_000 + "\n")
    dest = tmp_path / "out2"
    doc = _shard(cli, "images", manifest, dest)
    assert (doc["seen"], doc["written"], doc["failed"]) == (2, 1, 1)
    (entry,) = _report(dest)["failures"]
    assert entry["reason"] == "manifest: line 2 of m.jsonl is not valid JSON (nested too deeply to parse)"
