"""The CIFAR-10 python tarball: download with resume, MD5 check, and safe reading of its pickled batches.

The batches are pickles, so nothing is unpickled before the MD5 matches the official archive (or the user
explicitly skips the check for a tarball they built), and even then only numpy array reconstruction and
builtin containers are admitted.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fgdata.errors import FgdataError

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_TARBALL = "cifar-10-python.tar.gz"
TRAIN_MEMBERS = tuple(f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6))

Progress = Callable[[int, int], None]


def file_md5(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify_md5(path: str | os.PathLike[str], expected: str = CIFAR10_MD5) -> None:
    """Refuse a tarball that is not the official one, naming both digests and the way out."""
    actual = file_md5(path)
    if actual != expected:
        raise FgdataError(
            f"{path}: MD5 {actual} does not match the official {CIFAR10_TARBALL} ({expected}); "
            "pass --skip-md5 only for a CIFAR-format tarball you built yourself"
        )


def download_cifar10(dest_dir: str | os.PathLike[str], url: str = CIFAR10_URL, md5: str = CIFAR10_MD5,
                     progress: Progress | None = None, timeout: float = 60.0) -> Path:
    """Fetch the tarball into ``dest_dir``: reuse a verified file, resume a partial one, verify the result."""
    import urllib.error
    import urllib.request

    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / CIFAR10_TARBALL
    if dest.is_file():
        if file_md5(dest) == md5:
            return dest
        dest.unlink()
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            if have and resp.status != 206:  # the server ignored the range: start over
                have = 0
            total = have + int(resp.headers.get("Content-Length") or 0)
            with open(part, "ab" if have else "wb") as out:
                done = have
                while block := resp.read(1 << 20):
                    out.write(block)
                    done += len(block)
                    if progress:
                        progress(done, total)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # range beyond the end: the partial file is already complete
            pass
        else:
            raise FgdataError(f"{url}: download failed (HTTP {exc.code})") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FgdataError(f"{url}: download failed ({reason}); offline? pass --source PATH/{CIFAR10_TARBALL}") from None
    if file_md5(part) != md5:
        part.unlink()
        raise FgdataError(f"{url}: downloaded file fails its MD5 check ({md5}); it was removed, run again")
    os.replace(part, dest)
    return dest


class _BatchUnpickler(pickle.Unpickler):
    """Admit only what a CIFAR batch holds: numpy arrays and dtypes inside builtin dicts and lists."""

    _ALLOWED: ClassVar[frozenset[tuple[str, str]]] = frozenset({
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 spell bytes
    })

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise FgdataError(f"CIFAR batch refers to {module}.{name}, which a CIFAR batch never contains")
        if module == "_codecs":
            import codecs

            return codecs.encode
        if name in ("ndarray", "dtype"):
            return getattr(np, name)
        core = getattr(np, "_core", None) or getattr(np, "core")  # noqa: B009 - numpy 2 renamed core to _core
        return getattr(core.multiarray, name)


def load_batch(data: bytes, what: str) -> tuple[np.ndarray, list[int]]:
    """Decode one batch into NHWC uint8 rows and integer labels."""
    try:
        batch = _BatchUnpickler(io.BytesIO(data), encoding="latin1").load()
    except FgdataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a damaged batch
        raise FgdataError(f"{what}: not a readable CIFAR batch ({exc})") from None
    if not isinstance(batch, dict) or "data" not in batch or "labels" not in batch:
        raise FgdataError(f"{what}: CIFAR batch lacks 'data' or 'labels'")
    rows = np.asarray(batch["data"])
    labels = [int(x) for x in batch["labels"]]
    if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] != 3072 or rows.shape[0] != len(labels):
        raise FgdataError(f"{what}: expected uint8 rows of 3072 bytes with one label each, got {rows.dtype} {rows.shape}")
    return rows.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def read_cifar10(tarball: str | os.PathLike[str], skip_md5: bool = False) -> tuple[np.ndarray, list[int]]:
    """The 50,000 training images (N,32,32,3 uint8) and labels, in file order; ``test_batch`` is excluded."""
    if not Path(tarball).is_file():
        raise FgdataError(f"{tarball}: no such file")
    if not skip_md5:
        verify_md5(tarball)
    images, labels = [], []
    try:
        # One whole-file inflate is about twice as fast as tarfile's streaming gzip reader,
        # and the tarball (~170 MB) fits in memory comfortably.
        raw = zlib.decompress(Path(tarball).read_bytes(), 31)
    except zlib.error as exc:
        raise FgdataError(f"{tarball}: not a readable tar.gz ({exc})") from None
    # fgdata's own tar scanner, not tarfile: a crafted header (a negative size) sends tarfile backwards forever,
    # while the scanner only moves forward and calls anything malformed damage.
    from fgdata.shards.scan import TarDamage, iter_members

    found: dict[str, bytes] = {}
    try:
        for entry, data in iter_members(io.BytesIO(raw), seekable=True, total=len(raw),
                                        with_data=lambda name: name in TRAIN_MEMBERS):
            if data is not None:
                found[entry.name] = data  # a repeated name: the last one, as tarfile has it
    except TarDamage as exc:
        raise FgdataError(f"{tarball}: not a readable tar.gz ({exc})") from None
    for member in TRAIN_MEMBERS:
        if member not in found:
            raise FgdataError(f"{tarball}: missing member {member}")
        rows, labs = load_batch(found[member], f"{tarball}:{member}")
        images.append(rows)
        labels.extend(labs)
    return np.ascontiguousarray(np.concatenate(images)), labels
