"""S3 endpoints that stall: every S3 call, command and loader mode fails in one line, within the stall bound.

Two loopback endpoints are written here: one accepts connections and never answers,
the other forwards to the moto server but stops a chosen kind of request midway (an
object body after its headers and a few bytes, or an upload that is never answered).
The stall timeout (``FGDATA_S3_STALL_TIMEOUT``) is 0.5 s where the endpoint answers nothing,
1 s where some requests are answered; the tests assert the error and its wording, never
timings; pytest-timeout turns a hang into a failure.

Why those bounds: every stalled call waits out the bound on each of its 3 attempts, so the
bound is most of this file's time. The watcher calls a request stalled when the s5cmd
process moves no byte for the bound (polled every 0.25 s). On the silent endpoint no request
is ever answered, so no healthy request can be misjudged and the bound only has to exceed
the poll. Where listings, the count file or a retry must pass, a healthy request on a loaded
box (s5cmd's start, this proxy and the moto server sharing two cores with other test
processes) has to finish within the bound: such a request takes tens of milliseconds, a few
hundred at worst under load, so 1 s leaves a margin of several times; a healthy request
misjudged once would also be retried, not failed.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Callable

import pytest

from faultkit import LoopbackProxy, s3_through, write_dataset
from fgdata import storage
from fgdata.errors import FgdataError, StorageError
from test_shard_faults import cli, no_crash

pytestmark = pytest.mark.timeout(120)

STALL_S = "1"  # where answered requests must pass (see above)
SILENT_STALL_S = "0.5"  # where nothing is answered
LIFETIME_S = 60.0  # every held connection closes by itself after this long
STALLED = re.compile(r"no data from the endpoint for (1|0\.5) s.*FGDATA_S3_STALL_TIMEOUT")

# A request's verdict: "pass" it on, leave it "silent" (never answered), or "stall-body" (headers and a few bytes).
Policy = Callable[[str, str], str]


class StallingEndpoint(LoopbackProxy):
    """A threaded TCP server on 127.0.0.1: forwards each connection's one request to ``upstream`` as ``policy`` says.

    Each forwarded request gets ``Connection: close``, so every request arrives on a new
    connection and is judged alone. Without an upstream every request is silent.
    """

    def __init__(self, upstream: str | None = None, policy: Policy = lambda method, target: "silent",
                 body_bytes: int = 512):
        self.policy = policy if upstream else (lambda method, target: "silent")
        self.body_bytes = body_bytes
        self.seen: list[tuple[str, str, str]] = []
        self._sockets: list[socket.socket] = []
        super().__init__(upstream)

    def _hold(self) -> None:
        """Keep the connection open and quiet until the endpoint closes or its lifetime ends."""
        self._stop.wait(LIFETIME_S)

    def handle(self, client: socket.socket) -> None:
        self._sockets.append(client)
        try:
            client.settimeout(LIFETIME_S)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            method, target = head.split(b" ", 2)[:2]
            verdict = self.policy(method.decode(), target.decode())
            self.seen.append((method.decode(), target.decode(), verdict))
            if verdict == "silent" or self.upstream is None:
                self._hold()
                return
            upstream = socket.create_connection(self.upstream, timeout=LIFETIME_S)
            self._sockets.append(upstream)
            end = head.index(b"\r\n\r\n")
            upstream.sendall(head[:end] + b"\r\nConnection: close" + head[end:])
            threading.Thread(target=self._pump_request, args=(client, upstream), daemon=True).start()
            self._pump_response(upstream, client, verdict == "stall-body")
        except OSError:
            pass
        finally:
            client.close()

    def _pump_request(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while chunk := client.recv(65536):
                upstream.sendall(chunk)
        except OSError:
            pass

    def _pump_response(self, upstream: socket.socket, client: socket.socket, stall: bool) -> None:
        sent = b""
        while chunk := upstream.recv(65536):
            if stall:
                sent += chunk
                if b"\r\n\r\n" in sent:
                    limit = sent.index(b"\r\n\r\n") + 4 + self.body_bytes
                    if len(sent) >= limit:
                        client.sendall(chunk[: len(chunk) - (len(sent) - limit)])
                        self._hold()
                        return
            client.sendall(chunk)
        upstream.close()

    def close(self) -> None:
        super().close()
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass


def _object_get(method: str, target: str) -> bool:
    """A GET of one object (path-style ``/bucket/key``), not a listing (``/bucket?list-type=2…``)."""
    path = target.split("?", 1)[0]
    return method == "GET" and path.strip("/").count("/") >= 1


def stall_object_bodies(method: str, target: str) -> str:
    return "stall-body" if _object_get(method, target) else "pass"


def silent_uploads(method: str, target: str) -> str:
    return "silent" if method in ("PUT", "POST") else "pass"


def s5cmd_children() -> list[int]:
    """Live s5cmd processes started by this test process (killed ones are reaped, so absent)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and comm == "s5cmd":
            found.append(int(pid))
    return found


