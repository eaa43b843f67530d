"""Nothing a stopped job started can touch the next one: an S3 DST held through a lease, uploads staged, no child
outliving its job, every stop signal a stop, and ``.fgdata`` never followed.

The S3 scenarios put a loopback proxy in front of the moto server that holds one chosen upload, whole, until
the test releases it: the job is then known to be mid-upload, with no timing. Waits are bounded polls of a
state (a process gone), never sleeps.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from faultkit import FGDATA, LoopbackProxy, alive, descendants, png_bytes, run_cli, stop_trials, tree

pytestmark = pytest.mark.timeout(300)

LIFETIME_S = 120.0  # a held request is dropped after this long, whatever the test does
INTERRUPTED = " inputs done; rerun the same command to resume"


class HoldingEndpoint(LoopbackProxy):
    """A loopback proxy to ``upstream`` (one request per connection) that holds the first request ``pick``
    selects once it has arrived whole, until :meth:`release`; then it forwards it as if it had been slow."""

    def __init__(self, upstream: str, pick: Callable[[str, str], bool]):
        self.pick = pick
        self.held = threading.Event()  # the picked request has arrived whole and waits
        self.delivered = threading.Event()  # ... and, released, the server has answered it
        self._release = threading.Event()
        self._taken = False
        self._lock = threading.Lock()
        super().__init__(upstream)

    def _picked(self, method: str, target: str) -> bool:
        with self._lock:
            if self._taken or not self.pick(method, target):
                return False
            self._taken = True
            return True

    def handle(self, client: socket.socket) -> None:
        assert self.upstream is not None
        try:
            client.settimeout(LIFETIME_S)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = client.recv(65536)
                if not chunk:
                    return
                data += chunk
            end = data.index(b"\r\n\r\n")
            head = data[:end]
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(data) - end - 4 < length:
                chunk = client.recv(65536)
                if not chunk:
                    return
                data += chunk
            method, target = head.split(b" ", 2)[:2]
            hold = self._picked(method.decode(), target.decode())
            if hold:
                self.held.set()
                if not self._release.wait(LIFETIME_S) or self._stop.is_set():
                    return
            with socket.create_connection(self.upstream, timeout=LIFETIME_S) as upstream:
                upstream.sendall(head + b"\r\nConnection: close" + data[end:])
                answer = b""
                while chunk := upstream.recv(65536):
                    answer += chunk
            if hold:
                self.delivered.set()
            client.sendall(answer)
        except OSError:
            pass  # a client that died meanwhile (the point of some tests)
        finally:
            client.close()

    def release(self) -> None:
        self._release.set()

    def close(self) -> None:
        self._stop.set()  # before the release, so a held request is dropped, not forwarded
        self._release.set()
        super().close()


def _put_of(name: str) -> Callable[[str, str], bool]:
    """An upload of an object called ``name`` (wherever the job puts it)."""
    return lambda method, target: method == "PUT" and target.split("?", 1)[0].endswith("/" + name)


def _photos(root: Path, n: int) -> Path:
    root.mkdir()
    for i in range(n):
        (root / f"img{i:03d}.png").write_bytes(png_bytes(i, size=24))
    return root


def _objects(bucket_url: str, prefix: str, state: bool = False) -> dict[str, str]:
    """key below ``prefix`` -> sha256 of every object there (``state``: only the job state ``.fgdata/``, else
    everything but it)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"], region_name="us-east-1")
    bucket = bucket_url.removeprefix("s3://")
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix) + 1:]
            if rel.startswith(".fgdata/") == state:
                out[rel] = hashlib.sha256(s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()).hexdigest()
    return out


def _leftovers(bucket_url: str, prefix: str) -> list[str]:
    """Leases and staged uploads in DST's job state (other job state, such as input stamps, may stay)."""
    return sorted(k for k in _objects(bucket_url, prefix, state=True)
                  if k.startswith((".fgdata/lease", ".fgdata/staging/")))


def _s5cmd_below(pid: int) -> list[int]:
    found = []
    for child in descendants(pid):
        try:
            if Path(f"/proc/{child}/comm").read_text().strip() == "s5cmd":
                found.append(child)
        except OSError:
            continue
    return found


