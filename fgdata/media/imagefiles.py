"""A zip or folder of images / ``.npy`` arrays read by sorted file name, as EDM's dataset class reads it.

Both the loaders (``ImageZipDataset``, which adds labels, flips and tensors) and ``fid-refs`` (which needs only
the raw uint8 arrays) read EDM datasets; the reading lives here, below both, so that neither imports the other.
"""

from __future__ import annotations

import io
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from fgdata.errors import FgdataError


def _image_exts() -> frozenset[str]:
    from PIL import Image

    Image.init()
    return frozenset(Image.EXTENSION)


class ImageFiles:
    """The files of a local zip or folder in sorted name order (``dataset.json`` aside), each read as its stored
    CHW array: images decoded (pyspng for PNG when installed and asked for, palettes expanded to RGB), ``.npy``
    arrays loaded without pickles. Every file must have the first file's shape. A zip handle is opened per
    process, so the object can be pickled to worker processes."""

    def __init__(self, path: str, use_pyspng: bool = True, cache: bool = False):
        self.path = str(path)
        self.use_pyspng = use_pyspng
        self.cache = cache
        self._zip: zipfile.ZipFile | None = None
        self._zip_pid: int | None = None
        self._cached: dict[int, np.ndarray] = {}
        self._palette_warned = False
        exts = _image_exts() | {".npy"}
        if os.path.isfile(self.path):
            self._kind = "zip"
            all_names = self._open_zip().namelist()
        elif os.path.isdir(self.path):
            self._kind = "dir"
            all_names = [os.path.relpath(os.path.join(root, f), self.path)
                         for root, _dirs, files in os.walk(self.path) for f in files]
        else:
            raise OSError(f"{self.path}: no such zip file or directory")
        self._names = sorted(n for n in all_names
                             if os.path.splitext(n)[1].lower() in exts and os.path.basename(n) != "dataset.json")
        if not self._names:
            raise FgdataError(f"{self.path}: holds no image or .npy files")
        self.shape = tuple(self._load_raw(0).shape)

    @property
    def names(self) -> list[str]:
        """File names in item order (sorted, as EDM's dataset class)."""
        return self._names

    def image(self, raw: int) -> np.ndarray:
        """The stored array of file ``raw`` (CHW, uint8 for images), unflipped and unscaled: for pixel-space users."""
        return self._load_raw(raw)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_zip"], state["_zip_pid"], state["_cached"] = None, None, {}
        return state

    def _open_zip(self) -> zipfile.ZipFile:
        if self._zip is None or self._zip_pid != os.getpid():
            self._zip, self._zip_pid = zipfile.ZipFile(self.path), os.getpid()
        return self._zip

    def _read(self, name: str) -> bytes:
        if self._kind == "zip":
            return self._open_zip().read(name)
        return Path(self.path, name).read_bytes()

    def _load_raw(self, raw: int) -> np.ndarray:
        if raw in self._cached:
            return self._cached[raw]
        name = self._names[raw]
        data = self._read(name)
        if name.endswith(".npy"):
            arr = np.load(io.BytesIO(data), allow_pickle=False)
            arr = arr.reshape(-1, *arr.shape[-2:])
        else:
            arr = self._decode_image(name, data)
        if hasattr(self, "shape") and tuple(arr.shape) != self.shape:
            raise FgdataError(f"{self.path}: {name} has shape {tuple(arr.shape)}, the first file {self.shape}")
        if self.cache:
            self._cached[raw] = arr
        return arr

    def _decode_image(self, name: str, data: bytes) -> np.ndarray:
        from fgdata.media.image import image_size, open_image

        arr: np.ndarray | None = None
        if self.use_pyspng and name.lower().endswith(".png"):
            image_size(data)  # pyspng decodes without Pillow's pixel limit: refuse a bomb first
            try:
                import pyspng
            except ImportError:
                pyspng = None
            if pyspng is not None and data[25:26] != b"\x03":  # colour type 3 = palette: decode with Pillow
                arr = pyspng.load(data)
        if arr is None:
            with open_image(data) as img:
                if img.mode == "P":  # expand the palette instead of returning indices
                    if not self._palette_warned:
                        warnings.warn(f"{self.path}: {name} is a palette image; expanding it to RGB", stacklevel=2)
                        self._palette_warned = True
                    arr = np.array(img.convert("RGB"))
                else:
                    arr = np.array(img)
        if arr.ndim == 2:
            arr = arr[:, :, np.newaxis]
        return arr.transpose(2, 0, 1)
