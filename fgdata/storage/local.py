"""Local files: the standard library, with atomic writes through a temporary name in the same folder."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from typing import BinaryIO

from fgdata.errors import StorageError
from fgdata.storage.backend import Backend, FileInfo
from fgdata.storage.paths import is_url


def _os_error(path: str, exc: OSError) -> StorageError:
    if isinstance(exc, FileNotFoundError):
        return StorageError(f"{path}: file not found")
    if isinstance(exc, IsADirectoryError):
        return StorageError(f"{path}: is a directory")
    return StorageError(f"{path}: {exc.strerror or exc}")


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


def _info(path: str, name: str, st: os.stat_result) -> FileInfo:
    return FileInfo(path, name, st.st_size, str(st.st_mtime_ns))


class LocalBackend(Backend):
    """Paths on a local or mounted file system."""

    scheme = ""
    random_access = True

    @contextlib.contextmanager
    def open_read(self, path: str, buffering: int = -1) -> Iterator[BinaryIO]:
        try:
            f = open(path, "rb", buffering=buffering)  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            raise _os_error(path, exc) from None
        with f:
            yield f

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Loops over ``os.pread``: one call returns at most about 2 GiB on Linux."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise _os_error(path, exc) from None
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

    def list_files(self, path: str, recursive: bool) -> list[FileInfo]:
        if not recursive:
            try:
                with os.scandir(path) as it:
                    return [_info(e.path, e.name, e.stat()) for e in it if e.is_file()]
            except FileNotFoundError:
                raise StorageError(f"{path}: directory not found") from None
            except NotADirectoryError:
                raise StorageError(f"{path}: not a directory") from None
            except OSError as exc:
                raise _os_error(path, exc) from None
        if not os.path.isdir(path):
            raise StorageError(f"{path}: directory not found")
        return [
            _info(p, name, os.stat(p))
            for root, _, names in os.walk(path)
            for name in names
            if os.path.isfile(p := os.path.join(root, name))
        ]

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
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(data)

    def _copy(self, src: str, dst: str) -> None:
        if not os.path.isfile(src):
            raise StorageError(f"{src}: file not found")
        with atomic_path(dst) as tmp:
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
