"""`fgdata score` end to end: score files beside the shards, joined by key in the loaders, resumable, S3."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fgdata.score.job import ScoreOptions, sample_scores
from tests.faults.faultkit import run_ranks
from fgdata.shards import ShardWriter, iter_samples
from fgdata.shards.scores import SUFFIX
from inprocess import fgdata as fg  # output, files and exit status are what is checked; a kill test starts FGDATA
from scorefiles import score_rows

FGDATA = str(Path(sys.executable).with_name("fgdata"))


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def shards(tmp_path, sample_images) -> Path:
    """The repository's photos, a flat grey image, one undecodable image, one sample with no caption."""
    dest = tmp_path / "wds"
    with ShardWriter(str(dest), maxcount=3) as w:
        for i, p in enumerate(sample_images):
            w.write(f"photo_{i:03d}", {p.suffix[1:].lower(): p.read_bytes(), "txt": f"photo number {i}".encode(),
                                       "json": json.dumps({"source": p.name, "width": -1}).encode()})
        w.write("flat", {"png": _png(np.full((64, 96, 3), 128, np.uint8)), "txt": b"grey"})
        w.write("broken", {"jpg": b"not a jpeg", "txt": b"broken image"})
        w.write("nocaption", {"png": _png(np.zeros((40, 40, 3), np.uint8))})
    return dest


