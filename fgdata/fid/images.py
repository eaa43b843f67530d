"""The images a reference is computed over: an EDM dataset zip or image folder, or WebDataset image shards.

Every source has a fixed order and count, and splits into chunks of consecutive images; a chunk is the unit of
resume and of the work split between ranks. Zips and folders are read by
:class:`fgdata.media.imagefiles.ImageFiles` (names sorted, as EDM's dataset class and the loaders read them); an
``s3://`` zip is fetched once into the node cache. Shards (``WDS:<dir or s3 prefix>``) are counted from their
headers, streamed in shard order and split only at shard boundaries, so a chunk never needs random access into a
remote tar. An image that cannot be decoded comes out
as a :class:`~fgdata.jobs.report.Failure` in its place (the reference leaves it out and reports it); a source
FID cannot use (latents, other channel counts) stops the pass.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.jobs.report import Failure, clean_reason

SHARD_PREFIX = "WDS:"
#: Which member of a shard sample is the image, when a sample holds several.
IMAGE_EXT_PREFERENCE = ("png", "jpg", "jpeg", "webp")


@dataclass(frozen=True)
class Chunk:
    """Images ``start .. stop-1`` of the source; for shards, the shards holding exactly those images."""

    index: int
    start: int
    stop: int
    shards: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return self.stop - self.start


class ImageSource:
    """An ordered, counted set of uint8 RGB images; :meth:`read` yields one chunk as CHW arrays."""

    kind: str
    path: str
    count: int

    def identity(self) -> dict[str, Any]:
        """What identifies the input for resume: its path, kind, image count and sizes."""
        raise NotImplementedError

    def chunks(self, chunk_size: int) -> list[Chunk]:
        raise NotImplementedError

    def read(self, chunk: Chunk, workers: int) -> Iterator[np.ndarray | Failure]:
        """The chunk's images in order, each a uint8 CHW array or the failure of an undecodable image."""
        raise NotImplementedError


def _check_pixels(arr: np.ndarray, where: str) -> np.ndarray:
    """uint8 CHW with 3 channels; grey is repeated to RGB as the reference does."""
    if arr.dtype != np.uint8:
        raise FgdataError(f"{where}: holds {arr.dtype} arrays, not 8-bit images "
                          "(FID statistics are computed in pixel space: use the RGB zip, never latents)")
    if arr.shape[0] == 1:
        arr = np.repeat(arr, 3, axis=0)
    if arr.shape[0] != 3:
        raise FgdataError(f"{where}: has {arr.shape[0]} channels; FID needs RGB or grey images")
    return arr


def _undecodable(exc: BaseException) -> bool:
    """Whether ``exc`` says that one image cannot be decoded (a failure to report), rather than that the source
    is not one FID can use (which stops the pass)."""
    from PIL import Image

    from fgdata.media.errors import MediaError

    return isinstance(exc, (OSError, ValueError, SyntaxError, MediaError, Image.DecompressionBombError))


def _ordered(fn: Any, items: Iterator[Any], workers: int, what: Any) -> Iterator[np.ndarray | Failure]:
    """``fn`` over ``items`` on ``workers`` threads, in order; an undecodable image gives its failure, any other
    error stops the pass with the image's name."""
    from fgdata.compute import prefetch_map

    for item, result in prefetch_map(fn, items, workers, ahead=max(64, 8 * workers)):
        if isinstance(result, BaseException):
            if _undecodable(result):
                yield Failure(what(item), clean_reason(f"image-decode: {result}"))
                continue
            if isinstance(result, FgdataError):
                raise result
            raise FgdataError(f"{what(item)}: cannot decode ({type(result).__name__}: {result})")
        yield result


