"""Path arithmetic that treats ``s3://bucket/key`` URLs and local paths alike.

``os.path`` mangles URLs (``os.path.dirname("s3://b")`` is ``"s3:"``), which is how the
reference built malformed side-file paths from bucket-root tags.
"""

from __future__ import annotations

import os

from fgdata.errors import StorageError

S3_SCHEME = "s3://"


def is_s3(path: str) -> bool:
    """True for ``s3://`` URLs; everything else is a local path."""
    return path.startswith(S3_SCHEME)


def split_s3(url: str) -> tuple[str, str]:
    """Split ``s3://bucket/key`` into ``(bucket, key)``; the key may be empty (bucket root)."""
    bucket, _, key = url[len(S3_SCHEME):].partition("/")
    if not bucket:
        raise StorageError(f"{url}: no bucket name in the s3:// URL")
    return bucket, key


def join(base: str, *parts: str) -> str:
    """Append path parts; URLs always use ``/`` and never lose their scheme."""
    if not is_s3(base):
        return os.path.join(base, *parts)
    pieces = [base.rstrip("/")] + [p.strip("/") for p in parts if p.strip("/")]
    return "/".join(pieces)


def parent(path: str) -> str:
    """The containing directory or prefix; the bucket root has no parent inside the bucket."""
    if not is_s3(path):
        return os.path.dirname(path.rstrip("/") or "/") or "."
    bucket, key = split_s3(path)
    key = key.rstrip("/")
    if not key:
        raise StorageError(f"{path}: the bucket root has no parent inside the bucket")
    head, _, _ = key.rpartition("/")
    return f"{S3_SCHEME}{bucket}/{head}" if head else f"{S3_SCHEME}{bucket}"


def basename(path: str) -> str:
    """Last path component, ignoring a trailing slash (the bucket name for a bucket root)."""
    if is_s3(path):
        return path[len(S3_SCHEME):].rstrip("/").rpartition("/")[2]
    return os.path.basename(path.rstrip("/"))
