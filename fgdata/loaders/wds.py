"""WebDataset loaders: WDSLoader and its image, video, audio-video and camera variants.

A loader is an iterable of batch dicts. Iterating it starts a torch DataLoader
whose workers each build whole batches (batches form inside one worker). It is
put together from parts:

* a **sample source** (:mod:`fgdata.loaders.sources`) decides which samples a worker
  reads and in which order, in one of three modes:

  - **deterministic**: every batch is a list of global positions from
    :mod:`fgdata.loaders.plan`, read by random access, so every byte is read once
    per epoch in total. Resume (``sampler_start_idx`` or :meth:`BaseWDSLoader.load_state_dict`)
    is exact, across epoch wraps and for any worker count.
  - **training**: an infinite stream through a shuffle buffer bounded by
    ``shuffle_size`` samples *and* ``shuffle_bytes`` bytes, seeded from
    ``(seed, rank, worker, epoch)``.
  - **validation** (``train=False``): shard ``i`` goes to rank ``i mod W``, then to
    the rank's workers in turn; one pass, in order.

* a **sample builder** (:mod:`fgdata.loaders.builder`) turns a sample's members into a
  dict: ``key_map`` (with ``;``-separated alternatives), constants, filters, and the
  **per-modality decoders** of :mod:`fgdata.loaders.decoders` that each public class
  composes;
* **one batch loop** (:func:`fgdata.loaders.collate.batch_loop`).

**Drop rule in deterministic mode**: when the sample at position ``p`` cannot be used
(missing member, decode error, clip too short, damaged shard), the loader delivers
instead the next usable sample at ``p+1, p+2, ...``, logging shard, key and position;
every position yields exactly one sample and resuming never repeats or skips.
``strict=True`` raises instead. This is for rare data faults: when more than
``replaced_warn_fraction`` (default 1 %) of an epoch's positions were replaced the
loader warns once per epoch and rank when the epoch ends, with the epoch's count, and
as soon as ``max_replaced_fraction`` is passed it raises with the count so far. A misconfiguration is never a stream of drops: a mapped key that no sample
has, or clips that are all too short, raise at once (see the builder).
"""

from __future__ import annotations

import hashlib
import json
import logging
import numbers
import os
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, cast

import numpy as np

from fgdata.errors import FgdataError
from fgdata.loaders.builder import AUDIT_FIRST_SAMPLES, SampleBuilder, parse_key_map
from fgdata.loaders.collate import Batch, BatchSlots, batch_loop
from fgdata.loaders.decoders import (
    VIDEO_MEMBERS,
    CameraDecoder,
    Decoder,
    ImageDecoder,
    VideoDecoder,
    camera_keys,
    is_video_spec,
)
from fgdata.loaders.plan import EpochStream, SamplePlan
from fgdata.loaders.presets import build_filters, resolve_presets
from fgdata.loaders.ranks import checked_position, default_workers, resolve_rank
from fgdata.media.video import ClipSpec
from fgdata.loaders.selection import (
    LoaderConfigError,
    ShardRef,
    load_files_map,
    parse_datatags,
    resolve_dataset,
)
from fgdata.loaders.sources import (
    DeterministicSource,
    Drops,
    Reading,
    TrainingSource,
    ValidationSource,
)
from fgdata.loaders.sources import ShuffleBuffer as _ShuffleBuffer  # noqa: F401 - the name the shuffle tests import

log = logging.getLogger("fgdata.loaders")

DEFAULT_SHUFFLE_BYTES = 256 << 20
#: Default share of an epoch's positions that may be replaced before the loader warns.
REPLACED_WARN_FRACTION = 0.01


def _fraction(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) <= 1:
        raise LoaderConfigError(f"{what}={value!r}: must be a fraction in [0, 1]")
    return float(value)


