"""The read-only http(s):// backend against a loopback server the test starts (a folder served by http.server)."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fgdata import storage
from fgdata.errors import StorageError
from fgdata.sources.manifest import read_manifest
from fgdata.storage.http import HttpBackend, HttpsBackend


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(autouse=True)
def _loopback_allowed(monkeypatch) -> None:
    """The servers here are on loopback, which fgdata reaches only when allowed (an internal mirror)."""
    monkeypatch.setenv("FGDATA_ALLOW_PRIVATE_NETWORK", "1")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "site"
    root.mkdir()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_backend_by_scheme_is_read_only():
    assert isinstance(storage.backend_for("http://example.org/x.jpg"), HttpBackend)
    assert isinstance(storage.backend_for("https://example.org/x.jpg"), HttpsBackend)
    with pytest.raises(StorageError, match=r"^https://example.org/out/x.tar: http\(s\) URLs are read-only"):
        storage.write_bytes("https://example.org/out/x.tar", b"x")
    with pytest.raises(StorageError, match="cannot be listed; give a manifest of URLs instead"):
        storage.list_dir("http://example.org/photos/")


def test_read_stat_and_ranges(served):
    root, base = served
    (root / "x.bin").write_bytes(bytes(range(256)))
    assert storage.read_bytes(f"{base}/x.bin") == bytes(range(256))
    assert storage.read_range(f"{base}/x.bin", 250, 10) == bytes(range(250, 256))  # short only at the end
    info = storage.stat(f"{base}/x.bin")
    assert info is not None and (info.name, info.size) == ("x.bin", 256)
    assert storage.stat(f"{base}/nope.bin") is None and not storage.exists(f"{base}/nope.bin")
    with pytest.raises(StorageError, match=r"/nope\.bin: status 404$"):
        storage.read_bytes(f"{base}/nope.bin")


def test_a_manifest_at_a_url_resolves_relative_rows_against_it(served):
    root, base = served
    (root / "lists").mkdir()
    rows = [{"path": "img/a.jpg", "caption": "a", "score": 1}, {"path": "https://cdn.example.org/b.jpg"}]
    (root / "lists" / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = read_manifest(f"{base}/lists/m.jsonl")
    assert [i.path for i in items] == [f"{base}/lists/img/a.jpg", "https://cdn.example.org/b.jpg"]
    assert items[0].metadata == {"score": 1}


class _Counted(ThreadingHTTPServer):
    """A loopback server that counts the connections it accepts; with ``drop_after_each`` it closes each
    connection after one response without saying so (as servers with a short keep-alive timeout do)."""

    daemon_threads = True

    def __init__(self, body: bytes, drop_after_each: bool):
        self.connections = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = drop_after_each

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    def process_request(self, request: object, client_address: object) -> None:
        self.connections += 1
        super().process_request(request, client_address)  # type: ignore[arg-type]


@pytest.mark.parametrize("drop_after_each", [False, True])
def test_a_connection_is_kept_for_the_next_request_and_replaced_when_the_server_closed_it(drop_after_each):
    from fgdata.storage.http import DownloadOptions, fetch

    httpd = _Counted(b"x" * 1000, drop_after_each)
    httpd.thread.start()
    try:
        once = DownloadOptions(retries=0)  # a closed kept connection is not a failed try
        bodies = [fetch(f"{httpd.url}/{i}.bin", options=once)[1] for i in range(20)]
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert bodies == [b"x" * 1000] * 20
    assert httpd.connections == (20 if drop_after_each else 1)
