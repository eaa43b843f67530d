"""URL ingestion against the web as an attacker would serve it, all on loopback.

- The network policy, in-process (``shard images`` through typer's CliRunner): a resolver stub (the OS's
  ``getaddrinfo``, monkeypatched) maps test host names to private, link-local and public addresses, and a
  connect stub routes every address the stub knows to a loopback server; a connection to any other address
  that is not loopback fails the test, so no packet leaves 127.0.0.0/8.
- A hostile server: a short Content-Length with a smuggled second response, headers sent a byte per second
  (the total deadline; SIGTERM and SIGINT during it), credentials in the URL (sent as Basic authentication).
- A loopback proxy: it sees every request when set, none for NO_PROXY hosts; its credentials are forwarded
  and never written or printed; https goes through CONNECT with TLS verified for the URL's host (a test CA).
"""

from __future__ import annotations

import base64
import errno
import ipaddress
import json
import os
import random
import select
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from faultkit import FGDATA, png_bytes
from fgdata.shards import discover_shards, iter_samples
from fgdata.storage.http import read_environment

#: Test host names and what the stub resolves them to. The "public" addresses are ordinary Internet
#: addresses that no test ever reaches: the connect stub sends every address here to the loopback server.
PUBLIC = "45.79.10.20"
NAMES = {
    "img.public.test": [PUBLIC],
    "metadata.public.test": ["169.254.169.254"],  # a cloud VM's metadata endpoint
    "intranet.public.test": ["10.0.0.7"],
    "mixed.public.test": [PUBLIC, "10.0.0.8"],  # one public and one private answer
    "v6.public.test": ["fd00::7"],  # IPv6 unique local
}


