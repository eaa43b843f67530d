"""WebDataset loaders: WDSLoader and its image, video, audio-video and camera variants.

A loader is an iterable of batch dicts. Iterating it starts a torch DataLoader
whose workers each build whole batches (batches form inside one worker).
Three reading modes:

* **deterministic**: every batch is a list of global positions from
  :mod:`fgdata.loaders.plan`; each worker reads exactly its samples by random
  access (the shard's offset index; S3 shards through a node-local cached copy),
  so every byte is read once per epoch in total. Resume (``sampler_start_idx`` or
  :meth:`BaseWDSLoader.load_state_dict`) is exact, across epoch wraps and for any
  worker count.
* **training**: an infinite stream; each worker draws shards uniformly with
  replacement and passes samples through a shuffle buffer bounded by
  ``shuffle_size`` samples *and* ``shuffle_bytes`` bytes, all seeded from
  ``(seed, rank, worker, epoch)``.
* **validation** (``train=False``): shard ``i`` goes to rank ``i mod W``,
  then to the rank's workers in turn; one pass, in order.

**Drop rule in deterministic mode**: when the sample at position ``p``
cannot be used (missing member, decode error, clip too short, unreadable), the
loader delivers instead the sample at the next position ``p+1, p+2, ...`` of the
global stream that can be used, logging shard, key and position. Every position
therefore yields exactly one sample and resuming never repeats or skips. The
replacement's random choices (e.g. a video segment start) are seeded from
``(seed, p, attempt)``. ``strict=True`` raises instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import warnings
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from fgdata import storage
from fgdata.errors import DamagedShardError, FgdataError, ShardError
from fgdata.loaders.collate import collate_samples
from fgdata.loaders.plan import EpochStream, SamplePlan, Split
from fgdata.loaders.presets import build_filters, resolve_presets
from fgdata.loaders.selection import (
    LoaderConfigError,
    ShardRef,
    load_files_map,
    parse_datatags,
    resolve_dataset,
)
from fgdata.media.decode import decode_member, member_kind, unwrap_gz
from fgdata.media.errors import MediaError, MemberDecodeError
from fgdata.shards import Sample, ShardFile, iter_samples

log = logging.getLogger("fgdata.loaders")

DEFAULT_SHUFFLE_BYTES = 256 << 20
# How many samples the training shuffle buffer holds before it starts yielding.
SHUFFLE_WARMUP = 100


class SampleDropped(Exception):
    """A sample cannot be used; the message is the drop reason."""


# What makes a sample unusable (bad data), as opposed to unreachable storage (StorageError,
# OSError), which propagates: replacing samples because a network call failed would make the
# deterministic stream depend on the weather.
DROPPABLE = (SampleDropped, MediaError, ShardError, ValueError, EOFError, RuntimeError)


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: explicit keywords, else torch.distributed if initialised, else RANK/WORLD_SIZE."""
    if rank is None or world_size is None:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            r, w = dist.get_rank(), dist.get_world_size()
        else:
            r, w = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise LoaderConfigError(f"rank={rank}, world_size={world_size}: need 0 <= rank < world_size")
    return rank, world_size


