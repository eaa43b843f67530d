"""Batch collation and the one batch loop of the WDS loaders.

Decoded pixels go straight into their batch: :class:`BatchSlots` hands a decoder the row of a
preallocated ``[B, ...]`` tensor for its sample, the media function converts each frame once
into that row, and collation delivers the tensor itself. A 81-frame 480p clip is 390 MB of
float32; stacking it again after decoding was a third of the video loaders' time.

Collation rules:

Strings stay lists, arrays and tensors are stacked, Python ints become int64
tensors, dicts (JSON, cropping parameters, the audio-video modality dict) are
collated key by key and a list payload (SDXL's ``[tokens, pooled]``) becomes a
list of stacked tensors. ``None`` items are dropped before stacking, as the
reference's collation does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class BatchSlots:
    """Rows of preallocated batch tensors, one per output key, for decoders to write samples into.

    The batch loop calls :meth:`next_row` before it pulls each sample; a decoder asks
    :meth:`row` for its key and shape and writes there. A pull delivers one sample, so a build
    that fails (a drop) leaves its row to the next attempt in the same pull. Tensors are new for
    every batch (the previous one belongs to whoever received it), from numpy's allocator (large
    arrays get transparent huge pages: several times fewer page faults for a fresh 390 MB clip than
    torch's allocator); inside a DataLoader worker moved to shared memory before it is written (the
    batch then crosses to the main process without a copy).
    """

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self._row = 0
        self._tensors: dict[str, Any] = {}
        self._keys: dict[int, str] = {}  # id(row view) -> key
        self._handed: dict[tuple[str, int], np.ndarray] = {}

    def next_row(self, row: int) -> None:
        """The next sample built goes into ``row``; row 0 starts a new batch."""
        if row == 0:
            self._tensors, self._keys, self._handed = {}, {}, {}
        self._row = row

    def _allocate(self, shape: tuple[int, ...]) -> Any:
        import torch
        from torch.utils.data import get_worker_info

        tensor = torch.from_numpy(np.empty((self.batch_size, *shape), np.float32))
        # share_memory_() copies the unwritten buffer into shared memory once, which torch's private
        # direct allocation spares: about 30 ms of CPU per 390 MB clip batch (2-50 ms over five
        # runs), some 4 % of a worker's time per clip at the reference's video settings, 1 % for
        # 256² images (benchmarks/RESULTS.md). numpy's buffer, advised for huge pages, reads as the
        # huge zero page; copying a torch.empty one costs twice as much.
        return tensor.share_memory_() if get_worker_info() is not None else tensor

    def row(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        """The float32 ``shape`` row of ``key``'s batch tensor for the sample being built."""
        handed = self._handed.get((key, self._row))
        if handed is not None:  # a retry in the same pull: the failed build's row is free
            return handed
        tensor = self._tensors.get(key)
        if tensor is None or tuple(tensor.shape[1:]) != shape:
            if tensor is not None:  # another shape in the same batch: this sample stacks instead
                return np.empty(shape, np.float32)
            tensor = self._tensors[key] = self._allocate(shape)
        view = tensor[self._row].numpy()
        self._handed[(key, self._row)] = view
        self._keys[id(view)] = key
        return view

    def claim(self, items: Sequence[Any]) -> Any:
        """``key``'s tensor (its first ``len(items)`` rows) when ``items`` are exactly its rows 0, 1, ...; else None."""
        key = self._keys.get(id(items[0]))
        if key is None:
            return None
        if any(self._handed.get((key, i)) is not x for i, x in enumerate(items)):
            return None
        tensor = self._tensors[key]
        return tensor if len(items) == self.batch_size else tensor[: len(items)]


