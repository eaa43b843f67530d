"""``shard images`` from a manifest of http:// URLs, against a loopback server the test starts, with faults.

The server (http.server in a thread, bound to 127.0.0.1) serves generated images and one fault per path.
A stalling body waits on an Event the test holds, so the stall ends by fgdata's own stall timeout, never by
a sleep; every URL must end in exactly one outcome with its reason.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from faultkit import FGDATA, jpg_bytes, png_bytes, stop_trials
from fgdata.shards import discover_shards, iter_samples


def _noise_png(size: int) -> bytes:
    import io
    import random

    from PIL import Image

    rng = random.Random(size)
    im = Image.frombytes("RGB", (size, size), bytes(rng.randrange(256) for _ in range(size * size * 3)))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


class FaultServer:
    """Generated images under /img/N.png, and one fault per named path."""

    def __init__(self) -> None:
        self.release = threading.Event()  # a stalled body waits for this (set only at teardown)
        self.hits: dict[str, int] = {}
        self.down = True  # /down.png answers 500 until a test sets this False
        self.hold_for = 0  # /hold.png answers once this many /img/ requests came in
        self.others_asked = threading.Event()
        self.agents: set[str] = set()
        self.lock = threading.Lock()
        self.big = _noise_png(64)
        truncated = jpg_bytes(7, 64)
        self.routes = {
            "/wrong-type.jpg": (200, {"Content-Type": "text/html"}, jpg_bytes(3)),
            "/not-image.png": (200, {"Content-Type": "image/png"}, b"<html>not an image</html>"),
            "/big.png": (200, {"Content-Type": "image/png"}, self.big),
            "/opt-out.png": (200, {"Content-Type": "image/png", "X-Robots-Tag": "noai"}, png_bytes(5)),
            "/other-agent.png": (200, {"X-Robots-Tag": "otherbot: noindex"}, png_bytes(6)),
            "/truncated.jpg": (200, {"Content-Type": "image/jpeg"}, truncated[: len(truncated) // 2]),
            "/missing.png": (404, {}, b"not found"),
        }
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                with server.lock:
                    server.hits[path] = hit = server.hits.get(path, 0) + 1
                    server.agents.add(self.headers.get("User-Agent", ""))
                    if sum(p.startswith("/img/") for p in server.hits) >= server.hold_for > 0:
                        server.others_asked.set()
                if path.startswith("/img/"):
                    self._send(200, {"Content-Type": "image/png"}, png_bytes(int(path[5:].split(".")[0])))
                elif path == "/hold.png":  # no answer until the others were asked for (or teardown)
                    server.others_asked.wait(60) or server.release.wait()
                    self._send(200, {}, png_bytes(16))
                elif path == "/down.png":  # 500 while the server is "down", then the image
                    self._send(*((500, {}, b"down") if server.down else (200, {}, png_bytes(15))))
                elif path == "/flaky.png" and hit == 1:  # 500, then the image
                    self._send(500, {}, b"oops")
                elif path == "/busy.png" and hit == 1:  # 429 with Retry-After, then the image
                    self._send(429, {"Retry-After": "0"}, b"")
                elif path in ("/flaky.png", "/busy.png"):
                    self._send(200, {}, png_bytes(11 if path == "/flaky.png" else 12))
                elif path == "/loop-a":
                    self._send(302, {"Location": "/loop-b"}, b"")
                elif path == "/loop-b":
                    self._send(302, {"Location": "/loop-a"}, b"")
                elif path == "/stall.png":  # half the body, then nothing until the test lets go
                    body = png_bytes(13)
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    server.release.wait()
                    self.close_connection = True
                elif path == "/slow.png":  # a byte at a time, each well within the stall timeout: only the
                    body = png_bytes(14)      # total deadline can end it (the body takes >= 2 s to send)
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    for i in range(len(body)):
                        self.wfile.write(body[i:i + 1])
                        self.wfile.flush()
                        if server.release.wait(2 / len(body)):
                            break
                    self.close_connection = True
                elif path in server.routes:
                    self._send(*server.routes[path])
                else:
                    self._send(404, {}, b"")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: object, client_address: object) -> None:
                pass  # fgdata closing a too-large or stalled body mid-way is expected here

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def reset(self) -> None:
        with self.lock:
            self.hits.clear()


@pytest.fixture
def server(monkeypatch) -> Iterator[FaultServer]:
    """The fault server, on loopback: the documented setting that lets fgdata reach it (an internal mirror) is
    set for the test and the commands it starts."""
    monkeypatch.setenv("FGDATA_ALLOW_PRIVATE_NETWORK", "1")
    s = FaultServer()
    s.thread.start()
    try:
        yield s
    finally:
        s.release.set()
        s.others_asked.set()
        s.httpd.shutdown()
        s.httpd.server_close()


#: path -> the failure category it must end in (None: written)
FAULTS = {
    "/missing.png": "http: status 404",
    "/flaky.png": None,
    "/busy.png": None,
    "/loop-a": "redirect: redirect loop",
    "/wrong-type.jpg": None,
    "/not-image.png": "image-decode",
    "/big.png": "too-large",
    "/opt-out.png": "opt-out: X-Robots-Tag: noai",
    "/other-agent.png": None,
    "/truncated.jpg": "image-decode",
}


def _manifest(folder: Path, base: str, paths: list[str], name: str = "urls.jsonl") -> Path:
    rows = [{"url": base + p, "caption": f"caption {i}", "aesthetic": i / 4} for i, p in enumerate(paths)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path = folder / name
    path.write_bytes(gzip.compress(text.encode(), mtime=0) if name.endswith(".gz") else text.encode())
    return path


def _samples(dest: Path) -> list:
    return [s.members for shard in discover_shards(str(dest)) for s in iter_samples(shard)]


def _tree(dest: Path) -> dict[str, bytes]:
    return {p.relative_to(dest).as_posix(): p.read_bytes() for p in sorted(dest.rglob("*"))
            if p.is_file() and not p.relative_to(dest).as_posix().startswith(".fgdata")}


def test_every_url_ends_in_one_outcome_with_its_reason(cli, server, tmp_path):
    paths = [f"/img/{i}.png" for i in range(4)] + list(FAULTS) + ["/stall.png"]
    manifest = _manifest(tmp_path, server.url, paths, "urls.jsonl.gz")
    dest = tmp_path / "out"
    cli("shard", "images", manifest, dest, "--path-column", "url", "--stall-timeout", "0.5", "--retries", "1",
        "--max-download-size", str(len(server.big) - 1), "--user-agent-token", "ops@example.org", "--maxcount", "5",
        "--format", "keep", "-q")  # keep: the downloaded bytes are compared as served
    report = json.loads((dest / "failures.json").read_text())
    reasons = {f["input"].removeprefix(server.url): f["reason"] for f in report["failures"]}
    expected = {p: r for p, r in FAULTS.items() if r is not None}
    assert set(reasons) == set(expected) | {"/stall.png"}
    for path, reason in expected.items():
        assert reasons[path].startswith(reason), (path, reasons[path])
    assert reasons["/stall.png"] == "timeout: no answer in time (2 tries)"
    assert report["seen"] == len(paths) == report["written"] + report["failed"]
    assert report["failed_by_reason"] == {"http": 1, "image-decode": 2, "opt-out": 1, "redirect": 1, "timeout": 1,
                                          "too-large": 1}
    samples = _samples(dest)
    assert len(samples) == report["written"] == 4 + sum(r is None for r in FAULTS.values())
    by_source = {json.loads(s["json"])["fgdata"]["source"].removeprefix(server.url): s for s in samples}
    assert by_source["/wrong-type.jpg"]["jpg"] == jpg_bytes(3)  # the bytes decide, not the Content-Type
    assert by_source["/flaky.png"]["png"] == png_bytes(11) and server.hits["/flaky.png"] == 2
    assert by_source["/busy.png"]["png"] == png_bytes(12) and server.hits["/busy.png"] == 2
    assert server.hits["/missing.png"] == 1  # a 404 is final: never retried
    doc = json.loads(by_source["/img/2.png"]["json"])
    assert doc["aesthetic"] == 0.5 and by_source["/img/2.png"]["txt"] == b"caption 2"  # extra columns kept
    assert doc["fgdata"]["sha256"] == hashlib.sha256(png_bytes(2)).hexdigest()
    assert all(a.startswith("fgdata/") and "ops@example.org" in a for a in server.agents)
    # per-shard stats: each work unit of 5 inputs writes one shard, which holds its unit's failures
    stats = json.loads((dest / "shard_stats.json").read_text())
    assert stats["successes"] == 8 and stats["failed"] == 7 and stats["retryable"] == 1  # the stall
    assert stats["failed_by_reason"] == report["failed_by_reason"]
    assert stats["shards"] == {
        "00000.tar": {"samples": 4, "failed_by_reason": {"http": 1}},
        "00001.tar": {"samples": 3, "failed_by_reason": {"image-decode": 1, "redirect": 1}},
        "00002.tar": {"samples": 1, "failed_by_reason": {"image-decode": 1, "opt-out": 1, "timeout": 1,
                                                         "too-large": 1}},
    }


def test_videos_from_direct_media_urls(cli, server, keyframed_clip, tmp_path):
    clip = keyframed_clip.read_bytes()
    server.routes["/clip.mp4"] = (200, {"Content-Type": "application/octet-stream"}, clip)
    manifest = _manifest(tmp_path, server.url, ["/clip.mp4?sig=abc", "/missing.png"])
    dest = tmp_path / "out"
    cli("shard", "videos", manifest, dest, "--path-column", "url", "-q")
    (sample,) = _samples(dest)
    assert sample["mp4"] == clip  # the member is named by the URL's path, not its query
    report = json.loads((dest / "failures.json").read_text())
    assert report["failures"][0]["reason"] == "http: status 404"


def test_opt_out_can_be_ignored(cli, server, tmp_path):
    manifest = _manifest(tmp_path, server.url, ["/opt-out.png", "/img/1.png"])
    dest = tmp_path / "out"
    cli("shard", "images", manifest, dest, "--path-column", "url", "--ignore-opt-out", "-q")
    report = json.loads((dest / "failures.json").read_text())
    assert (report["written"], report["failed"]) == (2, 0)


def test_too_many_redirects_and_bad_flags(cli, server, tmp_path):
    manifest = _manifest(tmp_path, server.url, ["/loop-a", "/img/1.png"])
    result = cli("shard", "images", manifest, tmp_path / "out", "--path-column", "url", "--timeout", "0", expect=1)
    assert str(result.exception) == "--timeout must be > 0"
    cli("shard", "images", manifest, tmp_path / "out", "--path-column", "url", "--max-redirects", "0", "-q")
    report = json.loads((tmp_path / "out" / "failures.json").read_text())
    assert report["failures"][0]["reason"] == "redirect: more than 0 redirects"


def test_a_url_that_does_not_answer_holds_only_its_own_thread(cli, server, tmp_path):
    """/hold.png answers only once the server was asked for all 60 other URLs: the other fetch thread must go
    on past it (no batch that waits for its slowest URL), else the held URL ends by its stall timeout."""
    server.hold_for = 60
    manifest = _manifest(tmp_path, server.url, ["/hold.png"] + [f"/img/{i}.png" for i in range(60)])
    dest = tmp_path / "out"
    cli("shard", "images", manifest, dest, "--path-column", "url", "--fetch-threads", "2", "--stall-timeout", "20",
        "--retries", "0", "-q")
    report = json.loads((dest / "failures.json").read_text())
    assert (report["written"], report["failed"]) == (61, 0), report["failures"]


def test_same_bytes_for_one_or_two_workers(cli, server, tmp_path):
    paths = [f"/img/{i}.png" for i in range(40)] + list(FAULTS)  # two batches of 32 URLs (2 threads)
    manifest = _manifest(tmp_path, server.url, paths)
    runs = {}
    for workers in (1, 2):
        server.reset()  # the same server responses for both runs (500 and 429 first, again)
        dest = tmp_path / f"w{workers}"
        cli("shard", "images", manifest, dest, "--path-column", "url", "--maxcount", "6", "--workers", str(workers),
            "--fetch-threads", "2", "--max-download-size", "2000", "-q")
        runs[workers] = _tree(dest)
    assert runs[1] == runs[2] and len([n for n in runs[1] if n.endswith(".tar")]) == 9  # 50 inputs, units of 6


def test_rerun_with_other_fetch_concurrency_resumes_and_a_changed_download_flag_is_named(cli, server, tmp_path):
    """How many requests are in flight never changes which body a URL gives: ``--fetch-threads`` and ``--per-host``
    stay out of the job record. A setting that does change outcomes is refused by its flag, not its field."""
    manifest = _manifest(tmp_path, server.url, [f"/img/{i}.png" for i in range(6)])
    dest = tmp_path / "out"
    flags = ["--path-column", "url", "--maxcount", "3", "--max-download-size", "2000", "-q"]
    cli("shard", "images", manifest, dest, *flags, "--fetch-threads", "2", "--per-host", "2")
    before = {p.name: p.stat().st_mtime_ns for p in dest.glob("*.tar")}
    cli("shard", "images", manifest, dest, *flags, "--fetch-threads", "5", "--per-host", "1")
    assert {p.name: p.stat().st_mtime_ns for p in dest.glob("*.tar")} == before and len(before) == 2  # nothing redone
    refused = cli("shard", "images", manifest, dest, *flags[:-3], "--max-download-size", "3000", "-q", expect=1)
    message = str(refused.exception)
    assert "(--max-download-size was 2000, now 3000)" in message, message
    assert "download" not in message.replace("--max-download-size", "") and "max_bytes" not in message


def test_sigkill_and_rerun_give_the_bytes_of_an_uninterrupted_run(server, tmp_path):
    manifest = _manifest(tmp_path, server.url, [f"/img/{i}.png" for i in range(24)] + ["/missing.png"])
    cmd = [*FGDATA, "shard", "images", str(manifest), "{out}", "--path-column", "url", "--maxcount", "5",
           "--fetch-threads", "3", "-q"]
    stop_trials(cmd, out=tmp_path, clean=tmp_path / "clean", stops=[(1, signal.SIGKILL), (2, signal.SIGINT)])


def test_dedupe_keeps_the_first_of_equal_bodies_across_a_resume(cli, server, tmp_path):
    paths = ["/img/1.png", "/img/2.png", "/img/1.png?copy", "/img/3.png", "/img/2.png?copy", "/img/1.png?again"]
    manifest = _manifest(tmp_path, server.url, paths)
    dest = tmp_path / "out"
    cli("shard", "images", manifest, dest, "--path-column", "url", "--dedupe", "sha256", "-q")
    report = json.loads((dest / "failures.json").read_text())
    assert [(f["index"], f["reason"]) for f in report["failures"]] == [
        (2, "duplicate: same bytes as sample_000000"), (4, "duplicate: same bytes as sample_000001"),
        (5, "duplicate: same bytes as sample_000000")]
    result = cli("shard", "images", manifest, tmp_path / "ray", "--path-column", "url", "--dedupe", "sha256",
                 "--engine", "ray", expect=1)
    assert "--dedupe compares every input" in str(result.exception)
    # a kill after the first shard: the rerun finds the first bodies in the complete shards
    cmd = [*FGDATA, "shard", "images", str(manifest), "{out}", "--path-column", "url", "--dedupe", "sha256",
           "--maxcount", "1", "--fetch-threads", "1", "-q"]
    stop_trials(cmd, out=tmp_path, clean=tmp_path / "clean", stops=[(2, signal.SIGKILL)])


def test_a_slow_body_ends_at_the_total_deadline(cli, server, tmp_path):
    manifest = _manifest(tmp_path, server.url, ["/slow.png", "/img/1.png"])
    dest = tmp_path / "out"
    cli("shard", "images", manifest, dest, "--path-column", "url", "--timeout", "0.3", "--stall-timeout", "10",
        "--retries", "0", "-q")
    report = json.loads((dest / "failures.json").read_text())
    assert [f["reason"] for f in report["failures"]] == ["timeout: over 0.3 s in all"]


def test_report_shows_the_download_stats(cli, server, tmp_path):
    """``fgdata report`` on a URL job's folder: its successes and failures by reason, in the terminal and the page."""
    import subprocess

    paths = [f"/img/{i}.png" for i in range(3)] + ["/missing.png", "/flaky.png", "/not-image.png"]
    manifest = _manifest(tmp_path, server.url, paths)
    dest = tmp_path / "out"
    cli("shard", "images", manifest, dest, "--path-column", "url", "--retries", "0", "--maxcount", "2", "-q")
    stats = json.loads((dest / "shard_stats.json").read_text())
    assert stats["failed_by_reason"] == {"http": 2, "image-decode": 1} and stats["retryable"] == 1
    page = tmp_path / "report.html"
    res = subprocess.run([*FGDATA, "report", str(dest), "-o", str(page)], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    line = next(line for line in res.stdout.splitlines() if line.strip().startswith("downloads"))
    assert "3 of 6 URLs written, 3 failed (http 2, image-decode 1); 1 retryable (shard again with --retry-failed)" in line
    html = page.read_text()
    assert 'id="downloads"' in html and "3 of 6 URLs written, 3 failed, 1 of them retryable" in html
    assert '<td>http</td><td class="n">2</td>' in html
    doc = json.loads(subprocess.run([*FGDATA, "report", str(dest), "-o", str(tmp_path / "r2.html"), "--json"],
                                    capture_output=True, text=True).stdout)
    assert doc["downloads"] == {"file": str(dest / "shard_stats.json"), "successes": 3, "failed": 3,
                                "failed_by_reason": {"http": 2, "image-decode": 1}, "retryable": 1}


def test_rows_a_selection_leaves_out_are_counted_by_reason_in_the_stats_summary_and_report(cli, server, tmp_path):
    """A URL job with ``--where`` and ``--keep-top``: the rows left out are neither fetched nor failed; shard_stats.json
    (beside the per-shard counts), the summary, failures.json and ``fgdata report`` count them by reason."""
    paths = [f"/img/{i}.png" for i in range(6)] + ["/missing.png"]  # aesthetic 0, 0.25, ..., 1.5
    manifest = _manifest(tmp_path, server.url, paths)
    dest = tmp_path / "out"
    doc = json.loads(cli("shard", "images", manifest, dest, "--path-column", "url", "--retries", "0", "--maxcount", "2",
                         "--where", "aesthetic >= 0.5", "--keep-top", "0.8", "--by", "aesthetic", "--json").stdout)
    assert (doc["seen"], doc["written"], doc["failed"], doc["filtered"]) == (7, 3, 1, 3)
    assert doc["filtered_by_reason"] == {"keep-top": 1, "where": 2}  # 5 rows pass --where: the top 4 kept
    assert set(server.hits) == {"/img/3.png", "/img/4.png", "/img/5.png", "/missing.png"}
    stats = json.loads((dest / "shard_stats.json").read_text())
    assert (stats["successes"], stats["failed"], stats["filtered"]) == (3, 1, 3)
    assert stats["filtered_by_reason"] == doc["filtered_by_reason"] == \
        json.loads((dest / "failures.json").read_text())["filtered_by_reason"]
    assert sum(s["samples"] for s in stats["shards"].values()) == 3
    report = json.loads(cli("report", dest, "--output", tmp_path / "report.html", "--json").stdout)
    assert report["downloads"]["filtered_by_reason"] == report["selection"]["filtered_by_reason"] == \
        {"keep-top": 1, "where": 2}


def test_retry_failed_ends_as_a_fresh_run_that_succeeded(cli, server, tmp_path):
    """A 500 (with --retries 0) is fetched again by --retry-failed once the server answers: the bytes are those of
    a fresh run against the answering server. A 404 in an earlier shard is final: not fetched again."""
    paths = ["/missing.png"] + [f"/img/{i}.png" for i in range(5)] + ["/down.png"] + [f"/img/{i}.png" for i in range(10, 14)]
    manifest = _manifest(tmp_path, server.url, paths)
    dest, fresh = tmp_path / "out", tmp_path / "fresh"
    flags = ["--path-column", "url", "--retries", "0", "--maxcount", "2", "-q"]
    cli("shard", "images", manifest, dest, *flags)
    first = json.loads((dest / "failures.json").read_text())
    assert [f["reason"] for f in first["failures"]] == ["http: status 404", "http: status 500"]
    before = _tree(dest)
    cli("shard", "images", manifest, dest, *flags)  # a plain rerun keeps the failure
    assert _tree(dest) == before and server.hits["/down.png"] == 1
    server.down = False
    server.reset()
    doc = json.loads(cli("shard", "images", manifest, dest, *flags[:-1], "--retry-failed", "--json").stdout)
    assert (doc["retried"], doc["recovered"]) == (1, 1) and doc["written"] == len(paths) - 1
    assert server.hits.get("/missing.png", 0) == 0 and server.hits["/down.png"] == 1
    assert "/img/0.png" not in server.hits  # shards before the first retryable failure are kept
    cli("shard", "images", manifest, fresh, *flags)
    assert _tree(dest) == _tree(fresh)
    stats = json.loads((dest / "shard_stats.json").read_text())
    assert stats["failed_by_reason"] == {"http": 1} and stats["retryable"] == 0
    again = json.loads(cli("shard", "images", manifest, dest, *flags[:-1], "--retry-failed", "--json").stdout)
    assert again["retried"] == 0 and _tree(dest) == _tree(fresh)  # nothing retryable left: nothing to do
    result = cli("shard", "images", manifest, dest, *flags, "--retry-failed", "--no-resume", expect=2)
    assert "--retry-failed" in result.output


def test_a_zst_manifest_gives_the_samples_of_the_plain_one(cli, server, tmp_path):
    zstandard = pytest.importorskip("zstandard")
    paths = [f"/img/{i}.png" for i in range(3)] + ["/missing.png"]
    plain = _manifest(tmp_path, server.url, paths)
    packed = tmp_path / "urls.jsonl.zst"
    lines = plain.read_bytes().splitlines(keepends=True)
    # two frames, as pzstd writes: both are read
    packed.write_bytes(b"".join(zstandard.ZstdCompressor().compress(b"".join(part)) for part in (lines[:2], lines[2:])))
    for manifest, dest in ((plain, tmp_path / "plain"), (packed, tmp_path / "zst")):
        cli("shard", "images", manifest, dest, "--path-column", "url", "-q")
    assert _samples(tmp_path / "zst") == _samples(tmp_path / "plain") and len(_samples(tmp_path / "plain")) == 3
    report = json.loads((tmp_path / "zst" / "failures.json").read_text())
    assert report["seen"] == 4 and report["failed_by_reason"] == {"http": 1}
    broken = tmp_path / "broken.jsonl.zst"
    broken.write_bytes(packed.read_bytes()[:-6])
    result = cli("shard", "images", broken, tmp_path / "bad", "--path-column", "url", "-q", expect=1)
    assert "broken.jsonl.zst: a truncated zstd file" in str(result.exception)  # never a shorter manifest


def _accept_queue(listener) -> tuple[int, int]:
    """A listening socket's (connections waiting to be accepted, most it queues), from Linux's TCP_INFO."""
    import socket
    import struct

    info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 32)
    return struct.unpack_from("II", info, 24)  # tcpi_unacked, tcpi_sacked: the accept queue of a listener


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's TCP_INFO of a listener")
def test_a_connect_that_never_completes_is_a_timeout(cli, server, tmp_path):
    """A host that takes no connection (its accept queue full, so the kernel drops the SYN) ends at
    --connect-timeout as a retryable timeout that says so; the other URLs are written."""
    import socket

    listener = socket.socket()
    fillers = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        while _accept_queue(listener)[0] <= _accept_queue(listener)[1]:  # fill it: one connection never accepted
            assert len(fillers) < 8, _accept_queue(listener)
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(listener.getsockname())
            fillers.append(filler)
        dead = f"http://127.0.0.1:{listener.getsockname()[1]}/never.png"
        manifest = tmp_path / "urls.jsonl"
        manifest.write_text("".join(json.dumps({"url": u}) + "\n" for u in (server.url + "/img/1.png", dead)))
        dest = tmp_path / "out"
        cli("shard", "images", manifest, dest, "--path-column", "url", "--connect-timeout", "0.2",
            "--stall-timeout", "30", "--timeout", "60", "--retries", "1", "-q")
        report = json.loads((dest / "failures.json").read_text())
        assert [(f["input"], f["reason"]) for f in report["failures"]] == [
            (dead, "timeout: no connection in time (2 tries)")]
        assert report["seen"] == 2 and report["written"] == 1
        assert json.loads((dest / "shard_stats.json").read_text())["retryable"] == 1
    finally:
        for s in fillers:
            s.close()
        listener.close()


