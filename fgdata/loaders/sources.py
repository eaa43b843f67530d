"""Sample sources: which samples a worker reads, in which order, and what happens to unusable ones.

Each source has ``items(start, epoch, worker, num_workers)``, the built samples of one
worker in delivery order, and ``empty_message(...)``, why a worker that got no batch got none.

* :class:`DeterministicSource`: the positions of :mod:`fgdata.loaders.plan`, read by random
  access (the shard's offset index; S3 shards through a node-local cached copy). The drop
  rule: when the sample at position ``p`` cannot be used, the next usable one of
  ``p+1, p+2, ...`` is delivered instead, its random choices seeded from ``(seed, p, attempt)``.
* :class:`TrainingSource`: an infinite stream; shards drawn uniformly with replacement,
  samples through a shuffle buffer bounded in samples and bytes, seeded from
  ``(seed, rank, worker, epoch)``.
* :class:`ValidationSource`: shard ``i`` goes to rank ``i mod W``, then to the rank's workers
  in turn; one pass, in order.

Every source reads only the members the builder needs and checks what the count file
promised against what the shard holds.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from fgdata import storage
from fgdata.errors import FgdataError, StorageError
from fgdata.loaders.builder import (
    DROPPABLE,
    ScoreJoin,
    KeyAudit,
    RawSample,
    SampleBuilder,
    SampleContext,
    SampleDropped,
)
from fgdata.loaders.collate import BatchSlots, Delivered
from fgdata.loaders.plan import SamplePlan, Split
from fgdata.loaders.selection import COUNT_FIX, Dataset, ShardRef, count_mismatch
from fgdata.media.errors import ClipTooShort
from fgdata.formatting import terminal_safe
from fgdata.shards import ShardFile, scan_shard
from fgdata.shards.scan import BLOCK
from fgdata.shards.scan import TarDamage, group_samples, iter_members

log = logging.getLogger("fgdata.loaders")

# How many samples the training shuffle buffer holds before it starts yielding.
SHUFFLE_WARMUP = 100
#: How many different shards in a row may fail on storage before the training stream raises the storage error. One
#: shard's storage may fail alone (a vanished file, one bad object); a second in a row means the storage itself is
#: failing, and waiting for every shard's stall timeouts would take time in proportion to the shard count.
STORAGE_FAULT_SHARDS = 2


class Drops:
    """Per-reason drop counters with rate-limited log lines; ``strict`` raises instead."""

    def __init__(self, strict: bool):
        self.strict = strict
        self.counts: Counter[str] = Counter()

    def fail(self, where: str, exc: BaseException) -> None:
        reason = str(exc) or type(exc).__name__
        if self.strict:
            raise FgdataError(f"{where}: {reason} (strict=True)") from exc
        kind = reason.split(":", 1)[0] if isinstance(exc, SampleDropped) else type(exc).__name__
        self.counts[kind] += 1
        n = self.counts[kind]
        if n <= 5 or n % 1000 == 0:
            log.warning("dropped %s: %s (%d so far for %r)", terminal_safe(where), terminal_safe(reason), n, kind)


def _ext_of(name: str) -> str:
    """The member's extension by the key rule (after the first dot of the basename), lower-cased."""
    base = name.rsplit("/", 1)[-1]
    return base.split(".", 1)[1].lower() if "." in base else ""


