"""``http://`` and ``https://`` URLs, read-only, through a downloader fit for the open web.

Every GET goes through :func:`fetch`: a connect timeout, a read-stall timeout (each ``recv``) and a total
deadline over the whole exchange (connect, headers and body; a watchdog thread shuts the socket down when it
passes, so a server that sends its headers a byte at a time cannot hold a request past it); bounded retries
with exponential backoff for timeouts, dropped connections, 429 and 5xx (honouring ``Retry-After``, capped);
redirects followed by hand (http and https only, a loop or too many is a failure); a body limit checked while
reading; a ``User-Agent`` that names fgdata; ``X-Robots-Tag`` opt-outs (``noai``, ``noimageai``, ``noindex``,
``none``) honoured unless turned off.

The network policy: a URL list from the web is untrusted input, so no connection goes to a loopback,
private, link-local, multicast, reserved or unspecified address (IPv4 or IPv6, mapped and embedded IPv4
forms included) unless ``allow_private_network`` or ``FGDATA_ALLOW_PRIVATE_NETWORK=1`` allows it. A host
name is resolved once; every address it resolves to is checked (one private answer refuses the host), and
the connection goes to a checked address, never to a second lookup. Each hop, redirect and retry opens its
connections through the same check.

Proxies are read from the environment as curl and requests read them: ``http_proxy``, ``https_proxy``
(through ``CONNECT``), ``all_proxy`` and ``no_proxy`` (host suffixes, addresses, CIDR ranges, ``*``), lower
case first, then upper case (``HTTP_PROXY`` not under CGI, where a request header could set it). A proxy's
credentials (``http://user:pass@proxy:3128``) are sent as ``Proxy-Authorization`` and never printed. The proxy
is the user's own infrastructure and may be private; through a proxy the policy applies to the addresses this
machine resolves for the URL's host (a name it cannot resolve is left to the proxy to resolve).

``http://user:pass@host/...``: the credentials are sent as HTTP Basic authentication to that host (as curl
does), not to a host a redirect leads to.

Per process, host names are resolved once (a DNS cache), a semaphore per host bounds the requests in flight to
one host, and a connection whose response was read to its end is kept open for the next request to that host
(HTTP keep-alive). A kept connection is reused only when nothing is waiting to be read on it: bytes a server
sent past its response's end (a short ``Content-Length`` with a smuggled second response) or a close it sent
meanwhile make it be replaced, not read as the next response. Settings are per process (:func:`configure`): a
shard job sets them in each worker before its first fetch; :func:`stop_fetching` ends every fetch of the
process at once (their sockets shut down), so a stopped job is not held by its threads.

A failed fetch raises :class:`DownloadFailed` whose ``category`` (``timeout``, ``connection``, ``dns``,
``tls``, ``http``, ``too-large``, ``redirect``, ``opt-out``, ``network-policy``, ``proxy``) becomes the failure
reason's category; :func:`retryable` says which reasons ``--retry-failed`` tries again.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import functools
import http.client
import io
import ipaddress
import math
import os
import re
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from fgdata import __version__
from fgdata.catalog import RUNTIME
from fgdata.errors import StorageError
from fgdata.storage.backend import Backend, FileInfo
from fgdata.storage.local import atomic_path

OPT_OUT_DIRECTIVES = frozenset({"noai", "noimageai", "noindex", "none"})
#: ``FGDATA_ALLOW_PRIVATE_NETWORK=1``: the environment's form of ``--allow-private-network``.
ALLOW_PRIVATE_ENV = "FGDATA_ALLOW_PRIVATE_NETWORK"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 1 << 16


@dataclass(frozen=True)
class DownloadOptions:
    """How URLs are fetched. Part of a URL job's record: a rerun uses the same settings, but for how many requests
    are in flight (``threads``, ``per_host``: RUNTIME), which changes when a body arrives, never which body."""

    connect_timeout: float = 10.0
    stall_timeout: float = 20.0  # seconds without a byte from the server
    timeout: float = 60.0  # the whole request (connect, headers, body), redirects included, per try
    retries: int = 2  # extra tries after a timeout, a dropped connection, 429 or 5xx
    retry_after_cap: float = 30.0  # the longest Retry-After (and backoff) waited for
    max_bytes: int | None = 50_000_000  # body limit; None: no limit
    max_redirects: int = 5
    per_host: int = field(default=16, metadata=RUNTIME)  # requests in flight to one host, per worker process
    threads: int = field(default=32, metadata=RUNTIME)  # requests in flight per worker process
    user_agent_token: str | None = None  # appended to the User-Agent (a contact: email or URL)
    honour_opt_out: bool = True
    # Where the job may connect, not how its bytes are made: outside the job record's fingerprint, like the
    # proxy settings (the "runtime" mark of fgdata.jobs.options), so a rerun may add or drop it.
    allow_private_network: bool = field(default=False, metadata={"runtime": True})

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

    @functools.cached_property
    def user_agent(self) -> str:
        """``fgdata/VERSION (+HOMEPAGE; TOKEN)``: who fetches, where to read about it, whom to ask."""
        about = "; ".join(p for p in (f"+{_homepage()}" if _homepage() else "", self.user_agent_token or "") if p)
        return f"fgdata/{__version__}" + (f" ({about})" if about else "")

    @property
    def private_allowed(self) -> bool:
        return self.allow_private_network or os.environ.get(ALLOW_PRIVATE_ENV, "") in ("1", "true", "yes")


@functools.cache
def _homepage() -> str | None:
    """The ``Homepage`` of ``[project.urls]`` in fgdata's installed metadata (None when not installed so)."""
    import importlib.metadata

    try:
        entries = importlib.metadata.metadata("fgdata").get_all("Project-URL") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in entries:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "homepage" and url.strip():
            return url.strip()
    return None


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