class _DropLog:
    """Per-reason drop counters with rate-limited log lines (no sleeps, no log floods)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def record(self, kind: str, reason: str, where: str) -> None:
        self.counts[kind] += 1
        n = self.counts[kind]
        if n <= 5 or n % 1000 == 0:
            log.warning("dropped %s: %s (%d so far for %r)", where, reason, n, kind)


class _ShardReaders:
    """Open ShardFiles of one worker (LRU); S3 shards are read from a node-local cached copy."""

    def __init__(self, cache_path: str | None, exts: set[str] | None, size: int = 8):
        self.cache_path = cache_path
        self.exts = exts
        self.size = size
        self._open: OrderedDict[str, ShardFile] = OrderedDict()

    def read(self, ref: ShardRef, index: int) -> Sample:
        f = self._open.pop(ref.path, None)
        if f is None:
            local = storage.fetch_to_cache(ref.path, self.cache_path) if storage.is_s3(ref.path) else ref.path
            f = ShardFile(local)
            if len(self._open) >= self.size:
                self._open.popitem(last=False)[1].close()
        self._open[ref.path] = f
        if index >= len(f):
            raise SampleDropped(f"unreadable: sample {index} missing (the shard has {len(f)})")
        return f.sample(index, self.exts)

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()


class _ShuffleBuffer:
    """Random-out buffer capped by sample count and by payload bytes."""

    def __init__(self, size: int, max_bytes: int, rng: np.random.Generator):
        self.size = max(1, size)
        self.max_bytes = max_bytes
        self.rng = rng
        self.items: list[tuple[Sample, ShardRef, int]] = []
        self.bytes = 0
        self._pushes = 0

    def _pop(self) -> tuple[Sample, ShardRef]:
        i = int(self.rng.integers(len(self.items)))
        self.items[i], self.items[-1] = self.items[-1], self.items[i]
        sample, ref, nbytes = self.items.pop()
        self.bytes -= nbytes
        return sample, ref

    def push(self, sample: Sample, ref: ShardRef) -> Iterator[tuple[Sample, ShardRef]]:
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
class SampleContext:
    """Per-sample decode inputs: the RNG for random crops/segments and the global position (deterministic mode)."""

    rng: np.random.Generator
    position: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class BaseWDSLoader:
    """Shared reading machinery of the WDS loaders ( keywords); subclasses define what a sample becomes.

    Keywords beyond the reference's: ``seed`` (None: fixed 0 in deterministic mode,
    fresh entropy otherwise, logged), ``shuffle_block`` (deterministic mode only: a
    seeded block-wise shuffle, see :mod:`fgdata.loaders.plan`), ``shuffle_bytes``
    (byte cap of the training shuffle buffer), ``max_consecutive_errors`` (abort
    after that many unusable samples in a row) and ``rank`` / ``world_size``
    (default: torch.distributed, else ``RANK`` / ``WORLD_SIZE``).
    """

    def __init__(
        self,
        datatags: Sequence[str] | str,
        batch_size: int,
        num_workers: int | None = None,
        train: bool = True,
        cache_path: str | None = None,
        deterministic: bool = False,
        sampler_start_idx: int | None = 0,
        shard_count_file: str | None = None,
        ignore_index_paths: Sequence[str] | str | None = None,
        shard_start: int = 0,
        shard_end: int | None = None,
        shards_per_worker: int | None = None,
        partial: bool = False,
        empty_check: bool = True,
        shuffle_size: int = 1000,
        strict: bool = False,
        seed: int | None = None,
        shuffle_block: int | None = None,
        shuffle_bytes: int = DEFAULT_SHUFFLE_BYTES,
        max_consecutive_errors: int = 100,
        rank: int | None = None,
        world_size: int | None = None,
    ):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise LoaderConfigError(f"batch_size={batch_size!r}: must be a positive integer")
        self.tags = parse_datatags(datatags)
        self.batch_size = batch_size
        self.rank, self.world_size = resolve_rank(rank, world_size)
        if num_workers is None:
            num_workers = 1 if deterministic else max(0, min((os.cpu_count() or 1) // self.world_size, 8))
        if num_workers < 0:
            raise LoaderConfigError(f"num_workers={num_workers}: must be >= 0")
        self.num_workers = num_workers
        self.train = train
        self.cache_path = cache_path
        if cache_path is not None:
            os.makedirs(cache_path, exist_ok=True)
        self.deterministic = deterministic
        self.partial = partial
        self.empty_check = empty_check
        self.shuffle_size = shuffle_size
        self.shuffle_bytes = shuffle_bytes
        self.strict = strict
        self.max_consecutive_errors = max_consecutive_errors
        if shuffle_block is not None and not deterministic:
            raise LoaderConfigError("shuffle_block applies to deterministic mode only")
        if seed is None:
            seed = 0 if deterministic else int(np.random.SeedSequence().entropy % (2**63))
            if not deterministic:
                log.info("training stream seed %d (pass seed=%d to reproduce this run)", seed, seed)
        if seed < 0:
            raise LoaderConfigError(f"seed={seed}: must be non-negative")
        self.seed = int(seed)
        start = 0 if sampler_start_idx is None else int(sampler_start_idx)
        if start < 0:
            raise LoaderConfigError(f"sampler_start_idx={start}: must be >= 0")

        if deterministic and num_workers > 1:
            warnings.warn(
                f"deterministic mode with {num_workers} workers: fgdata keeps the 1-worker order, "
                "but the reference would not", stacklevel=2,
            )
        if deterministic and train and shuffle_block is None:
            warnings.warn("deterministic mode while training: samples are not shuffled", stacklevel=2)
        if start > 0 and not deterministic:
            warnings.warn(f"sampler_start_idx={start} is ignored without deterministic=True", stacklevel=2)

        self._dataset = resolve_dataset(
            self.tags,
            need_counts=deterministic,
            shard_start=shard_start,
            shard_end=shard_end,
            shards_per_worker=shards_per_worker,
            workers_total=self.world_size * max(num_workers, 1),
            shard_count_file=shard_count_file,
            ignore_index_paths=ignore_index_paths,
            cache_path=cache_path,
        )
        self.shards: list[ShardRef] = self._dataset.shards
        self._plan: SamplePlan | None = None
        if deterministic:
            stream = EpochStream(self._dataset.counts, self._dataset.ignored_indices)
            self._plan = SamplePlan(stream, seed=self.seed, shuffle_block=shuffle_block, train=train)
            self.plan_hash = self._plan.hash
        else:
            self.plan_hash = self._stream_hash()
        self._resume_position = start if deterministic else 0
        self._position = self._resume_position
        self._epoch = 0
        self._drops = 0

    # -- what a sample becomes (subclasses) --------------------------------

    def _needed_exts(self) -> set[str] | None:
        """Members to read in deterministic mode (None: all)."""
        return None

    def _build(self, sample: Sample, shard: str, ctx: SampleContext) -> dict[str, Any]:
        raise NotImplementedError

    # -- identity and state -------------------------------------------------

    def _stream_hash(self) -> str:
        payload = json.dumps(
            {"shards": [r.path for r in self.shards], "ignored": [sorted(k) for k in self._dataset.ignored_keys], "seed": self.seed}
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def __len__(self) -> int:
        """Samples per epoch (deterministic mode only: other modes do not count their shards)."""
        if self._plan is None:
            raise TypeError("len() needs deterministic=True (the shards are not counted otherwise)")
        return len(self._plan)

    def state_dict(self) -> dict[str, Any]:
        """Exact resume state: global samples consumed, epoch, seed, plan hash and drops so far."""
        n = len(self._plan) if self._plan is not None else None
        return {
            "position": self._position,
            "epoch": self._position // n if n else self._epoch,
            "seed": self.seed,
            "plan_hash": self.plan_hash,
            "drops": self._drops,
            "deterministic": self.deterministic,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; a state saved for another dataset, seed or order is refused."""
        if state.get("plan_hash") != self.plan_hash or bool(state.get("deterministic")) != self.deterministic:
            raise FgdataError(
                f"cannot resume: the state was saved for plan {state.get('plan_hash')} "
                f"(seed {state.get('seed')}), but this loader's dataset/seed/order gives plan {self.plan_hash} "
                f"(seed {self.seed}); resume with the same shards, ignore index, seed and shuffle"
            )
        self._resume_position = self._position = int(state["position"])
        self._drops = int(state.get("drops", 0))
        # A resumed training stream continues with the next epoch's RNG, never replaying the last one.
        self._epoch = int(state.get("epoch", 0)) + (0 if self.deterministic else 1)

    # -- iteration ----------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from fgdata.loaders._torch import iterate

        start, epoch = self._resume_position, self._epoch
        if not self.deterministic:
            self._epoch += 1
        self._position = start
        for batch in iterate(self, start, epoch):
            self._drops += int(batch.pop("__drops__", 0))
            self._position += len(batch["__key__"]) * self.world_size
            yield batch

    def worker_batches(self, start: int, epoch: int, worker: int, num_workers: int) -> Iterator[dict[str, Any]]:
        """The batches worker ``worker`` of ``num_workers`` builds for this rank, in its delivery order."""
        if self.deterministic:
            yield from self._deterministic_batches(start, worker, num_workers)
        elif self.train:
            yield from self._training_batches(epoch, worker, num_workers)
        else:
            yield from self._validation_batches(worker, num_workers)

    def _finish(self, samples: list[dict[str, Any]], drops: int, positions: list[int] | None = None) -> dict[str, Any]:
        batch = collate_samples(samples)
        if positions is not None:
            import torch

            batch["__index__"] = torch.tensor(positions, dtype=torch.int64)
        batch["__drops__"] = drops
        return batch

    def _fail(self, where: str, exc: BaseException, drop_log: _DropLog) -> None:
        """Raise under ``strict``; otherwise count the drop by kind and log it (rate-limited)."""
        reason = str(exc) or type(exc).__name__
        if self.strict:
            raise FgdataError(f"{where}: {reason} (strict=True)") from exc
        kind = reason.split(":", 1)[0] if isinstance(exc, SampleDropped) else type(exc).__name__
        drop_log.record(kind, reason, where)

    def _deterministic_batches(self, start: int, worker: int, num_workers: int) -> Iterator[dict[str, Any]]:
        assert self._plan is not None
        split = Split(start, self.rank, self.world_size, worker, max(num_workers, 1), self.batch_size)
        total = None if self.train else len(self._plan)
        readers = _ShardReaders(self.cache_path, self._needed_exts())
        drop_log = _DropLog()
        produced = False
        try:
            for positions in split.batches(total, self.partial):
                samples, drops = [], 0
                for p in positions:
                    sample, attempts = self._sample_at(p, readers, drop_log)
                    samples.append(sample)
                    drops += attempts
                produced = True
                yield self._finish(samples, drops, positions)
        finally:
            readers.close()
        if not produced and self.empty_check:
            n = split.rank_length(total)
            raise FgdataError(
                f"rank {self.rank} worker {worker} of {num_workers} got no batch: its share of the "
                f"{total} samples after position {start} is {n}, less than batch_size={self.batch_size}; "
                "use fewer workers, partial=True or empty_check=False"
            )

    def _sample_at(self, position: int, readers: _ShardReaders, drop_log: _DropLog) -> tuple[dict[str, Any], int]:
        """The sample for ``position`` under the drop rule; returns it and how many positions were skipped."""
        assert self._plan is not None
        n = len(self._plan)
        for attempt in range(self.max_consecutive_errors + 1):
            q = position + attempt
            planned = self._plan.at(q if self.train else q % n)
            ref = self.shards[planned.shard]
            where = f"{ref.path} sample #{planned.index} (position {q})"
            try:
                sample = readers.read(ref, planned.index)
                where = f"{ref.path} key {sample.key!r} (position {q})"
                entropy = [self.seed, position] + ([attempt] if attempt else [])
                ctx = SampleContext(np.random.default_rng(entropy), position)
                return self._build(sample, ref.path, ctx), attempt
            except DROPPABLE as exc:
                self._fail(where, exc, drop_log)
        raise FgdataError(
            f"{self.max_consecutive_errors + 1} consecutive unusable samples from position {position}; "
            "run `fgdata verify` and pass its ignore index"
        )

    def _use(self, sample: Sample, ref: ShardRef, ctx: SampleContext, drop_log: _DropLog) -> dict[str, Any] | None:
        try:
            return self._build(sample, ref.path, ctx)
        except DROPPABLE as exc:
            self._fail(f"{ref.path} key {sample.key!r}", exc, drop_log)
            return None

    def _shard_samples(self, ref: ShardRef, ignored: frozenset[str], drop_log: _DropLog) -> Iterator[Sample]:
        """One shard, in tar order, without ignored samples.

        Damage, or a stream that dies (an S3 endpoint gone mid-read), ends the shard with a
        warning; ``strict`` raises instead (through ``_fail``).
        """
        try:
            for sample in iter_samples(ref.path):
                if sample.key not in ignored:
                    yield sample
        except DamagedShardError as exc:
            self._fail(ref.path, SampleDropped(f"damaged shard: {exc.reason}"), drop_log)
        except FgdataError as exc:  # StorageError: the shard could not be (fully) read
            self._fail(ref.path, SampleDropped(f"unreadable shard: {str(exc).splitlines()[0]}"), drop_log)

    def _training_batches(self, epoch: int, worker: int, num_workers: int) -> Iterator[dict[str, Any]]:
        rng = np.random.default_rng([self.seed, self.rank, worker, epoch])
        buffer = _ShuffleBuffer(self.shuffle_size, self.shuffle_bytes, rng)
        drop_log = _DropLog()
        pending: list[dict[str, Any]] = []
        failures = empty_draws = 0
        ignored = dict(zip((r.path for r in self.shards), self._dataset.ignored_keys))
        while True:
            ref = self.shards[int(rng.integers(len(self.shards)))]
            read = 0
            for raw in self._shard_samples(ref, ignored[ref.path], drop_log):
                read += 1
                for sample, src in buffer.push(raw, ref):
                    out = self._use(sample, src, SampleContext(rng), drop_log)
                    failures = 0 if out is not None else failures + 1
                    if failures > self.max_consecutive_errors:
                        raise FgdataError(f"{failures} consecutive unusable samples (last from {src.path}); run `fgdata verify`")
                    if out is not None:
                        pending.append(out)
                        if len(pending) == self.batch_size:
                            yield self._finish(pending, 0)
                            pending = []
            empty_draws = 0 if read else empty_draws + 1
            if empty_draws > 3 * len(self.shards) + 10:
                raise FgdataError(f"no usable samples in {len(self.shards)} shard(s) under {', '.join(self.tags)}")

    def _validation_batches(self, worker: int, num_workers: int) -> Iterator[dict[str, Any]]:
        n = max(num_workers, 1)
        mine = [(i, r) for i, r in enumerate(self.shards) if i % self.world_size == self.rank][worker::n]
        drop_log = _DropLog()
        rng = np.random.default_rng([self.seed, self.rank, worker])
        pending: list[dict[str, Any]] = []
        produced = False
        for i, ref in mine:
            for sample in self._shard_samples(ref, self._dataset.ignored_keys[i], drop_log):
                out = self._use(sample, ref, SampleContext(rng), drop_log)
                if out is None:
                    continue
                pending.append(out)
                if len(pending) == self.batch_size:
                    produced = True
                    yield self._finish(pending, 0)
                    pending = []
        if pending and self.partial:
            produced = True
            yield self._finish(pending, 0)
        if not produced and self.empty_check:
            raise FgdataError(
                f"rank {self.rank} worker {worker} of {n} got no batch: {len(self.shards)} shard(s) for "
                f"{self.world_size} rank(s) x {n} worker(s) gives it {len(mine)} shard(s)"
                + ("" if mine else "; use fewer workers or ranks, or more shards")
                + ("" if self.partial else "; partial=False drops a short last batch")
            )