class ShardReaders:
    """Open shards of one worker (LRU), read by sample index; S3 shards from a node-local cached copy.

    Opening a shard checks its sample count against the plan's: a stale offset index is
    replaced by a header scan, and a count that still differs is an error (every later
    position would shift). The first opening of each shard also hands the member extensions of
    all its samples (from the header scan, no payload read) to ``audit``, which raises when a
    mapped key is absent from the whole shard.
    """

    def __init__(self, dataset: Dataset, cache_path: str | None, wanted: frozenset[str] | None,
                 audit: KeyAudit | None = None, size: int = 8, scores: ScoreJoin | None = None):
        self.dataset = dataset
        self.scores = scores  # the samples that scores give a json (the audit counts it)
        self.cache_path = cache_path
        self.wanted = set(wanted) if wanted is not None else None
        self.audit = audit
        self.size = size
        self._open: OrderedDict[str, ShardFile] = OrderedDict()
        self._audited: set[str] = set()

    def _shard(self, ref: ShardRef, promised: int) -> ShardFile:
        f = self._open.pop(ref.path, None)
        if f is None:
            local = storage.fetch_to_cache(ref.path, self.cache_path)
            f = ShardFile(local, scan=self.dataset.scans.get(ref.path))
            if len(f) != promised:
                f.close()
                f = ShardFile(local, scan=scan_shard(local, read_ahead=BLOCK))
            if len(f) != promised:
                f.close()
                raise FgdataError(
                    f"{count_mismatch(ref, len(f), promised, self.dataset.count_source(ref))}: deterministic positions would "
                    f"repeat or skip samples; {COUNT_FIX}"
                )
            if self.audit is not None and ref.path not in self._audited:
                self._audited.add(ref.path)
                exts: Counter[str] = Counter()
                for entry in f.entries:
                    members = list(entry.members)
                    if self.scores is not None and "json" not in members and self.scores.fields(ref.path, entry.key):
                        members.append("json")
                    exts.update(members)
                try:
                    self.audit.shard_read(ref, len(f), exts)
                except BaseException:
                    f.close()
                    raise
            if len(self._open) >= self.size:
                self._open.popitem(last=False)[1].close()
        self._open[ref.path] = f
        return f

    def read(self, shard: int, index: int) -> RawSample:
        ref = self.dataset.shards[shard]
        assert self.dataset.counts is not None
        f = self._shard(ref, self.dataset.counts[shard])
        sample = f.sample(index, self.wanted)
        return RawSample(sample.key, sample.members, tuple(f.entries[index].members), ref, index)

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()


class ShuffleBuffer:
    """Random-out buffer capped by sample count and by payload bytes."""

    def __init__(self, size: int, max_bytes: int, rng: np.random.Generator):
        self.size = max(1, size)
        self.max_bytes = max_bytes
        self.rng = rng
        self.items: list[tuple[RawSample, ShardRef, int]] = []
        self.bytes = 0
        self._pushes = 0

    def _pop(self) -> tuple[RawSample, ShardRef]:
        i = int(self.rng.integers(len(self.items)))
        self.items[i], self.items[-1] = self.items[-1], self.items[i]
        sample, ref, nbytes = self.items.pop()
        self.bytes -= nbytes
        return sample, ref

    def push(self, sample: RawSample, ref: ShardRef) -> Iterator[tuple[RawSample, ShardRef]]:
        """Add a sample; yield what leaves the buffer.

        After the warm-up, one sample leaves per push once the buffer is full and
        one per two pushes while it is still growing (as webdataset's shuffle grows
        its buffer); the byte cap evicts further samples at once.
        """
        nbytes = sum(len(v) for v in sample.members.values())
        self.items.append((sample, ref, nbytes))
        self.bytes += nbytes
        self._pushes += 1
        if len(self.items) >= min(SHUFFLE_WARMUP, self.size) and (len(self.items) >= self.size or self._pushes % 2 == 0):
            yield self._pop()
        while len(self.items) > 1 and self.bytes > self.max_bytes:
            yield self._pop()


