"""Path arithmetic that treats URLs (``s3://bucket/key``, any ``scheme://``) and local paths alike.

``os.path`` mangles URLs (``os.path.dirname("s3://b")`` is ``"s3:"``), which is how the
reference built malformed side-file paths from bucket-root tags.
"""

from __future__ import annotations

import functools
import os
import re
import urllib.parse

from fgdata.errors import StorageError

S3_SCHEME = "s3://"
_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://")


def scheme(path: str) -> str:
    """The URL scheme (``"s3"``), or ``""`` for a local path."""
    if "://" not in path:  # most paths of a local job: no pattern to run
        return ""
    m = _URL.match(path)
    return m.group(1) if m else ""


def is_url(path: str) -> bool:
    """True for ``scheme://`` URLs; everything else is a local path."""
    return bool(scheme(path))


def is_s3(path: str) -> bool:
    """True for ``s3://`` URLs."""
    return path.startswith(S3_SCHEME)


def is_absolute(path: str) -> bool:
    """A URL or an absolute local path: used as given, never joined to a base."""
    return is_url(path) or os.path.isabs(path)


def absolute(path: str) -> str:
    """A local path made absolute (against the working directory) and normalised; a URL as given.

    Side files that name shards of several folders key them by this form, so the names stay
    valid from any working directory.
    """
    return path if is_url(path) else os.path.abspath(path)


def same_file_key(path: str) -> str:
    """One spelling for every name of a file, for comparing only: a local path made absolute and
    normalised, its folder's symlinks resolved; a URL with repeated slashes collapsed."""
    if not is_url(path):
        full = os.path.abspath(path)
        return os.path.join(_real_folder(os.path.dirname(full)), os.path.basename(full))
    head = f"{scheme(path)}://"
    return head + re.sub("/+", "/", path[len(head):]).rstrip("/")


def place_key(path: str) -> str:
    """One spelling of a folder, file or prefix, for telling whether two are the same place or one holds the other:
    a local path with every link resolved (its own included), a URL as its bucket and prefix."""
    return same_file_key(path) if is_url(path) else os.path.realpath(path)


def within(path: str, folder: str) -> str | None:
    """Where ``path`` lies below ``folder`` (``/``-separated, ``""`` for the same place), however either is
    spelled (:func:`place_key`); None when it lies elsewhere."""
    inner, outer = place_key(path), place_key(folder).rstrip("/")
    if inner == outer or not outer:
        return "" if inner == outer else inner.lstrip("/")
    if not inner.startswith(outer + ("/" if is_url(outer) else os.sep)):
        return None
    return inner[len(outer) + 1:].replace(os.sep, "/")


@functools.lru_cache(maxsize=1024)
def _real_folder(folder: str) -> str:
    """A folder with its symlinks resolved (cached: a dataset's shards share a handful of folders)."""
    return os.path.realpath(folder)


def split_url(url: str) -> tuple[str, str]:
    """Split ``scheme://bucket/key`` into ``(bucket, key)``; the key may be empty (bucket root)."""
    bucket, _, key = url[len(scheme(url)) + 3:].partition("/")
    if not bucket:
        raise StorageError(f"{url}: no bucket name in the {scheme(url)}:// URL")
    return bucket, key


def split_s3(url: str) -> tuple[str, str]:
    """Split ``s3://bucket/key`` into ``(bucket, key)``."""
    return split_url(url)


def join(base: str, *parts: str) -> str:
    """Append path parts; URLs always use ``/`` and never lose their scheme."""
    if not is_url(base):
        return os.path.join(base, *parts)
    pieces = [base.rstrip("/")] + [p.strip("/") for p in parts if p.strip("/")]
    return "/".join(pieces)


def without_query(path: str) -> str:
    """An http(s) URL without its query and fragment (what names the file, and its extension); any other path
    as given (``?`` and ``#`` are part of an S3 key or a file name)."""
    if path.startswith(("http://", "https://")):
        return path.split("#", 1)[0].split("?", 1)[0]
    return path


def parent(path: str) -> str:
    """The containing directory or prefix; the bucket root has no parent inside the bucket. An http(s) URL's
    query and fragment are not part of its path (a presigned URL's signature holds ``/`` too)."""
    if not is_url(path):
        return os.path.dirname(path.rstrip("/") or "/") or "."
    path = without_query(path)
    bucket, key = split_url(path)
    key = key.rstrip("/")
    if not key:
        raise StorageError(f"{path}: the bucket root has no parent inside the bucket")
    head, _, _ = key.rpartition("/")
    root = f"{scheme(path)}://{bucket}"
    return f"{root}/{head}" if head else root


def basename(path: str) -> str:
    """Last path component, ignoring a trailing slash (the bucket name for a bucket root)."""
    if is_url(path):
        return path[len(scheme(path)) + 3:].rstrip("/").rpartition("/")[2]
    return os.path.basename(path.rstrip("/"))


def relative(root: str, path: str) -> str:
    """``path`` below ``root`` as a ``/``-separated relative name."""
    if is_url(root):
        return path[len(root.rstrip("/")) + 1:]
    return os.path.relpath(path, root).replace(os.sep, "/")


def file_url_path(url: str) -> str:
    """The local path a ``file://`` URL names (``file:///data/a%20b.png`` -> ``/data/a b.png``); a file URL
    of another host names no file here."""
    host, _, rest = url[len("file://"):].partition("/")
    if host not in ("", "localhost"):
        raise StorageError(f"{url}: a file:// URL of another host ({host})")
    return urllib.parse.unquote("/" + rest.split("#", 1)[0].split("?", 1)[0])
