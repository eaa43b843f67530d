"""Every command that reads shards: crafted headers end in damage (never a loop), unreadable shards get no
count, and the path forms (folder, shard, several, brace pattern; local and s3://)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fgdata.errors import DamagedShardError, ShardError
from fgdata.shards import ShardWriter, iter_samples, resolve_shards
from fgdata.shards.select import expand_braces

sys.path.insert(0, str(Path(__file__).parents[1] / "shards"))
import tarcraft  # noqa: E402
from inprocess import fgdata  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def fg(*args: str) -> subprocess.CompletedProcess:
    """The CLI in this process (its exit code and output are what is checked); a scan that loops fails by the
    suite's per-test timeout (pytest-timeout) instead of hanging it."""
    return fgdata(*args)


# shard bytes, and where the damage starts: the bad header itself, or the PAX header before the member
CRAFTED = {"negative-size": (tarcraft.negative_size_shard, 2048), "negative-pax-size": (tarcraft.negative_pax_size_shard, 1024)}


@pytest.fixture(params=sorted(CRAFTED))
def crafted(request, tmp_path) -> tuple[Path, str]:
    make, at = CRAFTED[request.param]
    data = make()
    assert len(data) == 2560
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "00000.tar").write_bytes(data)
    return tmp_path / "ds", f"byte {at}"


def test_crafted_header_is_damage_for_count_shards(crafted):
    crafted, at = crafted
    out = fg("count-shards", str(crafted), "--json")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    [row] = json.loads(out.stdout)["shards"]
    assert row["samples"] == 1 and at in row["damage"]
    assert json.loads((crafted / "shard_count.json").read_text()) == {"00000.tar": 1}


def test_crafted_header_is_damage_for_inspect(crafted):
    crafted, at = crafted
    out = fg("inspect", str(crafted / "00000.tar"), "--json")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    doc = json.loads(out.stdout)
    assert doc["samples"] == 1 and at in doc["damage"] and doc["samples_shown"][0]["key"] == "s0"


@pytest.mark.parametrize("decode", [False, True])
def test_crafted_header_is_damage_for_verify(crafted, decode):
    crafted, at = crafted
    out = fg("verify", str(crafted), "--json", *(["--decode"] if decode else []))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    doc = json.loads(out.stdout)
    assert not doc["ok"] and doc["readable"] == 1 and doc["by_reason"].get("corrupt")
    assert any(at in p["detail"] for p in doc["per_shard"][0]["problems"])


def test_crafted_header_is_damage_for_iter_samples(crafted):
    crafted, at = crafted
    seen = []
    with pytest.raises(DamagedShardError) as info:
        for sample in iter_samples(str(crafted / "00000.tar")):
            seen.append(sample.key)
    assert seen == ["s0"] and info.value.good == 1 and at in info.value.reason


# -- a shard that cannot be read gets no count --------------------------------------------------------


def _unreadable_dataset(root: Path) -> Path:
    """A dataset whose 00001.tar cannot be read: no read permission, or (root ignores permissions) a
    file whose every read fails with EIO (the reading process's own memory at address 0)."""
    root.mkdir()
    for i in range(3):
        (root / f"{i:05d}.tar").write_bytes(tarcraft.member(f"k{i}.txt", b"x") + tarcraft.member(f"k{i}b.txt", b"y")
                                            + bytes(1024))
    (root / "shard_count.json").write_text('{"00001.tar": 7}\n')
    if os.geteuid() == 0:
        (root / "00001.tar").unlink()
        (root / "00001.tar").symlink_to("/proc/self/mem")
    else:
        os.chmod(root / "00001.tar", 0)
    return root


def test_count_shards_keeps_the_old_entry_of_an_unreadable_shard(tmp_path):
    root = _unreadable_dataset(tmp_path / "ds")
    out = fg("count-shards", str(root))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert json.loads((root / "shard_count.json").read_text()) == {"00000.tar": 2, "00001.tar": 7, "00002.tar": 2}
    assert "00001.tar: could not be read" in out.stderr and "keeps its old count (7)" in out.stderr


def test_count_shards_writes_no_entry_for_an_unreadable_shard_without_one(tmp_path):
    root = _unreadable_dataset(tmp_path / "ds")
    (root / "shard_count.json").write_text("{}\n")
    out = fg("count-shards", str(root), "--json")
    assert out.returncode == 1
    rows = {r["shard"]: r for r in json.loads(out.stdout)["shards"]}
    assert rows["00001.tar"]["samples"] is None and rows["00001.tar"]["error"]
    assert json.loads((root / "shard_count.json").read_text()) == {"00000.tar": 2, "00002.tar": 2}
    assert "has no count for it" in out.stderr


# -- path forms -----------------------------------------------------------------------------------------


@pytest.fixture
def dataset(tmp_path) -> Path:
    dest = tmp_path / "out"
    with ShardWriter(str(dest), maxcount=2) as w:
        for i in range(7):
            w.write(f"s{i:03d}", {"txt": f"caption {i}".encode()})
    return dest