@dataclass
class Reading:
    """What every source shares: the dataset, the builder, the drop policy and the read options."""

    dataset: Dataset
    builder: SampleBuilder
    drops: Drops
    seed: int
    rank: int
    world_size: int
    batch_size: int
    cache_path: str | None
    max_consecutive_errors: int
    warned_counts: set[str]
    slots: BatchSlots | None = None

    def stream(self, ref: ShardRef, ignored: frozenset[str]) -> Iterator[RawSample]:
        """One shard in tar order without ignored samples, reading only the members the builder needs.

        Damage ends the shard with a drop (``strict`` raises). Storage that fails (an S3 endpoint
        that stalls or dies mid-read, a refused connection, a vanished file) raises its
        StorageError, which names the shard: that is not bad data, so the caller decides (the
        validation pass fails; the training stream draws another shard, up to
        :data:`STORAGE_FAULT_SHARDS` failing in a row).
        A shard read to its end whose count differs from the count file warns once: the stream
        uses what the shard really holds.
        """
        wanted = self.builder.wanted
        keep = (lambda name: _ext_of(name) in wanted) if wanted is not None else True
        count = 0
        exts: Counter[str] = Counter()
        problems: list[str] = []
        try:
            with storage.open_read(ref.path) as f:
                for entry, data in group_samples(iter_members(f, seekable=False, with_data=keep), problems):
                    raw = self.builder.joined(RawSample(entry.key, data, tuple(entry.members), ref, count))
                    count += 1
                    exts.update(raw.exts)
                    if raw.key in ignored:
                        continue
                    self.builder.audit.sample_read(raw)
                    yield raw
        except TarDamage as exc:
            self.drops.fail(ref.path, SampleDropped(f"damaged shard: {exc}"))
            return
        self.builder.audit.shard_read(ref, count, exts)
        promised = self.dataset.listed.get(ref.path)
        if promised is not None and promised != count and ref.path not in self.warned_counts:
            self.warned_counts.add(ref.path)
            warnings.warn(f"{count_mismatch(ref, count, promised, self.dataset.count_source(ref))}; using the {count} it holds. {COUNT_FIX}", stacklevel=2)

    def use(self, raw: RawSample, ctx: SampleContext) -> dict | None:
        """The built sample, or None after recording the drop."""
        try:
            return self.builder.build(raw, ctx)
        except DROPPABLE as exc:
            self.drops.fail(f"{raw.ref.path} key {raw.key!r}", exc)
            return None


class DeterministicSource:
    """The plan's positions for one worker of one rank, under the drop rule."""

    def __init__(self, reading: Reading, plan: SamplePlan, train: bool, partial: bool):
        self.r = reading
        self.plan = plan
        self.train = train
        self.partial = partial

    def total(self) -> int | None:
        return None if self.train else len(self.plan)

    def items(self, start: int, epoch: int, worker: int, num_workers: int) -> Iterator[Delivered]:
        r = self.r
        split = Split(start, r.rank, r.world_size, worker, max(num_workers, 1), r.batch_size)
        readers = ShardReaders(r.dataset, r.cache_path, r.builder.wanted, r.builder.audit,
                               scores=r.builder.scores if r.builder.joins_scores else None)
        try:
            for positions in split.batches(self.total(), self.partial):
                for p in positions:
                    yield self._at(p, readers)
        finally:
            readers.close()

    def empty_message(self, start: int, worker: int, num_workers: int) -> str | None:
        r = self.r
        split = Split(start, r.rank, r.world_size, worker, max(num_workers, 1), r.batch_size)
        total = self.total()
        return (
            f"rank {r.rank} worker {worker} of {num_workers} got no batch: its share of the "
            f"{total} samples after position {start} is {split.rank_length(total)}, less than batch_size={r.batch_size}; "
            "use fewer workers, partial=True or empty_check=False"
        )

    def _at(self, position: int, readers: ShardReaders) -> Delivered:
        """The sample for ``position``: the planned one, else the next usable one."""
        r = self.r
        n = len(self.plan)
        reasons: list[BaseException] = []
        for attempt in range(r.max_consecutive_errors + 1):
            q = position + attempt
            planned = self.plan.at(q if self.train else q % n)
            ref = r.dataset.shards[planned.shard]
            where = f"{ref.path} sample #{planned.index} (position {q})"
            try:
                raw = r.builder.joined(readers.read(planned.shard, planned.index))
                r.builder.audit.sample_read(raw)
                where = f"{ref.path} key {raw.key!r} (position {q})"
                entropy = [r.seed, position] + ([attempt] if attempt else [])
                sample = r.builder.build(raw, SampleContext(np.random.default_rng(entropy), position, slots=r.slots))
                return Delivered(sample, position, attempt)
            except DROPPABLE as exc:
                r.drops.fail(where, exc)
                reasons.append(exc)
        count = r.max_consecutive_errors + 1
        if all(isinstance(e, ClipTooShort) for e in reasons):
            raise FgdataError(r.builder.audit.too_short_message(count, str(reasons[-1])) + f" (from position {position})")
        raise FgdataError(
            f"{count} consecutive unusable samples from position {position} (last: {reasons[-1]}); "
            "run `fgdata verify` and pass its ignore index"
        )