def _find_member(members: Mapping[str, bytes], ext: str) -> tuple[str, bytes] | None:
    """The member for a mapped extension, also as ``<ext>.gz``."""
    if ext in members:
        return ext, members[ext]
    if ext + ".gz" in members:
        return ext + ".gz", members[ext + ".gz"]
    return None


class WDSLoader(BaseWDSLoader):
    """Precomputed tensors, text and JSON through ``key_map``, constants through ``files_map`` / ``presets_map``."""

    def __init__(
        self,
        datatags: Sequence[str] | str,
        batch_size: int,
        key_map: Mapping[str, str] | None = None,
        files_map: Mapping[str, Any] | None = None,
        presets_map: Mapping[str, str] | None = None,
        presets_filter: Mapping[str, Mapping | None] | None = None,
        txt_extensions: Sequence[str] = ("txt",),
        **kwargs: Any,
    ):
        self.key_map = {k: v.lower() for k, v in (key_map if key_map is not None else {"real": "latent.pth", "condition": "txt_emb.pth"}).items()}
        if presets_filter and kwargs.get("deterministic"):
            raise LoaderConfigError(
                "presets_filter cannot be combined with deterministic=True: a filtered sample would shift "
                "every later position; write an ignore index with `fgdata verify` instead"
            )
        self.txt_extensions = tuple(e.lower() for e in txt_extensions)
        self._filters = build_filters(presets_filter)
        super().__init__(datatags, batch_size, **kwargs)
        self._arrays = load_files_map(files_map, self.tags[0])
        self._strings = resolve_presets(presets_map)
        self._constant_keys = set(self._arrays) | set(self._strings)
        self._warned: set[str] = set()

    def _needed_exts(self) -> set[str] | None:
        return {e for ext in self.key_map.values() for e in (ext, ext + ".gz")}

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    def _build(self, sample: Sample, shard: str, ctx: SampleContext) -> dict[str, Any]:
        resolved: dict[str, tuple[str, bytes]] = {}
        for out_key, ext in self.key_map.items():
            found = _find_member(sample.members, ext)
            if found is not None:
                resolved[out_key] = found
            elif out_key in self._constant_keys:
                self._warn_once(f"missing:{out_key}", f"member {ext!r} missing in {sample.key!r}: keeping the constant for {out_key!r}")
            else:
                raise SampleDropped(f"missing member: {ext!r}")
        for _name, check in self._filters:
            reason = check(sample.members)
            if reason is not None:
                raise SampleDropped(reason)
        out: dict[str, Any] = {"fname": sample.key, "shard": shard, "__key__": sample.key}
        out.update(self._arrays)
        out.update(self._strings)
        out.update(self._decode(resolved, ctx))
        return out

    def _decode(self, resolved: dict[str, tuple[str, bytes]], ctx: SampleContext) -> dict[str, Any]:
        out = {}
        for key, (ext, data) in resolved.items():
            value = decode_member(ext, data, txt_extensions=self.txt_extensions)
            if isinstance(value, (bytes, bytearray)):
                self._warn_once(f"bytes:{key}", f"{key!r} ({ext!r}) is delivered as raw bytes: no decoder for that extension")
            out[key] = value
        return out


