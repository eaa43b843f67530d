"""``http://`` and ``https://`` URLs, read-only, through a downloader fit for the open web.

Every GET goes through :func:`fetch`: a connect timeout, a read-stall timeout (each ``recv``)
and a total deadline; bounded retries with exponential backoff for timeouts, dropped
connections, 429 and 5xx (honouring ``Retry-After``, capped); redirects followed by hand
(http and https only, a loop or too many is a failure); a body limit checked while reading;
a ``User-Agent`` that names fgdata; ``X-Robots-Tag`` opt-outs (``noai``, ``noimageai``,
``noindex``, ``none``) honoured unless turned off. Per process, host names are resolved once
(a DNS cache), a semaphore per host bounds the requests in flight to one host, and a connection whose
response was read to its end is kept open for the next request to that host (HTTP keep-alive; a kept
connection the server has closed meanwhile is replaced at once, not counted as a try). Settings are
per process (:func:`configure`): a shard job sets them in each worker before its first fetch.

A failed fetch raises :class:`DownloadFailed` whose ``category`` (``timeout``, ``connection``,
``dns``, ``tls``, ``http``, ``too-large``, ``redirect``, ``opt-out``) becomes the failure reason's category;
:func:`retryable` says which reasons ``--retry-failed`` tries again.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import io
import socket
import ssl
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from fgdata import __version__
from fgdata.errors import StorageError
from fgdata.storage.backend import Backend, FileInfo
from fgdata.storage.local import atomic_path

OPT_OUT_DIRECTIVES = frozenset({"noai", "noimageai", "noindex", "none"})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 1 << 16


@dataclass(frozen=True)
class DownloadOptions:
    """How URLs are fetched. Part of a URL job's record: a rerun uses the same settings."""

    connect_timeout: float = 10.0
    stall_timeout: float = 20.0  # seconds without a byte from the server
    timeout: float = 60.0  # the whole request, redirects included, per try
    retries: int = 2  # extra tries after a timeout, a dropped connection, 429 or 5xx
    retry_after_cap: float = 30.0  # the longest Retry-After (and backoff) waited for
    max_bytes: int | None = 50_000_000  # body limit; None: no limit
    max_redirects: int = 5
    per_host: int = 16  # requests in flight to one host, per worker process
    threads: int = 32  # requests in flight per worker process
    user_agent_token: str | None = None  # appended to the User-Agent (a contact: email or URL)
    honour_opt_out: bool = True

    def __post_init__(self) -> None:
        from fgdata.errors import FgdataError

        for name in ("connect_timeout", "stall_timeout", "timeout"):
            if getattr(self, name) <= 0:
                raise FgdataError(f"--{name.replace('_', '-')} must be > 0")
        if self.retries < 0 or self.max_redirects < 0 or self.retry_after_cap < 0:
            raise FgdataError("--retries, --max-redirects and the Retry-After cap must be >= 0")
        if self.per_host < 1 or self.threads < 1:
            raise FgdataError("--per-host and --fetch-threads must be at least 1")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise FgdataError("--max-download-size must be at least 1 byte")
        if self.user_agent_token is not None and not self.user_agent_token.isprintable():
            raise FgdataError("--user-agent-token must be printable text on one line")

    @property
    def user_agent(self) -> str:
        extra = f"; {self.user_agent_token}" if self.user_agent_token else ""
        return f"fgdata/{__version__} (+https://github.com/fgdata/fgdata{extra})"


class DownloadFailed(StorageError):
    """One URL that gave no usable body; ``category`` names why (the failure reason's category)."""

    def __init__(self, category: str, detail: str, url: str):
        super().__init__(f"{url}: {detail}")
        self.category = category
        self.detail = detail


_RETRYABLE = ("timeout:", "connection:", "http: status 429", "http: status 5")


def retryable(reason: str) -> bool:
    """True for a failure reason worth another try later: a timeout, a dropped connection, 429 or 5xx."""
    return reason.startswith(_RETRYABLE)


# -- per-process state: settings, DNS cache, per-host limits ------------------------------------------------

_lock = threading.Lock()
_settings = DownloadOptions(max_bytes=None)  # until configured: no body limit (a manifest read in the main process)
_dns: dict[tuple[str, int], tuple[int, int, int, str, tuple]] = {}
_hosts: dict[str, threading.BoundedSemaphore] = {}
_tls: ssl.SSLContext | None = None
#: Kept-alive connections by (scheme, host, port), the least recently used first; at most ``threads`` in all.
_idle: OrderedDict[tuple[str, str, int], list[http.client.HTTPConnection]] = OrderedDict()
_stopping = threading.Event()  # set when the job stops: no new try, no backoff wait


