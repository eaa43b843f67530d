"""The S3 requests a shard job makes grow with its shards at a constant rate: nothing is merged or renamed
after the fact, and no step reads every shard again.

The job writes to the moto server through a counting loopback proxy (every request passes and is recorded),
for 3, 6 and 9 shards of prompts (one per shard); the requests per extra shard must be the same from 3
to 6 as from 6 to 9, and small. Work that grew with the shards already written (a merge, a re-read of
them) would make the second increment larger than the first, at these sizes as at larger ones.
"""

from __future__ import annotations

import pytest

from fgdata.sharding.job import ShardJob, run_shard
from fgdata.producers.media import ShardOptions
from test_s3_stalls import StallingEndpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # 18 shards uploaded through a proxy


def _requests(s3_endpoint: str, s3_bucket: str, tmp_path, monkeypatch, shards: int) -> int:
    prompts = tmp_path / f"prompts-{shards}.txt"
    prompts.write_text("".join(f"prompt {i}\n" for i in range(shards)))
    proxy = StallingEndpoint(s3_endpoint, lambda method, target: "pass")
    try:
        with monkeypatch.context() as mp:
            mp.setenv("S3_ENDPOINT_URL", proxy.url)
            mp.setenv("FGDATA_S3_LEASE_SECONDS", "3600")  # no renewal during the job: its requests depend on time
            report = run_shard(ShardJob(src=str(prompts), dest=f"{s3_bucket}/p{shards}",
                                            options=ShardOptions(kind="prompts"), maxcount=1))
        assert (report.written, len(report.shards)) == (shards, shards)
        return len(proxy.seen)
    finally:
        proxy.close()


def test_requests_per_shard_do_not_grow_with_the_shards(s3_endpoint, s3_bucket, tmp_path, monkeypatch):
    counts = {n: _requests(s3_endpoint, s3_bucket, tmp_path, monkeypatch, n) for n in (3, 6, 9)}
    early = (counts[6] - counts[3]) / 3
    late = (counts[9] - counts[6]) / 3
    assert early == late, counts  # the same requests for every further shard: no merge, no re-read
    # the shard, its index, its unit's plan (when it starts) and marker (when it ends), each staged under the
    # lease, confirmed and moved into place
    assert late <= 18, counts