class _Origin(ThreadingHTTPServer):
    """Images under /img/N.png; /to?URL answers 302 to URL. HTTP/1.0: a connection per request."""

    daemon_threads = True

    def __init__(self) -> None:
        self.paths: list[tuple[str, str]] = []  # (Host header, path) of every request
        origin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                origin.paths.append((self.headers.get("Host", ""), self.path))
                if self.path.startswith("/to?"):
                    self.send_response(302)
                    self.send_header("Location", self.path[4:])
                    self.end_headers()
                    return
                body = png_bytes(int(self.path.rsplit("/", 1)[1].split(".")[0]))
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Net:
    """What sockets were asked to connect to, and any address beyond loopback the stub did not route."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.outside: list[object] = []


@pytest.fixture
def net(monkeypatch) -> Iterator[tuple[_Net, _Origin]]:
    origin = _Origin()
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect
    routed = {a for addresses in NAMES.values() for a in addresses} | {"::1"}  # the server listens on IPv4
    state = _Net()

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002, ANN001, ANN202
        name = str(host).lower()
        if name in NAMES:
            return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                     (a, port, 0, 0) if ":" in a else (a, port)) for a in NAMES[name]]
        if name != "localhost":
            try:
                ipaddress.ip_address(name.strip("[]"))
            except ValueError:  # never a real lookup: it could send a packet
                raise socket.gaierror(socket.EAI_NONAME, "unknown test host") from None
            flags |= socket.AI_NUMERICHOST
        return real_getaddrinfo(host, port, family, type, proto, flags)

    def connect(sock: socket.socket, address) -> None:  # noqa: ANN001
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            state.asked.append(host)
            if host in routed:  # the stub's stand-in for that host: the loopback server
                target = ("::ffff:127.0.0.1", origin.server_address[1], 0, 0) if sock.family == socket.AF_INET6 \
                    else origin.server_address
                return real_connect(sock, target)
            ip = ipaddress.ip_address(host.partition("%")[0])
            if not (getattr(ip, "ipv4_mapped", None) or ip).is_loopback:
                state.outside.append(address)
                raise OSError(errno.ENETUNREACH, "the test allows loopback only")
        return real_connect(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.delenv("FGDATA_ALLOW_PRIVATE_NETWORK", raising=False)
    try:
        yield state, origin
    finally:
        origin.stop()
    assert state.outside == [], "a socket connected beyond loopback"


def _manifest(path: Path, urls: list[str]) -> Path:
    path.write_text("".join(json.dumps({"url": u}) + "\n" for u in urls))
    return path


def _failures(dest: Path) -> dict[str, str]:
    return {f["input"]: f["reason"] for f in json.loads((dest / "failures.json").read_text())["failures"]}


def _by_source(dest: Path) -> dict[str, bytes]:
    return {json.loads(s.members["json"])["fgdata"]["source"]: s.members["png"]
            for shard in discover_shards(str(dest)) for s in iter_samples(shard)}


def test_the_network_policy_refuses_what_is_not_public_and_the_flag_allows_it(cli, net, tmp_path):
    state, origin = net
    port = origin.server_address[1]
    refused = {  # URL -> the start of its reason
        f"http://127.0.0.1:{port}/img/2.png": "network-policy: 127.0.0.1 is a loopback address",
        f"http://[::1]:{port}/img/3.png": "network-policy: ::1 is a loopback address",
        f"http://[::ffff:127.0.0.1]:{port}/img/4.png": "network-policy: ::ffff:127.0.0.1 is a loopback address",
        "http://metadata.public.test/img/5.png":
            "network-policy: metadata.public.test resolves to 169.254.169.254, a link-local address",
        "http://intranet.public.test/img/6.png": "network-policy: intranet.public.test resolves to 10.0.0.7, a private",
        "http://mixed.public.test/img/7.png": "network-policy: mixed.public.test resolves to 10.0.0.8, a private",
        "http://v6.public.test/img/8.png": "network-policy: v6.public.test resolves to fd00::7, a private",
        "http://img.public.test/to?http://intranet.public.test/img/9.png":
            "network-policy: intranet.public.test resolves to 10.0.0.7",
        f"http://img.public.test/to?http://127.0.0.1:{port}/img/10.png": "network-policy: 127.0.0.1 is a loopback",
    }
    urls = ["http://img.public.test/img/1.png", *refused]
    manifest = _manifest(tmp_path / "urls.jsonl", urls)
    cli("shard", "images", manifest, tmp_path / "out", "--path-column", "url", "--format", "keep", "-q")
    reasons = _failures(tmp_path / "out")
    assert set(reasons) == set(refused)
    for url, reason in refused.items():
        assert reasons[url].startswith(reason) and reasons[url].endswith("(--allow-private-network allows it)"), \
            (url, reasons[url])
    assert _by_source(tmp_path / "out") == {urls[0]: png_bytes(1)}
    assert set(state.asked) == {PUBLIC}  # no refused address was ever connected to
    assert sorted(path for _, path in origin.paths) == sorted(
        ["/img/1.png", "/to?http://intranet.public.test/img/9.png", f"/to?http://127.0.0.1:{port}/img/10.png"])

    state.asked.clear()
    cli("shard", "images", manifest, tmp_path / "allowed", "--path-column", "url", "--format", "keep",
        "--allow-private-network", "-q")
    report = json.loads((tmp_path / "allowed" / "failures.json").read_text())
    assert (report["written"], report["failed"]) == (len(urls), 0), report["failures"]
    by_source = _by_source(tmp_path / "allowed")
    assert by_source[f"http://127.0.0.1:{port}/img/2.png"] == png_bytes(2)
    assert by_source["http://img.public.test/to?http://intranet.public.test/img/9.png"] == png_bytes(9)
    assert {"169.254.169.254", "10.0.0.7", "fd00::7", "127.0.0.1", "::1"} <= set(state.asked)


def test_the_environment_setting_allows_private_addresses_too(cli, net, tmp_path, monkeypatch):
    _, origin = net
    url = f"http://127.0.0.1:{origin.server_address[1]}/img/3.png"
    monkeypatch.setenv("FGDATA_ALLOW_PRIVATE_NETWORK", "1")
    manifest = _manifest(tmp_path / "urls.jsonl", [url])
    cli("shard", "images", manifest, tmp_path / "out", "--path-column", "url", "--format", "keep", "-q")
    assert _by_source(tmp_path / "out") == {url: png_bytes(3)}


# -- a hostile server ----------------------------------------------------------------------------------------


class _Hostile:
    """A raw HTTP/1.1 server on loopback, keep-alive, one behaviour per path:

    /smuggle/N.png: N's image under a Content-Length that ends it, followed at once by a whole second response
    (a 20 KB body: more than a client's read buffer can swallow) that nobody asked for;
    /img/N.png: N's image; /drip: the status line and headers a byte per second, never ending;
    /auth/N.png: N's image only with the Basic credentials user:s3cret (401 otherwise).
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.dripping = threading.Event()  # a /drip request came in
        self.release = threading.Event()
        self.connections = 0
        self.auth: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    try:
                        chunk = conn.recv(65536)
                    except OSError:  # the client closed a connection it would not reuse
                        return
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
                try:
                    if path == "/drip":
                        self.dripping.set()
                        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"x" * 100_000:
                            conn.sendall(bytes([byte]))
                            if self.release.wait(1):
                                return
                        return
                    if path.startswith("/auth/"):
                        self.auth.append(headers.get("authorization", ""))
                        if headers.get("authorization") != "Basic " + base64.b64encode(b"user:s3cret").decode():
                            conn.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
                            continue
                    body = png_bytes(int(path.rsplit("/", 1)[1].split(".")[0]))
                    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                    if path.startswith("/smuggle/"):
                        evil = random.Random(99).randbytes(20_000)
                        reply += b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(evil), evil)
                    conn.sendall(reply)
                except OSError:
                    return

    def close(self) -> None:
        self.release.set()
        self.listener.close()