class ZipSource(ImageSource):
    """An EDM dataset zip or folder of images (local, or an ``s3://`` zip cached on this node)."""

    def __init__(self, path: str):
        from fgdata.media.imagefiles import ImageFiles

        self.path = path
        local = storage.fetch_to_cache(path)
        self.kind = "folder" if os.path.isdir(local) else "zip"
        try:
            self._data = ImageFiles(local)
        except zipfile.BadZipFile:
            raise FgdataError(f"{path}: not a zip file or an image folder") from None
        except OSError as exc:
            raise FgdataError(f"{path}: {exc.strerror or exc}") from None
        _check_pixels(self._data.image(0), path)
        self.count = len(self._data.names)
        self._size = storage.size(local) if self.kind == "zip" else None

    def identity(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "images": self.count, "bytes": self._size}

    def chunks(self, chunk_size: int) -> list[Chunk]:
        return [Chunk(i, a, min(a + chunk_size, self.count)) for i, a in enumerate(range(0, self.count, chunk_size))]

    def read(self, chunk: Chunk, workers: int) -> Iterator[np.ndarray | Failure]:
        names = self._data.names

        def load(i: int) -> np.ndarray:
            return _check_pixels(self._data.image(i), f"{self.path}: {names[i]}")

        return _ordered(load, iter(range(chunk.start, chunk.stop)), workers, lambda i: f"{self.path}: {names[i]}")


def _image_member(members: dict[str, bytes], where: str) -> bytes:
    from fgdata.media.decode import member_kind

    images = sorted(ext for ext in members if member_kind(ext) == "image")
    if not images:
        raise FgdataError(f"{where}: no image member (has {', '.join(sorted(members)) or 'nothing'})")
    preferred = [ext for ext in IMAGE_EXT_PREFERENCE if ext in images]
    return members[(preferred or images)[0]]


def _decode_member(item: tuple[str, bytes]) -> np.ndarray:
    """(where, bytes) -> uint8 CHW; converted to RGB first (palette, alpha, grey), as the loaders do."""
    from fgdata.media.image import open_image, to_rgb

    with open_image(item[1]) as im:
        return np.asarray(to_rgb(im)).transpose(2, 0, 1)


class ShardSource(ImageSource):
    """WebDataset shards: one image per sample, in shard order then tar order."""

    kind = "shards"

    def __init__(self, path: str, workers: int = 8):
        from fgdata.jobs.executor import thread_map
        from fgdata.shards import count_shards

        self.path = path
        counts = count_shards(path, pool=thread_map(workers))
        if not counts:
            raise FgdataError(f"{path}: no .tar shards")
        bad = [c for c in counts if c.damage or c.error]
        if bad:
            raise FgdataError(f"{bad[0].shard}: unreadable or damaged ({bad[0].error or bad[0].damage}); FID references "
                              "need every image (run fgdata verify)")
        self._counts = [(c.shard, c.samples, c.bytes) for c in counts]
        self.count = sum(c.samples for c in counts)
        if not self.count:
            raise FgdataError(f"{path}: the shards hold no samples")

    def identity(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "images": self.count,
                "shards": [[storage.basename(p), n, size] for p, n, size in self._counts]}

    def chunks(self, chunk_size: int) -> list[Chunk]:
        chunks: list[Chunk] = []
        group: list[str] = []
        start = pos = 0
        for shard, n, _size in self._counts:
            group.append(shard)
            pos += n
            if pos - start >= chunk_size:
                chunks.append(Chunk(len(chunks), start, pos, tuple(group)))
                group, start = [], pos
        if group:
            chunks.append(Chunk(len(chunks), start, pos, tuple(group)))
        return chunks

    def read(self, chunk: Chunk, workers: int) -> Iterator[np.ndarray | Failure]:
        from fgdata.shards import iter_samples

        def items() -> Iterator[tuple[str, bytes]]:
            for shard in chunk.shards:
                for sample in iter_samples(shard):
                    where = f"{shard}: {sample.key}"
                    yield where, _image_member(sample.members, where)

        for arr in _ordered(_decode_member, items(), workers, lambda item: item[0]):
            yield arr if isinstance(arr, Failure) else _check_pixels(arr, self.path)


def open_source(path: str, workers: int = 8) -> ImageSource:
    """``WDS:<dir or s3 prefix>`` for shards; otherwise an EDM zip (local or s3://) or a local image folder."""
    if path.startswith(SHARD_PREFIX):
        return ShardSource(path[len(SHARD_PREFIX):], workers=workers)
    if not storage.exists(path):
        raise FgdataError(f"{path}: no such zip or folder")
    return ZipSource(path)