def _still_running(pids: list[int], polls: int = 400) -> list[int]:
    """The pids still alive after a bounded poll (a dead process goes within milliseconds; 20 s at most)."""
    for _ in range(polls):
        if not any(alive(p) for p in pids):
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def _read(bucket_url: str, key: str) -> bytes:
    import boto3

    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"], region_name="us-east-1")
    return s3.get_object(Bucket=bucket_url.removeprefix("s3://"), Key=key)["Body"].read()


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([*FGDATA, *args], env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _end(proc: subprocess.Popen, orphans: list[int]) -> None:
    """Never leave a test's own job or an orphan of it behind, whatever failed."""
    for pid in [proc.pid, *orphans]:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)
    if proc.stderr is not None:
        proc.stderr.close()


@pytest.mark.slow  # end to end, several seconds
def test_a_killed_jobs_upload_never_lands_after_the_rerun(s3_bucket, s3_endpoint, tmp_path):
    """SIGKILL while 00000.tar uploads, rerun with --no-resume and other shard limits, then let the old upload
    arrive: the killed job's s5cmd died with it, and its upload could only ever land in its own staging prefix."""
    src = _photos(tmp_path / "src", 10)
    url = f"{s3_bucket}/ds"
    endpoint = HoldingEndpoint(s3_endpoint, _put_of("00000.tar"))
    env = {"S3_ENDPOINT_URL": endpoint.url, "FGDATA_CACHE": str(tmp_path / "cache")}
    proc = _start(["shard", "images", str(src), url, "--maxcount", "10", "--no-progress"], env)
    orphans: list[int] = []
    try:
        assert endpoint.held.wait(120), "the job never uploaded 00000.tar"
        orphans = _s5cmd_below(proc.pid)
        assert orphans, "the upload runs in an s5cmd child"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        assert _still_running(orphans) == [], "an s5cmd of the killed job is still running"
        rerun = run_cli("shard", "images", str(src), url, "--maxcount", "5", "--no-resume", "--no-progress",
                        env=env)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        finished = _objects(s3_bucket, "ds")
        endpoint.release()  # the old upload arrives now, as a slow link would have delivered it
        assert endpoint.delivered.wait(120)
    finally:
        _end(proc, orphans)
        endpoint.close()
    assert _objects(s3_bucket, "ds") == finished
    assert json.loads(_read(s3_bucket, "ds/shard_count.json")) == {"00000.tar": 5, "00001.tar": 5}
    checked = run_cli("verify", url)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]


@pytest.mark.slow  # end to end, several seconds
def test_two_jobs_from_two_caches_on_one_prefix(s3_bucket, s3_endpoint, tmp_path):
    """The second job is refused in one line naming the first, whose output is exactly an undisturbed run's."""
    src = _photos(tmp_path / "src", 12)
    args = ["--maxcount", "4", "--no-progress"]
    reference = run_cli("shard", "images", str(src), f"{s3_bucket}/reference", *args,
                        env={"FGDATA_CACHE": str(tmp_path / "cache0")})
    assert reference.returncode == 0, reference.stderr[-2000:]
    url = f"{s3_bucket}/ds"
    endpoint = HoldingEndpoint(s3_endpoint, _put_of("00000.tar"))
    env = {"S3_ENDPOINT_URL": endpoint.url, "FGDATA_S3_STALL_TIMEOUT": "600"}
    first = _start(["shard", "images", str(src), url, *args], {**env, "FGDATA_CACHE": str(tmp_path / "cache1")})
    try:
        assert endpoint.held.wait(120), "the first job never uploaded 00000.tar"
        second = run_cli("shard", "images", str(src), url, *args, env={**env, "FGDATA_CACHE": str(tmp_path / "cache2")})
        endpoint.release()
        assert first.wait(timeout=240) == 0, first.stderr.read()[-2000:] if first.stderr else ""
    finally:
        _end(first, [])
        endpoint.close()
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-2000:]
    line = second.stderr.strip().splitlines()[-1]
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert "another fgdata job" in line and f"pid {first.pid}" in line and socket.gethostname() in line, line
    assert _objects(s3_bucket, "ds") == _objects(s3_bucket, "reference")
    assert _leftovers(s3_bucket, "ds") == []  # the lease is given back, nothing staged is left