# -- per-process state: settings, DNS cache, per-host limits, kept connections, the watchdog -----------------

_lock = threading.Lock()
_settings = DownloadOptions(max_bytes=None)  # until configured: no body limit (a manifest read in the main process)
_dns: dict[tuple[str, int], list[tuple]] = {}
_unresolved: set[tuple[str, int]] = set()  # names this machine cannot resolve, left to a proxy
_hosts: dict[str, threading.BoundedSemaphore] = {}
_tls: ssl.SSLContext | None = None
#: Kept-alive connections by route (see :class:`_Route`), the least recently used first; ``threads`` in all.
_idle: OrderedDict[tuple, list[http.client.HTTPConnection]] = OrderedDict()
_stopping = threading.Event()  # set when the job stops: no new try, no backoff wait, sockets shut down


def stop_fetching(stop: bool = True) -> None:
    """Let this process's fetches end now: no new try or backoff wait, and every request in flight has its
    socket shut down (it ends as ``interrupted``), so a stopped job is not held by its threads;
    ``stop=False`` lets fetching start again (a job's start: the environment is read again)."""
    if stop:
        _stopping.set()
        with _watch_cv:
            _watch_cv.notify()
    else:
        _stopping.clear()
        read_environment()


@dataclass(frozen=True)
class _ProxyEnvironment:
    http_proxy: str
    https_proxy: str
    all_proxy: str
    no_proxy: str


_env_now: list[_ProxyEnvironment] = []  # read at first use and at each job's start (a lookup costs microseconds)


def read_environment() -> None:
    """Read the proxy variables again (a job's start does; at first use otherwise), so a change of the
    environment between jobs of one process applies to the next."""
    _env_now[:] = [_ProxyEnvironment(_env("http_proxy"), _env("https_proxy"), _env("all_proxy"), _env("no_proxy"))]


def _environment() -> _ProxyEnvironment:
    if not _env_now:
        read_environment()
    return _env_now[0]


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


class _Attempt(Exception):
    """One try failed; ``retry``: worth another (after ``wait`` seconds when the server said so)."""

    def __init__(self, category: str, detail: str, retry: bool, wait: float | None = None):
        super().__init__(detail)
        self.category, self.detail, self.retry, self.wait = category, detail, retry, wait


