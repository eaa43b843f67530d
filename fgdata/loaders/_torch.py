"""The torch side of the loaders: an IterableDataset over a loader's worker batches.

Kept apart so ``import fgdata.loaders`` does not import torch; this module is
imported when a loader is first iterated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, IterableDataset

from fgdata.errors import FgdataError
from fgdata.loaders.collate import Batch
from fgdata.loaders.ranks import worker_slot

if TYPE_CHECKING:
    from fgdata.loaders.wds import BaseWDSLoader


@dataclass(frozen=True)
class WorkerFailure:
    """A worker's FgdataError on its way to the main process, in place of the batch it could not build,
    so the user gets the one-line message instead of torch's wrapped traceback text."""

    error_type: type[Exception]
    message: str

    def error(self) -> Exception:
        """The error to raise here: its own class when that takes one message."""
        try:
            return self.error_type(self.message)
        except TypeError:  # a class with another constructor: the message is what matters
            return FgdataError(self.message)


class WorkerBatches(IterableDataset):
    """Each DataLoader worker yields the batches its (worker id, worker count) owns."""

    def __init__(self, loader: BaseWDSLoader, start: int, epoch: int):
        super().__init__()
        self.loader = loader
        self.start = start
        self.epoch = epoch

    def __iter__(self) -> Iterator[Batch | WorkerFailure]:
        worker, workers = worker_slot()
        try:
            yield from self.loader.worker_batches(self.start, self.epoch, worker, workers)
        except FgdataError as exc:
            if self.loader.num_workers == 0:
                raise
            yield WorkerFailure(type(exc), str(exc))


def _raise_worker_errors(items: Iterator[Batch | WorkerFailure]) -> Iterator[Batch]:
    """The workers' batches; a worker's FgdataError is raised again in this process.

    Whatever ends the stream, the workers' iterator leaves this frame at once, so its workers stop now.
    A raised error's traceback keeps this frame alive; an iterator freed later by the garbage collector
    has its queues' feeder threads closed before its own shutdown runs, so the workers never get the
    stop message and torch waits 5 s for each before killing it, at some unrelated later moment.
    """
    try:
        for item in items:
            if isinstance(item, WorkerFailure):
                raise item.error()
            yield item
    finally:
        del items


def _unchanged(batch: Any) -> Any:
    """Batches are collated inside the workers already."""
    return batch


class LoaderView(DataLoader):
    """``loader.loader``, as the reference's WDS loaders expose it: a torch DataLoader whose iteration and
    ``len()`` are the owning loader's own, so the resume state and warnings stay in one place."""

    def __init__(self, owner: BaseWDSLoader):
        super().__init__(WorkerBatches(owner, 0, 0), batch_size=None, num_workers=owner.num_workers,
                         collate_fn=_unchanged)
        self.owner = owner

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        return iter(self.owner)

    def __len__(self) -> int:
        return len(self.owner)


def iterate(loader: BaseWDSLoader, start: int, epoch: int) -> Iterator[Batch]:
    """Batches in delivery order, with their control data (the loader unwraps them).

    torch's DataLoader takes one batch from each worker in turn, in order, so
    worker ``w`` owning batches ``j ≡ w (mod n)`` reproduces the 1-worker order.
    """
    dataset = WorkerBatches(loader, start, epoch)
    if loader.num_workers == 0:  # the dataset raises in this process itself
        return _raise_worker_errors(iter(dataset))
    return _raise_worker_errors(iter(DataLoader(dataset, batch_size=None, num_workers=loader.num_workers, collate_fn=_unchanged)))