class TrainingSource:
    """Shards drawn uniformly with replacement, through a shuffle buffer; never ends.

    A shard whose storage fails is skipped with a drop and not drawn again until another shard was read to its
    end; when :data:`STORAGE_FAULT_SHARDS` different shards fail in a row (every shard, when there are fewer;
    ``strict``: the first) the storage error is raised. Each failure is bounded by the storage layer's retries and
    stall timeout, so the stream gives up within a bounded time whatever the shard count.
    """

    def __init__(self, reading: Reading, shuffle_size: int, shuffle_bytes: int, tags: list[str]):
        self.r = reading
        self.shuffle_size = shuffle_size
        self.shuffle_bytes = shuffle_bytes
        self.tags = tags

    def items(self, start: int, epoch: int, worker: int, num_workers: int) -> Iterator[Delivered]:
        r = self.r
        shards = r.dataset.shards
        rng = np.random.default_rng([r.seed, r.rank, worker, epoch])
        buffer = ShuffleBuffer(self.shuffle_size, self.shuffle_bytes, rng)
        ignored = dict(zip((s.path for s in shards), r.dataset.ignored_keys))
        failures = empty_draws = 0
        give_up = 1 if r.drops.strict else min(len(shards), STORAGE_FAULT_SHARDS)
        unreadable: list[str] = []  # shards whose storage failed since a shard was last read to its end
        while True:
            ref = shards[int(rng.integers(len(shards)))]
            if ref.path in unreadable:
                continue  # read it again only after another shard was read: its failure is known
            read = 0
            try:
                for raw in r.stream(ref, ignored[ref.path]):
                    read += 1
                    for sample, src in buffer.push(raw, ref):
                        out = r.use(sample, SampleContext(rng, slots=r.slots))
                        failures = 0 if out is not None else failures + 1
                        if failures > r.max_consecutive_errors:
                            raise FgdataError(f"{failures} consecutive unusable samples (last from {src.path}); run `fgdata verify`")
                        if out is not None:
                            yield Delivered(out)
            except StorageError as exc:
                unreadable.append(ref.path)
                line = str(exc).splitlines()[0]
                if len(unreadable) >= give_up:  # the storage, not one shard: stop before trying every shard
                    if len(unreadable) == 1:
                        raise StorageError(line) from exc
                    raise StorageError(f"{len(unreadable)} different shards in a row could not be read, a storage "
                                       f"fault (the training stream gives up after {give_up}); the last: {line}") from exc
                r.drops.fail(ref.path, SampleDropped(f"unreadable shard: {line}"))
                continue
            unreadable.clear()
            empty_draws = 0 if read else empty_draws + 1
            if empty_draws > 3 * len(shards) + 10:
                raise FgdataError(f"no usable samples in {len(shards)} shard(s) under {', '.join(self.tags)}")

    def empty_message(self, start: int, worker: int, num_workers: int) -> str | None:
        return None  # an endless stream: it never ends empty


class ValidationSource:
    """This rank's shards, split over its workers; one pass in order."""

    def __init__(self, reading: Reading, partial: bool):
        self.r = reading
        self.partial = partial

    def mine(self, worker: int, num_workers: int) -> list[int]:
        r = self.r
        return [i for i in range(len(r.dataset.shards)) if i % r.world_size == r.rank][worker :: max(num_workers, 1)]

    def items(self, start: int, epoch: int, worker: int, num_workers: int) -> Iterator[Delivered]:
        r = self.r
        rng = np.random.default_rng([r.seed, r.rank, worker])
        for i in self.mine(worker, num_workers):
            ref = r.dataset.shards[i]
            for raw in r.stream(ref, r.dataset.ignored_keys[i]):
                out = r.use(raw, SampleContext(rng, slots=r.slots))
                if out is not None:
                    yield Delivered(out)

    def empty_message(self, start: int, worker: int, num_workers: int) -> str | None:
        r = self.r
        n = max(num_workers, 1)
        mine = self.mine(worker, num_workers)
        return (
            f"rank {r.rank} worker {worker} of {n} got no batch: {len(r.dataset.shards)} shard(s) for "
            f"{r.world_size} rank(s) x {n} worker(s) gives it {len(mine)} shard(s)"
            + ("" if mine else "; use fewer workers or ranks, or more shards")
            + ("" if self.partial else "; partial=False drops a short last batch")
        )
