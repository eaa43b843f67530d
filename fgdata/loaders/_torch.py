"""The torch side of the loaders: an IterableDataset over a loader's worker batches.

Kept apart so ``import fgdata.loaders`` does not import torch; this module is
imported when a loader is first iterated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

if TYPE_CHECKING:
    from fgdata.loaders.wds import BaseWDSLoader


class WorkerBatches(IterableDataset):
    """Each DataLoader worker yields the batches its (worker id, worker count) owns."""

    def __init__(self, loader: "BaseWDSLoader", start: int, epoch: int):
        super().__init__()
        self.loader = loader
        self.start = start
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        yield from self.loader.worker_batches(self.start, self.epoch, worker, workers)


def _unchanged(batch: dict[str, Any]) -> dict[str, Any]:
    """Batches are collated inside the workers already."""
    return batch


def iterate(loader: "BaseWDSLoader", start: int, epoch: int) -> Iterator[dict[str, Any]]:
    """Batches in delivery order.

    torch's DataLoader takes one batch from each worker in turn, in order, so
    worker ``w`` owning batches ``j ≡ w (mod n)`` reproduces the 1-worker order.
    """
    dataset = WorkerBatches(loader, start, epoch)
    if loader.num_workers == 0:
        return iter(dataset)
    return iter(DataLoader(dataset, batch_size=None, num_workers=loader.num_workers, collate_fn=_unchanged))