def test_score_writes_every_sample_beside_its_shard(shards):
    done = fg("score", str(shards), "--with", "basic", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    tars = sorted(shards.glob("*.tar"))
    assert sorted(p.name for p in shards.glob("*" + SUFFIX)) == [t.name + SUFFIX for t in tars]
    rows = score_rows(shards)
    keys = [s.key for t in tars for s in iter_samples(str(t))]
    assert list(rows) == keys and summary["samples"] == len(keys) and summary["failed_samples"] == 1
    options = ScoreOptions(("size", "sharpness", "exposure", "uniformity", "caption"))
    for t in tars:  # each row is the signals of that very sample
        for s in iter_samples(str(t)):
            assert rows[s.key] == sample_scores(s.members, options)
    assert rows["broken"]["score_error"].startswith(".jpg:") and "width" not in rows["broken"]
    assert rows["broken"]["caption_words"] == 2
    assert rows["flat"]["sharpness"] == 0.0 and rows["flat"]["uniformity"] == 1.0 and rows["flat"]["aspect"] == 1.5
    assert rows["nocaption"]["caption_chars"] == 0 and rows["nocaption"]["exposure_dark"] == 1.0
    for row in rows.values():  # numbers only, never NaN
        for name, value in row.items():
            assert name == "score_error" or (isinstance(value, (int, float)) and np.isfinite(value))
    meta = json.loads((shards / "scores.json").read_text())
    assert set(meta["signals"]) == {"size", "sharpness", "exposure", "uniformity", "caption"}
    assert meta["signals"]["sharpness"]["model_sha256"] is None and "512" in meta["signals"]["sharpness"]["preprocessing"]
    media = {t.name: t.read_bytes() for t in tars}
    # another signal later adds to the file; the shards are untouched; a rerun changes nothing
    first = {p.name: p.read_bytes() for p in shards.glob("*" + SUFFIX)}
    assert fg("score", str(shards), "--with", "caption", "-q").returncode == 0
    assert {p.name: p.read_bytes() for p in shards.glob("*" + SUFFIX)} == first
    assert {t.name: t.read_bytes() for t in tars} == media


def test_torchrun_ranks_score_their_share_and_together_the_whole(shards, tmp_path):
    """Two ranks started at once: rank r scores shards r, r+2, ...; the files they leave are those of one process."""
    import shutil

    alone = tmp_path / "alone"
    shutil.copytree(shards, alone)
    assert fg("score", str(alone), "--with", "basic", "-q").returncode == 0
    docs = run_ranks([FGDATA, "score", str(shards), "--with", "basic"], timeout=300)
    tars = sorted(t.name for t in shards.glob("*.tar"))
    for r, doc in enumerate(docs):
        assert (doc["rank"], doc["world"]) == (r, 2)
        assert [Path(s["shard"]).name for s in doc["shards"]] == tars[r::2]
    written = sorted(p.name for p in shards.iterdir() if p.suffix != ".tar")
    assert written == sorted(p.name for p in alone.iterdir() if p.suffix != ".tar")
    for name in written:
        assert (shards / name).read_bytes() == (alone / name).read_bytes(), name


def test_rescoring_adds_fields(shards):
    assert fg("score", str(shards), "--with", "caption").returncode == 0
    assert set(score_rows(shards)["photo_000"]) == {"caption_words", "caption_chars"}
    assert fg("score", str(shards), "--with", "size").returncode == 0
    assert set(score_rows(shards)["photo_000"]) == {"caption_words", "caption_chars", "width", "height", "aspect"}
    assert set(json.loads((shards / "scores.json").read_text())["signals"]) == {"caption", "size"}


def test_loaders_join_scores_and_presets_filter_keeps_exactly(shards):
    from fgdata.loaders import WDSLoader

    assert fg("score", str(shards), "--with", "basic").returncode == 0
    rows = score_rows(shards)
    threshold = float(np.median([r["sharpness"] for r in rows.values() if "sharpness" in r]))
    # presets_filter keeps a sample whose field is >= the threshold, and one without the field (the broken image)
    want = sorted(k for k, r in rows.items() if r.get("sharpness", threshold) >= threshold)
    loader = WDSLoader(["WDS:" + str(shards)], batch_size=1, num_workers=0, train=False, partial=True,
                       presets_filter={"score": {"threshold": threshold, "score_key": "sharpness"}},
                       key_map={"meta": "json", "caption": "txt"}, missing_text="empty")
    got = _metas(loader)
    assert sorted(got) == want and 0 < len(want) < len(rows)
    name = next(k for k in want if k.startswith("photo"))
    assert got[name]["source"].endswith((".png", ".jpg")) and got[name]["width"] > 0  # a score replaces the json's own
    assert got[name]["sharpness"] == rows[name]["sharpness"]
    # the deterministic reader (random access) joins the same fields, also into samples that had no json
    det = WDSLoader(["WDS:" + str(shards)], batch_size=1, num_workers=0, deterministic=True, train=False,
                    partial=True, key_map={"meta": "json"})
    every = _metas(det)
    assert sorted(every) == sorted(rows)
    assert every["nocaption"] == rows["nocaption"] and every[name] == {**got[name]}


def _metas(loader) -> dict[str, dict]:
    """key -> the json the loader delivered (batches of one: each collated field holds one value)."""
    got = {}
    for batch in loader:
        (key,) = batch["__key__"]
        got[key] = {k: (v.tolist() if hasattr(v, "tolist") else v)[0] for k, v in batch["meta"].items()}
    return got


def test_missing_signal_and_path_are_one_line(shards, tmp_path):
    bad = fg("score", str(shards), "--with", "clip_score")
    assert bad.returncode == 2 and "unknown signal 'clip_score'" in bad.stderr
    missing = fg("score", str(tmp_path / "nope"), "--with", "size")
    assert missing.returncode == 1 and "nope" in missing.stderr and "Traceback" not in missing.stderr


def test_sigkill_and_rerun_give_the_uninterrupted_result(shards, tmp_path):
    import shutil

    clean = tmp_path / "clean"
    shutil.copytree(shards, clean)
    assert fg("score", str(clean), "--with", "basic").returncode == 0
    want = {p.name: p.read_bytes() for p in clean.iterdir()}
    proc = subprocess.Popen([FGDATA, "score", str(shards), "--with", "basic"], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, start_new_session=True,
                            env={**os.environ, "FGDATA_TEST_STOP_AFTER": "1"})
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "fgdata-test-hook: paused" in line:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert len(list(shards.glob("*" + SUFFIX))) == 1 and not (shards / "scores.json").exists()
    again = fg("score", str(shards), "--with", "basic", "--json")
    assert again.returncode == 0, again.stderr
    assert sum(s["skipped"] for s in json.loads(again.stdout)["shards"]) == 1
    assert {p.name: p.read_bytes() for p in shards.iterdir()} == want


def test_no_resume_scores_again_and_overwrite_removes_the_score_files(shards):
    """Resume is the default (a rerun keeps every shard); --no-resume scores every shard again, saying so, to the
    same bytes and keeping other signals' fields; --overwrite names and removes the score files first, so only the
    asked-for signal's fields are left."""
    assert fg("score", shards, "--with", "caption", "-q").returncode == 0
    assert fg("score", shards, "--with", "size", "-q").returncode == 0
    before = {p.name: p.read_bytes() for p in shards.iterdir() if p.is_file()}
    kept = fg("score", shards, "--with", "size", "--json")
    assert kept.returncode == 0 and all(s["skipped"] for s in json.loads(kept.stdout)["shards"])
    again = fg("score", shards, "--with", "size", "--no-resume", "--json")
    assert again.returncode == 0, again.stderr
    assert f"--no-resume: scoring every shard of {shards} again with size" in again.stderr
    assert not any(s["skipped"] for s in json.loads(again.stdout)["shards"])
    assert {p.name: p.read_bytes() for p in shards.iterdir() if p.is_file()} == before
    assert set(score_rows(shards)["photo_000"]) == {"caption_words", "caption_chars", "width", "height", "aspect"}
    files = sorted(shards.glob("*" + SUFFIX))
    fresh = fg("score", shards, "--with", "size", "--overwrite")
    assert fresh.returncode == 0, fresh.stderr
    assert f"--overwrite: removing {len(files) + 1} score file(s) from {shards}: {files[0].name}" in fresh.stderr
    assert set(score_rows(shards)["photo_000"]) == {"width", "height", "aspect"}
    assert set(json.loads((shards / "scores.json").read_text())["signals"]) == {"size"}
    assert sorted(shards.glob("*" + SUFFIX)) == files and not (shards / ".fgdata-score").exists()


@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_score_on_s3(shards, s3_bucket):
    from fgdata import storage

    for p in sorted(shards.glob("*.tar")):
        storage.upload(str(p), f"{s3_bucket}/ds/{p.name}")
    done = fg("score", f"{s3_bucket}/ds", "--with", "size")
    assert done.returncode == 0, done.stderr
    assert fg("score", str(shards), "--with", "size").returncode == 0
    for p in sorted(shards.glob("*.tar")):
        assert storage.read_bytes(f"{s3_bucket}/ds/{p.name}{SUFFIX}") == (shards / (p.name + SUFFIX)).read_bytes()


def test_verify_inspect_report_read_the_scores(shards, tmp_path):
    assert fg("score", str(shards), "--with", "basic").returncode == 0
    rows = score_rows(shards)
    ok = fg("verify", str(shards), "--json")
    assert ok.returncode == 0, ok.stdout
    inspect = json.loads(fg("inspect", str(shards), "--json", "-n", "0").stdout)
    assert set(inspect["scores"][str(shards)]) == {"size", "sharpness", "exposure", "uniformity", "caption"}
    text = fg("inspect", str(shards / "00000.tar"), "-n", "0", env={"COLUMNS": "300"}).stdout
    assert "variance of the 4-neighbour Laplacian" in text
    threshold = sorted(r["sharpness"] for r in rows.values() if "sharpness" in r)[2]
    report = fg("report", str(shards), "-o", str(tmp_path / "r.html"), "--json", "--threshold", f"sharpness={threshold}")
    assert report.returncode == 1 and "undecodable image" in report.stderr  # the broken sample, found as always
    sharp = json.loads(report.stdout)["numeric_fields"]["sharpness"]
    assert sharp["present"] == sum("sharpness" in r for r in rows.values())
    assert sharp["score_filter"]["kept_with_field"] == sum(r.get("sharpness", -1) >= threshold for r in rows.values())
    # a score file that no longer matches its shard is a verify finding
    first = shards / ("00000.tar" + SUFFIX)
    lines = first.read_text().splitlines()
    first.write_text("\n".join(lines[:-1]) + "\n")
    bad = fg("verify", str(shards), "--json")
    assert bad.returncode == 1 and "scores-mismatch" in bad.stdout
    first.write_text("not a score file\n")
    assert "scores-invalid" in fg("verify", str(shards), "--json").stdout


def test_into_writes_the_json_in_place_and_the_filter_keeps_the_same_samples(shards, tmp_path):
    import shutil

    from fgdata.loaders import WDSLoader

    beside = tmp_path / "beside"
    shutil.copytree(shards, beside)
    assert fg("score", str(beside), "--with", "basic").returncode == 0
    rows = score_rows(beside)
    media = {t.name: {s.key: {e: d for e, d in s.members.items() if e != "json"} for s in iter_samples(str(t))}
             for t in sorted(shards.glob("*.tar"))}
    not_updated = []
    for signals in ("size,sharpness", "caption"):  # a second signal adds to the json
        done = fg("score", str(shards), "--with", signals, "--into", "--json")
        assert done.returncode == 0, done.stderr
        not_updated.append(json.loads(done.stdout).get("not_updated", 0))
    assert not_updated == [1, 0]  # the broken image has no image fields: kept as it was; its caption is scored
    assert not list(shards.glob("*" + SUFFIX))
    for t in sorted(shards.glob("*.tar")):
        for s in iter_samples(str(t)):
            assert {e: d for e, d in s.members.items() if e != "json"} == media[t.name][s.key]  # media untouched
            if s.key == "broken":
                assert json.loads(s.members["json"]) == {"caption_chars": 12, "caption_words": 2}
                continue
            doc = json.loads(s.members["json"])
            for name in ("width", "height", "aspect", "sharpness", "caption_words", "caption_chars"):
                assert doc[name] == rows[s.key][name], (s.key, name)
            if s.key.startswith("photo"):
                assert doc["source"].endswith((".png", ".jpg"))
    threshold = float(np.median([r["sharpness"] for r in rows.values() if "sharpness" in r]))
    kept = {}
    for folder in (shards, beside):
        loader = WDSLoader(["WDS:" + str(folder)], batch_size=1, num_workers=0, train=False, partial=True,
                           presets_filter={"score": {"threshold": threshold, "score_key": "sharpness"}},
                           key_map={"caption": "txt"}, missing_text="empty")
        kept[folder] = sorted(k for b in loader for k in b["__key__"])
    assert kept[shards] == kept[beside] == sorted(k for k, r in rows.items() if r.get("sharpness", threshold) >= threshold)
    # scores beside a shard and --into do not mix
    refused = fg("score", str(beside), "--with", "size", "--into")
    assert refused.returncode == 1 and SUFFIX in refused.stderr and "Traceback" not in refused.stderr