def collate(items: Sequence[Any], slots: BatchSlots | None = None) -> Any:
    """Collate one field across the samples of a batch; rows of a slot tensor are that tensor."""
    import torch

    items = [x for x in items if x is not None]
    if not items:
        return None
    if slots is not None and isinstance(items[0], np.ndarray):
        claimed = slots.claim(items)
        if claimed is not None:
            return claimed
    first = items[0]
    if isinstance(first, (str, bytes)):
        return list(items)
    if isinstance(first, torch.Tensor):
        return torch.stack(list(items))
    if isinstance(first, np.ndarray):
        if first.dtype.kind in "USO":  # string arrays do not become tensors
            return list(items)
        return torch.stack([torch.from_numpy(np.ascontiguousarray(x)) for x in items])
    if isinstance(first, (bool, np.bool_)):
        return torch.tensor(items, dtype=torch.bool)
    if isinstance(first, (int, np.integer)):
        return torch.tensor([int(x) for x in items], dtype=torch.int64)
    if isinstance(first, (float, np.floating)):
        return torch.tensor([float(x) for x in items], dtype=torch.float64)
    if isinstance(first, dict):
        keys = list(dict.fromkeys(k for d in items for k in d))
        return {k: collate([d.get(k) for d in items], slots) if all(k in d for d in items) else [d.get(k) for d in items]
                for k in keys}
    if isinstance(first, (list, tuple)):
        if all(isinstance(x, (list, tuple)) and len(x) == len(first) for x in items):
            return [collate([x[i] for x in items], slots) for i in range(len(first))]
        return list(items)
    return list(items)


def collate_samples(samples: Sequence[dict[str, Any]], slots: BatchSlots | None = None) -> dict[str, Any]:
    """A batch dict from sample dicts; keys follow the first sample's order."""
    keys = list(dict.fromkeys(k for s in samples for k in s))
    return {k: collate([s.get(k) for s in samples], slots) for k in keys}


@dataclass
class Delivered:
    """A built sample on its way into a batch: its global position (deterministic mode) and how many
    unusable positions were skipped to find it (0: it is the planned sample)."""

    sample: dict[str, Any]
    position: int | None = None
    skipped: int = 0


@dataclass
class Batch:
    """A collated batch and the control data that stays the loader's own.

    ``drops`` counts the unusable positions skipped to fill it; ``replaced`` lists the positions
    whose planned sample was replaced by the next usable one. A DataLoader worker sends the whole
    object to the main process, where the loader counts the control data and delivers ``data``
    alone: the user's batch dict never holds a key the loader would have to take out again.
    """

    data: dict[str, Any]
    drops: int = 0
    replaced: list[int] = field(default_factory=list)


Collator = Callable[[list[dict[str, Any]], "BatchSlots | None"], dict[str, Any]]


def batch_loop(
    items: Iterable[Delivered], batch_size: int, partial: bool, collate: Collator, slots: BatchSlots | None = None
) -> Iterator[Batch]:
    """The one batch loop of the WDS loaders: ``batch_size`` items per batch; a short last batch only with ``partial``.

    Besides the collated fields a batch dict carries ``__index__`` (global positions,
    deterministic mode), a diagnostic for the user. With ``slots``, each sample is built into
    its row of the batch's tensors (a source builds the sample it delivers during the pull that
    delivers it).
    """
    pending: list[Delivered] = []
    stream = iter(items)
    while True:
        if slots is not None:
            slots.next_row(len(pending))
        item = next(stream, None)
        if item is None:
            break
        pending.append(item)
        if len(pending) == batch_size:
            yield _finish(pending, collate, slots)
            pending = []
    if pending and partial:
        yield _finish(pending, collate, slots)


def _finish(items: list[Delivered], collate: Collator, slots: BatchSlots | None) -> Batch:
    data = collate([d.sample for d in items], slots)
    positions = [d.position for d in items if d.position is not None]
    if positions:
        import torch

        data["__index__"] = torch.tensor(positions, dtype=torch.int64)
    replaced = [d.position for d in items if d.skipped and d.position is not None]
    return Batch(data, drops=sum(d.skipped for d in items), replaced=replaced)
