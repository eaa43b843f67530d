"""The storage backend interface, and the choice of backend by URL scheme.

Everything outside :mod:`fgdata.storage` calls the module-level functions of
:mod:`fgdata.storage.files`, which hand each path to the backend of its scheme:
local paths to :class:`~fgdata.storage.local.LocalBackend`, ``s3://`` URLs to
:class:`~fgdata.storage.s3.S3Backend`, ``http(s)://`` URLs (read-only) to
:class:`~fgdata.storage.http.HttpBackend`. Supporting another scheme means writing one
subclass of :class:`Backend` and registering it in ``_BACKENDS``.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import BinaryIO, ClassVar

from fgdata.errors import StorageError
from fgdata.storage.paths import scheme


@dataclass(frozen=True, slots=True)  # slots: a listing of a million files holds a million of these
class FileInfo:
    """One listed file: full path or URL, basename, size in bytes, and ``version``: what changes when its content
    is replaced (local: the modification time in ns; S3: the ETag), so a rerun can tell a replaced input."""

    path: str
    name: str
    size: int
    version: str = ""


@dataclass(frozen=True)
class Unlisted:
    """An entry below a listed folder that is not a readable file: what :func:`list_tree` leaves out, and why.

    ``kind``: ``special`` (a FIFO, socket or device), ``linked-folder``, ``broken-link`` or ``unreadable``
    (a folder that cannot be listed); ``detail`` says it in words.
    """

    path: str
    kind: str
    detail: str


@dataclass(frozen=True)
class Folder:
    """One folder of a tree, as a tree walk lists it: its files, the sub-folders to walk (full paths or URLs),
    and the entries that are neither (:class:`Unlisted`). Nothing is sorted."""

    files: list[FileInfo]
    folders: list[str]
    unlisted: list[Unlisted]


#: Lists one folder of a tree at a time (``lister(folder)``), starting with the tree's root; it keeps what the
#: walk must remember between folders (the linked folders already followed).
FolderLister = Callable[[str], Folder]


class ListedTree:
    """A tree listed whole (an object store lists every key below a prefix in one call), handed out one folder
    at a time like a local walk. Each folder's part is dropped once handed out."""

    def __init__(self, root: str, files: Iterable[FileInfo]):
        top = root.rstrip("/")
        self._parts: dict[str, tuple[list[FileInfo], set[str]]] = {root: ([], set())}
        for info in files:
            folder = root
            names = info.path[len(top) + 1:].split("/")[:-1]
            for depth in range(len(names)):
                child = top + "/" + "/".join(names[:depth + 1])
                if child != folder:  # a key with an empty part ("p//x") under a root given as "p/"
                    self._parts[folder][1].add(child)
                    folder = child
                    self._parts.setdefault(folder, ([], set()))
            self._parts[folder][0].append(info)

    def __call__(self, folder: str) -> Folder:
        files, folders = self._parts.pop(folder, ([], set()))
        return Folder(files, list(folders), [])


def walk_whole(lister: FolderLister, root: str) -> tuple[list[FileInfo], list[Unlisted]]:
    """Every file below ``root`` and every entry that is not one, through ``lister``, unsorted."""
    files: list[FileInfo] = []
    unlisted: list[Unlisted] = []
    folders = [root]
    while folders:
        listed = lister(folders.pop())
        files += listed.files
        unlisted += listed.unlisted
        folders += listed.folders
    return files, unlisted