def _raw_media(ext: str, data: bytes) -> bytes:
    """Media payload bytes, un-gzipped when stored as ``<ext>.gz``."""
    try:
        return unwrap_gz(ext, data)[1]
    except MemberDecodeError as exc:
        raise SampleDropped(f"bad gzip data in {ext!r}: {exc.__cause__}") from exc.__cause__


class ImageWDSLoader(WDSLoader):
    """Images resized (short side ``input_res``) and centre-cropped, normalised to [-1, 1] by default.

    ``fast_jpeg`` allows simplejpeg when installed; pass False for results that
    depend on Pillow alone.
    """

    def __init__(
        self,
        datatags: Sequence[str] | str,
        batch_size: int,
        input_res: int | Sequence[int] = 512,
        norm_mean: Sequence[float] = (0.5, 0.5, 0.5),
        norm_std: Sequence[float] = (0.5, 0.5, 0.5),
        fast_jpeg: bool = True,
        **kwargs: Any,
    ):
        self.input_res = input_res if isinstance(input_res, int) else tuple(int(v) for v in input_res)
        self.norm_mean = tuple(norm_mean)
        self.norm_std = tuple(norm_std)
        self.fast_jpeg = fast_jpeg
        super().__init__(datatags, batch_size, **kwargs)

    def _decode(self, resolved: dict[str, tuple[str, bytes]], ctx: SampleContext) -> dict[str, Any]:
        from fgdata.media.image import load_image_for_training

        images = {k: v for k, v in resolved.items() if member_kind(v[0], self.txt_extensions) == "image"}
        out = super()._decode({k: v for k, v in resolved.items() if k not in images}, ctx)
        for key, (ext, data) in images.items():
            out[key] = load_image_for_training(_raw_media(ext, data), self.input_res, self.norm_mean, self.norm_std, fast=self.fast_jpeg)
        return out


