"""``s3://`` URLs through the s5cmd binary (see :mod:`fgdata.storage.s5cmd` for the bounds on every call).

Inside a destination a job holds through a lease (:mod:`fgdata.storage.guard`), a file bound for a
final name is uploaded under the job's staging prefix first and moved into place (a server-side copy)
only after the job has confirmed the lease is still its own; removals and writes of job state there
are checked the same way. Local temporary files live in this host's fgdata cache, never in the system
temp folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import BinaryIO

from fgdata.errors import StorageError
from fgdata.storage import guard, s5cmd
from fgdata.storage.backend import Backend, FileInfo
from fgdata.storage.local import atomic_path
from fgdata.storage.paths import is_s3, parent, split_s3


def _prefix(url: str) -> str:
    """The listing prefix of a directory-like URL (``s3://b`` and ``s3://b/p`` -> trailing slash)."""
    split_s3(url)
    return url.rstrip("/") + "/"


def _entry(url: str) -> dict | None:
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


class S3Backend(Backend):
    """Objects in S3 or an S3-compatible store. There are no directories: a prefix with objects below acts as one."""

    scheme = "s3"
    missing = "object not found"
    shared = True

    @contextlib.contextmanager
    def open_read(self, path: str, buffering: int = -1) -> Iterator[BinaryIO]:
        """Streams ``s5cmd cat`` without a local copy; stalls are retried from the byte reached."""
        split_s3(path)
        raw = s5cmd.CatStream(path)
        try:
            yield io.BufferedReader(raw, buffer_size=1 << 20)
        finally:
            raw.close()

    def list_files(self, path: str, recursive: bool, listed: Callable[[], None] | None = None) -> list[FileInfo]:
        prefix = _prefix(path)
        infos = []
        for entry in s5cmd.list_entries(prefix, recursive=recursive):
            key = entry.get("key", "")
            rel = key[len(prefix):]
            if entry.get("type") != "file" or not key.startswith(prefix) or not rel:
                continue
            if not recursive and "/" in rel:
                continue
            infos.append(FileInfo(key, rel.rpartition("/")[2], int(entry.get("size", 0)), entry.get("etag", "")))
        return infos

    def list_names(self, path: str) -> list[str]:
        prefix = _prefix(path)
        names = {
            entry["key"][len(prefix):].rstrip("/")
            for entry in s5cmd.list_entries(prefix)
            if entry.get("key", "").startswith(prefix)
        }
        return sorted(n for n in names if n and "/" not in n)

    def stat(self, path: str) -> FileInfo | None:
        entry = _entry(path) if split_s3(path)[1] else None
        if entry is None or entry.get("type") != "file":
            return None
        return FileInfo(path, path.rpartition("/")[2], int(entry["size"]), entry.get("etag", ""))

    def exists(self, path: str) -> bool:
        if not split_s3(path)[1].strip("/"):
            s5cmd.list_entries(_prefix(path))  # raises for a missing bucket
            return True
        return _entry(path) is not None

    def is_dir(self, path: str) -> bool:
        if not split_s3(path)[1].strip("/"):
            return self.exists(path)
        entry = _entry(path.rstrip("/") + "/")
        return entry is not None

    def write_atomic(self, path: str, data: bytes) -> None:
        """Stage in a local temporary file, then one upload (an S3 object appears whole or not at all)."""
        split_s3(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.rpartition('/')[2]}.fgtmp-", dir=self._local_stage(path))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self.upload(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):  # a rerun of the job empties the staging folder
                os.remove(tmp)

    def _local_stage(self, path: str) -> str:
        """The local folder for temporary files bound for ``path``: its leased destination's staging folder
        (a rerun empties it), else its parent's."""
        held = guard.covering(path)
        folder = self.staging_dir(held.dest if held else parent(path.rstrip("/")))
        os.makedirs(folder, exist_ok=True)
        return folder

    def _cp(self, local: str, path: str) -> None:
        # Absolute path: a name starting with '-' must never be read as an option.
        s5cmd.run(path, "cp", "--raw", os.path.abspath(local), path, size=os.path.getsize(local))

    def _checked(self, path: str) -> guard.Guard | None:
        """The lease covering ``path``, confirmed still this job's (None: no lease, or the job's own state)."""
        held = guard.covering(path)
        if held is None or held.exempt(path):
            return None
        held.confirm(path)
        return held

    def upload(self, local: str, path: str) -> None:
        if not os.path.isfile(local):
            raise StorageError(f"{local}: file not found")
        split_s3(path)
        staged = self.stage(local, path, keep=True)
        if staged == local:
            self._checked(path)
            self._cp(local, path)
        else:
            self.publish(staged, path)

    def stage(self, local: str, path: str, keep: bool = False) -> str:
        """Under a lease: upload ``local`` to the job's staging prefix and return that URL (``local`` is removed
        unless ``keep``); elsewhere ``local`` itself."""
        held = guard.covering(path)
        if held is None or not held.stages(path):
            return local
        staged = held.staging_url(path)
        self._cp(local, staged)
        if not keep:
            os.remove(local)
        return staged

    def download(self, path: str, local: str) -> None:
        with atomic_path(local) as tmp:
            info = self.stat(path)  # its size sets the time cap of the copy
            if info is None:
                raise StorageError(f"{path}: {self.missing}")
            s5cmd.run(path, "cp", "--raw", path, tmp, size=info.size)

    def move(self, src: str, dst: str) -> None:
        info = self.stat(src)
        if info is None:
            raise StorageError(f"{src}: {self.missing}")
        split_s3(dst)
        self._checked(dst)
        s5cmd.run(src, "mv", "--raw", src, dst, size=info.size)

    def remove(self, path: str) -> None:
        split_s3(path)
        self._checked(path)
        self._rm(path)

    def _rm(self, path: str) -> None:
        s5cmd.run(path, "rm", "--raw", path, size=0, missing_ok=True)

    def remove_tree(self, path: str) -> None:
        self._checked(path)  # once for the whole tree
        if split_s3(path)[1].strip("/"):
            self._rm(path.rstrip("/"))
        for info in self.list_files(path, recursive=True):
            self._rm(info.path)

    def make_dirs(self, path: str) -> None:
        """S3 has no directories: nothing to create."""

    def local_copy(self, path: str, directory: str) -> str:
        name = path.rstrip("/").rpartition("/")[2]
        if name in ("", ".", ".."):
            raise StorageError(f"{path}: not an object URL")
        local = os.path.join(directory, name)
        self.download(path, local)
        return local

    def staging_dir(self, dest: str) -> str:
        """This host's private folder for ``dest`` under ``$FGDATA_CACHE`` (never the shared temp folder).

        The same folder on every run, so a rerun finds (and clears) what a killed run left.
        """
        root = os.environ.get("FGDATA_CACHE") or os.path.expanduser("~/.cache/fgdata")
        digest = hashlib.sha256(dest.rstrip("/").encode()).hexdigest()[:20]
        return os.path.join(root, "staging", digest)

    def publish(self, staged: str, path: str) -> None:
        """A file :meth:`stage` uploaded is moved into place (after the lease check); a local one is uploaded."""
        if is_s3(staged):
            self.move(staged, path)
        else:
            self.upload(staged, path)
            os.remove(staged)