# -- the network policy --------------------------------------------------------------------------------------

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _not_public(address: str) -> str | None:
    """What makes ``address`` (a resolved IP) one fgdata does not connect to by default, or None."""
    ip = ipaddress.ip_address(address.partition("%")[0])
    checked: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    if isinstance(ip, ipaddress.IPv6Address):  # the IPv4 address a mapped or embedding form reaches
        embedded = ip.ipv4_mapped or ip.sixtofour or (
            ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None)
        if embedded is not None:
            checked.append(embedded)
    checked.append(ip)
    for one in checked:
        for kind in ("unspecified", "loopback", "link_local", "multicast", "private", "reserved"):
            if getattr(one, f"is_{kind}"):
                return f"{'an' if kind == 'unspecified' else 'a'} {kind.replace('_', '-')} address"
        if not one.is_global:
            return "not a public address"
    return None


def _check_addresses(host: str, infos: list[tuple]) -> None:
    """Refuse ``host`` when any address it resolved to is not public (one private answer is enough: a
    resolver that mixes them would otherwise choose for the attacker)."""
    for info in infos:
        address = info[4][0]
        why = _not_public(address)
        if why is not None:
            named = f"{address} is" if host.strip("[]") == address else f"{host} resolves to {address},"
            raise _Attempt("network-policy", f"{named} {why}; not fetched (--allow-private-network allows it)",
                           retry=False)


def _resolve(host: str, port: int) -> list[tuple]:
    """Every address of ``host`` (cached per process: one lookup per host, not per URL)."""
    key = (host, port)
    found = _dns.get(key)
    if found is None:
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as e:
            raise _Attempt("dns", f"cannot resolve {host} ({e})", retry=False) from None
        _dns[key] = found
    return found


def _check_proxied(host: str, port: int) -> None:
    """Through a proxy: check the addresses this machine resolves ``host`` to; a name it cannot resolve is
    the proxy's to resolve (a cluster whose only way out is a proxy often has no outside DNS)."""
    if (host, port) in _unresolved:
        return
    try:
        infos = _resolve(host, port)
    except _Attempt:
        _unresolved.add((host, port))
        return
    _check_addresses(host, infos)


# -- proxies from the environment ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Proxy:
    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)  # the Proxy-Authorization value; never printed

    def __str__(self) -> str:
        return f"proxy {self.host}:{self.port}"


def _env(name: str) -> str:
    """``name`` from the environment, lower case first (curl's order); ``HTTP_PROXY`` is not read under CGI."""
    value = os.environ.get(name)
    if value is None and not (name == "http_proxy" and "REQUEST_METHOD" in os.environ):
        value = os.environ.get(name.upper())
    return (value or "").strip()


def _bypassed(host: str, port: int, rules: str) -> bool:
    """``no_proxy``: ``*``, a host or domain suffix (``example.org``, ``.example.org``, ``*.example.org``), an
    address, a CIDR range (``10.0.0.0/8``), each with an optional ``:port``."""
    host = host.strip("[]").rstrip(".").lower()
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for rule in re.split(r"[,\s]+", rules.lower()):
        if rule == "*":
            return True
        name, rule_port = rule, None
        if m := re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d+)", rule):
            if rule.startswith("[") or m.group(1).count(":") == 0:  # not the last group of a bare IPv6 address
                name, rule_port = m.group(1), int(m.group(2))
        name = name.strip("[]")
        if not name or (rule_port is not None and rule_port != port):
            continue
        if "/" in name:
            with contextlib.suppress(ValueError):
                if ip is not None and ip in ipaddress.ip_network(name, strict=False):
                    return True
            continue
        name = name.removeprefix("*").lstrip(".").rstrip(".")
        if host == name or (ip is None and host.endswith("." + name)):
            return True
        with contextlib.suppress(ValueError):
            if ip is not None and ip == ipaddress.ip_address(name):
                return True
    return False


def _proxy_for(scheme: str, host: str, port: int) -> _Proxy | None:
    """The proxy the environment names for this URL, or None; a proxy fgdata cannot use fails the URL."""
    env = _environment()
    url = (env.https_proxy if scheme == "https" else env.http_proxy) or env.all_proxy
    if not url or _bypassed(host, port, env.no_proxy):
        return None
    return _parse_proxy(url)


@functools.lru_cache(maxsize=8)
def _parse_proxy(url: str) -> _Proxy:
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme.lower() != "http" or not parts.hostname:
        what = f"a {parts.scheme}:// proxy" if parts.hostname else "a proxy setting that names no host"
        raise _Attempt("proxy", f"{what} is not supported (http:// proxies only, https through CONNECT)",
                       retry=False)
    auth = None
    if parts.username is not None:
        pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        auth = "Basic " + base64.b64encode(pair.encode()).decode()
    return _Proxy(parts.hostname, parts.port or 80, auth)