class Backend(abc.ABC):
    """One kind of storage. Paths are full local paths or full URLs of the backend's scheme."""

    scheme: ClassVar[str]
    #: How a missing file is called in messages.
    missing: ClassVar[str] = "file not found"
    #: Reads can start at any byte cheaply (``open_read`` streams are seekable, ``read_range`` works).
    random_access: ClassVar[bool] = False
    #: Files can be listed with their size and version, so a rerun can tell a changed input from a kept one.
    versioned: ClassVar[bool] = True
    #: Jobs on other hosts (or with another local cache) may write the same place, so a job holds it through a
    #: lease kept in the destination itself (:mod:`fgdata.jobs.lease`), not a local lock alone.
    shared: ClassVar[bool] = False
    #: Asking for one file (:meth:`stat`) costs no more than its entry in a listing (a local ``stat`` is one system
    #: call), so a few files are looked up one by one rather than by listing their folder.
    cheap_stat: ClassVar[bool] = False

    @abc.abstractmethod
    def open_read(self, path: str, buffering: int = -1) -> contextlib.AbstractContextManager[BinaryIO]:
        """A binary stream of the file from its first byte; seekable where ``random_access``.

        ``buffering`` is the read buffer of a local file (as for ``open``); remote streams keep their own.
        """

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer only at the end of the file)."""
        raise StorageError(f"{path}: this storage has no ranged reads; stream it with open_read")

    @abc.abstractmethod
    def list_files(self, path: str, recursive: bool, listed: Callable[[], None] | None = None) -> list[FileInfo]:
        """Files directly under (``recursive``: anywhere below) a directory or prefix, unsorted.

        A file that goes while it is listed (another process renames its temporary into place or removes it) is
        left out, as a listing a moment later would. ``listed`` (not recursive): called once the names are read and
        before each file is looked at, where the storage does the two apart (a local folder); a test holds a job
        there to remove a file in between. Object stores answer names and sizes together and ignore it."""

    def tree_lister(self, path: str, follow_links: bool) -> FolderLister:
        """A lister of the folders below ``path``, one folder at a time (see :class:`Folder`). Here the tree is
        listed whole first (:class:`ListedTree`); object stores have no entries that are not files."""
        return ListedTree(path, self.list_files(path, recursive=True))

    @abc.abstractmethod
    def list_names(self, path: str) -> list[str]:
        """Names directly under ``path``, folders included (S3: objects and prefixes), sorted; none when missing."""

    @abc.abstractmethod
    def stat(self, path: str) -> FileInfo | None:
        """The file or object at ``path``, or None when there is none (a directory is not a file)."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """True for an existing file or directory (a prefix with something below it)."""

    @abc.abstractmethod
    def is_dir(self, path: str) -> bool:
        """True for an existing directory (a prefix with something below it)."""

    @abc.abstractmethod
    def write_atomic(self, path: str, data: bytes) -> None:
        """Write a whole file so that readers see the old file or the new one, never a part."""

    @abc.abstractmethod
    def upload(self, local: str, path: str) -> None:
        """Copy a finished local file to ``path`` atomically; ``local`` stays."""

    @abc.abstractmethod
    def download(self, path: str, local: str) -> None:
        """Copy ``path`` to a local file atomically: a failed copy leaves nothing behind."""

    @abc.abstractmethod
    def move(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` (both on this backend), replacing ``dst``."""

    @abc.abstractmethod
    def remove(self, path: str) -> None:
        """Delete one file; a missing one is not an error (idempotent cleanup)."""

    @abc.abstractmethod
    def remove_tree(self, path: str) -> None:
        """Delete ``path`` whatever it is: a file, or a folder (prefix) with everything below it.

        A link is removed, never followed; a missing path is not an error.
        """

    @abc.abstractmethod
    def make_dirs(self, path: str) -> None:
        """Create a directory tree where the storage has directories."""

    @abc.abstractmethod
    def local_copy(self, path: str, directory: str) -> str:
        """A local file with ``path``'s bytes: the file itself when local, else a download into ``directory``."""

    @abc.abstractmethod
    def staging_dir(self, dest: str) -> str:
        """The local folder (not created here) where files for ``dest`` are built before :meth:`publish` moves them in."""

    def stage(self, local: str, path: str, keep: bool = False) -> str:
        """Bring a finished file built in :meth:`staging_dir` as close to ``path`` as possible without making it
        visible there; :meth:`publish` then completes the move. Here: nothing to do (``local`` itself).

        A stop may land while a file is staged (a long upload); only :meth:`publish` must not be interrupted.
        """
        return local

    @abc.abstractmethod
    def publish(self, staged: str, path: str) -> None:
        """Move a finished file from :meth:`staging_dir` to ``path`` (atomically); the staged file is gone after."""


def _backends() -> dict[str, Backend]:
    from fgdata.storage.local import LocalBackend
    from fgdata.storage.http import HttpBackend, HttpsBackend
    from fgdata.storage.s3 import S3Backend

    return {b.scheme: b for b in (LocalBackend(), S3Backend(), HttpBackend(), HttpsBackend())}


_BACKENDS: dict[str, Backend] = {}


def backend_for(path: str) -> Backend:
    """The backend of ``path``'s scheme; an unknown scheme is a one-line error."""
    if not _BACKENDS:
        _BACKENDS.update(_backends())
    found = _BACKENDS.get(scheme(path))
    if found is None:
        known = ", ".join(f"{s}://" for s in sorted(_BACKENDS) if s)
        raise StorageError(f"{path}: unsupported URL scheme (supported: local paths, {known})")
    return found