class VideoWDSLoader(WDSLoader):
    """Video clips of ``sequence_length`` frames at ``img_size`` = (W, H) in [-1, 1], ``[C,T,H,W]``."""

    _with_audio = False

    def __init__(
        self,
        datatags: Sequence[str] | str,
        batch_size: int,
        sequence_length: int = 81,
        img_size: Sequence[int] = (832, 480),
        video_keys: Sequence[str] = ("real_raw",),
        decoder_type: str = "segment",
        target_fps: float | None = None,
        **kwargs: Any,
    ):
        if decoder_type not in ("segment", "full"):
            raise LoaderConfigError(f"decoder_type={decoder_type!r}: choose 'segment' or 'full'")
        if sequence_length < 1:
            raise LoaderConfigError(f"sequence_length={sequence_length}: must be positive")
        if len(img_size) != 2:
            raise LoaderConfigError(f"img_size={img_size!r}: must be (W, H)")
        if target_fps is not None and target_fps <= 0:
            raise LoaderConfigError(f"target_fps={target_fps}: must be positive or None")
        self.sequence_length = int(sequence_length)
        self.img_size = (int(img_size[0]), int(img_size[1]))
        self.video_keys = tuple(video_keys)
        self.decoder_type = decoder_type
        self.target_fps = target_fps
        key_map = kwargs.get("key_map") or {"real_raw": "mp4", "condition_raw": "txt"}
        kwargs["key_map"] = key_map
        missing = [k for k in self.video_keys if k not in key_map]
        if missing:
            raise LoaderConfigError(f"video_keys {missing} are not key_map keys ({sorted(key_map)})")
        super().__init__(datatags, batch_size, **kwargs)

    def _clip(self, data: bytes, ctx: SampleContext):
        from fgdata.media.video import decode_clip, probe_video

        info = probe_video(data)
        clip = decode_clip(
            data,
            sequence_length=self.sequence_length,
            img_size=self.img_size,
            decoder_type=self.decoder_type,
            target_fps=self.target_fps,
            rng=ctx.rng,
            with_audio=self._with_audio,
            target_sample_rate=getattr(self, "target_sample_rate", None),
            info=info,
        )
        return clip, info

    def _video_value(self, clip: Any) -> Any:
        return clip.video

    def _decode(self, resolved: dict[str, tuple[str, bytes]], ctx: SampleContext) -> dict[str, Any]:
        videos = {k: resolved[k] for k in self.video_keys if k in resolved}
        out = super()._decode({k: v for k, v in resolved.items() if k not in videos}, ctx)
        for key, (ext, data) in videos.items():
            clip, info = self._clip(_raw_media(ext, data), ctx)
            ctx.extra.setdefault("clips", {})[key] = (clip, info)
            out[key] = self._video_value(clip)
            out["cropping_params" if len(self.video_keys) == 1 else f"{key}_cropping_params"] = dict(clip.cropping_params)
        return out


