"""File operations with one signature for local paths and ``s3://`` URLs.

Local paths use the standard library; URLs go through :mod:`fgdata.storage.s5cmd`.
Every write lands under a temporary name first, so readers never see half a file.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from fgdata.errors import StorageError
from fgdata.storage import s5cmd
from fgdata.storage.paths import is_s3, split_s3

CAT_EXIT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class FileInfo:
    """One listed file: full path or URL, basename, size in bytes."""

    path: str
    name: str
    size: int


def _prefix(url: str) -> str:
    """The listing prefix of a directory-like URL (``s3://b`` and ``s3://b/p`` -> trailing slash)."""
    split_s3(url)
    return url.rstrip("/") + "/"


def _s3_files(url: str, recursive: bool) -> list[FileInfo]:
    prefix = _prefix(url)
    infos = []
    for entry in s5cmd.list_entries(prefix, recursive=recursive):
        key = entry.get("key", "")
        rel = key[len(prefix):]
        if entry.get("type") != "file" or not key.startswith(prefix) or not rel:
            continue
        if not recursive and "/" in rel:
            continue
        infos.append(FileInfo(key, rel.rpartition("/")[2], int(entry.get("size", 0))))
    return infos


def list_dir(path: str, suffix: str | None = None) -> list[FileInfo]:
    """Direct children that are files, sorted by name; ``suffix`` matches in any case."""
    if is_s3(path):
        infos = _s3_files(path, recursive=False)
    else:
        try:
            with os.scandir(path) as it:
                infos = [FileInfo(e.path, e.name, e.stat().st_size) for e in it if e.is_file()]
        except FileNotFoundError:
            raise StorageError(f"{path}: directory not found") from None
        except NotADirectoryError:
            raise StorageError(f"{path}: not a directory") from None
    if suffix is not None:
        infos = [i for i in infos if i.name.lower().endswith(suffix.lower())]
    return sorted(infos, key=lambda i: i.name)


def list_recursive(path: str) -> list[FileInfo]:
    """All files below ``path``, sorted by full path."""
    if is_s3(path):
        infos = _s3_files(path, recursive=True)
    else:
        if not os.path.isdir(path):
            raise StorageError(f"{path}: directory not found")
        infos = [
            FileInfo(p, name, os.path.getsize(p))
            for root, _, names in os.walk(path)
            for name in names
            if os.path.isfile(p := os.path.join(root, name))
        ]
    return sorted(infos, key=lambda i: i.path)


def _s3_stat(url: str) -> dict | None:
    """The ls entry for exactly ``url`` (an object, or a prefix as a directory entry), else None.

    ``ls`` matches key prefixes and has no ``--raw``, so list up to the first ``*``/``?``
    and compare keys exactly.
    """
    bare = url.rstrip("/")
    _, key = split_s3(bare)
    cut = min((key.index(ch) for ch in "*?" if ch in key), default=len(key))
    if "/" in key[cut:]:
        raise StorageError(f"{url}: '*' and '?' are not supported in s3 directory names")
    listing_url = bare[: len(bare) - len(key) + cut]
    wanted = {bare + "/"} if url.endswith("/") else {bare, bare + "/"}
    return next((e for e in s5cmd.list_entries(listing_url) if e.get("key") in wanted), None)


def exists(path: str) -> bool:
    """True for an existing file or directory (for s3: an object or a non-empty prefix)."""
    if not is_s3(path):
        return os.path.exists(path)
    if not split_s3(path)[1].strip("/"):
        s5cmd.list_entries(_prefix(path))  # raises for a missing bucket
        return True
    return _s3_stat(path) is not None


def size(path: str) -> int:
    """Size in bytes of one file or object."""
    if not is_s3(path):
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            raise StorageError(f"{path}: file not found") from None
    entry = _s3_stat(path) if split_s3(path)[1] else None
    if entry is None or entry.get("type") != "file":
        raise StorageError(f"{path}: object not found")
    return int(entry["size"])


class _CatStream(io.RawIOBase):
    """The stdout of ``s5cmd cat``, remembering whether the reader reached its end."""

    def __init__(self, pipe: BinaryIO):
        self._pipe = pipe
        self.eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        n = self._pipe.readinto(buffer)
        if not n:
            self.eof = True
        return n or 0


def _finish_cat(proc: subprocess.Popen, stderr: BinaryIO, reached_eof: bool) -> str | None:
    """Stop ``s5cmd cat`` and return its error; a reader that stopped early stopped on purpose."""
    if reached_eof:
        try:
            proc.wait(timeout=CAT_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return f"s5cmd did not exit within {CAT_EXIT_TIMEOUT_S:g} s after the end of the stream"
    else:
        proc.kill()
        proc.wait()
    proc.stdout.close()
    if not reached_eof or proc.returncode == 0:
        return None
    stderr.seek(0)
    return s5cmd.classify(s5cmd.error_line(stderr.read())).reason


@contextlib.contextmanager
def _open_s3(url: str) -> Iterator[BinaryIO]:
    split_s3(url)
    with tempfile.TemporaryFile() as stderr:
        proc = s5cmd.popen_cat(url, stderr)
        raw = _CatStream(proc.stdout)
        reader = io.BufferedReader(raw, buffer_size=1 << 20)
        try:
            yield reader
        except BaseException as exc:
            reason = _finish_cat(proc, stderr, raw.eof)
            if reason:
                raise StorageError(f"{url}: {reason}") from exc
            raise
        reason = _finish_cat(proc, stderr, raw.eof)
        if reason:
            raise StorageError(f"{url}: {reason}")


@contextlib.contextmanager
def open_read(path: str) -> Iterator[BinaryIO]:
    """A binary stream of the file; for s3 it streams ``s5cmd cat`` without a local copy."""
    if is_s3(path):
        with _open_s3(path) as stream:
            yield stream
        return
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise StorageError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise StorageError(f"{path}: is a directory") from None
    with f:
        yield f


def read_bytes(path: str) -> bytes:
    """The whole file; s3 reads are retried on transient errors."""
    if is_s3(path):
        split_s3(path)
        return s5cmd.run(path, "cat", "--raw", path, timeout=s5cmd.TRANSFER_TIMEOUT_S) or b""
    with open_read(path) as f:
        return f.read()


def read_text(path: str) -> str:
    """The whole file decoded as UTF-8."""
    return read_bytes(path).decode("utf-8")


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path next to ``path``; renamed onto it on success, removed on error.

    Same folder, so the rename is atomic and readers see either the old or the new file.
    """
    if is_s3(path):
        raise StorageError(f"{path}: atomic_path works on local paths only (use write_bytes or upload)")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        yield tmp
        if not os.path.isfile(tmp):
            raise StorageError(f"{path}: nothing was written to the temporary file")
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_bytes(path: str, data: bytes) -> None:
    """Write a whole file atomically (s3: stage in a temp file, then one upload)."""
    if not is_s3(path):
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(data)
        return
    fd, tmp = tempfile.mkstemp(prefix="fgdata-upload-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        upload(tmp, path)
    finally:
        os.remove(tmp)


def _copy_local(src: str, dst: str) -> None:
    if not os.path.isfile(src):
        raise StorageError(f"{src}: file not found")
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def upload(local: str, url: str) -> None:
    """Copy a local file to ``url`` (or atomically to another local path)."""
    if not is_s3(url):
        _copy_local(local, url)
        return
    if not os.path.isfile(local):
        raise StorageError(f"{local}: file not found")
    split_s3(url)
    # Absolute path: a name starting with '-' must never be read as an option.
    s5cmd.run(url, "cp", "--raw", os.path.abspath(local), url, timeout=s5cmd.TRANSFER_TIMEOUT_S)


def download(url: str, local: str) -> None:
    """Copy ``url`` to a local file atomically: a failed download leaves nothing behind."""
    if not is_s3(url):
        _copy_local(url, local)
        return
    split_s3(url)
    with atomic_path(local) as tmp:
        s5cmd.run(url, "cp", "--raw", url, tmp, timeout=s5cmd.TRANSFER_TIMEOUT_S)


def remove(path: str) -> None:
    """Delete one file or object; a missing one is not an error (idempotent cleanup)."""
    if is_s3(path):
        split_s3(path)
        s5cmd.run(path, "rm", "--raw", path, missing_ok=True)
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def make_dirs(path: str) -> None:
    """Create a local directory tree; S3 has no directories, so URLs need nothing."""
    if not is_s3(path):
        os.makedirs(path, exist_ok=True)