# -- connections ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Route:
    """Where a request goes: straight to ``host``, or through ``proxy`` (plain http: to the proxy, which any
    host's requests share; https: a CONNECT tunnel to ``host``)."""

    scheme: str
    host: str
    port: int
    proxy: _Proxy | None

    @property
    def key(self) -> tuple:
        """Connections of equal keys are interchangeable (the pool's key)."""
        if self.proxy is not None and self.scheme == "http":
            return ("proxy", self.proxy)
        return (self.scheme, self.host, self.port, self.proxy)


def _connect(options: DownloadOptions, deadline: float, checked: bool):  # noqa: ANN202 - http.client's factory
    """The socket factory http.client calls: one lookup (cached), the policy on its addresses when ``checked``
    (not for a proxy), then a connection to exactly those addresses, in order, within the connect timeout."""
    def create(address: tuple[str, int], *_: object) -> socket.socket:
        host, port = address
        infos = _resolve(host, port)
        if checked and not options.private_allowed:
            _check_addresses(host, infos)
        failure: OSError | None = None
        for family, kind, proto, _name, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(max(0.001, min(options.connect_timeout, deadline - time.monotonic())))
                sock.connect(sockaddr)
                sock.settimeout(options.stall_timeout)
                return sock
            except socket.timeout:  # said apart from a server that connects and then stays silent
                sock.close()
                raise _Attempt("timeout", "no connection in time", retry=True) from None
            except OSError as e:
                sock.close()
                failure = e
            except BaseException:
                sock.close()
                raise
        raise failure or OSError(f"no address for {host}")

    return create


def _drop_idle() -> None:
    """Close every kept connection (the caller holds ``_lock``)."""
    for conns in _idle.values():
        for conn in conns:
            conn.close()
    _idle.clear()


def _kept(key: tuple) -> http.client.HTTPConnection | None:
    """A kept-alive connection for ``key``, or None."""
    with _lock:
        conns = _idle.get(key)
        if not conns:
            return None
        conn = conns.pop()
        if not conns:
            del _idle[key]
        return conn


def _keep(key: tuple, conn: http.client.HTTPConnection) -> None:
    """Keep ``conn`` open for the next request of ``key``; past the cap, the least recently used goes."""
    with _lock:
        _idle.setdefault(key, []).append(conn)
        _idle.move_to_end(key)
        if sum(map(len, _idle.values())) > _settings.threads:
            oldest = next(iter(_idle))
            _idle[oldest].pop(0).close()
            if not _idle[oldest]:
                del _idle[oldest]


def _quiet(sock: socket.socket | None) -> bool:
    """True when nothing waits to be read on a kept connection: no bytes (a server that sent more than its
    response's length, or a smuggled response) and no close. Anything else and it is not reused."""
    if sock is None or sock.fileno() < 0:
        return False
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return False
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI)
    try:
        return not poller.poll(0)
    except OSError:
        return False


def _new_connection(route: _Route, options: DownloadOptions, deadline: float) -> http.client.HTTPConnection:
    proxy = route.proxy
    host, port = (route.host, route.port) if proxy is None else (proxy.host, proxy.port)
    conn: http.client.HTTPConnection
    if route.scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=options.stall_timeout, context=_tls_context())
        if proxy is not None:  # CONNECT, then TLS to the URL's host (its name for SNI and the certificate)
            conn.set_tunnel(route.host, route.port,
                            headers={"Proxy-Authorization": proxy.authorization} if proxy.authorization else None)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=options.stall_timeout)
    # http.client's own hook: every connection goes through the DNS cache, the policy and the connect timeout
    conn._create_connection = _connect(options, deadline, checked=proxy is None)  # type: ignore[attr-defined]
    return conn


def _ack_at_once(sock: socket.socket) -> None:
    """Acknowledge the response's first segments at once on a kept connection (Linux). Otherwise the kernel
    delays ACKs on a connection that has carried a request before, and a server that writes headers and body
    apart with Nagle's algorithm on waits that delay (~40 ms) before it sends the body."""
    quickack = getattr(socket, "TCP_QUICKACK", None)
    if quickack is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)


