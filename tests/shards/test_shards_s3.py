"""The shard engine against a real S3 server on loopback, through s5cmd."""

from __future__ import annotations

import pytest

from fgdata.shards import ShardWriter, count_shards, discover_shards, iter_samples, read_shard_counts, scan_shard

pytestmark = pytest.mark.s3


def test_write_count_and_read_on_s3(s3_bucket, sample_images, tmp_path):
    dest = f"{s3_bucket}/train shards"  # a space in the prefix must just work
    blobs = [p.read_bytes() for p in sample_images]
    with ShardWriter(dest, maxcount=4) as w:
        for i in range(10):
            w.write(f"sample_{i:06d}", {"jpg": blobs[i % len(blobs)], "txt": f"c{i}".encode()}, input_pos=i)
    shards = discover_shards(dest)
    assert [s.rsplit("/", 1)[1] for s in shards] == ["00000.tar", "00001.tar", "00002.tar"]
    assert read_shard_counts(f"{dest}/shard_count.json") == {"00000.tar": 4, "00001.tar": 4, "00002.tar": 2}
    rows = count_shards(dest, workers=2)
    assert [r.samples for r in rows] == [4, 4, 2] and all(r.from_index for r in rows)
    assert [s.key for s in iter_samples(shards[2])] == ["sample_000008", "sample_000009"]
    assert len(scan_shard(shards[1]).samples) == 4
    # Resume against the remote destination keeps every complete shard.
    w2 = ShardWriter(dest, maxcount=4)
    assert (w2.resume_point.shards, w2.resume_point.next_input) == (3, 10)
    w2.close()