@pytest.fixture
def hostile(monkeypatch) -> Iterator[_Hostile]:
    monkeypatch.setenv("FGDATA_ALLOW_PRIVATE_NETWORK", "1")  # on loopback: an internal server
    server = _Hostile()
    try:
        yield server
    finally:
        server.close()


def test_a_smuggled_response_never_becomes_the_next_urls_image(cli, hostile, tmp_path):
    urls = [f"{hostile.url}/smuggle/1.png", f"{hostile.url}/img/2.png", f"{hostile.url}/smuggle/3.png",
            f"{hostile.url}/img/4.png"]
    manifest = _manifest(tmp_path / "urls.jsonl", urls)
    cli("shard", "images", manifest, tmp_path / "out", "--path-column", "url", "--format", "keep",
        "--fetch-threads", "1", "--per-host", "1", "--retries", "0", "-q")
    assert _by_source(tmp_path / "out") == {u: png_bytes(int(u.rsplit("/", 1)[1][:-4])) for u in urls}
    assert hostile.connections == 3  # a new connection after each smuggling response, none otherwise


@pytest.mark.timeout(120)
def test_headers_a_byte_per_second_end_at_the_total_deadline(cli, hostile, tmp_path):
    manifest = _manifest(tmp_path / "urls.jsonl", [f"{hostile.url}/drip", f"{hostile.url}/img/1.png"])
    cli("shard", "images", manifest, tmp_path / "out", "--path-column", "url", "--timeout", "3",
        "--stall-timeout", "5", "--retries", "0", "-q")
    assert _failures(tmp_path / "out") == {f"{hostile.url}/drip": "timeout: over 3 s in all"}