def _send(route: _Route, options: DownloadOptions, deadline: float, method: str, target: str,
          headers: dict[str, str], watched: list[socket.socket]) -> tuple[http.client.HTTPConnection,
                                                                          http.client.HTTPResponse]:
    """Send one request on a kept connection of ``route`` (a new one when none is kept, when the kept one has
    unread bytes, or when it turns out closed by the server before it answered); returns the connection and its
    response. Every socket used is watched until ``deadline`` (``watched`` lists them for the caller)."""
    if _stopping.is_set():
        raise _Attempt("interrupted", "the job is stopping", retry=False)
    kept = _kept(route.key)
    if kept is not None and _quiet(kept.sock):
        sock = kept.sock
        _watch(sock, deadline, watched)
        try:
            kept.request(method, target, headers=headers)
            _ack_at_once(sock)
            return kept, kept.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                http.client.CannotSendRequest, http.client.ResponseNotReady):
            _unwatch(watched)
            kept.close()  # closed by the server while idle: not this URL's fault
            if _stopping.is_set() or time.monotonic() >= deadline:  # shut down by the watchdog: it is
                raise
        except BaseException:
            _unwatch(watched)
            kept.close()
            raise
    elif kept is not None:
        kept.close()
    conn = _new_connection(route, options, deadline)
    try:
        conn.connect()
        _watch(conn.sock, deadline, watched)
        conn.request(method, target, headers=headers)
        return conn, conn.getresponse()
    except BaseException:
        _unwatch(watched)
        conn.close()
        raise


