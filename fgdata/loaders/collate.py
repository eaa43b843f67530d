"""Batch collation with the rules of.

Strings stay lists, arrays and tensors are stacked, Python ints become int64
tensors, dicts (JSON, cropping parameters, the audio-video modality dict) are
collated key by key and a list payload (SDXL's ``[tokens, pooled]``) becomes a
list of stacked tensors. ``None`` items are dropped before stacking, as the
reference's collation does.
"""

from __future__ import annotations

from typing import Any, Sequence

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
