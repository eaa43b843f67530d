"""fgdata shard images: pass-through, re-encode, corrupt inputs, determinism, workers, shuffle."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from job_summary import check_json_summary
from PIL import Image

from fgdata.shards import discover_shards, iter_samples, read_shard_counts


#: The bundled photos that are not stored as they are: transparency, and an Adobe RGB profile.
NORMALISED = {"horse.png": {"alpha": "#ffffff"}, "sub/rocket.jpg": {"icc": "Adobe RGB (1998)"}}


def _samples(dest: Path) -> list:
    return [s for shard in discover_shards(str(dest)) for s in iter_samples(shard)]


def test_pass_through_keeps_bytes_captions_and_metadata(cli, image_folder: Path, tmp_path: Path):
    """--format keep: every photo byte for byte but those a viewer shows differently (NORMALISED)."""
    dest = tmp_path / "out"
    cli("shard", "images", image_folder, dest, "--maxcount", "3", "--format", "keep", "--no-progress")
    samples = _samples(dest)
    files = sorted(p.relative_to(image_folder).as_posix() for p in image_folder.rglob("*") if p.suffix in (".jpg", ".png"))
    assert [s.key for s in samples] == [f"sample_{i:06d}" for i in range(len(files))]
    for sample, rel in zip(samples, files):
        ext = "jpg" if rel.endswith(".jpg") else "png"
        meta = json.loads(sample.members["json"])["fgdata"]
        if rel in NORMALISED:
            assert meta["normalised"] == NORMALISED[rel] and meta["mode"] == "RGB"
        else:
            assert sample.members[ext] == (image_folder / rel).read_bytes()  # no re-encode
            assert "normalised" not in meta
        assert meta["source"] == rel and {"width", "height", "mode"} <= meta.keys()
        assert sample.members["txt"].decode() == (image_folder / rel).with_suffix(".txt").read_text().strip()
    rocket = json.loads(samples[files.index("sub/rocket.jpg")].members["json"])
    assert rocket["score"] == 6.5 and rocket["tags"] == ["space"] and rocket["fgdata"]["width"] == 640
    counts = read_shard_counts(str(dest / "shard_count.json"))
    n = len(files)
    assert counts == {f"{i:05d}.tar": min(3, n - 3 * i) for i in range((n + 2) // 3)}
    report = json.loads((dest / "failures.json").read_text())
    assert report["seen"] == report["written"] == n and report["failed"] == 0


def test_default_format_is_jpeg_with_jpeg_inputs_kept(cli, image_folder: Path, tmp_path: Path):
    dest = tmp_path / "out"
    doc = json.loads(cli("shard", "images", image_folder, dest, "--json").stdout)
    files = sorted(p.relative_to(image_folder).as_posix() for p in image_folder.rglob("*") if p.suffix in (".jpg", ".png"))
    samples = _samples(dest)
    assert len(samples) == len(files) and doc["normalised"] == {"alpha": 1, "icc": 1}
    for sample, rel in zip(samples, files):
        assert set(sample.members) == {"jpg", "json", "txt"}
        if rel.endswith(".jpg") and rel not in NORMALISED:
            assert sample.members["jpg"] == (image_folder / rel).read_bytes()
        else:
            im = Image.open(io.BytesIO(sample.members["jpg"]))
            assert im.format == "JPEG" and im.size == Image.open(image_folder / rel).size


def test_corrupt_inputs_are_reported_and_counts_reconcile(cli, corrupt_folder: Path, tmp_path: Path):
    dest = tmp_path / "out"
    result = cli("shard", "images", corrupt_folder, dest, "--no-progress", "--json")
    doc = json.loads(result.stdout)
    n = len(list(corrupt_folder.rglob("*.jpg"))) + len(list(corrupt_folder.rglob("*.png")))
    assert doc["seen"] == n and doc["written"] == n - 2 and doc["failed"] == 2
    assert doc["seen"] == doc["written"] + doc["failed"]
    assert doc["failed_by_reason"] == {"image-decode": 2}
    report = json.loads((dest / "failures.json").read_text())
    assert sorted(f["input"] for f in report["failures"]) == ["notes.jpg", "truncated.jpg"]
    assert all(f["reason"].startswith("image-decode:") for f in report["failures"])
    assert len(_samples(dest)) == n - 2


def test_rerun_is_byte_identical_and_workers_do_not_change_output(cli, corrupt_folder, tmp_path, snapshot):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    cli("shard", "images", corrupt_folder, a, "--maxcount", "3", "--no-progress")
    cli("shard", "images", corrupt_folder, b, "--maxcount", "3", "--no-progress", "--no-resume")
    cli("shard", "images", corrupt_folder, c, "--maxcount", "3", "--no-progress", "--workers", "2")
    assert snapshot(a) == snapshot(b) == snapshot(c)
    before = snapshot(a)
    cli("shard", "images", corrupt_folder, a, "--maxcount", "3", "--no-progress")  # resume: nothing left to do
    assert snapshot(a) == before


def test_reencode_max_side_and_format(cli, image_folder, tmp_path, snapshot):
    from PIL import Image
    import io

    one, two = tmp_path / "w1", tmp_path / "w2"
    cli("shard", "images", image_folder, one, "--max-side", "96", "--format", "webp", "--quality", "80", "--no-progress")
    cli("shard", "images", image_folder, two, "--max-side", "96", "--format", "webp", "--quality", "80",
        "--no-progress", "--workers", "2")
    assert snapshot(one) == snapshot(two)
    for sample in _samples(one):
        assert set(sample.members) == {"webp", "json", "txt"}
        im = Image.open(io.BytesIO(sample.members["webp"]))
        meta = json.loads(sample.members["json"])["fgdata"]
        assert max(im.size) == 96 and (meta["width"], meta["height"]) == im.size


def test_shuffle_seed_gives_a_seeded_order_with_stable_keys(cli, image_folder, tmp_path, snapshot):
    plain, s1, s1b, s2 = (tmp_path / n for n in ("plain", "s1", "s1b", "s2"))
    cli("shard", "images", image_folder, plain, "--no-progress")
    cli("shard", "images", image_folder, s1, "--shuffle-seed", "1", "--no-progress")
    cli("shard", "images", image_folder, s1b, "--shuffle-seed", "1", "--no-progress")
    cli("shard", "images", image_folder, s2, "--shuffle-seed", "2", "--no-progress")
    assert snapshot(s1) == snapshot(s1b)
    keys = {name: [s.key for s in _samples(d)] for name, d in (("plain", plain), ("s1", s1), ("s2", s2))}
    assert keys["s1"] != keys["plain"] and keys["s1"] != keys["s2"]
    assert sorted(keys["s1"]) == keys["plain"]  # a key names its input, whatever the order
    by_key = {s.key: s.members for s in _samples(plain)}
    assert all(by_key[s.key] == s.members for s in _samples(s1))


def test_resume_refuses_a_different_job(cli, image_folder, tmp_path):
    dest = tmp_path / "out"
    cli("shard", "images", image_folder, dest, "--no-progress")
    result = cli("shard", "images", image_folder, dest, "--max-side", "64", "--no-progress", expect=1)
    assert "--no-resume" in str(result.exception)
    cli("shard", "images", image_folder, dest, "--max-side", "64", "--no-progress", "--no-resume")


def test_missing_source_is_one_line_error(tmp_path):
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("fgdata")
    proc = subprocess.run([str(exe), "shard", "images", str(tmp_path / "nope"), str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error:") and len(proc.stderr.strip().splitlines()) == 1


def test_a_file_given_for_the_source_folder_says_what_was_expected(image_folder, tmp_path):
    photo = next(p for p in sorted(image_folder.iterdir()) if p.suffix in (".jpg", ".png"))
    proc = _fgdata("shard", "images", photo, tmp_path / "out")
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: {photo}: is a file; expected a folder or a manifest (.csv, .jsonl, .parquet)"
    assert not (tmp_path / "out").exists()


def _fgdata(*args) -> subprocess.CompletedProcess:
    """The installed console script in a fresh process: real stdout and stderr, stderr not a terminal."""
    fgdata = str(Path(sys.executable).with_name("fgdata"))
    return subprocess.run([fgdata, *map(str, args)], capture_output=True, text=True, timeout=120)


def test_json_is_the_only_stdout_and_quiet_prints_nothing(corrupt_folder: Path, tmp_path: Path):
    dest = tmp_path / "out"
    done = _fgdata("shard", "images", corrupt_folder, dest, "--maxcount", "3", "--json")
    assert done.returncode == 0, done.stderr
    doc = check_json_summary(done.stdout, "shard images", dest)
    n = len(list(corrupt_folder.rglob("*.jpg"))) + len(list(corrupt_folder.rglob("*.png")))
    assert (doc["seen"], doc["written"], doc["failed"]) == (n, n - 2, 2)
    assert doc["failures_file"] == str(dest / "failures.json") and doc["source"] == str(corrupt_folder)
    assert done.stderr == ""  # no bar: stderr is not a terminal

    # --no-resume says what it deletes, on stderr; stdout is still the one document
    again = _fgdata("shard", "images", corrupt_folder, dest, "--maxcount", "3", "--no-resume", "--json")
    assert again.returncode == 0, again.stderr
    assert "--no-resume: removing" in again.stderr and "00000.tar" in again.stderr
    assert check_json_summary(again.stdout, "shard images", dest)["written"] == n - 2

    quiet = _fgdata("shard", "images", corrupt_folder, tmp_path / "quiet", "--maxcount", "3", "-q")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    assert read_shard_counts(str(tmp_path / "quiet" / "shard_count.json")) == doc["counts"]


def test_quiet_still_prints_errors(tmp_path: Path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "fake.jpg").write_text("not an image")
    done = _fgdata("shard", "images", tmp_path / "in", tmp_path / "out", "-q")
    assert done.returncode == 1 and done.stdout == ""
    assert "nothing written: all 1 input(s) failed" in done.stderr


def _sized_images(folder: Path) -> dict[str, tuple[int, int]]:
    """PNGs of chosen sizes made here: wide, tall, small, square, very wide."""
    sizes = {"a_wide": (300, 200), "b_tall": (120, 240), "c_small": (40, 30), "d_square": (100, 100),
             "e_strip": (400, 50)}
    folder.mkdir()
    for i, (name, size) in enumerate(sizes.items()):
        Image.new("RGB", size, (40 * i, 200 - 30 * i, 90)).save(folder / f"{name}.png")
    return sizes


def _image_sizes(dest: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for s in _samples(dest):
        im = Image.open(io.BytesIO(s.members["jpg"]))
        meta = json.loads(s.members["json"])["fgdata"]
        assert (meta["width"], meta["height"]) == im.size
        out[meta["source"].rsplit(".", 1)[0]] = im.size
    return out


def test_resize_modes_give_img2dataset_sizes(cli, tmp_path: Path):
    """Each --resize-mode's exact output sizes (smaller images enlarged), and --max-side as keep_ratio_largest
    that never enlarges."""
    src = tmp_path / "sized"
    sizes = _sized_images(src)
    expected = {
        "keep_ratio": {"a_wide": (96, 64), "b_tall": (64, 128), "c_small": (85, 64), "d_square": (64, 64),
                       "e_strip": (512, 64)},
        "keep_ratio_largest": {"a_wide": (64, 43), "b_tall": (32, 64), "c_small": (64, 48), "d_square": (64, 64),
                               "e_strip": (64, 8)},
        "center_crop": {name: (64, 64) for name in sizes},
        "border": {name: (64, 64) for name in sizes},
        "no": sizes,
    }
    for mode, want in expected.items():
        dest = tmp_path / mode
        size_flags = ["--image-size", "64"] if mode != "no" else []
        cli("shard", "images", src, dest, "--resize-mode", mode, *size_flags, "--no-progress")
        assert _image_sizes(dest) == want, mode
    dest = tmp_path / "max-side"
    cli("shard", "images", src, dest, "--max-side", "64", "--no-progress")
    assert _image_sizes(dest) == {**expected["keep_ratio_largest"], "c_small": (40, 30)}
    # border pads with --background: the strip's rows above and below it are black
    dest = tmp_path / "border-black"
    cli("shard", "images", src, dest, "--resize-mode", "border", "--image-size", "64", "--background", "black",
        "--format", "png", "--no-progress")
    strip = next(s for s in _samples(dest) if json.loads(s.members["json"])["fgdata"]["source"] == "e_strip.png")
    im = Image.open(io.BytesIO(strip.members["png"])).convert("RGB")
    assert im.size == (64, 64) and im.getpixel((32, 0)) == (0, 0, 0) and im.getpixel((32, 63)) == (0, 0, 0)
    assert im.getpixel((32, 32)) == (160, 80, 90)


def test_resize_flags_are_checked_and_part_of_the_job(cli, tmp_path: Path):
    src = tmp_path / "sized"
    _sized_images(src)
    for flags, says in ((["--resize-mode", "border"], "--image-size"), (["--image-size", "64"], "--resize-mode"),
                        (["--resize-mode", "fit", "--image-size", "64"], "--resize-mode"),
                        (["--resize-mode", "border", "--image-size", "64", "--max-side", "64"], "--max-side")):
        result = cli("shard", "images", src, tmp_path / "bad", *flags, "--no-progress", expect=2)  # a usage error
        assert says in " ".join(result.output.split()), flags
    dest = tmp_path / "out"
    cli("shard", "images", src, dest, "--resize-mode", "border", "--image-size", "64", "--no-progress")
    result = cli("shard", "images", src, dest, "--resize-mode", "border", "--image-size", "32", "--no-progress", expect=1)
    assert "--image-size was 64, now 32" in str(result.exception)


def test_size_filters_fail_as_filtered(cli, tmp_path: Path):
    """--min-image-size, --max-image-area, --max-aspect-ratio judge the original size; every input is counted."""
    src = tmp_path / "sized"
    sizes = _sized_images(src)
    dest = tmp_path / "out"
    cli("shard", "images", src, dest, "--min-image-size", "50", "--max-image-area", "50000",
        "--max-aspect-ratio", "3", "--resize-mode", "center_crop", "--image-size", "32", "--no-progress")
    assert _image_sizes(dest) == {"b_tall": (32, 32), "d_square": (32, 32)}
    report = json.loads((dest / "failures.json").read_text())
    assert report["seen"] == len(sizes) == report["written"] + report["failed"] and report["failed"] == 3
    assert report["failed_by_reason"] == {"filtered": 3}
    reasons = {f["input"]: f["reason"] for f in report["failures"]}
    assert reasons == {
        "a_wide.png": "filtered: 300x200: area above --max-image-area 50000",
        "c_small.png": "filtered: 40x30: smaller side below --min-image-size 50",
        "e_strip.png": "filtered: 400x50: aspect ratio above --max-aspect-ratio 3",
    }
