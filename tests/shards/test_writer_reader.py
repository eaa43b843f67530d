"""The shard engine: key rule, writer limits and determinism, reader, index, scanner, damage."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from fgdata.errors import DamagedShardError, ShardError
from fgdata.jobs.executor import thread_map
from fgdata.shards import (
    ShardFile,
    ShardWriter,
    count_shards,
    discover_shards,
    iter_samples,
    load_index,
    read_shard_counts,
    scan_shard,
    split_member_name,
)
from fgdata.storage.temps import clean_temps


def _samples(sample_images, n):
    blobs = [p.read_bytes() for p in sample_images]
    for i in range(n):
        yield f"sample_{i:06d}", {"jpg": blobs[i % len(blobs)], "txt": f"caption {i}".encode(), "json": b'{"i": %d}' % i}


def _write(dest, sample_images, n=23, **kw):
    with ShardWriter(str(dest), **kw) as w:
        for key, members in _samples(sample_images, n):
            w.write(key, members)
    return w


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize(
    "name,expected",
    [
        ("sample_000001.txt_emb.pth", ("sample_000001", "txt_emb.pth")),
        ("a/b.c/key.JPG", ("a/b.c/key", "jpg")),
        ("noext", ("noext", "")),
        ("dir/x.tar.gz", ("dir/x", "tar.gz")),
    ],
)
def test_key_rule(name, expected):
    assert split_member_name(name) == expected


def test_maxcount_counts_index_and_reader(tmp_path, sample_images):
    dest = tmp_path / "shards"
    _write(dest, sample_images, n=23, maxcount=10)
    shards = discover_shards(str(dest))
    assert [os.path.basename(s) for s in shards] == ["00000.tar", "00001.tar", "00002.tar"]
    assert read_shard_counts(str(dest / "shard_count.json")) == {"00000.tar": 10, "00001.tar": 10, "00002.tar": 3}
    # Python's own tar reader agrees on member names and order.
    with tarfile.open(shards[0]) as tf:
        names = tf.getnames()
        assert names[:3] == ["sample_000000.jpg", "sample_000000.json", "sample_000000.txt"]
        assert all(m.mtime == 0 and m.uid == 0 and m.mode == 0o644 for m in tf.getmembers())
    seq = [s for shard in shards for s in iter_samples(shard)]
    assert [s.key for s in seq] == [f"sample_{i:06d}" for i in range(23)]
    assert seq[5].members["txt"] == b"caption 5"
    # Random access through the index returns the same bytes.
    sf = ShardFile(shards[1])
    assert len(sf) == 10
    assert sf.sample(3).members == seq[13].members
    assert sf.sample(3, exts={"txt"}).members == {"txt": b"caption 13"}
    idx = load_index(shards[1], expected_size=os.path.getsize(shards[1]))
    assert idx is not None and idx.samples == scan_shard(shards[1]).samples


def test_maxsize_limits_shard_bytes(tmp_path, sample_images):
    dest = tmp_path / "s"
    limit = 1_200_000
    _write(dest, sample_images, n=20, maxcount=1000, maxsize=limit)
    counts = read_shard_counts(str(dest / "shard_count.json"))
    assert len(counts) > 1 and sum(counts.values()) == 20
    for shard in discover_shards(str(dest)):
        scan = scan_shard(shard)
        assert len(scan.samples) == 1 or scan.samples[-1].end + 1024 <= limit


def test_rerun_is_byte_identical(tmp_path, sample_images):
    _write(tmp_path / "a", sample_images, n=15, maxcount=4)
    _write(tmp_path / "b", sample_images, n=15, maxcount=4)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    _write(tmp_path / "b", sample_images, n=15, maxcount=4)  # again, over the first run's files
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")


def test_webdataset_reads_our_shards(tmp_path, sample_images):
    import webdataset as wds

    _write(tmp_path / "s", sample_images, n=7, maxcount=5)
    urls = [str(p) for p in sorted((tmp_path / "s").glob("*.tar"))]
    got = list(wds.WebDataset(urls, shardshuffle=False))
    assert [s["__key__"] for s in got] == [f"sample_{i:06d}" for i in range(7)]
    assert got[2]["txt"] == b"caption 2"


@pytest.mark.parametrize(
    "key,members,message",
    [
        ("", {"jpg": b"x"}, "empty"),
        ("a.b", {"jpg": b"x"}, "dot in its basename"),
        ("../up", {"jpg": b"x"}, "'..'"),
        ("/abs", {"jpg": b"x"}, "relative"),
        ("ok", {}, "no members"),
        ("ok", {"JPG": b"x", "jpg": b"y"}, "twice"),
        ("ok", {"jpg": "text"}, "must be bytes"),
    ],
)
def test_writer_rejects_bad_samples(tmp_path, key, members, message):
    with ShardWriter(str(tmp_path / "s")) as w:
        with pytest.raises(ShardError, match=message):
            w.write(key, members)


def test_writer_rejects_duplicate_key(tmp_path):
    with ShardWriter(str(tmp_path / "s"), maxcount=1) as w:
        w.write("k", {"txt": b"1"})
        with pytest.raises(ShardError, match="not unique"):
            w.write("k", {"txt": b"2"})


def test_nothing_partial_under_final_name(tmp_path, sample_images):
    dest = tmp_path / "s"
    w = ShardWriter(str(dest), maxcount=5)
    for key, members in _samples(sample_images, 7):
        w.write(key, members)
    # One shard closed, the second open: only the complete one is visible under a .tar name.
    assert sorted(p.name for p in dest.glob("*.tar")) == ["00000.tar"]
    [open_shard] = [p.name for p in dest.iterdir() if p.name.startswith(".")]
    assert open_shard.startswith(".00001.tar.fgtmp-")
    w.abort()  # the open shard's temporary goes; the complete shard stays, and no count file is written
    assert sorted(p.name for p in dest.iterdir()) == ["00000.tar", "00000.tar.idx.json"]
    assert [s.key for s in iter_samples(str(dest / "00000.tar"))] == [f"sample_{i:06d}" for i in range(5)]


def test_writer_never_reads_or_removes_what_dest_holds(tmp_path, sample_images):
    """No resume ledger and no cleaning: what was there stays (a same-named shard is replaced whole), and
    numbering starts at 0 whatever is there; cleaning up after a kill is the job's decision."""
    dest = tmp_path / "s"
    dest.mkdir()
    kept = {"00007.tar": b"someone else's", "notes.txt": b"mine", ".00000.tar.fgtmp-0123456789abcdef": b"stale"}
    for name, data in kept.items():
        (dest / name).write_bytes(data)
    (dest / "00000.tar").write_bytes(b"an older shard")
    _write(dest, sample_images, n=3, maxcount=2)
    _write(tmp_path / "fresh", sample_images, n=3, maxcount=2)
    assert {name: (dest / name).read_bytes() for name in kept} == kept
    assert {k: v for k, v in _digest(dest).items() if k not in kept} == _digest(tmp_path / "fresh")


