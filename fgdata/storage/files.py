"""File operations with one signature for local paths and URLs.

Each function hands its path to the backend of the path's scheme
(:func:`fgdata.storage.backend.backend_for`); nothing here knows a scheme.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

from fgdata.storage.backend import FileInfo, FolderLister, Unlisted, backend_for, walk_whole


@contextlib.contextmanager
def open_read(path: str, buffering: int = -1) -> Iterator[BinaryIO]:
    """A binary stream of the file from its first byte; remote files stream without a local copy.

    The stream is seekable where the storage has random access (local files); check
    ``stream.seekable()``. ``buffering`` sets a local file's read buffer, as for ``open``.
    """
    with backend_for(path).open_read(path, buffering) as stream:
        yield stream


def random_access(path: str) -> bool:
    """True where reads can start at any byte cheaply (local files): seek, or :func:`read_range`."""
    return backend_for(path).random_access


def read_range(path: str, offset: int, length: int) -> bytes:
    """``length`` bytes from ``offset`` (fewer only at the end); only where :func:`random_access`."""
    return backend_for(path).read_range(path, offset, length)


def read_bytes(path: str) -> bytes:
    """The whole file (remote reads are bounded and retried like every stream)."""
    with open_read(path) as f:
        return f.read()


def read_text(path: str) -> str:
    """The whole file decoded as UTF-8."""
    return read_bytes(path).decode("utf-8")


def list_dir(path: str, suffix: str | None = None, listed: Callable[[], None] | None = None) -> list[FileInfo]:
    """Direct children that are files, sorted by name; ``suffix`` matches in any case. A file that goes while the
    folder is listed is left out; ``listed``: see :meth:`fgdata.storage.backend.Backend.list_files`."""
    infos = backend_for(path).list_files(path, recursive=False, listed=listed)
    if suffix is not None:
        infos = [i for i in infos if i.name.lower().endswith(suffix.lower())]
    return sorted(infos, key=lambda i: i.name)


def list_recursive(path: str) -> list[FileInfo]:
    """All files below ``path``, sorted by full path."""
    return sorted(backend_for(path).list_files(path, recursive=True), key=lambda i: i.path)


def tree_lister(path: str, follow_links: bool = False) -> FolderLister:
    """A lister of the folders below ``path``, one at a time, for a walk that never holds the whole tree: local
    folders are listed as they are asked for (linked folders walked with ``follow_links``, and the entries that are
    not files reported: special files, linked folders, broken links, unreadable folders); an object store's prefix
    is listed whole first, then handed out folder by folder. A missing folder is an error."""
    return backend_for(path).tree_lister(path, follow_links)


def list_tree(path: str, follow_links: bool = False) -> tuple[list[FileInfo], list[Unlisted]]:
    """All files below ``path`` and the entries that are not files (see :func:`tree_lister`), both sorted."""
    files, unlisted = walk_whole(tree_lister(path, follow_links), path)
    return sorted(files, key=lambda i: i.path), sorted(unlisted, key=lambda u: u.path)


def list_names(path: str) -> list[str]:
    """Names directly under ``path``, folders (prefixes) included, sorted; a missing folder has none."""
    return backend_for(path).list_names(path)


def stat(path: str) -> FileInfo | None:
    """The file at ``path`` (with its size), or None when there is no file there."""
    return backend_for(path).stat(path)


def exists(path: str) -> bool:
    """True for an existing file or directory (for s3: an object or a non-empty prefix)."""
    return backend_for(path).exists(path)


def is_dir(path: str) -> bool:
    """True for an existing directory (for s3: a prefix with objects below it, or a bucket)."""
    return backend_for(path).is_dir(path)


def size(path: str) -> int:
    """Size in bytes of one file or object."""
    from fgdata.errors import StorageError

    backend = backend_for(path)
    info = backend.stat(path)
    if info is None:
        raise StorageError(f"{path}: {backend.missing}")
    return info.size


def write_bytes(path: str, data: bytes) -> None:
    """Write a whole file atomically: readers see the old file or the new one."""
    backend_for(path).write_atomic(path, data)


def upload(local: str, path: str) -> None:
    """Copy a finished local file to ``path`` (a URL or another local path), atomically."""
    backend_for(path).upload(local, path)


def download(path: str, local: str) -> None:
    """Copy ``path`` to a local file atomically: a failed download leaves nothing behind."""
    backend_for(path).download(path, local)


def move(src: str, dst: str) -> None:
    """Rename a file within one storage, replacing ``dst``."""
    backend_for(src).move(src, dst)


def remove(path: str) -> None:
    """Delete one file or object; a missing one is not an error (idempotent cleanup)."""
    backend_for(path).remove(path)


def remove_tree(path: str) -> None:
    """Delete a file, or a directory (prefix) with everything below it; links are removed, never followed."""
    backend_for(path).remove_tree(path)


def make_dirs(path: str) -> None:
    """Create a local directory tree; S3 has no directories, so URLs need nothing."""
    backend_for(path).make_dirs(path)


def local_copy(path: str, directory: str) -> str:
    """A local file with ``path``'s bytes: a local path as it is, a remote file downloaded into ``directory``."""
    return backend_for(path).local_copy(path, directory)


def staging_dir(dest: str) -> str:
    """Where to build files bound for ``dest`` (not created here): ``dest`` itself when local, else a private local folder."""
    return backend_for(dest).staging_dir(dest)


def stage(local: str, path: str) -> str:
    """Bring a file built in :func:`staging_dir` close to ``path`` (s3 under a lease: uploaded to the job's
    staging prefix) and return what :func:`publish` takes; a stop may land here, unlike in ``publish``."""
    return backend_for(path).stage(local, path)


def publish(staged: str, path: str) -> None:
    """Move a file built in :func:`staging_dir` to ``path``; the staged file is gone after."""
    backend_for(path).publish(staged, path)