@pytest.mark.timeout(120)
def test_a_stop_during_a_dripping_response_ends_the_job_at_once(hostile, tmp_path):
    """SIGTERM mid-response (SIGINT takes the same handler: tests/jobs/test_shard_job.py sends each signal)."""
    manifest = _manifest(tmp_path / "urls.jsonl", [f"{hostile.url}/drip"] + [f"{hostile.url}/img/{i}.png"
                                                                              for i in range(3)])
    proc = subprocess.Popen([*FGDATA, "shard", "images", str(manifest), str(tmp_path / "out"), "--path-column",
                             "url", "--timeout", "600", "--stall-timeout", "300", "--retries", "0", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert hostile.dripping.wait(60), "the job never asked for /drip"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)  # a guard only: the job ends within a few seconds
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted:"), err


def test_credentials_in_a_url_are_sent_as_basic_authentication(cli, hostile, tmp_path):
    base = hostile.url.replace("http://", "http://user:s3cret@")
    urls = [f"{base}/auth/1.png", f"{hostile.url}/auth/2.png"]
    manifest = _manifest(tmp_path / "urls.jsonl", urls)
    result = cli("shard", "images", manifest, tmp_path / "out", "--path-column", "url", "--retries", "0")
    assert sorted(hostile.auth) == ["", "Basic " + base64.b64encode(b"user:s3cret").decode()]
    reasons = json.loads((tmp_path / "out" / "failures.json").read_text())["failures"]
    assert [f["reason"] for f in reasons] == ["http: status 401"]
    assert "s3cret" not in result.output


# -- proxies -------------------------------------------------------------------------------------------------


class _Proxy(ThreadingHTTPServer):
    """A forwarding proxy on loopback: absolute-form GETs are forwarded to their origin, CONNECT is tunnelled;
    every request line and its Proxy-Authorization are recorded."""

    daemon_threads = True

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []  # (method, target, Proxy-Authorization)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                import http.client
                import urllib.parse

                proxy.seen.append(("GET", self.path, self.headers.get("Proxy-Authorization", "")))
                parts = urllib.parse.urlsplit(self.path)
                upstream = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=30)
                upstream.request("GET", parts.path, headers={"Host": parts.netloc})
                answer = upstream.getresponse()
                body = answer.read()
                self.send_response(answer.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                upstream.close()

            def do_CONNECT(self) -> None:  # noqa: N802 - http.server's name
                proxy.seen.append(("CONNECT", self.path, self.headers.get("Proxy-Authorization", "")))
                host, _, port = self.path.rpartition(":")
                upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=30)
                self.send_response(200)
                self.end_headers()
                self.wfile.flush()
                ends = [self.connection, upstream]
                while True:
                    ready, _, _ = select.select(ends, [], [], 30)
                    if not ready:
                        break
                    for s in ready:
                        data = s.recv(65536)
                        if not data:
                            upstream.close()
                            self.close_connection = True
                            return
                        (upstream if s is self.connection else self.connection).sendall(data)
                upstream.close()
                self.close_connection = True

        super().__init__(("127.0.0.1", 0), Handler)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture
def proxy(monkeypatch) -> Iterator[_Proxy]:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("FGDATA_ALLOW_PRIVATE_NETWORK", "1")  # the test's origin is on loopback
    server = _Proxy()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):  # no proxy for what this process
            monkeypatch.delenv(name, raising=False)                           # fetches next (a library call
            monkeypatch.delenv(name.upper(), raising=False)                   # reads them once)
        read_environment()


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
def test_a_proxy_sees_every_request_but_those_no_proxy_names(cli, hostile, proxy, tmp_path, monkeypatch, variable):
    port = hostile.url.rsplit(":", 1)[1]
    monkeypatch.setenv(variable, f"http://proxyuser:pr0xy-secret@127.0.0.1:{proxy.port}")
    monkeypatch.setenv("NO_PROXY" if variable.isupper() else "no_proxy", "example.org, localhost")
    via = [f"http://127.0.0.1:{port}/img/{i}.png" for i in range(3)]
    direct = [f"http://localhost:{port}/img/{i}.png" for i in range(3, 5)]
    manifest = _manifest(tmp_path / "urls.jsonl", via + direct)
    result = cli("shard", "images", manifest, tmp_path / "out", "--path-column", "url", "--format", "keep",
                 "--retries", "0", "--fetch-threads", "1")
    assert _by_source(tmp_path / "out") == {u: png_bytes(int(u.rsplit("/", 1)[1][:-4])) for u in via + direct}
    auth = "Basic " + base64.b64encode(b"proxyuser:pr0xy-secret").decode()
    assert sorted(proxy.seen) == sorted(("GET", u, auth) for u in via)  # the NO_PROXY host went direct
    written = b"".join(p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert b"pr0xy-secret" not in written and "pr0xy-secret" not in result.output


def test_a_socks_proxy_fails_each_url_with_its_reason(cli, hostile, proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("ALL_PROXY", "socks5://user:pw@127.0.0.1:1080")
    manifest = _manifest(tmp_path / "urls.jsonl", [f"{hostile.url}/img/1.png"])
    cli("shard", "images", manifest, tmp_path / "out", "--path-column", "url", "-q", expect=1)
    assert list(_failures(tmp_path / "out").values()) == [
        "proxy: a socks5:// proxy is not supported (http:// proxies only, https through CONNECT)"]


@pytest.mark.parametrize(("rule", "proxied"), [
    ("127.0.0.0/8", False), ("127.0.0.1", False), ("*", False), ("{port}", False), ("example.org,127.0.0.1", False),
    ("10.0.0.0/8", True), ("example.org", True), ("127.0.0.1:1", True), ("", True)])
def test_no_proxy_rules(hostile, proxy, monkeypatch, rule, proxied):
    """NO_PROXY as curl and requests read it: CIDR ranges, addresses, ``*``, ``host:port``, lists."""
    from fgdata.storage.http import DownloadOptions, fetch

    port = hostile.url.rsplit(":", 1)[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("NO_PROXY", rule.replace("{port}", f"127.0.0.1:{port}"))
    read_environment()  # a library call reads the environment once; a job's start reads it again
    assert fetch(f"{hostile.url}/img/5.png", options=DownloadOptions(retries=0))[1] == png_bytes(5)
    assert [target for _, target, _ in proxy.seen] == ([f"{hostile.url}/img/5.png"] if proxied else [])


def _tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """A test CA and a certificate for ``localhost`` it signed: (CA pem, certificate pem, key pem)."""
    import datetime

    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fgdata test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def test_https_through_connect_verifies_the_urls_host(proxy, tmp_path, monkeypatch):
    """https through the proxy's CONNECT tunnel to a TLS server for ``localhost``: with the test CA trusted
    (SSL_CERT_FILE) the image is written, the TLS name being the URL's host (SNI and the certificate check),
    not the proxy's; without it the URL fails as ``tls``."""
    import ssl

    ca, cert, key = _tls_files(tmp_path)
    origin = _Origin()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    names: list[str | None] = []
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    origin.socket = context.wrap_socket(origin.socket, server_side=True)
    port = origin.server_address[1]
    try:
        manifest = _manifest(tmp_path / "urls.jsonl", [f"https://localhost:{port}/img/1.png"])
        env = {**os.environ, "https_proxy": f"http://proxyuser:pr0xy-secret@127.0.0.1:{proxy.port}"}
        trusted = subprocess.run([*FGDATA, "shard", "images", str(manifest), str(tmp_path / "ok"), "--path-column",
                                  "url", "--format", "keep", "--retries", "0"], capture_output=True, text=True,
                                 env={**env, "SSL_CERT_FILE": str(ca)}, timeout=300)
        assert trusted.returncode == 0, trusted.stderr
        assert _by_source(tmp_path / "ok") == {f"https://localhost:{port}/img/1.png": png_bytes(1)}
        assert names == ["localhost"]
        assert proxy.seen == [("CONNECT", f"localhost:{port}", "Basic " + base64.b64encode(b"proxyuser:pr0xy-secret").decode())]
        untrusted = subprocess.run([*FGDATA, "shard", "images", str(manifest), str(tmp_path / "bad"),
                                    "--path-column", "url", "--retries", "0"], capture_output=True, text=True,
                                   env=env, timeout=300)
        assert untrusted.returncode == 1, untrusted.stderr
        (reason,) = _failures(tmp_path / "bad").values()
        assert reason.startswith("tls: certificate not verified"), reason
        assert "pr0xy-secret" not in trusted.stdout + trusted.stderr + untrusted.stdout + untrusted.stderr
    finally:
        origin.stop()