@pytest.fixture
def stall_bound(monkeypatch):
    monkeypatch.setenv("FGDATA_S3_STALL_TIMEOUT", STALL_S)


@pytest.fixture
def dataset_on_s3(s3_bucket, s3_endpoint, tmp_path):
    """Shards and their count file, without offset indexes (readers must read the shards themselves).

    Each shard's body is far longer than the 512 bytes the stalling endpoint lets through;
    the count file is shorter, so loaders get past their set-up.
    """
    local = tmp_path / "local"
    write_dataset(local, n=6, maxcount=3, kinds=("png", "txt", "npy"))
    url = f"{s3_bucket}/ds"
    for p in sorted(local.glob("*.tar")) + [local / "shard_count.json"]:
        storage.upload(str(p), f"{url}/{p.name}")
    return url, local


@pytest.fixture
def silent(s3_endpoint, monkeypatch):
    """The endpoint that accepts connections and never answers."""
    monkeypatch.setenv("FGDATA_S3_STALL_TIMEOUT", SILENT_STALL_S)
    with s3_through(StallingEndpoint(), monkeypatch) as endpoint:
        yield endpoint


@pytest.fixture
def body_stall(stall_bound, s3_endpoint, monkeypatch):
    """Listings pass; an object's body stops after its headers and 512 bytes."""
    with s3_through(StallingEndpoint(s3_endpoint, stall_object_bodies), monkeypatch) as endpoint:
        yield endpoint


def one_line_stall(message: str, url: str) -> None:
    assert "\n" not in message.strip(), message
    assert url in message, message
    assert STALLED.search(message), message


# -- the storage calls ---------------------------------------------------------------------------------------

@pytest.mark.slow  # two calls, each through its 3 attempts of a stall (the single-call tests stay quick)
def test_every_call_fails_on_a_silent_endpoint(silent, tmp_path):
    url = "s3://fgtest-silent/p/x.tar"
    # every other call goes through the same two paths as "download" (a command; listings fail on the silent
    # endpoint in the loader and command tests below) and "read" (a stream)
    calls = {
        "read": lambda: storage.read_bytes(url),
        "download": lambda: storage.download(url, str(tmp_path / "d.bin")),
    }
    for name, call in calls.items():
        with pytest.raises(StorageError) as err:
            call()
        one_line_stall(str(err.value), "s3://fgtest-silent/p")
        assert "3 attempts" in str(err.value), name
    assert not (tmp_path / "d.bin").exists()
    assert s5cmd_children() == []


def test_a_stalled_body_is_killed_and_fails_naming_the_url(dataset_on_s3, body_stall):
    url = f"{dataset_on_s3[0]}/00000.tar"
    with pytest.raises(StorageError) as err, storage.open_read(url) as f:
        f.read()
    one_line_stall(str(err.value), url)
    assert [v for m, t, v in body_stall.seen if _object_get(m, t)] == ["stall-body"] * 3  # bounded retries
    assert s5cmd_children() == []


def test_a_stalled_stream_resumes_at_the_byte_where_it_stopped(dataset_on_s3, stall_bound, s3_endpoint, monkeypatch):
    """The first GET stalls mid-body; the retry delivers the rest, byte for byte."""
    url, local = dataset_on_s3
    first = []

    def once(method: str, target: str) -> str:
        if _object_get(method, target) and not first:
            first.append(target)
            return "stall-body"
        return "pass"

    with s3_through(StallingEndpoint(s3_endpoint, once, body_bytes=5000), monkeypatch) as endpoint:
        with storage.open_read(f"{url}/00000.tar") as f:
            head = f.read(3000)  # delivered before the stall ...
            rest = f.read()  # ... the rest after it, from a second s5cmd
    assert head + rest == (local / "00000.tar").read_bytes()
    gets = [v for m, t, v in endpoint.seen if _object_get(m, t)]
    assert gets == ["stall-body", "pass"]
    assert s5cmd_children() == []


