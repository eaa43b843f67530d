"""Batch collation and the one batch loop of the WDS loaders.

Collation rules:

Strings stay lists, arrays and tensors are stacked, Python ints become int64
tensors, dicts (JSON, cropping parameters, the audio-video modality dict) are
collated key by key and a list payload (SDXL's ``[tokens, pooled]``) becomes a
list of stacked tensors. ``None`` items are dropped before stacking, as the
reference's collation does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def collate(items: Sequence[Any]) -> Any:
    """Collate one field across the samples of a batch."""
    import torch

    items = [x for x in items if x is not None]
    if not items:
        return None
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
        return {k: collate([d.get(k) for d in items]) if all(k in d for d in items) else [d.get(k) for d in items] for k in keys}
    if isinstance(first, (list, tuple)):
        if all(isinstance(x, (list, tuple)) and len(x) == len(first) for x in items):
            return [collate([x[i] for x in items]) for i in range(len(first))]
        return list(items)
    return list(items)


def collate_samples(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A batch dict from sample dicts; keys follow the first sample's order."""
    keys = list(dict.fromkeys(k for s in samples for k in s))
    return {k: collate([s.get(k) for s in samples]) for k in keys}


@dataclass
class Delivered:
    """A built sample on its way into a batch: its global position (deterministic mode) and how many
    unusable positions were skipped to find it (0: it is the planned sample)."""

    sample: dict[str, Any]
    position: int | None = None
    skipped: int = 0


def batch_loop(
    items: Iterable[Delivered], batch_size: int, partial: bool, collate: Callable[[list[dict[str, Any]]], dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    """The one batch loop of the WDS loaders: ``batch_size`` items per batch; a short last batch only with ``partial``.

    Besides the collated fields a batch carries ``__index__`` (global positions, deterministic
    mode), ``__drops__`` (positions skipped) and ``__replaced__`` (positions whose planned
    sample was replaced); the loader pops the last two before delivering it.
    """
    pending: list[Delivered] = []
    for item in items:
        pending.append(item)
        if len(pending) == batch_size:
            yield _finish(pending, collate)
            pending = []
    if pending and partial:
        yield _finish(pending, collate)


def _finish(items: list[Delivered], collate: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> dict[str, Any]:
    batch = collate([d.sample for d in items])
    positions = [d.position for d in items if d.position is not None]
    if positions:
        import torch

        batch["__index__"] = torch.tensor(positions, dtype=torch.int64)
    batch["__drops__"] = sum(d.skipped for d in items)
    batch["__replaced__"] = [d.position for d in items if d.skipped]
    return batch
