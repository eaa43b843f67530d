"""Local files: the standard library, with atomic writes through a temporary name in the same folder."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from typing import BinaryIO

from fgdata.errors import StorageError
from fgdata.storage.backend import Backend, FileInfo, Folder, FolderLister, Unlisted, walk_whole
from fgdata.storage.paths import is_url


def _os_error(path: str, exc: OSError) -> StorageError:
    if isinstance(exc, FileNotFoundError):
        return StorageError(f"{path}: file not found")
    if isinstance(exc, IsADirectoryError):
        return StorageError(f"{path}: is a directory")
    return StorageError(f"{path}: {exc.strerror or exc}")


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "a special file"


def _open_regular(path: str) -> int:
    """A read descriptor of ``path``, refused unless it is a regular file.

    A FIFO would block the open (or the reads) forever and a device such as ``/dev/zero`` never ends,
    so the open does not wait (``O_NONBLOCK``) and the opened file itself is checked (no race with a
    rename between a check and the open). Regular files ignore ``O_NONBLOCK``; it is cleared anyway.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise _os_error(path, exc) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise StorageError(f"{path}: is {_file_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def writing_to(path: str) -> Iterator[None]:
    """An ``OSError`` raised while writing ``path`` (a full disk, a quota, an I/O error) as a StorageError that
    names it: a failed ``write`` carries no file name of its own."""
    try:
        yield
    except OSError as exc:
        raise _os_error(path, exc) from None


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path next to ``path``; renamed onto it on success, removed on error.

    Same folder, so the rename is atomic and readers see either the old or the new file.
    """
    if is_url(path):
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


def _special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe), not a file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file"
    return "a device, not a file" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def _info(path: str, name: str, st: os.stat_result) -> FileInfo:
    return FileInfo(path, name, st.st_size, str(st.st_mtime_ns))


class _LocalTree:
    """One folder at a time, with ``os.scandir``: files (links to files included) and what is not a file.

    A linked folder is walked only with ``follow_links``, and only when it leads out of the root to a folder not
    walked yet (its files are listed under the link's path); otherwise it is an :class:`Unlisted` entry, as are
    special files, broken links and folders that cannot be listed. A folder's links to folders are decided in name
    order, so which of two links to one folder is followed does not depend on the order the file system lists them.
    """

    def __init__(self, root: str, follow_links: bool):
        self._real_root = os.path.realpath(root)
        self._walked = {self._real_root}
        self._follow_links = follow_links

    def __call__(self, folder: str) -> Folder:
        listed = Folder([], [], [])
        linked: list[os.DirEntry] = []  # decided in name order, after the rest
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    self._checked(entry, listed, linked)
        except OSError as exc:  # nothing of a folder that cannot be listed to its end
            return Folder([], [], [Unlisted(folder, "unreadable", f"cannot be listed ({exc.strerror or exc})")])
        for entry in sorted(linked, key=lambda e: e.name):
            self._checked(entry, listed, None)
        return listed

    def _checked(self, entry: os.DirEntry, listed: Folder, linked: list[os.DirEntry] | None) -> None:
        """:meth:`_take`, with an entry that cannot be examined listed as unreadable."""
        try:
            self._take(entry, listed, linked)
        except OSError as exc:
            listed.unlisted.append(Unlisted(entry.path, "unreadable", f"cannot be read ({exc.strerror or exc})"))

    def _take(self, entry: os.DirEntry, listed: Folder, linked: list[os.DirEntry] | None) -> None:
        """Put ``entry`` where it belongs in ``listed``; a link to a folder goes to ``linked`` (when given)."""
        if entry.is_dir(follow_symlinks=False):
            listed.folders.append(entry.path)
        elif entry.is_file():
            listed.files.append(_info(entry.path, entry.name, entry.stat()))
        elif entry.is_dir() and linked is not None:
            linked.append(entry)
        elif entry.is_dir():
            real = os.path.realpath(entry.path)
            root = self._real_root
            inside = real == root or real.startswith(root.rstrip(os.sep) + os.sep)
            if self._follow_links and not inside and real not in self._walked:
                self._walked.add(real)
                listed.folders.append(entry.path)
            else:
                why = ("its folder is listed under its own name" if inside
                       else "its folder was listed through another link" if self._follow_links
                       else "pass --follow-symlinks to read it")
                listed.unlisted.append(Unlisted(entry.path, "linked-folder", f"a link to a folder; {why}"))
        elif entry.is_symlink():
            listed.unlisted.append(Unlisted(entry.path, "broken-link", "a link to nothing"))
        else:
            listed.unlisted.append(Unlisted(entry.path, "special", _special_kind(entry.stat().st_mode)))


class LocalBackend(Backend):
    """Paths on a local or mounted file system."""

    scheme = ""
    random_access = True
    cheap_stat = True

    @contextlib.contextmanager
    def open_read(self, path: str, buffering: int = -1) -> Iterator[BinaryIO]:
        with open(path, "rb", buffering=buffering, opener=lambda name, _flags: _open_regular(name)) as f:
            yield f

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Loops over ``os.pread``: one call returns at most about 2 GiB on Linux."""
        fd = _open_regular(path)
        try:
            parts = []
            while length > 0:
                chunk = os.pread(fd, min(length, 1 << 30), offset)
                if not chunk:
                    break
                parts.append(chunk)
                offset += len(chunk)
                length -= len(chunk)
            return b"".join(parts)
        finally:
            os.close(fd)

    def list_files(self, path: str, recursive: bool, listed: Callable[[], None] | None = None) -> list[FileInfo]:
        if recursive:
            return walk_whole(self.tree_lister(path, follow_links=False), path)[0]
        try:
            with os.scandir(path) as it:
                entries = [e for e in it if e.is_file()]
        except FileNotFoundError:
            raise StorageError(f"{path}: directory not found") from None
        except NotADirectoryError:
            raise StorageError(f"{path}: not a directory") from None
        except OSError as exc:
            raise _os_error(path, exc) from None
        if listed is not None:
            listed()
        infos = []
        for entry in entries:  # an entry gone since the folder was read (renamed into place, removed) is left out
            try:
                infos.append(_info(entry.path, entry.name, entry.stat()))
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _os_error(entry.path, exc) from None
        return infos

    def tree_lister(self, path: str, follow_links: bool) -> FolderLister:
        if not os.path.isdir(path):
            raise StorageError(f"{path}: directory not found")
        return _LocalTree(path, follow_links)

    def list_names(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            raise StorageError(f"{path}: not a directory") from None
        except OSError as exc:
            raise _os_error(path, exc) from None

    def stat(self, path: str) -> FileInfo | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _os_error(path, exc) from None
        if not os.path.isfile(path):
            return None
        return _info(path, os.path.basename(path.rstrip("/")), st)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def write_atomic(self, path: str, data: bytes) -> None:
        with writing_to(path), atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(data)

    def _copy(self, src: str, dst: str) -> None:
        if not os.path.isfile(src):
            raise StorageError(f"{src}: file not found")
        with writing_to(dst), atomic_path(dst) as tmp:
            shutil.copyfile(src, tmp)

    def upload(self, local: str, path: str) -> None:
        self._copy(local, path)

    def download(self, path: str, local: str) -> None:
        self._copy(path, local)

    def move(self, src: str, dst: str) -> None:
        try:
            os.replace(src, dst)
        except OSError as exc:
            raise _os_error(src, exc) from None

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)

    def remove_tree(self, path: str) -> None:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _os_error(exc.filename or path, exc) from None

    def make_dirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def local_copy(self, path: str, directory: str) -> str:
        return path

    def staging_dir(self, dest: str) -> str:
        """``dest`` itself: a rename inside one folder is atomic and copies nothing."""
        return dest

    def publish(self, staged: str, path: str) -> None:
        self.move(staged, path)