def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process (building one loads the CA store: too slow per request)."""
    global _tls
    with _lock:
        if _tls is None:
            _tls = ssl.create_default_context()
        return _tls


# -- the watchdog: total deadlines and stops -----------------------------------------------------------------

_watch_cv = threading.Condition(threading.Lock())
_watched: dict[int, tuple[socket.socket, float]] = {}
_watcher: list[threading.Thread] = []  # the one watchdog thread of this process, once started
_wake = [math.inf]  # when the watchdog wakes next


def _watch(sock: socket.socket, deadline: float, watched: list[socket.socket]) -> None:
    """Shut ``sock`` down at ``deadline`` or when the job stops, whatever its thread is blocked in."""
    with _watch_cv:
        _watched[id(sock)] = (sock, deadline)
        watched.append(sock)
        if not _watcher or not _watcher[0].is_alive():
            _watcher[:] = [threading.Thread(target=_watchdog, name="fgdata-fetch-deadlines", daemon=True)]
            _watcher[0].start()
        elif deadline < _wake[0]:
            _watch_cv.notify()


def _unwatch(watched: list[socket.socket]) -> None:
    """Stop watching the sockets of one request (before they are closed or kept: the watchdog shuts a socket
    down under the same lock, so it never touches a closed one)."""
    with _watch_cv:
        for sock in watched:
            _watched.pop(id(sock), None)
        watched.clear()


def _watchdog() -> None:
    with _watch_cv:
        while True:
            now, stopping, nearest = time.monotonic(), _stopping.is_set(), math.inf
            for key, (sock, deadline) in list(_watched.items()):
                if stopping or deadline <= now:
                    del _watched[key]
                    with contextlib.suppress(OSError):  # the socket level, under TLS too
                        socket.socket.shutdown(sock, socket.SHUT_RDWR)
                else:
                    nearest = min(nearest, deadline)
            _wake[0] = nearest
            _watch_cv.wait(min(nearest - now, 3600.0))


def _failure(e: BaseException, options: DownloadOptions, deadline: float) -> _Attempt:
    """The failed try an exception of the transport stands for (a stop and a passed deadline first: the
    watchdog's shutdown reads as a dropped connection)."""
    if _stopping.is_set():
        return _Attempt("interrupted", "the job is stopping", retry=False)
    if time.monotonic() >= deadline:
        return _Attempt("timeout", f"over {options.timeout:g} s in all", retry=True)
    if isinstance(e, socket.timeout):
        return _Attempt("timeout", "no answer in time", retry=True)
    if isinstance(e, ssl.SSLCertVerificationError):
        return _Attempt("tls", f"certificate not verified: {e.reason}", retry=False)
    if isinstance(e, OSError) and str(e).startswith("Tunnel connection failed"):
        return _Attempt("proxy", f"CONNECT refused: {str(e).partition(':')[2].strip()}"[:200], retry=False)
    return _Attempt("connection", f"{type(e).__name__}: {e}"[:200], retry=True)


# -- one request ---------------------------------------------------------------------------------------------


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


def _basic(parts: urllib.parse.SplitResult) -> dict[str, str]:
    """``user:pass@`` of this hop's URL as HTTP Basic authentication (curl's rule), or nothing."""
    if parts.username is None:
        return {}
    pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


def _once(url: str, options: DownloadOptions, method: str, headers: dict[str, str]) -> tuple[int, bytes, dict]:
    """One try: follow redirects, read the body within the limits; returns (status, body, headers)."""
    deadline = time.monotonic() + options.timeout
    seen = {url}
    for _hop in range(options.max_redirects + 1):
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        try:
            hostname, port = parts.hostname, parts.port
        except ValueError:  # a port that is not a number
            hostname = port = None
        if scheme not in ("http", "https") or not hostname:
            raise _Attempt("redirect", f"not an http(s) URL ({scheme or 'no'} scheme)", retry=False)
        port = port or (443 if scheme == "https" else 80)
        route = _Route(scheme, hostname, port, _proxy_for(scheme, hostname, port))
        if route.proxy is not None and not options.private_allowed:
            _check_proxied(hostname, port)
        target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        if route.proxy is not None and scheme == "http":  # the absolute form a proxy is asked with
            target = f"http://{parts.netloc.rpartition('@')[2]}{target}"
        sent = {"User-Agent": options.user_agent, **_basic(parts), **headers}
        if route.proxy is not None and scheme == "http" and route.proxy.authorization:
            sent["Proxy-Authorization"] = route.proxy.authorization
        conn: http.client.HTTPConnection | None = None
        watched: list[socket.socket] = []
        reusable = False
        try:
            with _host_slot(hostname):
                conn, response = _send(route, options, deadline, method, target, sent, watched)
                if response.status in _REDIRECTS and response.getheader("Location"):
                    url = urllib.parse.urljoin(url, response.getheader("Location", ""))
                    if url in seen:
                        raise _Attempt("redirect", "redirect loop", retry=False)
                    seen.add(url)
                    continue
                if options.honour_opt_out and (directive := _opted_out(response.msg)):
                    raise _Attempt("opt-out", f"X-Robots-Tag: {directive}", retry=False)
                if response.status == 407 and route.proxy is not None:
                    raise _Attempt("proxy", f"{route.proxy} asks for credentials (status 407)", retry=False)
                if response.status == 429 or response.status >= 500:
                    wait = _retry_after(response.getheader("Retry-After"))
                    raise _Attempt("http", f"status {response.status}", retry=True, wait=wait)
                if response.status >= 400:
                    raise _Attempt("http", f"status {response.status}", retry=False)
                body = response.read() if method == "HEAD" else _body(response, options, deadline)
                reusable = not response.will_close
                return response.status, body, dict(response.getheaders())
        except (OSError, http.client.HTTPException) as e:
            raise _failure(e, options, deadline) from None
        finally:
            _unwatch(watched)
            if conn is not None:
                if reusable:
                    _keep(route.key, conn)
                else:  # a redirect, an error status or a failure: its body was not read to the end
                    conn.close()
    raise _Attempt("redirect", f"more than {options.max_redirects} redirects", retry=False)


def _host_slot(host: str) -> threading.BoundedSemaphore:
    with _lock:
        slot = _hosts.get(host)
        if slot is None:
            slot = _hosts[host] = threading.BoundedSemaphore(_settings.per_host)
        return slot


def _body(response: http.client.HTTPResponse, options: DownloadOptions, deadline: float) -> bytes:
    limit = options.max_bytes
    length = response.getheader("Content-Length")
    if limit is not None and length and length.isdigit() and int(length) > limit:
        raise _Attempt("too-large", f"{int(length):,} bytes (limit {limit:,})", retry=False)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = response.read1(_CHUNK)
        if not chunk:
            if _stopping.is_set() or time.monotonic() >= deadline:  # cut by the watchdog, not the body's end
                raise TimeoutError()
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