class AudioVideoWDSLoader(VideoWDSLoader):
    """Each video key becomes ``{"video": [C,T,H,W], "audio": [2, N]}``; ``audio`` is omitted without an audio stream."""

    _with_audio = True

    def __init__(self, datatags: Sequence[str] | str, batch_size: int, target_sample_rate: int | None = None, **kwargs: Any):
        if target_sample_rate is not None and target_sample_rate <= 0:
            raise LoaderConfigError(f"target_sample_rate={target_sample_rate}: must be positive or None")
        self.target_sample_rate = target_sample_rate
        super().__init__(datatags, batch_size, **kwargs)

    def _video_value(self, clip: Any) -> Any:
        value = {"video": clip.video}
        if clip.audio is not None:
            value["audio"] = clip.audio
        return value

    def _finish(self, samples: list[dict[str, Any]], drops: int, positions: list[int] | None = None) -> dict[str, Any]:
        """Collate; audio that cannot stack (mixed presence or lengths) stays a per-sample list, with a warning."""
        loose: dict[str, list] = {}
        for key in self.video_keys:
            values = [s.get(key) for s in samples]
            shapes = {None if not isinstance(v, dict) or "audio" not in v else tuple(v["audio"].shape) for v in values}
            if len(shapes) > 1:
                self._warn_once(f"mixed:{key}", f"a batch of {key!r} mixes audio rates or presence ({shapes}); 'audio' is a list")
                loose[key] = [v.pop("audio", None) if isinstance(v, dict) else None for v in values]
        batch = super()._finish(samples, drops, positions)
        if loose:
            import torch

            for key, audio in loose.items():
                batch[key]["audio"] = [None if a is None else torch.as_tensor(a) for a in audio]
        return batch