@pytest.mark.slow  # a Ray cluster and two torchrun launches, each its own process tree
def test_url_jobs_under_ray_and_torchrun_write_the_local_bytes(cli, server, tmp_path):
    """The same server responses give the same files from one process, two torchrun ranks and Ray; a rerun with
    --retry-failed under ranks fetches the retryable failure again, as one process does."""
    import subprocess

    paths = [f"/img/{i}.png" for i in range(9)] + ["/missing.png", "/flaky.png", "/busy.png"]
    manifest = _manifest(tmp_path, server.url, paths)
    flags = ["--path-column", "url", "--maxcount", "3", "--fetch-threads", "2", "--retries", "0", "-q"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "RAY_AUTH_MODE": "disabled",
           "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    runs = {}
    for how, prefix, extra in [
        ("local", list(FGDATA), []),
        ("ranks", [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", "-m",
                   "fgdata.cli.main"], []),
        ("ray", list(FGDATA), ["--engine", "ray"]),
    ]:
        server.reset()  # /flaky.png answers 500 first, /busy.png 429: with --retries 0 both fail the first time
        dest = tmp_path / how
        done = subprocess.run([*prefix, "shard", "images", str(manifest), str(dest), *flags, *extra],
                              capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[how] = _tree(dest)
        report = json.loads((dest / "failures.json").read_text())
        assert (report["written"], report["failed"]) == (9, 3), how
    assert runs["ranks"] == runs["local"] == runs["ray"]
    again = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                            "-m", "fgdata.cli.main", "shard", "images", str(manifest), str(tmp_path / "ranks"),
                            *flags, "--retry-failed"], capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    report = json.loads((tmp_path / "ranks" / "failures.json").read_text())
    assert (report["written"], report["failed"]) == (11, 1)  # the 500 and the 429 answer now; the 404 is final
