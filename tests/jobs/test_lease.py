"""The lease an S3 destination is held by (fgdata.jobs.lease), against the loopback S3 server.

Other jobs' leases are planted as objects, the way a job on another host or from another cache would have
left them; the job under test is this process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.jobs.lease import Lease

pytestmark = [pytest.mark.s3, pytest.mark.timeout(180)]


def _plant(url: str, **fields) -> None:
    record = {"job": "0123456789abcdef", "host": "elsewhere", "pid": 4242, "pid_start": 1, "boot": "b",
              "start": time.time(), "heartbeat": time.time(), "expires_after": 60.0, **fields}
    storage.write_bytes(url, json.dumps(record).encode())


def _holder(dest: str) -> dict:
    return json.loads(storage.read_bytes(f"{dest}/.fgdata/lease.json"))


@pytest.fixture
def dest(s3_bucket, tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("FGDATA_CACHE", str(tmp_path / "cache"))
    return f"{s3_bucket}/ds"


def test_a_live_lease_refuses_and_an_expired_one_is_taken(dest):
    _plant(f"{dest}/.fgdata/lease.json")
    with pytest.raises(FgdataError, match=r"another fgdata job is writing here \(job 0123456789abcdef, host "
                                          r"elsewhere, pid 4242, last heartbeat \d+ s ago\)"):
        Lease(dest).acquire()
    assert _holder(dest)["host"] == "elsewhere"  # a refused job leaves the holder's lease alone
    _plant(f"{dest}/.fgdata/lease.json", heartbeat=time.time() - 61)
    lease = Lease(dest)
    lease.acquire()
    try:
        mine = _holder(dest)
        assert (mine["job"], mine["host"], mine["pid"]) == (lease.job, socket.gethostname(), os.getpid())
    finally:
        lease.release()
    assert storage.stat(f"{dest}/.fgdata/lease.json") is None


def test_a_dead_process_of_this_host_holds_nothing(dest):
    """A killed job's rerun on the same host does not wait for the expiry (a reused pid is not the holder)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    _plant(f"{dest}/.fgdata/lease.json", host=socket.gethostname(), boot=boot, pid=int(done.stdout))
    lease = Lease(dest)
    lease.acquire()
    lease.release()
    # this very process, but with another start time: a pid reused by a process that is not the holder
    _plant(f"{dest}/.fgdata/lease.json", host=socket.gethostname(), boot=boot, pid=os.getpid(), pid_start=1)
    lease = Lease(dest)
    lease.acquire()
    lease.release()


def test_writes_are_staged_and_a_lost_lease_stops_them(dest):
    lease = Lease(dest)
    lease.acquire()
    try:
        storage.write_bytes(f"{dest}/a.json", b"{}")
        assert storage.read_bytes(f"{dest}/a.json") == b"{}"
        assert storage.list_recursive(f"{dest}/.fgdata/staging") == []  # moved into place, not copied
        _plant(f"{dest}/.fgdata/lease.json", heartbeat=time.time())  # another job took it over
        with pytest.raises(FgdataError, match=r"b\.json: not written: this job no longer holds the lease on "
                                              r".*\(now held by job 0123456789abcdef, host elsewhere"):
            storage.write_bytes(f"{dest}/b.json", b"{}")
        with pytest.raises(FgdataError, match="no longer holds the lease"):
            storage.remove(f"{dest}/a.json")
        with pytest.raises(FgdataError, match="no longer holds the lease"):
            storage.write_bytes(f"{dest}/.fgdata/units/000000.json", b"{}")
    finally:
        lease.release()
    assert storage.stat(f"{dest}/b.json") is None and storage.stat(f"{dest}/a.json") is not None
    assert storage.list_recursive(f"{dest}/.fgdata/staging") == []  # what it had staged went with it
    assert _holder(dest)["host"] == "elsewhere"  # the new holder's lease is not removed


def test_what_dead_jobs_staged_is_removed(dest):
    storage.write_bytes(f"{dest}/.fgdata/staging/deadbeefdeadbeef/00000.tar", b"a dead job's upload")
    _plant(f"{dest}/.fgdata/lease.rank1.json")  # a live rank's staging stays
    storage.write_bytes(f"{dest}/.fgdata/staging/0123456789abcdef/00001.tar", b"a live job's upload")
    lease = Lease(dest)
    lease.acquire()
    lease.release()
    assert [i.name for i in storage.list_recursive(f"{dest}/.fgdata/staging")] == ["00001.tar"]


def test_the_lease_is_renewed_while_held(dest, monkeypatch):
    monkeypatch.setenv("FGDATA_S3_LEASE_SECONDS", "2")  # a heartbeat every 0.5 s
    lease = Lease(dest)
    lease.acquire()
    try:
        first = _holder(dest)["heartbeat"]
        for _ in range(300):  # a bounded poll of the object, 30 s at most
            if _holder(dest)["heartbeat"] > first:
                break
            time.sleep(0.1)
        assert _holder(dest)["heartbeat"] > first and _holder(dest)["expires_after"] == 2.0
    finally:
        lease.release()


@pytest.mark.parametrize("bad", ["0", "-1", "soon", "inf"])
def test_the_lease_variable_is_checked(dest, monkeypatch, bad):
    monkeypatch.setenv("FGDATA_S3_LEASE_SECONDS", bad)
    with pytest.raises(FgdataError, match="FGDATA_S3_LEASE_SECONDS"):
        Lease(dest)


@pytest.mark.parametrize("bad", ["-1", "soon", "inf"])
def test_the_settle_variable_is_checked(monkeypatch, bad):
    monkeypatch.setenv("FGDATA_S3_LEASE_SETTLE_SECONDS", bad)
    with pytest.raises(FgdataError, match="FGDATA_S3_LEASE_SETTLE_SECONDS"):
        Lease("s3://unused/ds")


@pytest.mark.parametrize(("raw", "expiry", "settle"), [("", 60.0, 1.0), ("", 4.0, 0.2), ("0.05", 60.0, 0.05),
                                                        ("0", 60.0, 0.0), ("30", 60.0, 3.0)])
def test_the_settle_is_the_setting_at_most_a_twentieth_of_the_expiry(monkeypatch, raw, expiry, settle):
    monkeypatch.setenv("FGDATA_S3_LEASE_SETTLE_SECONDS", raw)
    monkeypatch.setenv("FGDATA_S3_LEASE_SECONDS", str(expiry))
    assert Lease("s3://unused/ds").settle == settle
