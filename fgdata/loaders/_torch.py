"""The torch side of the loaders: an IterableDataset over a loader's worker batches.

Kept apart so ``import fgdata.loaders`` does not import torch; this module is
imported when a loader is first iterated.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, IterableDataset

from fgdata.loaders.ranks import worker_slot

if TYPE_CHECKING:
    from fgdata.loaders.wds import BaseWDSLoader


class WorkerBatches(IterableDataset):
    """Each DataLoader worker yields the batches its (worker id, worker count) owns."""

    def __init__(self, loader: BaseWDSLoader, start: int, epoch: int):
        super().__init__()
        self.loader = loader
        self.start = start
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker, workers = worker_slot()
        yield from self.loader.worker_batches(self.start, self.epoch, worker, workers)


def _unchanged(batch: Any) -> Any:
    """Batches are collated inside the workers already."""
    return batch


def iterate(loader: BaseWDSLoader, start: int, epoch: int) -> Iterator[dict[str, Any]]:
    """Batches in delivery order.

    torch's DataLoader takes one batch from each worker in turn, in order, so
    worker ``w`` owning batches ``j ≡ w (mod n)`` reproduces the 1-worker order.
    """
    dataset = WorkerBatches(loader, start, epoch)
    if loader.num_workers == 0:
        return iter(dataset)
    return iter(DataLoader(dataset, batch_size=None, num_workers=loader.num_workers, collate_fn=_unchanged))