class BaseWDSLoader:
    """The reading machinery every WDS loader shares: dataset, mode, resume state and iteration.

    Keywords beyond the reference's: ``seed`` (None: fixed 0 in deterministic mode,
    fresh entropy otherwise, logged), ``shuffle_block`` (deterministic mode only: a
    seeded block-wise shuffle, see :mod:`fgdata.loaders.plan`), ``shuffle_bytes``
    (byte cap of the training shuffle buffer), ``max_consecutive_errors`` (abort
    after that many unusable samples in a row), ``rank`` / ``world_size``
    (default: torch.distributed, else ``RANK`` / ``WORLD_SIZE``),
    ``replaced_warn_fraction`` / ``max_replaced_fraction`` (deterministic mode: the
    share of an epoch's positions replaced by the drop rule above which the loader
    warns, or raises; None never raises).
    """

    _builder: SampleBuilder

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
        replaced_warn_fraction: float = REPLACED_WARN_FRACTION,
        max_replaced_fraction: float | None = None,
    ):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise LoaderConfigError(f"batch_size={batch_size!r}: must be a positive integer")
        self.tags = parse_datatags(datatags)
        self.batch_size = batch_size
        self.rank, self.world_size = resolve_rank(rank, world_size)
        if num_workers is None:
            num_workers = default_workers(deterministic, self.world_size)
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
        self.replaced_warn_fraction = _fraction(replaced_warn_fraction, "replaced_warn_fraction")
        self.max_replaced_fraction = None if max_replaced_fraction is None else _fraction(max_replaced_fraction, "max_replaced_fraction")
        if shuffle_block is not None and not deterministic:
            raise LoaderConfigError("shuffle_block applies to deterministic mode only")
        if seed is None:
            seed = 0 if deterministic else int(cast(int, np.random.SeedSequence().entropy) % (2**63))
            if not deterministic:
                log.info("training stream seed %d (pass seed=%d to reproduce this run)", seed, seed)
        if seed < 0:
            raise LoaderConfigError(f"seed={seed}: must be non-negative")
        self.seed = int(seed)
        start = checked_position(0 if sampler_start_idx is None else sampler_start_idx, "sampler_start_idx")

        if deterministic and num_workers > 1:
            warnings.warn(
                f"deterministic mode with {num_workers} workers: fgdata keeps the 1-worker order, "
                "but the reference would not", stacklevel=2,
            )
        if deterministic and train and shuffle_block is None:
            warnings.warn("deterministic mode while training: samples come in shard order, unshuffled; pass "
                          "shuffle_block (e.g. 1024) for a seeded block-wise shuffle that keeps resume exact", stacklevel=2)
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
            assert self._dataset.counts is not None
            stream = EpochStream(self._dataset.counts, self._dataset.ignored_indices)
            self._plan = SamplePlan(stream, seed=self.seed, shuffle_block=shuffle_block, train=train)
            self.plan_hash = self._plan.hash
        else:
            self.plan_hash = self._stream_hash()
        self._resume_position = start if deterministic else 0
        self._position = self._resume_position
        self._epoch = 0
        self._drops = 0
        self._iter_start = self._position
        self._replaced: Counter[int] = Counter()  # epoch -> replaced positions, until the epoch ends

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
        """Continue from ``state``; a malformed state, or one saved for another dataset, seed or order, is refused."""
        if not isinstance(state, Mapping) or "position" not in state:
            raise LoaderConfigError(f"load_state_dict: expected the dict that state_dict() returns, got {type(state).__name__}")
        position = checked_position(state["position"], "state['position']")
        for name in ("epoch", "drops"):
            value = state.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise LoaderConfigError(f"load_state_dict: state[{name!r}]={value!r} must be a non-negative integer")
        if state.get("plan_hash") != self.plan_hash or bool(state.get("deterministic")) != self.deterministic:
            raise FgdataError(
                f"cannot resume: the state was saved for plan {state.get('plan_hash')} "
                f"(seed {state.get('seed')}), but this loader's dataset/seed/order gives plan {self.plan_hash} "
                f"(seed {self.seed}); resume with the same shards, ignore index, seed and shuffle"
            )
        self._resume_position = self._position = position
        self._drops = int(state.get("drops", 0))
        # A resumed training stream continues with the next epoch's RNG, never replaying the last one.
        self._epoch = int(state.get("epoch", 0)) + (0 if self.deterministic else 1)

    # -- iteration ----------------------------------------------------------

    @property
    def loader(self) -> Any:
        """A torch ``DataLoader`` over this loader (the reference's ``loader.loader``): iterating it is iterating this."""
        from fgdata.loaders._torch import LoaderView

        return LoaderView(self)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from fgdata.loaders._torch import iterate

        start, epoch = self._resume_position, self._epoch
        if not self.deterministic:
            self._epoch += 1
        self._position = self._iter_start = start
        self._replaced.clear()  # a new iteration is a new stream: its epochs are counted afresh
        for batch in iterate(self, start, epoch):
            self._drops += batch.drops
            self._note_replaced(batch.replaced)
            self._position += len(batch.data["__key__"]) * self.world_size
            self._warn_replaced(stream_over=False)
            yield batch.data
        self._warn_replaced(stream_over=True)

    def _rank_positions(self, epoch: int, end: int) -> int:
        """How many of epoch ``epoch``'s positions below ``end`` belong to this rank in this iteration."""
        assert self._plan is not None
        n = len(self._plan)
        first = self._iter_start + self.rank  # this rank's positions: first, first + W, first + 2W, ...
        lo, hi = max(epoch * n, first), min((epoch + 1) * n, end)
        lo += (first - lo) % self.world_size
        return max(0, -(-(hi - lo) // self.world_size))

    def _note_replaced(self, positions: Sequence[int]) -> None:
        """Count replaced positions per epoch; raise as soon as an epoch's share passes ``max_replaced_fraction``."""
        if not positions or self._plan is None:
            return
        n = len(self._plan)
        for p in positions:
            epoch = int(p) // n
            self._replaced[epoch] += 1
            count, planned = self._replaced[epoch], self._rank_positions(epoch, (epoch + 1) * n)
            if self.max_replaced_fraction is not None and count > self.max_replaced_fraction * planned:
                raise FgdataError(
                    f"epoch {epoch}: at least {count} of this rank's {planned} positions ({count / planned:.1%}) "
                    "delivered a replacement so far (the next usable sample, because the planned sample was unusable); "
                    f"more than max_replaced_fraction={self.max_replaced_fraction:g}. "
                    "Run `fgdata verify` and pass its ignore index, or fix the loader's key_map"
                )

    def _warn_replaced(self, stream_over: bool) -> None:
        """One warning per ended epoch (and per rank) whose replaced share passed ``replaced_warn_fraction``.

        An epoch ends when this rank has delivered every position of it, or when the stream ends
        (``train=False``); the counts are then final. Only ``warnings`` carries it: the per-sample
        log lines already name each replaced sample.
        """
        if self._plan is None:
            return
        n = len(self._plan)
        for epoch in sorted(self._replaced):
            if not (stream_over or (epoch + 1) * n <= self._position):
                continue
            count = self._replaced.pop(epoch)
            delivered = max(count, self._rank_positions(epoch, self._position))
            if count > self.replaced_warn_fraction * delivered:
                warnings.warn(
                    f"epoch {epoch}: {count} of the {delivered} positions this rank delivered ({count / delivered:.1%}) "
                    "were replacements (the next usable sample, because the planned sample was unusable); more than "
                    f"replaced_warn_fraction={self.replaced_warn_fraction:g}, so those samples appear twice this epoch. "
                    "Run `fgdata verify` and pass its ignore index", stacklevel=3,
                )

    def worker_batches(self, start: int, epoch: int, worker: int, num_workers: int) -> Iterator[Batch]:
        """The batches worker ``worker`` of ``num_workers`` builds for this rank, in its delivery order,
        each with its control data (drops, replaced positions)."""
        builder = self._builder
        builder.audit.reset()
        slots = BatchSlots(self.batch_size)
        reading = Reading(dataset=self._dataset, builder=builder, drops=Drops(self.strict), seed=self.seed,
                          rank=self.rank, world_size=self.world_size, batch_size=self.batch_size,
                          cache_path=self.cache_path, max_consecutive_errors=self.max_consecutive_errors,
                          warned_counts=set(), slots=slots)
        source: DeterministicSource | TrainingSource | ValidationSource
        if self.deterministic:
            assert self._plan is not None
            source = DeterministicSource(reading, self._plan, self.train, self.partial)
        elif self.train:
            source = TrainingSource(reading, self.shuffle_size, self.shuffle_bytes, self.tags)
        else:
            source = ValidationSource(reading, self.partial)
        produced = False
        for batch in batch_loop(source.items(start, epoch, worker, num_workers), self.batch_size, self.partial,
                                builder.collate, slots):
            produced = True
            yield batch
        message = None if produced or not self.empty_check else source.empty_message(start, worker, num_workers)
        if message is not None:
            builder.audit.raise_if_all_too_short()
            raise FgdataError(message)


class WDSLoader(BaseWDSLoader):
    """Precomputed tensors, text and JSON through ``key_map``, constants through ``files_map`` / ``presets_map``.

    A ``key_map`` value may list alternatives, ``"jpg;png;webp"``: the first the sample has.
    ``missing_text`` says what a sample without its text member becomes: ``"drop"``
    (unusable) or ``"empty"`` (the empty string).
    """

    default_key_map: Mapping[str, str] = {"real": "latent.pth", "condition": "txt_emb.pth"}

    def __init__(
        self,
        datatags: Sequence[str] | str,
        batch_size: int,
        key_map: Mapping[str, str] | None = None,
        files_map: Mapping[str, Any] | None = None,
        presets_map: Mapping[str, str] | None = None,
        presets_filter: Mapping[str, Mapping | None] | None = None,
        txt_extensions: Sequence[str] = ("txt",),
        missing_text: str = "drop",
        **kwargs: Any,
    ):
        self.key_map = {k: v.lower() if isinstance(v, str) else v for k, v in (key_map if key_map is not None else self.default_key_map).items()}
        keys = parse_key_map(self.key_map)
        if presets_filter and kwargs.get("deterministic"):
            raise LoaderConfigError(
                "presets_filter cannot be combined with deterministic=True: a filtered sample would shift "
                "every later position; write an ignore index with `fgdata verify` instead"
            )
        self.txt_extensions = tuple(e.lower() for e in txt_extensions)
        filters = build_filters(presets_filter)
        decoders = self._media_decoders(keys)
        super().__init__(datatags, batch_size, **kwargs)
        constants = {**load_files_map(files_map, self.tags[0]), **resolve_presets(presets_map)}
        audit = min(AUDIT_FIRST_SAMPLES, len(self._plan)) if self._plan is not None else AUDIT_FIRST_SAMPLES
        self._builder = SampleBuilder(self.key_map, decoders=decoders, constants=constants, filters=filters,
                                      txt_extensions=self.txt_extensions, missing_text=missing_text, audit_samples=audit)

    def _media_decoders(self, keys: dict[str, tuple[str, ...]]) -> list[Decoder]:
        """The media decoders this loader composes (none: tensors, text and JSON only)."""
        return []


def _resize_mode(resize: str) -> str:
    """The media functions' check, as a loader configuration error."""
    from fgdata.media.pixels import check_resize

    try:
        return check_resize(resize)
    except ValueError as exc:
        raise LoaderConfigError(f"{exc} ('reference': bit-identical to the reference loaders)") from None


class ImageWDSLoader(WDSLoader):
    """Images resized (short side ``input_res``) and centre-cropped, normalised to [-1, 1] by default.

    ``resize="reference"`` decodes at full size and resizes as the reference loader does, for
    bit-identical tensors; the default ``"fast"`` decodes JPEGs DCT-scaled and resamples only
    the crop (docs/DIFFERENCES.md gives its PSNR). ``fast_jpeg`` allows simplejpeg in the fast
    mode when installed; pass False for results that depend on Pillow alone.
    """

    def __init__(
        self,
        datatags: Sequence[str] | str,
        batch_size: int,
        input_res: int | Sequence[int] = 512,
        norm_mean: Sequence[float] = (0.5, 0.5, 0.5),
        norm_std: Sequence[float] = (0.5, 0.5, 0.5),
        fast_jpeg: bool = True,
        resize: str = "fast",
        **kwargs: Any,
    ):
        if not isinstance(input_res, int) and len(input_res) != 2:
            raise LoaderConfigError(f"input_res={input_res!r}: an integer (short side) or (H, W)")
        self.input_res = input_res if isinstance(input_res, int) else (int(input_res[0]), int(input_res[1]))
        self.norm_mean = tuple(norm_mean)
        self.norm_std = tuple(norm_std)
        if len(self.norm_mean) != 3 or len(self.norm_std) != 3 or 0 in self.norm_std:
            raise LoaderConfigError(f"norm_mean={norm_mean!r}, norm_std={norm_std!r}: three values each, no zero std")
        self.fast_jpeg = fast_jpeg
        self.resize = _resize_mode(resize)
        super().__init__(datatags, batch_size, **kwargs)

    def _media_decoders(self, keys: dict[str, tuple[str, ...]]) -> list[Decoder]:
        return [ImageDecoder(self.input_res, self.norm_mean, self.norm_std, self.fast_jpeg, self.txt_extensions, self.resize)]


class VideoWDSLoader(WDSLoader):
    """Video clips of ``sequence_length`` frames at ``img_size`` = (W, H) in [-1, 1], ``[C,T,H,W]``.

    ``video_keys`` defaults to the ``key_map`` entries whose extensions are all video
    extensions (``{"real": "mp4", ...}`` works without naming ``video_keys``).
    ``resize="reference"`` resizes full-size frames as the reference loader does, for
    bit-identical tensors; the default ``"fast"`` resizes inside libswscale (docs/DIFFERENCES.md
    gives its PSNR).
    """

    default_key_map: Mapping[str, str] = {"real_raw": VIDEO_MEMBERS, "condition_raw": "txt"}
    _with_audio = False

    def __init__(
        self,
        datatags: Sequence[str] | str,
        batch_size: int,
        sequence_length: int = 81,
        img_size: Sequence[int] = (832, 480),
        video_keys: Sequence[str] | None = None,
        decoder_type: str = "segment",
        target_fps: float | None = None,
        resize: str = "fast",
        **kwargs: Any,
    ):
        self.resize = _resize_mode(resize)
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
        self.video_keys: tuple[str, ...] = () if video_keys is None else tuple(video_keys)
        self.decoder_type = cast(Literal["segment", "full"], decoder_type)
        self.target_fps = target_fps
        if not kwargs.get("key_map"):
            kwargs["key_map"] = dict(self.default_key_map)
        super().__init__(datatags, batch_size, **kwargs)

    def _video_decoder(self, keys: dict[str, tuple[str, ...]], target_sample_rate: int | None = None) -> VideoDecoder:
        if not self.video_keys:
            self.video_keys = tuple(k for k, alternatives in keys.items() if is_video_spec(alternatives))
            if not self.video_keys:
                raise LoaderConfigError(f"key_map {self.key_map} maps no key to a video extension; name the video keys in video_keys")
        missing = [k for k in self.video_keys if k not in keys]
        if missing:
            raise LoaderConfigError(f"video_keys {missing} are not key_map keys ({sorted(keys)})")
        spec = ClipSpec(sequence_length=self.sequence_length, img_size=self.img_size, decoder_type=self.decoder_type,
                        target_fps=self.target_fps, with_audio=self._with_audio,
                        target_sample_rate=target_sample_rate, resize=self.resize)
        return VideoDecoder(self.video_keys, spec)

    def _media_decoders(self, keys: dict[str, tuple[str, ...]]) -> list[Decoder]:
        return [self._video_decoder(keys)]


class AudioVideoWDSLoader(VideoWDSLoader):
    """Each video key becomes ``{"video": [C,T,H,W], "audio": [2, N]}``; ``audio`` is omitted without an audio stream.

    Audio that cannot stack in a batch (mixed presence or lengths) stays a per-sample list, with a warning.
    """

    _with_audio = True

    def __init__(self, datatags: Sequence[str] | str, batch_size: int, target_sample_rate: int | None = None, **kwargs: Any):
        if target_sample_rate is not None and target_sample_rate <= 0:
            raise LoaderConfigError(f"target_sample_rate={target_sample_rate}: must be positive or None")
        self.target_sample_rate = target_sample_rate
        super().__init__(datatags, batch_size, **kwargs)

    def _media_decoders(self, keys: dict[str, tuple[str, ...]]) -> list[Decoder]:
        return [self._video_decoder(keys, self.target_sample_rate)]


class CameraVideoWDSLoader(VideoWDSLoader):
    """Video plus camera poses ``[T,4,4]`` and intrinsics ``[T,4]`` sliced to the decoded frames.

    Poses and intrinsics are the ``key_map`` entries with extensions ``poses.npy``
    and ``intrinsics.npy``. Intrinsics are rescaled and shifted for the resize and
    crop of the first video key; the pixel convention (principal point measured
    from the top-left corner, OpenCV) is documented in :mod:`fgdata.media.camera`.
    """

    default_key_map: Mapping[str, str] = {
        "real_raw": VIDEO_MEMBERS,
        "condition_raw": "txt",
        "camera_poses": "poses.npy",
        "camera_intrinsics": "intrinsics.npy",
    }

    def _media_decoders(self, keys: dict[str, tuple[str, ...]]) -> list[Decoder]:
        pose_key, intrinsics_key = camera_keys(keys)
        video = self._video_decoder(keys)
        return [video, CameraDecoder(pose_key, intrinsics_key, video.video_keys[0])]
