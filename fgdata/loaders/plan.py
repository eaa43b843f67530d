"""The sample plan: which sample each global position delivers, as a pure function.

Everything here is plain numpy and holds O(number of shards) state, so a plan for
millions of shards is cheap to build in every worker and needs no coordination.

Definitions:

* **E**, the epoch stream: the selected shards in order, each shard's samples in
  tar order, minus ignored samples. ``N = len(E)``.
* The **global stream** ``G``: position ``p`` is epoch ``p // N``, item
  ``order_e(p % N)`` of E, where ``order_e`` is the identity or, with
  ``shuffle_block``, a seeded block-wise permutation for epoch ``e``. With
  ``train=False`` G is E once.
* Rank ``r`` of ``W`` takes positions ``start + r + k*W`` (k = 0, 1, ...). Batch
  ``j`` of a rank is its ``k`` in ``[j*B, (j+1)*B)``; worker ``w`` of ``n`` builds
  the batches ``j ≡ w (mod n)``. Because torch's DataLoader hands out worker
  batches round-robin, in order, the delivered order equals the 1-worker order.

Block-wise shuffle: E is cut into blocks of ``shuffle_block`` consecutive items.
Epoch ``e`` visits the blocks in the order of a permutation drawn from
``SeedSequence([seed, e])`` and each block's items in the order of a permutation
drawn from ``SeedSequence([seed, e, block])``. Consecutive positions stay within
one block (one shard region), which keeps reads local.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


class EpochStream:
    """E as a mapping from epoch index to (shard index, sample index in shard).

    ``counts[s]`` is the number of samples physically in shard ``s`` and
    ``ignored[s]`` the sample indices to remove from it.
    """

    def __init__(self, counts: Sequence[int], ignored: Sequence[Sequence[int]] | None = None):
        self.counts = np.asarray(counts, dtype=np.int64)
        if self.counts.ndim != 1 or (self.counts < 0).any():
            raise ValueError("shard counts must be a list of non-negative integers")
        ignored = ignored or [()] * len(self.counts)
        if len(ignored) != len(self.counts):
            raise ValueError("one ignore list per shard is required")
        self._kept: dict[int, np.ndarray] = {}
        kept_counts = self.counts.copy()
        for s, skip in enumerate(ignored):
            if len(skip):
                kept = np.setdiff1d(np.arange(self.counts[s]), np.asarray(skip, dtype=np.int64))
                self._kept[s] = kept
                kept_counts[s] = len(kept)
        self.kept_counts = kept_counts
        self.offsets = np.concatenate([[0], np.cumsum(kept_counts)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """Shard index and sample index (in tar order) of item ``index`` of E."""
        if not 0 <= index < len(self):
            raise IndexError(f"epoch index {index} outside [0, {len(self)})")
        shard = int(np.searchsorted(self.offsets, index, side="right") - 1)
        local = index - int(self.offsets[shard])
        kept = self._kept.get(shard)
        return shard, int(kept[local]) if kept is not None else local

    def fingerprint(self) -> list:
        """What identifies E: counts and the kept indices of shards with ignored samples."""
        return [self.counts.tolist(), {str(s): k.tolist() for s, k in sorted(self._kept.items())}]


@lru_cache(maxsize=64)
def _permutation(n: int, *entropy: int) -> np.ndarray:
    """A seeded permutation of ``range(n)``; cached because consecutive positions share blocks."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(entropy)))).permutation(n)


@lru_cache(maxsize=4)
def _block_layout(n: int, b: int, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """Block visiting order of an epoch and the epoch offset where each visited block starts.

    Every block holds ``b`` items except the last block of E, which may be shorter.
    """
    n_blocks = -(-n // b)
    order = _permutation(n_blocks, seed, epoch)
    lengths = np.where(order == n_blocks - 1, n - (n_blocks - 1) * b, b)
    return order, np.concatenate([[0], np.cumsum(lengths)[:-1]])


@dataclass(frozen=True)
class PlannedSample:
    """What a global position resolves to."""

    position: int
    epoch: int
    shard: int
    index: int


class SamplePlan:
    """Global position -> sample, for one epoch stream, seed and shuffle policy."""

    def __init__(self, stream: EpochStream, *, seed: int = 0, shuffle_block: int | None = None, train: bool = True):
        if len(stream) == 0:
            raise ValueError("the epoch stream is empty")
        if shuffle_block is not None and shuffle_block < 1:
            raise ValueError("shuffle_block must be a positive integer or None")
        if seed < 0:
            raise ValueError("seed must be non-negative")
        self.stream = stream
        self.seed = int(seed)
        self.shuffle_block = shuffle_block
        self.train = train

    def __len__(self) -> int:
        """Items per epoch (N)."""
        return len(self.stream)

    @property
    def hash(self) -> str:
        """Identifies the order: a resume state from another dataset, seed or shuffle is refused."""
        payload = json.dumps(
            {"E": self.stream.fingerprint(), "seed": self.seed, "block": self.shuffle_block, "train": self.train},
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def _order(self, epoch: int, j: int) -> int:
        """Item of E delivered at offset ``j`` of epoch ``epoch``."""
        b = self.shuffle_block
        if b is None:
            return j
        block_order, starts = _block_layout(len(self), b, self.seed, epoch)
        k = int(np.searchsorted(starts, j, side="right") - 1)
        block = int(block_order[k])
        length = min(b, len(self) - block * b)
        return block * b + int(_permutation(length, self.seed, epoch, block)[j - int(starts[k])])

    def at(self, position: int) -> PlannedSample:
        """The sample at global position ``position`` (epochs repeat only when training)."""
        if position < 0:
            raise IndexError("positions are non-negative")
        n = len(self)
        epoch, j = divmod(position, n)
        if epoch and not self.train:
            raise IndexError(f"position {position} is past the single pass of {n} samples (train=False)")
        shard, index = self.stream.locate(self._order(epoch, j))
        return PlannedSample(position, epoch, shard, index)


@dataclass(frozen=True)
class Split:
    """How one worker of one rank walks the global stream."""

    start: int
    rank: int
    world_size: int
    worker: int
    num_workers: int
    batch_size: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        if not 0 <= self.worker < max(self.num_workers, 1):
            raise ValueError(f"worker {self.worker} outside {self.num_workers} workers")
        if self.batch_size < 1 or self.start < 0:
            raise ValueError("batch_size must be positive and start non-negative")

    def rank_position(self, k: int) -> int:
        """Global position of the rank's k-th sample."""
        return self.start + self.rank + k * self.world_size

    def rank_length(self, total: int | None) -> int | None:
        """How many samples the rank gets from a finite stream of ``total`` positions."""
        if total is None:
            return None
        first = self.start + self.rank
        return max(0, -(-(total - first) // self.world_size))

    def batches(self, total: int | None = None, partial: bool = False) -> Iterator[list[int]]:
        """This worker's batches, as lists of global positions, in delivery order.

        ``total`` bounds the stream (train=False); the rank's last short batch is
        kept only with ``partial``.
        """
        n = max(self.num_workers, 1)
        limit = self.rank_length(total)
        j = self.worker
        while True:
            lo, hi = j * self.batch_size, (j + 1) * self.batch_size
            if limit is not None:
                if lo >= limit or (hi > limit and not partial):
                    return
                hi = min(hi, limit)
            yield [self.rank_position(k) for k in range(lo, hi)]
            j += n
