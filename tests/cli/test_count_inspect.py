"""`fgdata count-shards`, `fgdata inspect`, start-up cost and error conventions, through the console entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fgdata.shards import ShardWriter, scan_shard
from inprocess import fgdata

def fg(*args: str, **kw) -> subprocess.CompletedProcess:
    """``fgdata ARGS`` in this process, through the console entry (its exit codes and one-line errors)."""
    return fgdata(*args, **kw)


@pytest.fixture(scope="module")
def shards(tmp_path_factory, sample_images, sample_video) -> Path:
    import torch

    dest = tmp_path_factory.mktemp("shards")
    buf = __import__("io").BytesIO()
    torch.save(torch.arange(12, dtype=torch.float32).reshape(3, 4).clone(), buf)
    npy = __import__("io").BytesIO()
    np.save(npy, np.ones((2, 2), dtype=np.float16))
    with ShardWriter(str(dest), maxcount=3) as w:
        for i, p in enumerate(sample_images):
            w.write(f"sample_{i:06d}", {p.suffix[1:]: p.read_bytes(), "txt": f"photo {i}".encode(), "json": b'{"score": 5}'})
        w.write("clip", {"mp4": sample_video.read_bytes(), "txt": b"bunny"})
        w.write("tensors", {"latent.pth": buf.getvalue(), "emb.npy": npy.getvalue()})
    return dest


def test_help_lists_commands_and_stays_light():
    out = fg("--help")
    assert out.returncode == 0
    for name in ("count-shards", "inspect"):
        assert name in out.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; sys.argv=['fgdata','--help'];\n"
         "from fgdata.cli import main\n"
         "try: main.run()\n"
         "except SystemExit: pass\n"
         "print(sorted(m for m in ('torch','diffusers','transformers','webdataset','av','ray','pyarrow','boto3') if m in sys.modules))"],
        capture_output=True, text=True, timeout=60,
    )
    assert probe.stdout.strip().splitlines()[-1] == "[]"
    assert fg("--version").stdout.startswith("fgdata ")


def test_count_shards_table_json_and_output(shards, tmp_path):
    out = fg("count-shards", str(shards))
    assert out.returncode == 0, out.stderr
    assert "total" in out.stdout
    counts = json.loads((shards / "shard_count.json").read_text())
    assert sum(counts.values()) == 9 and list(counts) == ["00000.tar", "00001.tar", "00002.tar"]
    doc = json.loads(fg("count-shards", str(shards), "--json", "--output", str(tmp_path / "c.json")).stdout)
    assert doc["total_samples"] == 9 and [s["samples"] for s in doc["shards"]] == [3, 3, 3]
    assert json.loads((tmp_path / "c.json").read_text()) == counts


def test_count_shards_reports_damage_with_exit_1(shards, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    data = (shards / "00000.tar").read_bytes()
    entries = scan_shard(str(shards / "00000.tar")).samples
    (bad / "00000.tar").write_bytes(data[: entries[2].start + 600])
    (bad / "00001.tar").write_bytes((shards / "00001.tar").read_bytes())
    (bad / "00002.tar").write_bytes(b"not a tar" * 100)
    out = fg("count-shards", str(bad), "--json")
    assert out.returncode == 1
    rows = {r["shard"]: r for r in json.loads(out.stdout)["shards"]}
    assert rows["00000.tar"]["samples"] == 2 and "truncated" in rows["00000.tar"]["damage"]
    assert rows["00001.tar"]["damage"] is None and rows["00002.tar"]["damage"]
    assert "Traceback" not in out.stderr


def test_inspect_summaries_key_and_preview(shards, tmp_path):
    out = fg("inspect", str(shards / "00002.tar"), "--json", "--preview", str(tmp_path / "p.png"))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["samples"] == 3
    shown = {s["key"]: s["members"] for s in doc["samples_shown"]}
    video = shown["clip"]["mp4"]
    assert (video["width"], video["height"], video["codec"], video["frame_count"]) == (1280, 720, "h264", 132)
    assert video["audio_codec"] == "aac" and video["audio_sample_rate"] == 48000
    assert shown["tensors"]["latent.pth"]["tensor"] == {"dtype": "float32", "shape": [3, 4], "min": 0.0, "max": 11.0, "mean": 5.5}
    assert shown["tensors"]["emb.npy"]["tensor"]["dtype"] == "float16"
    assert doc["preview"]["tiles"] == 2 and (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one contact sheet in fgdata: the preview is the report's, tile for tile and byte for byte
    report = fg("report", str(shards / "00002.tar"), "-o", str(tmp_path / "r.html"), "--tiles", "3",
                "--contact-sheet", str(tmp_path / "r.png"), "--json")
    assert json.loads(report.stdout)["contact_sheet"] == [{"shard": "00002.tar", "key": k} for k in ("sample_000006", "clip")]
    assert (tmp_path / "p.png").read_bytes() == (tmp_path / "r.png").read_bytes()
    one = json.loads(fg("inspect", str(shards / "00000.tar"), "--key", "sample_000001", "--json").stdout)
    assert [s["key"] for s in one["samples_shown"]] == ["sample_000001"]
    first = one["samples_shown"][0]["members"]
    assert first["json"]["keys"] == ["score"] and first["txt"]["text"] == "photo 1"
    table = fg("inspect", str(shards / "00000.tar"), "--limit", "1")
    assert "extension sets" in table.stdout and "sample_000000" in table.stdout


@pytest.mark.parametrize("content", [b"", b"definitely not a tar archive" * 30])
def test_inspect_bad_input_is_one_line(tmp_path, content):
    p = tmp_path / "x.tar"
    p.write_bytes(content)
    out = fg("inspect", str(p))
    if content:
        assert out.returncode == 1 and out.stderr.strip().startswith("error:") and len(out.stderr.strip().splitlines()) == 1
    else:
        assert out.returncode == 0 and "0 samples" in out.stdout


def test_usage_errors_exit_2():
    assert fg("inspect").returncode == 2
    assert fg("count-shards", "--workers", "0", "x").returncode == 2
    assert fg("no-such-command").returncode == 2


@pytest.mark.s3
def test_count_and_inspect_on_s3(shards, s3_bucket):
    from fgdata import storage

    for p in sorted(shards.glob("*.tar")):
        storage.upload(str(p), f"{s3_bucket}/ds/{p.name}")
    env = dict(os.environ)
    out = fg("count-shards", f"{s3_bucket}/ds", "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["total_samples"] == 9
    assert json.loads(storage.read_bytes(f"{s3_bucket}/ds/shard_count.json")) == {"00000.tar": 3, "00001.tar": 3, "00002.tar": 3}
    doc = json.loads(fg("inspect", f"{s3_bucket}/ds/00002.tar", "--json", env=env).stdout)
    assert doc["samples"] == 3 and doc["extension_sets"]
    missing = fg("inspect", f"{s3_bucket}/ds/nope.tar", env=env)
    assert missing.returncode == 1 and "nope.tar" in missing.stderr and "Traceback" not in missing.stderr


def test_inspect_of_many_shards_shows_limit_samples_in_one_summary(tmp_path, sample_images):
    """A folder of 30 one-sample shards with --limit 3: one summary of them all and 3 samples, not 30 tables."""
    with ShardWriter(str(tmp_path), maxcount=1) as w:
        for i in range(30):
            w.write(f"sample_{i:06d}", {"jpg": sample_images[0].read_bytes(), "txt": f"photo {i}".encode()})
    out = fg("inspect", str(tmp_path), "--limit", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("extension sets") == 1 and out.stdout.count("bytes per extension") == 1
    assert "30 shards: 30 samples" in out.stdout
    shown = [k for k in (f"sample_{i:06d}" for i in range(30)) if k in out.stdout]
    assert shown == ["sample_000000", "sample_000001", "sample_000002"]
    assert len(out.stdout.splitlines()) < 60
    doc = json.loads(fg("inspect", str(tmp_path), "--limit", "3", "--json").stdout)
    assert doc["total_samples"] == 30 and len(doc["shards"]) == 30
    assert [s["key"] for s in doc["samples_shown"]] == ["sample_000000", "sample_000001", "sample_000002"]
    assert doc["extension_sets"] == {"jpg,txt": 30}


def test_inspect_key_in_several_datasets_names_each_by_path(tmp_path, sample_images):
    """Every dataset numbers keys from sample_000000: --key shows the match in each, named by its folder's path."""
    for name, caption in (("a", "first"), ("b", "second")):
        with ShardWriter(str(tmp_path / name), maxcount=2) as w:
            for i in range(3):
                w.write(f"sample_{i:06d}", {"jpg": sample_images[0].read_bytes(), "txt": f"{caption} {i}".encode()})
    doc = json.loads(fg("inspect", "a", "b", "--key", "sample_000000", "--json", cwd=tmp_path).stdout)
    assert [(s["shard"], s["members"]["txt"]["text"]) for s in doc["samples_shown"]] == [
        ("a/00000.tar", "first 0"), ("b/00000.tar", "second 0")]
    out = fg("inspect", "a", "b", "--key", "sample_000000", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "a/00000.tar sample_000000" in out.stdout and "b/00000.tar sample_000000" in out.stdout
    alone = json.loads(fg("inspect", "a", "--key", "sample_000002", "--json", cwd=tmp_path).stdout)
    assert [s["shard"] for s in alone["samples_shown"]] == ["00001.tar"]