def test_count_shards_on_one_shard_updates_only_its_entry(dataset):
    (dataset / "shard_count.json").write_text('{"00000.tar": 2, "00001.tar": 99}\n')
    out = fg("count-shards", str(dataset / "00001.tar"))
    assert out.returncode == 0, out.stderr
    assert json.loads((dataset / "shard_count.json").read_text()) == {"00000.tar": 2, "00001.tar": 2}


def test_count_shards_on_several_shards_and_a_pattern(dataset):
    doc = json.loads(fg("count-shards", str(dataset / "00003.tar"), str(dataset / "00000.tar"), "--json", "--no-write").stdout)
    assert [(r["shard"], r["samples"]) for r in doc["shards"]] == [("00003.tar", 1), ("00000.tar", 2)]
    doc = json.loads(fg("count-shards", str(dataset / "{00001..00003}.tar"), "--json", "--no-write").stdout)
    assert [r["shard"] for r in doc["shards"]] == ["00001.tar", "00002.tar", "00003.tar"] and doc["total_samples"] == 5


def test_verify_and_inspect_take_the_same_forms(dataset):
    out = fg("verify", str(dataset / "{00000..00001}.tar"), "--json")
    assert out.returncode == 0, out.stdout[-2000:]
    assert json.loads(out.stdout)["readable"] == 4
    doc = json.loads(fg("inspect", str(dataset), "--json", "--limit", "3").stdout)
    assert [r["samples"] for r in doc["shards"]] == [2, 2, 2, 1]
    assert sum(len(r["samples_shown"]) for r in doc["shards"]) == 3
    assert json.loads(fg("inspect", str(dataset), "--key", "s006", "--json").stdout)["shards"][3]["samples_shown"][0]["key"] == "s006"


@pytest.mark.parametrize("arg,message", [
    ("shard_count.json", "is a file, not a .tar shard; expected a folder of .tar shards"),
    ("missing.tar", "missing.tar: not found; expected"),
    ("{00000..00009}.tar", "00004.tar (from the pattern"),
    ("{00000..oops}.tar", "is neither a range"),
])
def test_path_errors_say_what_the_path_is(dataset, arg, message):
    for cmd in ("count-shards", "inspect", "verify"):
        out = fg(cmd, str(dataset / arg))
        assert out.returncode == 1 and "Traceback" not in out.stderr
        assert message in out.stderr, (cmd, out.stderr)


def test_empty_folder_is_an_error(tmp_path):
    out = fg("count-shards", str(tmp_path))
    assert out.returncode == 1 and "is a folder without .tar shards" in out.stderr


def test_expand_braces():
    assert expand_braces("d/{00008..00011}.tar") == [f"d/{i:05d}.tar" for i in range(8, 12)]
    assert expand_braces("{a,b}/{1..2}.tar") == ["a/1.tar", "a/2.tar", "b/1.tar", "b/2.tar"]
    assert expand_braces("x.tar") == ["x.tar"]
    with pytest.raises(ShardError):
        expand_braces("{1..99999999999}.tar")


@pytest.mark.s3
def test_s3_path_forms(s3_bucket):
    dest = f"{s3_bucket}/ds"
    with ShardWriter(dest, maxcount=2) as w:
        for i in range(5):
            w.write(f"s{i:03d}", {"txt": b"x"})
    whole = resolve_shards(dest)
    assert len(whole.shards) == 3 and whole.whole == {dest}
    one = resolve_shards(f"{dest}/00001.tar")
    assert one.shards == [f"{dest}/00001.tar"] and one.whole == set() and one.sizes[f"{dest}/00001.tar"] > 0
    assert resolve_shards(f"{dest}/{{00000..00002}}.tar").shards == [f"{dest}/{i:05d}.tar" for i in range(3)]
    with pytest.raises(ShardError, match="00003.tar .from the pattern"):
        resolve_shards(f"{dest}/{{00000..00003}}.tar")
    with pytest.raises(ShardError, match="nothing: not found; expected"):
        resolve_shards(f"{s3_bucket}/nothing")
    out = fg("count-shards", f"{dest}/00002.tar", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["shards"][0]["samples"] == 1


def test_counting_does_not_import_the_writer():
    """``fgdata.shards`` loads its modules on first use: count-shards does not pay for the writer's imports."""
    code = ("import sys; import fgdata.shards as s; from fgdata.shards import count_shards, resolve_shards; "
            "assert sorted(s.__all__) == sorted(s._WHERE); print('fgdata.shards.writer' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("tamper", ["negative-size", "overlap", "outside"])
def test_an_index_with_impossible_ranges_is_not_trusted(dataset, tamper):
    from fgdata.shards import ShardFile, index_path, load_index

    shard = str(dataset / "00000.tar")
    doc = json.loads(Path(index_path(shard)).read_text())
    first, second = doc["samples"]
    if tamper == "negative-size":
        first[3]["txt"][1] = -1536
    elif tamper == "overlap":
        second[1] = first[1]
    else:
        first[3]["txt"][0] = doc["size"] + 512
    Path(index_path(shard)).write_text(json.dumps(doc))
    assert load_index(shard) is None  # the reader scans the shard instead
    with ShardFile(shard) as sf:
        assert [sf.sample(i).members["txt"] for i in range(len(sf))] == [b"caption 0", b"caption 1"]