def stop_fetching(stop: bool = True) -> None:
    """Let this process's fetches end soon (no new try or backoff wait; a request in flight ends within its
    timeouts), so a stopped job is not held by its threads; ``stop=False`` lets fetching start again."""
    if stop:
        _stopping.set()
    else:
        _stopping.clear()


def configure(options: DownloadOptions) -> None:
    """Use ``options`` for every fetch of this process from now on (cheap when they are already set)."""
    global _settings
    with _lock:
        if options != _settings:
            _settings = options
            _hosts.clear()
            _drop_idle()


def settings() -> DownloadOptions:
    return _settings


def _resolve(host: str, port: int) -> tuple[int, int, int, str, tuple]:
    """The first address of ``host`` (cached per process: one lookup per host, not per URL)."""
    key = (host, port)
    found = _dns.get(key)
    if found is None:
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        except (socket.gaierror, UnicodeError) as e:
            raise _Attempt("dns", f"cannot resolve {host} ({e})", retry=False) from None
        _dns[key] = found
    return found


def _host_slot(host: str) -> threading.BoundedSemaphore:
    with _lock:
        slot = _hosts.get(host)
        if slot is None:
            slot = _hosts[host] = threading.BoundedSemaphore(_settings.per_host)
        return slot


class _Attempt(Exception):
    """One try failed; ``retry``: worth another (after ``wait`` seconds when the server said so)."""

    def __init__(self, category: str, detail: str, retry: bool, wait: float | None = None):
        super().__init__(detail)
        self.category, self.detail, self.retry, self.wait = category, detail, retry, wait


def _connect(options: DownloadOptions, deadline: float):  # noqa: ANN202 - the socket factory http.client calls
    def create(address: tuple[str, int], *_: object) -> socket.socket:
        family, kind, proto, _name, sockaddr = _resolve(*address)
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(max(0.001, min(options.connect_timeout, deadline - time.monotonic())))
            try:
                sock.connect(sockaddr)
            except socket.timeout:  # said apart from a server that connects and then stays silent
                raise _Attempt("timeout", "no connection in time", retry=True) from None
            sock.settimeout(options.stall_timeout)
        except BaseException:
            sock.close()
            raise
        return sock

    return create


def _drop_idle() -> None:
    """Close every kept connection (the caller holds ``_lock``)."""
    for conns in _idle.values():
        for conn in conns:
            conn.close()
    _idle.clear()


def _kept(origin: tuple[str, str, int]) -> http.client.HTTPConnection | None:
    """A kept-alive connection to ``origin``, or None."""
    with _lock:
        conns = _idle.get(origin)
        if not conns:
            return None
        conn = conns.pop()
        if not conns:
            del _idle[origin]
        return conn


def _keep(origin: tuple[str, str, int], conn: http.client.HTTPConnection) -> None:
    """Keep ``conn`` open for the next request to ``origin``; past the cap, the least recently used goes."""
    with _lock:
        _idle.setdefault(origin, []).append(conn)
        _idle.move_to_end(origin)
        if sum(map(len, _idle.values())) > _settings.threads:
            oldest = next(iter(_idle))
            _idle[oldest].pop(0).close()
            if not _idle[oldest]:
                del _idle[oldest]


def _new_connection(origin: tuple[str, str, int], options: DownloadOptions,
                    deadline: float) -> http.client.HTTPConnection:
    scheme, host, port = origin
    conn: http.client.HTTPConnection
    if scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=options.stall_timeout, context=_tls_context())
    else:
        conn = http.client.HTTPConnection(host, port, timeout=options.stall_timeout)
    # http.client's own hook: every connection goes through the DNS cache and the connect timeout
    conn._create_connection = _connect(options, deadline)  # type: ignore[attr-defined]
    return conn


def _ack_at_once(sock: socket.socket) -> None:
    """Acknowledge the response's first segments at once on a kept connection (Linux). Otherwise the kernel
    delays ACKs on a connection that has carried a request before, and a server that writes headers and body
    apart with Nagle's algorithm on waits that delay (~40 ms) before it sends the body."""
    quickack = getattr(socket, "TCP_QUICKACK", None)
    if quickack is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)