def test_unit_names_stage_and_callback(tmp_path, sample_images):
    """A caller that writes one part of a dataset names its shards, builds them in its own stage folder, keeps
    the count file for itself and hears of each shard once it is in place."""
    dest, stage = tmp_path / "s", tmp_path / "stage"
    seen: list[tuple[str, int, bool]] = []
    with ShardWriter(str(dest), name=lambda n: f"u000003-{n:04d}.tar", maxcount=4, stage=str(stage),
                     count_file=False, on_shard=lambda name, k, size: seen.append((name, k, (dest / name).stat().st_size == size))) as w:
        for key, members in _samples(sample_images, 9):
            w.write(key, members)
    summary = w.close()  # a second close returns the same summary
    names = ["u000003-0000.tar", "u000003-0001.tar", "u000003-0002.tar"]
    assert seen == [(names[0], 4, True), (names[1], 4, True), (names[2], 1, True)]
    assert summary.shards == [str(dest / n) for n in names] and summary.samples == 9
    assert summary.counts == dict(zip(names, [4, 4, 1]))
    assert sorted(p.name for p in dest.iterdir()) == sorted(names + [n + ".idx.json" for n in names])
    assert list(stage.iterdir()) == []
    _write(tmp_path / "plain", sample_images, n=9, maxcount=4)
    plain = [(tmp_path / "plain" / f"{i:05d}.tar").read_bytes() for i in range(3)]
    assert [(dest / n).read_bytes() for n in names] == plain  # the names are not in the bytes


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_scanner_handles_long_names(tmp_path, fmt):
    path = tmp_path / "long.tar"
    key = "d" * 120 + "/" + "k" * 130
    with tarfile.open(path, "w", format=fmt) as tf:
        for ext, data in [("jpg", b"a" * 700), ("txt", b"hello")]:
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    scan = scan_shard(str(path))
    assert scan.damage is None and [s.key for s in scan.samples] == [key]
    assert set(scan.samples[0].members) == {"jpg", "txt"}
    assert ShardFile(str(path)).sample(0).members["txt"] == b"hello"


def test_truncated_shard_reports_good_samples(tmp_path, sample_images):
    _write(tmp_path / "s", sample_images, n=6, maxcount=10)
    shard = tmp_path / "s" / "00000.tar"
    entries = scan_shard(str(shard)).samples
    cut = tmp_path / "cut.tar"
    cut.write_bytes(shard.read_bytes()[: entries[3].start + 700])  # inside sample 3's first member
    scan = scan_shard(str(cut))
    assert len(scan.samples) == 3 and "truncated" in scan.damage
    with pytest.raises(DamagedShardError) as info:
        list(iter_samples(str(cut)))
    assert info.value.good == 3


