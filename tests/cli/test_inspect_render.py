"""`fgdata inspect` at 80 columns: 4 significant digits, `float32[3,17,29]` tokens never split; --json exact."""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fgdata.shards import ShardWriter
from inprocess import fgdata

EXACT = -2.700103998184204


@pytest.fixture(scope="module")
def shard(tmp_path_factory, sample_images, sample_video) -> Path:
    import torch

    dest = tmp_path_factory.mktemp("inspect")
    latent = torch.linspace(EXACT, 3.0, 3 * 17 * 29, dtype=torch.float64).float().reshape(3, 17, 29)
    buf = io.BytesIO()
    torch.save(latent, buf)
    npz = io.BytesIO()
    np.savez(npz, emb=np.full((2, 77, 4096), 0.123456789, np.float16), mask=np.ones(77, np.int64))
    caption = "a watercolour of a lighthouse on a cliff at dusk, gulls overhead, long exposure, " * 3
    with ShardWriter(str(dest), maxcount=10) as w:
        w.write("tensors", {"latent.pth": buf.getvalue(), "txt_emb.npz": npz.getvalue(), "txt": caption.encode(),
                            "json": json.dumps({"aesthetic_score": 5.123456789, "width": 512}).encode()})
        w.write("photo", {"jpg": next(p for p in sample_images if p.suffix == ".jpg").read_bytes()})
        w.write("clip", {"mp4": sample_video.read_bytes()})
    return dest / "00000.tar"


def _inspect(shard: Path, *args: str) -> subprocess.CompletedProcess:
    return fgdata("inspect", str(shard), *args, env={"COLUMNS": "80"})


def test_table_is_compact_and_never_splits_a_shape(shard):
    out = _inspect(shard)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    text = out.stdout
    assert "float32[3,17,29]" in text and "float16[2,77,4096]" in text and "int64[77]" in text
    assert re.search(r"min -2\.7(\s|$)", text, re.MULTILINE)  # -2.700103998184204 at 4 significant digits
    assert not re.search(r"\d\.\d{5,}", text), "floats beyond 4 significant digits"
    assert "h264 1280×720" in text and "132 frames" in text and "25 fps" in text
    assert "{" not in text and "[3, 17" not in text  # no dict or list reprs


def test_json_keeps_full_precision(shard):
    out = _inspect(shard, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    members = {s["key"]: s["members"] for s in doc["samples_shown"]}
    latent = members["tensors"]["latent.pth"]["tensor"]
    assert latent["shape"] == [3, 17, 29] and latent["dtype"] == "float32"
    assert latent["min"] == pytest.approx(np.float32(EXACT), abs=0) and latent["min"] != round(latent["min"], 4)
