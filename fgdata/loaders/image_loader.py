"""``ImageLoader``: FastGen's class-conditional loader over EDM dataset zips and folders.

The order is a pure function of the global sample position, so resume is exact and independent
of ``num_workers``; each worker opens its own zip handle, which the reference avoided by pinning one
worker. Caching is opt-in here (``cache=False`` by default, unlike the reference's ``cache=True``; the presets
still pass ``cache=True``): a cache holds every decoded sample in every worker, so enabling it warns with the
projected memory once that reaches :data:`CACHE_WARN_BYTES`.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from fgdata.errors import FgdataError
from fgdata.loaders.ranks import checked_position, resolve_rank
from fgdata.media.imagefiles import ImageFiles

#: ``cache=True`` warns when the decoded samples it would keep, summed over the worker processes,
#: reach this size (or exceed the memory available): below it a cache costs nothing worth a word.
CACHE_WARN_BYTES = 1 << 30


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class ImageZipDataset(ImageFiles, torch.utils.data.Dataset):
    """Map-style dataset over a zip or folder of images / ``.npy`` arrays, as EDM's ImageFolderDataset (the files
    are read by :class:`fgdata.media.imagefiles.ImageFiles`; labels, subsets and flips are added here)."""

    def __init__(self, path: str, resolution: int | None = None, use_pyspng: bool = True, max_size: int | None = None,
                 xflip: bool = False, random_seed: int = 0, use_labels: bool = True, cache: bool = False):
        super().__init__(path, use_pyspng=use_pyspng, cache=cache)
        if resolution is not None and (self.shape[1] != resolution or self.shape[2] != resolution):
            raise FgdataError(f"{self.path}: images are {self.shape[2]}x{self.shape[1]}, not resolution={resolution}")
        self.labels = self._load_labels() if use_labels else np.zeros((len(self._names), 0), np.float32)
        self._raw_idx = np.arange(len(self._names), dtype=np.int64)
        if max_size is not None and self._raw_idx.size > max_size:
            np.random.RandomState(random_seed % (1 << 31)).shuffle(self._raw_idx)
            self._raw_idx = np.sort(self._raw_idx[:max_size])
        self._xflip = np.zeros(self._raw_idx.size, dtype=np.uint8)
        if xflip:
            self._raw_idx = np.tile(self._raw_idx, 2)
            self._xflip = np.concatenate([self._xflip, np.ones_like(self._xflip)])
            if self._names[0].endswith(".npy"):
                warnings.warn(f"{self.path}: xflip on latents only approximates the latent of a mirrored image",
                              stacklevel=2)

    def cache_bytes(self) -> int:
        """What a full cache holds in one process: every distinct file, decoded."""
        item = int(np.prod(self.shape)) * self._load_raw(0).dtype.itemsize
        return item * len(np.unique(self._raw_idx))

    def identity(self) -> str:
        """A digest of which files, in which item order and flips, this dataset serves (for resume checks)."""
        digest = hashlib.sha256("\0".join(self._names).encode("utf-8", "surrogateescape"))
        digest.update(self._raw_idx.tobytes())
        digest.update(self._xflip.tobytes())
        return digest.hexdigest()[:16]

    @property
    def label_dim(self) -> int:
        return self.labels.shape[1]

    def __len__(self) -> int:
        return int(self._raw_idx.size)

    def _load_labels(self) -> np.ndarray:
        try:
            meta = json.loads(self._read("dataset.json"))
        except (KeyError, FileNotFoundError):
            return np.zeros((len(self._names), 0), np.float32)
        if meta.get("labels") is None:
            return np.zeros((len(self._names), 0), np.float32)
        table = {str(name).replace("\\", "/"): value for name, value in meta["labels"]}
        try:
            raw = np.array([table[name.replace("\\", "/")] for name in self._names])
        except KeyError as exc:
            raise FgdataError(f"{self.path}: dataset.json has no label for {exc.args[0]}") from None
        if raw.ndim == 1:
            onehot = np.zeros((raw.size, int(raw.max()) + 1), np.float32)
            onehot[np.arange(raw.size), raw.astype(np.int64)] = 1
            return onehot
        return raw.astype(np.float32)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        arr = self._load_raw(int(self._raw_idx[idx]))
        if self._xflip[idx]:
            arr = arr[:, :, ::-1]
        real = torch.from_numpy(np.ascontiguousarray(arr))
        real = real.float() / 127.5 - 1 if real.dtype == torch.uint8 else real.float()
        condition = torch.from_numpy(self.labels[self._raw_idx[idx]].copy())
        return {"real": real, "condition": condition, "neg_condition": torch.zeros_like(condition),
                "idx": torch.tensor(idx, dtype=torch.int64)}


class PositionSampler(torch.utils.data.Sampler[int]):
    """Infinite the reference order: position p → item π_e[p mod N], e = p // N; rank r takes start + r + k·W."""

    def __init__(self, n: int, rank: int = 0, world_size: int = 1, shuffle: bool = True, seed: int = 0,
                 start: int = 0):
        if n <= 0:
            raise FgdataError("the dataset is empty")
        self.n, self.rank, self.world, self.shuffle, self.seed, self.start = n, rank, world_size, shuffle, seed, start

    def permutation(self, epoch: int) -> np.ndarray:
        order = np.arange(self.n)
        if self.shuffle:
            np.random.RandomState((self.seed + epoch) % (2**32 - 1)).shuffle(order)
        return order

    def __len__(self) -> int:
        """This rank's positions in one epoch: ``r, r + W, ...`` below N."""
        return max(0, -(-(self.n - self.rank) // self.world))

    def __iter__(self) -> Iterator[int]:
        pos, epoch, order = self.start + self.rank, -1, np.empty(0, np.int64)
        while True:
            e, i = divmod(pos, self.n)
            if e != epoch:
                epoch, order = e, self.permutation(e)
            yield int(order[i])
            pos += self.world


class ImageLoader(torch.utils.data.DataLoader):
    """Infinite batches ``{real, condition, neg_condition, idx}`` from a class-conditional zip or folder.

    Example::

        loader = ImageLoader("DATA/cifar10/cifar10-32x32.zip", None, batch_size=128, xflip=True)
        batch = next(iter(loader))   # real [128,3,32,32] in [-1,1], condition [128,10]

    ``sampler_start_idx`` counts global samples already consumed (all ranks), so a resumed run continues the
    exact stream; ``state_dict()`` / ``load_state_dict()`` carry that position, as on the WDS loaders. Each
    ``iter()`` starts at the resume position. The stream never ends; ``len()`` is the batches of one epoch
    (this rank's share of the dataset), as for any DataLoader. ``cache`` defaults to False (opt-in, see the
    module docstring).
    """

    def __init__(self, dataset_path: str, s3_path: str | None, batch_size: int, use_labels: bool = True,
                 cache: bool = False, shuffle: bool = True, sampler_start_idx: int | None = 0, num_workers: int = 1,
                 pin_memory: bool = False, seed: int = 0, rank: int | None = None, world_size: int | None = None,
                 resolution: int | None = None, use_pyspng: bool = True, max_size: int | None = None,
                 xflip: bool = False, random_seed: int = 0, **loader_kwargs: Any):
        path = self._locate(str(dataset_path), s3_path)
        dataset = ImageZipDataset(path, resolution=resolution, use_pyspng=use_pyspng, max_size=max_size, xflip=xflip,
                                  random_seed=random_seed, use_labels=use_labels, cache=cache)
        rank, world_size = resolve_rank(rank, world_size)
        self.sampler_start_idx = checked_position(sampler_start_idx or 0, "sampler_start_idx")
        if cache:
            _warn_cache_size(dataset, max(num_workers, 1))
        sampler = PositionSampler(len(dataset), rank, world_size, shuffle, seed, self.sampler_start_idx)
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                         pin_memory=pin_memory, persistent_workers=False, **loader_kwargs)
        self.plan_hash = hashlib.sha256(f"{dataset.identity()}:{shuffle}:{seed}".encode()).hexdigest()[:16]
        self._resume_position = self._position = self.sampler_start_idx

    @property
    def loader(self) -> ImageLoader:
        """The torch ``DataLoader`` the reference's ``loader.loader`` names: this loader is one, so iterating it (and
        its resume state) is iterating this, as ``loader.loader`` is on the WDS loaders."""
        return self

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:  # type: ignore[override]
        """Batches from the resume position on, counting the samples delivered (all ranks) for :meth:`state_dict`."""
        sampler = self.sampler
        assert isinstance(sampler, PositionSampler)
        sampler.start = self._position = self._resume_position
        for batch in super().__iter__():
            self._position += len(batch["idx"]) * sampler.world
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Exact resume state: global samples consumed (all ranks), epoch, seed and a digest of the order."""
        sampler = self.sampler
        assert isinstance(sampler, PositionSampler)
        return {"position": self._position, "epoch": self._position // sampler.n, "seed": sampler.seed,
                "plan_hash": self.plan_hash}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; one saved for other files, another order or seed is refused."""
        if not isinstance(state, Mapping) or "position" not in state:
            raise FgdataError(f"load_state_dict: expected the dict that state_dict() returns, got {type(state).__name__}")
        position = checked_position(state["position"], "state['position']")
        if state.get("plan_hash") != self.plan_hash:
            raise FgdataError(
                f"cannot resume: the state was saved for order {state.get('plan_hash')} (seed {state.get('seed')}), "
                f"but this loader's files, shuffle and seed give {self.plan_hash}; resume with the same dataset and options"
            )
        self._resume_position = self._position = position

    @staticmethod
    def _locate(dataset_path: str, s3_path: str | None) -> str:
        """A local zip, else a local folder, else the S3 zip fetched once per node."""
        if os.path.isfile(dataset_path) or os.path.isdir(dataset_path):
            return dataset_path
        if s3_path and s3_path.endswith(".zip"):
            from fgdata.storage import fetch_to_cache, is_url

            if not is_url(s3_path):
                raise FgdataError(f"s3_path={s3_path} is not a URL such as s3://bucket/key.zip")
            # fetch_to_cache holds a file lock: the first process on a node downloads, the others wait and reuse it.
            return fetch_to_cache(s3_path, cache_dir=os.path.dirname(os.path.abspath(dataset_path)))
        raise OSError(f"{dataset_path}: no local zip or folder, and no s3_path ending in .zip to fetch")


def _warn_cache_size(dataset: ImageZipDataset, processes: int) -> None:
    """Say what ``cache=True`` will hold once it reaches :data:`CACHE_WARN_BYTES` or the available memory."""
    each = dataset.cache_bytes()
    total = each * processes
    avail = _available_memory()
    if total < CACHE_WARN_BYTES and not (avail and total > avail):
        return
    over = f"; that exceeds the {avail / 2**30:.1f} GiB available" if avail and total > avail else ""
    where = "one process" if processes == 1 else f"each of {processes} worker processes"
    warnings.warn(f"{dataset.path}: cache=True keeps about {each / 2**30:.1f} GiB of decoded samples in {where} "
                  f"({total / 2**30:.1f} GiB in all){over}", stacklevel=3)
