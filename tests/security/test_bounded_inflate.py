"""A small ``.gz`` member that inflates past a reader's limit fails that member with the reason, in bounded memory,
in every reader: inspect (64 MiB), verify --decode, report and the loaders (64 MiB for text, json and integers,
1 GiB for media and tensors: the limit for the member's kind)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from fgdata.shards import ShardWriter

GIB = 1 << 30  # media and tensors
TEXT = 64 << 20  # text, json and integer members
FGDATA = [sys.executable, "-m", "fgdata"]
pytestmark = pytest.mark.timeout(300)


def _bomb(inflated: int) -> bytes:
    """gzip data of ``inflated`` zero bytes (about 1 MB per GiB)."""
    deflate = zlib.compressobj(6, zlib.DEFLATED, 31)
    block = bytes(16 << 20)
    parts = [deflate.compress(block) for _ in range(inflated // len(block))]
    return b"".join([*parts, deflate.compress(bytes(inflated % len(block))), deflate.flush()])


@pytest.fixture(scope="module")
def bomb_shards(tmp_path_factory) -> Path:
    """Three samples; the middle one's txt.gz, json.gz and npy.gz inflate to 1 GiB + 1 MiB each."""
    import gzip

    root = tmp_path_factory.mktemp("bomb") / "ds"
    bomb = _bomb(GIB + (1 << 20))
    assert len(bomb) < 2 << 20
    writer = ShardWriter(str(root), maxcount=10)
    for i in range(3):
        if i == 1:
            members = {"txt.gz": bomb, "json.gz": bomb, "npy.gz": bomb}
        else:
            members = {"txt.gz": gzip.compress(f"caption {i}".encode(), mtime=0),
                       "json.gz": gzip.compress(json.dumps({"score": i}).encode(), mtime=0),
                       "npy.gz": gzip.compress(_npy(i), mtime=0)}
        writer.write(f"sample_{i:06d}", members)
    writer.close()
    return root


def _npy(i: int) -> bytes:
    import io

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.full((2, 2), i, dtype=np.float32))
    return buf.getvalue()


# Runs a command and writes the peak resident size of it and every process it waited for (in bytes).
_MEASURE = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[2:]); "
            "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)); "
            "sys.exit(code)")


def _run(tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    """``fgdata ARGS`` (or ``python ARGS`` when the first is a .py file) and its peak resident bytes."""
    peak = tmp / "peak"
    command = [sys.executable, *args] if args[0].endswith(".py") else [*FGDATA, *args]
    proc = subprocess.run([sys.executable, "-c", _MEASURE, str(peak), *command], capture_output=True, text=True,
                          timeout=280, env={**os.environ, "COLUMNS": "200"})
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc, int(peak.read_text())


@pytest.mark.slow  # a member inflating past 64 MiB or 1 GiB
def test_inspect_stops_inflating_at_its_64_mib_limit(bomb_shards, tmp_path):
    proc, peak = _run(tmp_path, "inspect", str(bomb_shards / "00000.tar"), "--limit", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    shown = {s["key"]: s["members"] for s in json.loads(proc.stdout)["samples_shown"]}
    for ext in ("txt.gz", "json.gz", "npy.gz"):
        assert shown["sample_000001"][ext]["error"] == f".{ext} inflates past the {64 << 20:,}-byte limit; not loaded"
    assert shown["sample_000000"]["txt.gz"]["text"] == "caption 0"
    assert peak < 700 << 20, peak  # one 64 MiB member at a time, not the gigabyte


@pytest.mark.slow  # a member inflating past 64 MiB or 1 GiB
def test_verify_decode_fails_the_member_that_inflates_past_the_decode_limit(bomb_shards, tmp_path):
    proc, peak = _run(tmp_path, "verify", str(bomb_shards), "--decode", "--workers", "1", "--json")
    assert proc.returncode == 1, proc.stderr
    (shard,) = json.loads(proc.stdout)["per_shard"]
    assert shard["by_reason"] == {"gzip-too-large": 3}
    assert {(p["key"], p["detail"]) for p in shard["problems"]} == {
        ("sample_000001", f".{ext} inflates past the {limit:,}-byte limit for its kind")
        for ext, limit in (("json.gz", TEXT), ("npy.gz", GIB), ("txt.gz", TEXT))}
    assert peak < GIB + (700 << 20), peak  # at most the limit itself, never the inflated whole twice


@pytest.mark.slow  # a member inflating past 64 MiB or 1 GiB
def test_report_names_the_member_that_inflates_past_the_decode_limit(bomb_shards, tmp_path):
    proc, peak = _run(tmp_path, "report", str(bomb_shards), "-o", str(tmp_path / "r.html"), "--workers", "1",
                      "--json")
    doc = json.loads(proc.stdout)
    problems = {p["kind"]: p["examples"] for p in doc["problems"]}
    text, tensor = (f"inflates past the {n:,}-byte limit" for n in (TEXT, GIB))
    assert any("sample_000001.json.gz" in e and text in e for e in problems["member too large"]), problems
    assert any("sample_000001.npy.gz" in e and tensor in e for e in problems["undecodable tensor"]), problems
    assert peak < GIB + (700 << 20), peak


def test_loaders_drop_the_sample_with_the_reason(bomb_shards, tmp_path):
    script = tmp_path / "load.py"
    script.write_text(f"""
import logging
from fgdata.loaders import WDSLoader
logging.basicConfig(level=logging.WARNING, format="%(message)s")
loader = WDSLoader(["WDS:{bomb_shards}"], batch_size=1, key_map={{"caption": "txt.gz", "arr": "npy.gz"}},
                   train=False, partial=True, num_workers=0)
print("keys", sorted(k for batch in loader for k in batch["__key__"]))
""")
    proc, peak = _run(tmp_path, str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "keys ['sample_000000', 'sample_000002']" in proc.stdout
    assert "sample_000001" in proc.stderr and f"inflates past the {TEXT:,}-byte limit" in proc.stderr, proc.stderr
    assert peak < GIB + (700 << 20), peak


def test_the_stepwise_inflater_reads_what_gzip_reads():
    """Concatenated gzip members, zero padding, empty input: what gzip.decompress returns; cut or trailing
    data: a decode error; one byte past the limit: the limit error."""
    import gzip

    from fgdata.media.decode import InflateLimitError, MemberDecodeError, inflate_gz

    payload = os.urandom(3 << 20)  # incompressible: the input itself spans several steps
    for data in (gzip.compress(payload) + gzip.compress(b"x" * 5_000_000), gzip.compress(b"abc") + bytes(3000),
                 b"", gzip.compress(b"")):
        assert inflate_gz(data) == gzip.decompress(data)
    for bad in (gzip.compress(payload)[:-5], gzip.compress(b"abc") + b"\0x", b"not gzip"):
        with pytest.raises(MemberDecodeError, match="bad gzip data"):
            inflate_gz(bad)
    assert inflate_gz(gzip.compress(bytes(1000)), 1000) == bytes(1000)
    with pytest.raises(InflateLimitError, match="inflates past the 999-byte limit"):
        inflate_gz(gzip.compress(bytes(1000)), 999)