def test_header_bit_flip_and_non_tar(tmp_path, sample_images):
    _write(tmp_path / "s", sample_images, n=4, maxcount=10)
    data = bytearray((tmp_path / "s" / "00000.tar").read_bytes())
    entries = scan_shard(str(tmp_path / "s" / "00000.tar")).samples
    data[entries[2].start + 10] ^= 0x20  # a bit in the name field of sample 2's first header
    (tmp_path / "flip.tar").write_bytes(bytes(data))
    scan = scan_shard(str(tmp_path / "flip.tar"))
    assert len(scan.samples) == 2 and "checksum" in scan.damage
    (tmp_path / "not.tar").write_bytes(b"this is not a tar file at all" * 40)
    scan = scan_shard(str(tmp_path / "not.tar"))
    assert scan.samples == [] and scan.damage


def test_count_shards_local(tmp_path, sample_images):
    _write(tmp_path / "s", sample_images, n=23, maxcount=10)
    rows = count_shards(str(tmp_path / "s"), pool=thread_map(2))
    assert [(r.name, r.samples) for r in rows] == [("00000.tar", 10), ("00001.tar", 10), ("00002.tar", 3)]
    assert all(r.damage is None for r in rows)
    assert json.loads((tmp_path / "s" / "shard_count.json").read_text()) == {r.name: r.samples for r in rows}


def test_discovery_sorts_by_integer_stem_and_falls_back(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    for name in ["10.tar", "9.tar", "00002.TAR", "notes.txt"]:
        (d / name).write_bytes(b"")
    assert [os.path.basename(p) for p in discover_shards(str(d))] == ["00002.TAR", "9.tar", "10.tar"]
    (d / "x.tar").write_bytes(b"")
    assert [os.path.basename(p) for p in discover_shards(str(d))] == ["00002.TAR", "10.tar", "9.tar", "x.tar"]


@pytest.mark.parametrize(
    "name,size",
    [("sample_000000.jpg", 0), ("a/b/c.txt", 511), ("x" * 99, 10**10), ("x" * 100, 5), ("é/k.txt", 3), ("k.jpg", 2**40)],
)
def test_packed_headers_equal_tarfile(name, size):
    from fgdata.shards.writer import member_header

    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o644, 0, 0, "", ""
    assert member_header(name, size) == info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def test_stale_side_file_temporaries_are_cleaned(tmp_path):
    """What a killed writer leaves is removed by the storage layer's cleaner, which the job calls (the writer
    itself never cleans): its shard and side-file temporaries, a link named like one (never followed), and
    nothing else."""
    dest = tmp_path / "s"
    dest.mkdir()
    junk = [".shard_count.json.tmp-1-ab", ".00000.tar.idx.json.tmp-2-cd", ".00001.tar.tmp-3",
            ".00002.tar.fgtmp-0123456789abcdef"]
    for name in junk:
        (dest / name).write_bytes(b"partial")
    target = tmp_path / "elsewhere.tar"
    target.write_bytes(b"not ours")
    (dest / ".00003.tar.fgtmp-fedcba9876543210").symlink_to(target)
    keep = [".unrelated.tmp-4", "00000.tar", "notes.tmp-5"]
    for name in keep:
        (dest / name).write_bytes(b"keep")
    (dest / ".00004.tar.fgtmp-00aa").mkdir()  # a folder is never removed
    assert sorted(clean_temps(str(dest))) == sorted(junk + [".00003.tar.fgtmp-fedcba9876543210"])
    assert sorted(p.name for p in dest.iterdir()) == sorted(keep + [".00004.tar.fgtmp-00aa"])
    assert target.read_bytes() == b"not ours"
    assert clean_temps(str(tmp_path / "missing")) == []


def test_sample_with_many_members_round_trips(tmp_path):
    members = {f"m{i:03d}.bin": bytes([i % 256]) * (i + 1) for i in range(400)}  # > one writev's buffers
    with ShardWriter(str(tmp_path / "s")) as w:
        w.write("big", members)
    [sample] = list(iter_samples(str(tmp_path / "s" / "00000.tar")))
    assert sample.members == members
    with tarfile.open(tmp_path / "s" / "00000.tar") as tf:
        assert len(tf.getnames()) == 400


def test_the_count_file_is_jsons_own_layout_whatever_the_names():
    """Both writers of shard_count.json (the whole-dict one and a job's streamed finalize) share one encoder: its
    bytes are ``json.dumps(counts, indent=1)`` in numeric shard order, for any names."""
    from hypothesis import given
    from hypothesis import strategies as st

    from fgdata.shards.index import shard_counts_bytes
    from fgdata.shards.keys import sort_shards

    @given(st.dictionaries(st.text(min_size=1, max_size=12).map(lambda s: s + ".tar"), st.integers(0, 10**9),
                           max_size=8))
    def check(counts: dict[str, int]) -> None:
        ordered = {k: counts[k] for k in sort_shards(counts)}
        assert shard_counts_bytes(counts) == (json.dumps(ordered, indent=1) + "\n").encode()

    check()