def _send(origin: tuple[str, str, int], options: DownloadOptions, deadline: float, method: str, target: str,
          headers: dict[str, str]) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Send one request on a kept connection to ``origin`` (a new one when none is kept, or when the kept one
    turns out closed by the server before it answered); returns the connection and its response."""
    kept = _kept(origin)
    if kept is not None and kept.sock is not None:
        try:
            kept.request(method, target, headers=headers)
            _ack_at_once(kept.sock)
            return kept, kept.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                http.client.CannotSendRequest, http.client.ResponseNotReady):
            kept.close()  # closed by the server while idle: not this URL's fault
        except BaseException:
            kept.close()
            raise
    conn = _new_connection(origin, options, deadline)
    try:
        conn.request(method, target, headers=headers)
        return conn, conn.getresponse()
    except BaseException:
        conn.close()
        raise


def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process (building one loads the CA store: too slow per request)."""
    global _tls
    with _lock:
        if _tls is None:
            _tls = ssl.create_default_context()
        return _tls


def _opted_out(headers: http.client.HTTPMessage) -> str | None:
    """The X-Robots-Tag directive that opts this URL out (for every agent, or for fgdata), or None."""
    for value in headers.get_all("X-Robots-Tag") or []:
        for token in value.split(","):
            agent, _, directive = token.rpartition(":")
            if agent.strip().lower() not in ("", "*", "fgdata"):
                continue
            if directive.strip().lower() in OPT_OUT_DIRECTIVES:
                return directive.strip().lower()
    return None


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (a number or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _once(url: str, options: DownloadOptions, method: str, headers: dict[str, str]) -> tuple[int, bytes, dict]:
    """One try: follow redirects, read the body within the limits; returns (status, body, headers)."""
    deadline = time.monotonic() + options.timeout
    seen = {url}
    for _hop in range(options.max_redirects + 1):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _Attempt("redirect", f"not an http(s) URL: {url[:200]}", retry=False)
        origin = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        conn: http.client.HTTPConnection | None = None
        reusable = False
        try:
            with _host_slot(parts.hostname):
                conn, response = _send(origin, options, deadline, method, target,
                                       {"User-Agent": options.user_agent, **headers})
                if response.status in _REDIRECTS and response.getheader("Location"):
                    url = urllib.parse.urljoin(url, response.getheader("Location", ""))
                    if url in seen:
                        raise _Attempt("redirect", "redirect loop", retry=False)
                    seen.add(url)
                    continue
                if options.honour_opt_out and (directive := _opted_out(response.msg)):
                    raise _Attempt("opt-out", f"X-Robots-Tag: {directive}", retry=False)
                if response.status == 429 or response.status >= 500:
                    wait = _retry_after(response.getheader("Retry-After"))
                    raise _Attempt("http", f"status {response.status}", retry=True, wait=wait)
                if response.status >= 400:
                    raise _Attempt("http", f"status {response.status}", retry=False)
                body = response.read() if method == "HEAD" else _body(response, options, deadline)
                reusable = not response.will_close
                return response.status, body, dict(response.getheaders())
        except socket.timeout:
            left = deadline - time.monotonic()
            what = "no answer in time" if left > 0 else f"over {options.timeout:g} s in all"
            raise _Attempt("timeout", what, retry=True) from None
        except (ConnectionError, http.client.HTTPException, ssl.SSLError, OSError) as e:
            if isinstance(e, ssl.SSLCertVerificationError):
                raise _Attempt("tls", f"certificate not verified: {e.reason}", retry=False) from None
            raise _Attempt("connection", f"{type(e).__name__}: {e}"[:200], retry=True) from None
        finally:
            if conn is not None:
                if reusable:
                    _keep(origin, conn)
                else:  # a redirect, an error status or a failure: its body was not read to the end
                    conn.close()
    raise _Attempt("redirect", f"more than {options.max_redirects} redirects", retry=False)


def _body(response: http.client.HTTPResponse, options: DownloadOptions, deadline: float) -> bytes:
    limit = options.max_bytes
    length = response.getheader("Content-Length")
    if limit is not None and length and length.isdigit() and int(length) > limit:
        raise _Attempt("too-large", f"{int(length):,} bytes (limit {limit:,})", retry=False)
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise socket.timeout()
        chunk = response.read1(_CHUNK)
        if not chunk:
            response.close()  # the end of the body: the connection may carry the next request
            break
        size += len(chunk)
        if limit is not None and size > limit:
            raise _Attempt("too-large", f"over {limit:,} bytes", retry=False)
        chunks.append(chunk)
    if length and length.isdigit() and size != int(length):
        raise _Attempt("connection", f"body ended after {size:,} of {int(length):,} bytes", retry=True)
    return b"".join(chunks)


def fetch(url: str, method: str = "GET", headers: dict[str, str] | None = None,
          options: DownloadOptions | None = None) -> tuple[int, bytes, dict]:
    """GET (or HEAD) ``url`` with this process's settings: (status, body, headers), or :class:`DownloadFailed`."""
    options = options or _settings
    tries = options.retries + 1
    for attempt in range(tries):
        if _stopping.is_set():
            raise DownloadFailed("interrupted", "the job is stopping", url)
        try:
            return _once(url, options, method, headers or {})
        except _Attempt as failed:
            if not failed.retry or attempt + 1 == tries:
                detail = failed.detail + (f" ({tries} tries)" if failed.retry and tries > 1 else "")
                raise DownloadFailed(failed.category, detail, url) from None
            backoff = failed.wait if failed.wait is not None else 0.5 * 2**attempt
            _stopping.wait(min(backoff, options.retry_after_cap))
    raise AssertionError("unreachable")


class HttpBackend(Backend):
    """Files served over HTTP: read, stat (HEAD) and ranged reads only; nothing can be listed or written."""

    scheme = "http"
    missing = "URL not found"
    versioned = False  # a URL's content is what its server answers when it is fetched

    def open_read(self, path: str, buffering: int = -1) -> contextlib.AbstractContextManager[BinaryIO]:
        """The whole body (bounded by the body limit), as a seekable stream."""
        return contextlib.nullcontext(io.BytesIO(fetch(path)[1]))

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        status, body, _ = fetch(path, headers={"Range": f"bytes={offset}-{offset + length - 1}"})
        return body[:length] if status == 206 else body[offset:offset + length]

    def list_files(self, path: str, recursive: bool, listed: Callable[[], None] | None = None) -> list[FileInfo]:
        raise StorageError(f"{path}: http(s) URLs cannot be listed; give a manifest of URLs instead")

    def list_names(self, path: str) -> list[str]:
        raise StorageError(f"{path}: http(s) URLs cannot be listed; give a manifest of URLs instead")

    def stat(self, path: str) -> FileInfo | None:
        try:
            _, _, headers = fetch(path, method="HEAD")
        except DownloadFailed as e:
            if e.detail.startswith("status 404") or e.detail.startswith("status 410"):
                return None
            raise
        length = {k.lower(): v for k, v in headers.items()}.get("content-length", "")
        name = urllib.parse.urlsplit(path).path.rpartition("/")[2]
        return FileInfo(path, name, int(length) if length.isdigit() else 0)

    def exists(self, path: str) -> bool:
        return self.stat(path) is not None

    def is_dir(self, path: str) -> bool:
        return False

    def _read_only(self, path: str) -> StorageError:
        return StorageError(f"{path}: http(s) URLs are read-only; write to a local path or s3:// instead")

    def write_atomic(self, path: str, data: bytes) -> None:
        raise self._read_only(path)

    def upload(self, local: str, path: str) -> None:
        raise self._read_only(path)

    def download(self, path: str, local: str) -> None:
        body = fetch(path)[1]
        with atomic_path(local) as tmp:
            with open(tmp, "wb") as f:
                f.write(body)

    def move(self, src: str, dst: str) -> None:
        raise self._read_only(dst)

    def remove(self, path: str) -> None:
        raise self._read_only(path)

    def remove_tree(self, path: str) -> None:
        raise self._read_only(path)

    def make_dirs(self, path: str) -> None:
        raise self._read_only(path)

    def local_copy(self, path: str, directory: str) -> str:
        import os

        name = urllib.parse.urlsplit(path).path.rpartition("/")[2]
        if name in ("", ".", ".."):
            name = "download"
        local = os.path.join(directory, name)
        self.download(path, local)
        return local

    def staging_dir(self, dest: str) -> str:
        raise self._read_only(dest)

    def publish(self, staged: str, path: str) -> None:
        raise self._read_only(path)


class HttpsBackend(HttpBackend):
    """The same for ``https://`` (certificates verified)."""

    scheme = "https"