@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_sighup_mid_upload(s3_bucket, s3_endpoint, tmp_path, short_tmp):
    """A closed terminal stops the job like SIGTERM: 129 and the resume line, its s5cmd gone, and after the rerun
    nothing staged is left, neither in DST, nor in the cache, nor in the system temp folder."""
    src = _photos(tmp_path / "src", 12)
    args = ["shard", "images", str(src), f"{s3_bucket}/ds", "--maxcount", "4", "--no-progress"]
    systemp = short_tmp
    env = {"FGDATA_CACHE": str(tmp_path / "cache"), "TMPDIR": str(systemp)}
    endpoint = HoldingEndpoint(s3_endpoint, _put_of("00001.tar"))
    proc = _start(args, {**env, "S3_ENDPOINT_URL": endpoint.url})
    children: list[int] = []
    try:
        assert endpoint.held.wait(120), "the job never uploaded 00001.tar"
        children = _s5cmd_below(proc.pid)
        assert children, "the upload runs in an s5cmd child"
        os.kill(proc.pid, signal.SIGHUP)
        assert proc.wait(timeout=120) == 129
        assert proc.stderr is not None
        said = proc.stderr.read().strip().splitlines()
        assert said and said[-1].startswith("interrupted: ") and said[-1].endswith(INTERRUPTED), said[-5:]
        assert _still_running(children) == []
    finally:
        _end(proc, children)
        endpoint.close()
    again = run_cli(*args, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(k for k in _objects(s3_bucket, "ds") if k.endswith(".tar")) == ["00000.tar", "00001.tar",
                                                                                   "00002.tar"]
    assert _leftovers(s3_bucket, "ds") == []
    staged = [p.relative_to(tmp_path / "cache").as_posix() for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert all(p.endswith("/.fgdata/lock") for p in staged), staged
    assert list(systemp.iterdir()) == []


def test_sighup_and_sigquit_are_stops(tmp_path):
    """On a local DST too: 129 and 131 with the resume line, workers stopped, and a rerun ends byte-identical."""
    src = _photos(tmp_path / "src", 24)
    cmd = [*FGDATA, "shard", "images", str(src), "{out}", "--maxcount", "4", "--no-progress", "--workers", "2"]
    stop_trials(cmd, out=tmp_path, clean=tmp_path / "clean", stops=[(1, signal.SIGHUP), (2, signal.SIGQUIT)])


@pytest.mark.parametrize("planted", ["link", "file"])
def test_a_planted_state_folder_is_refused(tmp_path, planted):
    """``DST/.fgdata`` as a link (to a folder holding a ``lock``) or a file: refused, and nothing anywhere changes."""
    src = _photos(tmp_path / "src", 3)
    dst = tmp_path / "dst"
    dst.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "lock").write_text("someone else's file")
    if planted == "link":
        (dst / ".fgdata").symlink_to(elsewhere)
    else:
        (dst / ".fgdata").write_text("not a folder")
    before = (tree(elsewhere), tree(dst), sorted(os.listdir(dst)))
    done = run_cli("shard", "images", str(src), str(dst), "--no-progress")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "not a plain folder" in done.stderr and ".fgdata" in done.stderr, done.stderr
    assert (tree(elsewhere), tree(dst), sorted(os.listdir(dst))) == before


def test_a_refused_foreign_dst_is_left_as_found(tmp_path):
    src = _photos(tmp_path / "src", 3)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "000000.tar").write_bytes(b"another tool's shard")
    (dst / "notes.txt").write_text("mine")
    before = (tree(dst), sorted(os.listdir(dst)))
    done = run_cli("shard", "images", str(src), str(dst), "--no-progress")
    assert done.returncode == 1 and "did not write" in done.stderr, done.stderr[-2000:]
    assert (tree(dst), sorted(os.listdir(dst))) == before
