"""Members over 2 GiB (one ``pread`` returns at most 0x7ffff000 bytes): read whole, never called damage.

The shard is a sparse file: its big payloads are holes, so the test writes a few KB, not gigabytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fgdata.shards import ShardFile, count_shards, scan_shard
from fgdata.shards.scan import MAX_READ

sys.path.insert(0, str(Path(__file__).parent))
import tarcraft  # noqa: E402

BIG = (2 << 30) + 4096 + 5  # over 2 GiB and over one pread's limit
TAIL = b"tail!"


def _sparse_shard(path: Path) -> None:
    """Sample ``big``: a .mp4 and a .bin of BIG bytes each (holes, with TAIL as their last bytes); then ``small``."""
    with open(path, "wb") as f:
        for ext in ("mp4", "bin"):
            f.write(bytes(tarcraft.raw_header(f"big.{ext}".encode(), b"%011o\0" % BIG)))
            start = f.tell()
            f.seek(start + BIG - len(TAIL))
            f.write(TAIL)
            f.write(bytes(-BIG % 512))
        f.write(tarcraft.member("small.txt", b"hello") + bytes(1024))


@pytest.fixture(scope="module")
def big_shard(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("big")
    shard = folder / "00000.tar"
    _sparse_shard(shard)
    if shard.stat().st_blocks * 512 > 1 << 20:
        pytest.skip("the temporary filesystem does not keep sparse files sparse")
    return shard


def fg(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fgdata", *args], capture_output=True, text=True, timeout=300)


def test_scan_and_count(big_shard):
    assert BIG > MAX_READ
    scan = scan_shard(str(big_shard))
    assert scan.damage is None and [s.key for s in scan.samples] == ["big", "small"]
    assert scan.samples[0].members["bin"][1] == BIG
    [row] = count_shards(str(big_shard))
    assert row.samples == 2 and row.damage is None and row.error is None


@pytest.mark.slow  # end to end, several seconds
def test_member_over_2_gib_reads_whole(big_shard):
    with ShardFile(str(big_shard)) as sf:
        sample = sf.sample(0, {"bin"})
        data = sample.members["bin"]
        assert len(data) == BIG and data[-len(TAIL):] == TAIL and data[:4096] == bytes(4096)
        del sample, data
        assert sf.sample(1).members == {"txt": b"hello"}


def test_verify_decode_reports_ok_with_a_too_large_note(big_shard):
    out = fg("verify", str(big_shard), "--decode", "--json")
    doc = json.loads(out.stdout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert doc["ok"] and doc["readable"] == 2 and doc["by_reason"] == {}
    [shard] = doc["per_shard"]
    assert [(n["reason"], n["key"]) for n in shard["notes"]] == [("too-large-to-decode", "big")]
    assert "truncated" not in out.stdout


def test_inspect_summarises_without_loading(big_shard):
    out = fg("inspect", str(big_shard), "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["samples"] == 2 and doc["damage"] is None and "short read" not in out.stdout
    big = doc["samples_shown"][0]["members"]
    assert big["bin"]["bytes"] == BIG and "not_loaded" in big["bin"] and "not_loaded" in big["mp4"]
    assert doc["samples_shown"][1]["members"]["txt"]["text"] == "hello"


# VmHWM is this process's own peak (ru_maxrss would include the parent's, which it keeps across exec).
MAXRSS = """
import runpy, sys
sys.argv = ["fgdata", *sys.argv[1:]]
try:
    runpy.run_module("fgdata", run_name="__main__")
except SystemExit:
    pass
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print("maxrss_kb", hwm.split()[1], file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["inspect", "--json"], ["verify", "--decode", "--json", "--workers", "1"]])
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc for the peak memory")
def test_large_members_are_never_loaded_whole(big_shard, args):
    """inspect and verify --decode stay far below one big member in memory (it was 3.6 GB for a 1.9 GB member)."""
    out = subprocess.run([sys.executable, "-c", MAXRSS, args[0], str(big_shard), *args[1:]], capture_output=True,
                         text=True, timeout=300)
    maxrss_kb = int(out.stderr.rsplit("maxrss_kb", 1)[1])
    assert maxrss_kb * 1024 < BIG // 4, maxrss_kb


def test_tmp_is_sparse_aware(big_shard):
    """The fixture's premise: the shard claims gigabytes and occupies kilobytes."""
    assert os.path.getsize(big_shard) > BIG * 2 and big_shard.stat().st_blocks * 512 < 1 << 20