class CameraVideoWDSLoader(VideoWDSLoader):
    """Video plus camera poses ``[T,4,4]`` and intrinsics ``[T,4]`` sliced to the decoded frames.

    Poses and intrinsics are the ``key_map`` entries with extensions ``poses.npy``
    and ``intrinsics.npy``. Intrinsics are rescaled and shifted for the resize and
    crop of the first video key; the pixel convention (principal point measured
    from the top-left corner, OpenCV) is documented in :mod:`fgdata.media.camera`.
    """

    def __init__(self, datatags: Sequence[str] | str, batch_size: int, **kwargs: Any):
        if kwargs.get("key_map") is None:
            kwargs["key_map"] = {
                "real_raw": "mp4",
                "condition_raw": "txt",
                "camera_poses": "poses.npy",
                "camera_intrinsics": "intrinsics.npy",
            }
        by_ext = {v.lower().removesuffix(".gz"): k for k, v in kwargs["key_map"].items()}
        if "poses.npy" not in by_ext or "intrinsics.npy" not in by_ext:
            raise LoaderConfigError("key_map must map one output key to 'poses.npy' and one to 'intrinsics.npy'")
        self._pose_key, self._intr_key = by_ext["poses.npy"], by_ext["intrinsics.npy"]
        super().__init__(datatags, batch_size, **kwargs)

    def _decode(self, resolved: dict[str, tuple[str, bytes]], ctx: SampleContext) -> dict[str, Any]:
        from fgdata.media.camera import slice_camera, transform_intrinsics

        out = super()._decode(resolved, ctx)
        if self._pose_key not in out or self._intr_key not in out:
            return out
        clip, info = ctx.extra["clips"][self.video_keys[0]]
        poses, intrinsics = slice_camera(out[self._pose_key], out[self._intr_key], clip.frame_indices)
        # Intrinsics describe the displayed frame, which is the coded frame turned by the rotation tag.
        src_w, src_h = (info.height, info.width) if info.rotation in (90, 270) else (info.width, info.height)
        out[self._pose_key] = poses
        out[self._intr_key] = transform_intrinsics(intrinsics, src_w, src_h, clip.cropping_params)
        return out
