"""A node-local copy of a remote (e.g. S3) file, downloaded once per node.

The reference downloaded on global rank 0 only and non-atomically, so other nodes could
miss the file or read half of it. Here every node fetches into its own cache under a
file lock, renames into place, and checks the size against the listing. A download that fails
fails every process that waited for it with the same error (the processes of one node would
otherwise each spend the storage's retries and stall timeouts in turn on one fault); a process that
comes later tries again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time

from fgdata.errors import StorageError
from fgdata.storage.files import download, size, write_bytes
from fgdata.storage.paths import basename, is_url


def cache_root(cache_dir: str | None = None) -> str:
    """``cache_dir``, else ``$FGDATA_CACHE``, else ``~/.cache/fgdata/s3``."""
    return cache_dir or os.environ.get("FGDATA_CACHE") or os.path.expanduser("~/.cache/fgdata/s3")


def cache_path(url: str, cache_dir: str | None = None) -> str:
    """Where ``url`` is cached: a hash of the URL as folder keeps any key inside the cache."""
    name = basename(url)
    if name in ("", ".", "..") or url.endswith("/"):
        raise StorageError(f"{url}: not an object URL")
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:20]
    return os.path.join(cache_root(cache_dir), digest, name)


def fetch_to_cache(path: str, cache_dir: str | None = None) -> str:
    """A local path holding ``path``'s bytes; local paths come back unchanged."""
    if not is_url(path):
        return path
    dest = cache_path(path, cache_dir)
    expected = size(path)
    if os.path.isfile(dest) and os.path.getsize(dest) == expected:
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    failed = dest + ".failed"  # the error of the last download that failed, written under the lock
    arrived = time.time()
    with open(dest + ".lock", "a") as lock:
        # Concurrent processes on this node wait here; the first one downloads.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(dest) and os.path.getsize(dest) == expected:
            return dest
        try:
            if os.stat(failed).st_mtime >= arrived:  # it failed while this process waited for it
                with open(failed, encoding="utf-8") as f:
                    raise StorageError(f.read())
        except FileNotFoundError:
            pass
        try:
            download(path, dest)
        except StorageError as exc:
            write_bytes(failed, str(exc).encode("utf-8"))
            raise
        if os.path.exists(failed):
            os.remove(failed)
        got = os.path.getsize(dest)
        if got != expected:
            os.remove(dest)
            raise StorageError(f"{path}: downloaded {got} bytes but the listing says {expected}")
    return dest