def test_fetches_waiting_for_one_stalled_download_share_its_error(dataset_on_s3, stall_bound, s3_endpoint, monkeypatch,
                                                                  tmp_path):
    """Two fetches of one object into the node-local cache at once (the loaders' workers and ranks on one node): the
    second waits for the first's download and, when that fails, raises its error instead of spending the retries and
    stall timeouts again. A fetch that starts after the failure tries again."""
    url, local = dataset_on_s3
    url = f"{url}/00000.tar"
    stalling = threading.Event()
    stalling.set()

    def policy(method: str, target: str) -> str:
        return "stall-body" if stalling.is_set() and _object_get(method, target) else "pass"

    errors: list[str] = []

    def fetch() -> None:
        try:
            storage.fetch_to_cache(url, str(tmp_path / "cache"))
        except StorageError as exc:
            errors.append(str(exc))

    with s3_through(StallingEndpoint(s3_endpoint, policy), monkeypatch) as endpoint:
        threads = [threading.Thread(target=fetch) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(errors) == 2 and errors[0] == errors[1], errors
        one_line_stall(errors[0], url)
        assert [v for m, t, v in endpoint.seen if _object_get(m, t)] == ["stall-body"] * 3
        stalling.clear()
        with open(storage.fetch_to_cache(url, str(tmp_path / "cache")), "rb") as f:
            assert f.read() == (local / "00000.tar").read_bytes()
    assert s5cmd_children() == []


def test_an_upload_that_is_never_answered(stall_bound, s3_bucket, s3_endpoint, monkeypatch, tmp_path):
    local = tmp_path / "shard.tar"
    local.write_bytes(os.urandom(200_000))
    with s3_through(StallingEndpoint(s3_endpoint, silent_uploads), monkeypatch), pytest.raises(StorageError) as err:
        storage.upload(str(local), f"{s3_bucket}/up/shard.tar")
    one_line_stall(str(err.value), f"{s3_bucket}/up/shard.tar")
    assert s5cmd_children() == []


def test_the_stall_variable_is_checked(monkeypatch):
    for bad in ("0", "-3", "soon", "inf", "nan"):
        monkeypatch.setenv("FGDATA_S3_STALL_TIMEOUT", bad)
        with pytest.raises(StorageError, match="FGDATA_S3_STALL_TIMEOUT"):
            storage.list_dir("s3://fgtest-any/p")


# -- the commands ----------------------------------------------------------------------------------------------

def _cli_fails(*args: str) -> str:
    """Exit 1 without a traceback; returns what the command printed (reports go to stdout, errors to stderr)."""
    code, out, err = cli(*args)
    no_crash(code, err)
    assert code == 1, (out, err)
    return out + err


@pytest.mark.slow  # four commands, each waiting out its stalls
def test_commands_fail_on_a_silent_endpoint(silent, tmp_path, sample_images):
    url = "s3://fgtest-silent/ds"
    for args in (("count-shards", url), ("inspect", f"{url}/00000.tar"), ("verify", url)):
        err = _cli_fails(*args)
        assert STALLED.search(err), (args, err)
    images = tmp_path / "images"
    images.mkdir()
    for p in sample_images[:2]:
        (images / p.name).write_bytes(p.read_bytes())
    err = _cli_fails("shard", "images", str(images), "s3://fgtest-silent/out")
    assert STALLED.search(err), err
    assert s5cmd_children() == []


@pytest.mark.slow  # three commands, each waiting out its stalls
def test_commands_fail_when_bodies_stall(dataset_on_s3, body_stall):
    url, _ = dataset_on_s3
    # --json: the reports' tables would wrap the message
    for args in (("count-shards", url, "--no-write", "--json"), ("inspect", f"{url}/00000.tar"), ("verify", url, "--json")):
        said = _cli_fails(*args)
        assert STALLED.search(said) and "00000.tar" in said, (args, said)
    assert s5cmd_children() == []


def test_shard_upload_that_is_never_answered(stall_bound, s3_bucket, s3_endpoint, monkeypatch, tmp_path, sample_images):
    images = tmp_path / "images"
    images.mkdir()
    for p in sample_images[:2]:
        (images / p.name).write_bytes(p.read_bytes())
    with s3_through(StallingEndpoint(s3_endpoint, silent_uploads), monkeypatch):
        err = _cli_fails("shard", "images", str(images), f"{s3_bucket}/out")
    assert STALLED.search(err) and f"{s3_bucket}/out" in err, err
    assert s5cmd_children() == []


# -- the loaders -------------------------------------------------------------------------------------------------

MODES = {
    "training": dict(train=True),
    "deterministic": dict(deterministic=True, train=False),
    "validation": dict(train=False),
}


def _loader(url: str, tmp_path, mode: str, **kw):
    from fgdata.loaders import WDSLoader

    return WDSLoader(["WDS:" + url], batch_size=2, num_workers=0, key_map={"image": "png", "caption": "txt"},
                     cache_path=str(tmp_path / "cache"), **MODES[mode], **kw)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.slow  # waits out S3 stall bounds
def test_loaders_fail_on_a_silent_endpoint(silent, tmp_path, mode):
    url = "s3://fgtest-silent/ds"
    with pytest.raises(FgdataError) as err:
        next(iter(_loader(url, tmp_path, mode)))
    one_line_stall(str(err.value), url)
    assert s5cmd_children() == []


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.slow  # waits out S3 stall bounds
def test_strict_loaders_fail_when_bodies_stall(dataset_on_s3, body_stall, tmp_path, mode):
    url, _ = dataset_on_s3
    with pytest.raises(FgdataError) as err:
        next(iter(_loader(url, tmp_path, mode, strict=True, shard_count_file=f"{url}/shard_count.json")))
    one_line_stall(str(err.value), url)
    assert s5cmd_children() == []


@pytest.mark.slow  # waits out S3 stall bounds
def test_a_training_loader_gives_up_on_stalling_storage_after_a_bounded_number_of_shards(
        stall_bound, s3_bucket, s3_endpoint, monkeypatch, tmp_path):
    """12 shards whose bodies all stall: the training stream raises the storage error, naming the stall and the last
    shard, after STORAGE_FAULT_SHARDS different shards (each with its bounded retries), not after drawing them all."""
    from fgdata.loaders.sources import STORAGE_FAULT_SHARDS

    local = tmp_path / "local"
    write_dataset(local, n=12, maxcount=1, kinds=("png", "txt"))
    url = f"{s3_bucket}/many"
    for p in sorted(local.glob("*.tar")):
        storage.upload(str(p), f"{url}/{p.name}")
    with s3_through(StallingEndpoint(s3_endpoint, stall_object_bodies), monkeypatch) as endpoint:
        with pytest.raises(StorageError) as err:
            next(iter(_loader(url, tmp_path, "training", seed=0)))
    message = str(err.value)
    one_line_stall(message, url)
    reads = [t.split("?", 1)[0] for m, t, v in endpoint.seen if _object_get(m, t) and ".tar" in t]
    assert len(set(reads)) == STORAGE_FAULT_SHARDS < 12, reads
    assert all(reads.count(t) == 3 for t in reads), reads  # each with its bounded retries
    assert f"{STORAGE_FAULT_SHARDS} different shards in a row" in message and reads[-1].rsplit("/", 1)[1] in message
    assert s5cmd_children() == []


@pytest.mark.parametrize("counts", ["count-file", "counted"])
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.slow  # waits out S3 stall bounds
def test_loaders_fail_on_stalled_bodies_naming_the_stall(dataset_on_s3, body_stall, tmp_path, mode, counts):
    """Not strict, every shard's body stalls: each mode fails with the storage error that names the shard and the
    stall (not the ignore index or the workers' shares); training raises once both shards failed."""
    url, _ = dataset_on_s3
    kw = {"shard_count_file": f"{url}/shard_count.json"} if counts == "count-file" else {}
    with pytest.raises(FgdataError) as err:
        next(iter(_loader(url, tmp_path, mode, **kw)))
    message = str(err.value)
    one_line_stall(message, url)
    assert re.search(r"/0000[01]\.tar", message), message
    assert "ignore index" not in message and "got no batch" not in message, message
    assert s5cmd_children() == []
