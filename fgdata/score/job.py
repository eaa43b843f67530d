"""``fgdata score``: per-sample scores of every shard, written beside it (:mod:`fgdata.shards.scores`).

Each folder's shards are one job of the job core (:func:`fgdata.jobs.driver.run_job`, :class:`ScoreJob`): one work
unit per shard. The unit's output, the score file, is also its marker: it is written whole and atomically once the
shard is read, and it records the shard's byte size and the signals it holds, which the job reads back as the
unit's :class:`~fgdata.jobs.units.Marker` (:meth:`ScoreJob.unit_state`). A rerun (``--resume``, the default) keeps
a shard whose score file holds every asked-for signal for the same shard size, so a run stopped at any point
(SIGKILL included) and rerun gives the bytes of an uninterrupted run; ``--no-resume`` scores every shard again,
``--overwrite`` first removes the shards' score files. Scoring another signal later reads the file, adds the new
fields to each row and rewrites it: the shard itself is only read, never written. The job's own state (its lock)
lives in ``FOLDER/.fgdata-score/``, removed once the job ends.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fgdata.errors import OptionError
from fgdata.jobs.driver import Context, JobDefinition, RunSettings
from fgdata.jobs.executor import Executor
from fgdata.jobs.units import Marker, Totals
from fgdata.score.models import MODEL_SIGNALS
from fgdata.score.signals import DESCRIPTIONS, IMAGE_SIGNALS, WEIGHT_FREE

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

    from fgdata.jobs.summary import JobSummary

#: An object's address in an error message (Pillow names the BytesIO it read): dropped, so reruns write the same bytes.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")
#: The job's state folder (its lock) inside each scored folder, removed when the job ends.
STATE_FOLDER = ".fgdata-score"
#: ``--with`` names that stand for several signals.
GROUPS = {"basic": tuple(WEIGHT_FREE)}
#: Every signal, in the order its fields are computed and listed.
ALL_SIGNALS = (*WEIGHT_FREE, *MODEL_SIGNALS)


def parse_signals(text: str) -> tuple[str, ...]:
    """``--with size,sharpness`` (or ``basic``) -> signal names in a fixed order; an unknown name is a usage error."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        for name in GROUPS.get(part, (part,)):
            if name not in ALL_SIGNALS:
                known = ", ".join([*GROUPS, *ALL_SIGNALS])
                raise OptionError(f"--with: unknown signal {name!r}; choose from {known}")
            if name not in names:
                names.append(name)
    if not names:
        raise OptionError("--with: name at least one signal")
    return tuple(n for n in ALL_SIGNALS if n in names)


@dataclass(frozen=True)
class ScoreOptions:
    """What ``score`` computes: the signals, the caption member and the image member (None: the first image); for
    the model signals, the folder of weight files, the device and the batch size."""

    signals: tuple[str, ...]
    text_ext: str = "txt"
    image_ext: str | None = None
    model_dir: str | None = None
    device: str = "cpu"
    batch_size: int = 32

    @property
    def model_signals(self) -> tuple[str, ...]:
        return tuple(s for s in self.signals if s in MODEL_SIGNALS)


@dataclass
class ShardScored:
    """What one unit did: the shard, its samples, the samples that could not be scored, whether it was skipped."""

    shard: str
    samples: int = 0
    failed: int = 0
    skipped: bool = False
    error: str | None = None


@dataclass
class ScoreSummary:
    """The shards this process scored: all of them, or under torchrun this ``rank``'s share of ``world``."""

    shards: list[ShardScored] = field(default_factory=list)
    rank: int = 0
    world: int = 1

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def failed(self) -> int:
        return sum(s.failed for s in self.shards)

    @property
    def failed_shards(self) -> list[ShardScored]:
        return [s for s in self.shards if s.error is not None]

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"samples": self.samples, "failed_samples": self.failed,
                               "shards": [vars(s) for s in self.shards]}
        if self.world > 1:
            doc.update(rank=self.rank, world=self.world)
        return doc


def signal_record(name: str, options: ScoreOptions) -> dict[str, Any]:
    """What a signal is, recorded with its scores: its fields, model file and sha256 (None: no model),
    preprocessing and scale."""
    if name in MODEL_SIGNALS:
        from fgdata.score import models

        assert options.model_dir is not None  # checked up front by models.check_files
        return models.signal_record(name, options.model_dir)
    return {"fields": list(WEIGHT_FREE[name]), "model": None, "model_sha256": None, **DESCRIPTIONS[name]}


def _media_member(members: dict[str, bytes], image_ext: str | None) -> tuple[str, bytes] | None:
    """The member scored: ``--image-ext``'s, else the sample's first image, else its first video."""
    from fgdata.media.decode import VIDEO_EXTS
    from fgdata.media.image import SourceImageExtensions

    if image_ext is not None:
        return (image_ext, members[image_ext]) if image_ext in members else None
    exts = SourceImageExtensions()
    image = next(((e, d) for e, d in members.items() if e in exts), None)
    return image or next(((e, d) for e, d in members.items() if e.rpartition(".")[2] in VIDEO_EXTS), None)


def _pictures(ext: str, data: bytes) -> tuple[list[Image.Image], bool]:
    """A member decoded once for every signal: ``([image], False)`` for an image, a video's scored frames
    (:func:`fgdata.score.signals.video_times`) and True for a video."""
    from fgdata.media.decode import VIDEO_EXTS
    from fgdata.media.image import decode_display
    from fgdata.score.signals import video_times

    if ext.rpartition(".")[2] in VIDEO_EXTS:
        from fgdata.media.video import frames_shown_at, probe_video

        info = probe_video(data)
        return frames_shown_at(data, video_times(info.duration), info), True
    return [decode_display(data)[0]], False


@dataclass
class _Sample:
    """One sample on its way through the scorer: its fields so far and, for the model signals, its pictures as the
    model's input (None: nothing to score), whether they are a video's frames, and its caption."""

    fields: dict[str, Any]
    inputs: list[dict[str, np.ndarray]] | None = None
    video: bool = False
    caption: str | None = None


def _sample(members: dict[str, bytes], options: ScoreOptions,
            prepare: Callable[[Image.Image], dict[str, np.ndarray]] | None) -> _Sample:
    """One sample's weight-free fields (``score_error`` when its media could not be read) and its model inputs
    (``prepare``: each picture as the models' inputs, :meth:`fgdata.score.models.Scorer.prepare`; None without
    model signals), from one decode of its media."""
    from fgdata.media.errors import MediaError
    from fgdata.score.signals import analyse_image, caption_fields, caption_text, image_fields, reduce_frames
    from fgdata.shards.scores import ERROR_FIELD

    out = _Sample({}, caption=caption_text(members, options.text_ext))
    wanted = frozenset(IMAGE_SIGNALS.intersection(options.signals))
    if wanted or prepare is not None:
        found = _media_member(members, options.image_ext)
        if found is None:
            out.fields[ERROR_FIELD] = f"no {options.image_ext or 'image or video'} member"
        else:
            try:
                pictures, out.video = _pictures(*found)
                if wanted:
                    per_frame = [image_fields(analyse_image(p), wanted) for p in pictures]
                    out.fields.update(reduce_frames(per_frame) if out.video else per_frame[0])
                if prepare is not None:
                    out.inputs = [prepare(p) for p in pictures]
            except MediaError as exc:
                out.fields = {ERROR_FIELD: f".{found[0]}: {_ADDRESS.sub('>', str(exc))}"}
                out.inputs = None
    if "caption" in options.signals:
        out.fields.update(caption_fields(out.caption))
    return out


def sample_scores(members: dict[str, bytes], options: ScoreOptions) -> dict[str, Any]:
    """One sample's weight-free fields (and ``score_error`` when its image or video could not be read)."""
    return _sample(members, options, None).fields


def scored(items: Iterable[Any], members_of: Callable[[Any], dict[str, bytes] | None], options: ScoreOptions
           ) -> Iterator[tuple[Any, dict[str, Any] | None]]:
    """Each item with its sample's fields, in order (None for an item ``members_of`` gives no sample for). The
    weight-free fields are computed per sample; the model signals run on batches of about ``options.batch_size``
    pictures (a video's frames stay in one batch)."""
    if not options.model_signals:
        for item in items:
            members = members_of(item)
            yield item, None if members is None else sample_scores(members, options)
        return
    from fgdata.score.models import scorer

    assert options.model_dir is not None
    prepare = scorer(options.model_dir, options.device, options.model_signals).prepare
    batch: list[tuple[Any, _Sample | None]] = []
    pictures = 0
    for item in items:
        members = members_of(item)
        sample = None if members is None else _sample(members, options, prepare)
        batch.append((item, sample))
        pictures += len(sample.inputs or ()) if sample is not None else 0
        if pictures >= options.batch_size:
            yield from _model_pass(batch, options)
            batch, pictures = [], 0
    yield from _model_pass(batch, options)


def _model_pass(batch: list[tuple[Any, _Sample | None]], options: ScoreOptions
                ) -> Iterator[tuple[Any, dict[str, Any] | None]]:
    """Add the model fields to one batch (a video's: reduced over its frames, as its weight-free fields are)."""
    from fgdata.score.models import scorer
    from fgdata.score.signals import reduce_frames
    from fgdata.shards.scores import ERROR_FIELD

    if not batch:
        return
    assert options.model_dir is not None
    model = scorer(options.model_dir, options.device, options.model_signals)
    ready = [s for _, s in batch if s is not None and s.inputs]
    images = [x for s in ready for x in s.inputs or ()]
    captions = [s.caption for s in ready for _ in s.inputs or ()]
    if images:
        got = iter(model.score(images, captions, options.model_signals))
        for sample in ready:
            per_frame = [next(got) for _ in sample.inputs or ()]
            bad = sorted({k for f in per_frame for k, v in f.items() if not math.isfinite(v)})
            if bad:  # never a NaN where a number is expected: the sample is reported instead
                sample.fields[ERROR_FIELD] = f"the model gave a non-finite {', '.join(bad)}"
                per_frame = [{k: v for k, v in f.items() if k not in bad} for f in per_frame]
            sample.fields.update(reduce_frames(per_frame) if sample.video else per_frame[0])
    for item, done in batch:
        yield item, None if done is None else done.fields


def score_shard(options: ScoreOptions, shard: str) -> ShardScored:
    """Score one shard and write its score file (the unit; see the module docstring): the asked-for signals
    anew, the fields of other signals kept when the file describes the same shard bytes."""
    from fgdata import storage
    from fgdata.errors import FgdataError
    from fgdata.shards import iter_samples
    from fgdata.shards.scores import ERROR_FIELD, ScoreFile, read_scores, write_scores

    size = storage.size(shard)
    old = read_scores(shard)
    if old is not None and old.shard_size != size:
        old = None  # the shard was rewritten: its old scores describe other bytes
    done = ShardScored(shard)
    rows: dict[str, dict[str, Any]] = {}
    try:
        for s, fields in scored(iter_samples(shard), lambda s: s.members, options):
            row = dict(old.rows.get(s.key, {})) if old is not None else {}
            row.pop(ERROR_FIELD, None)
            row.update(fields or {})
            rows[s.key] = row
    except FgdataError as exc:
        done.error = str(exc)
        return done
    signals = dict(old.signals) if old is not None else {}
    signals.update({name: signal_record(name, options) for name in options.signals})
    # a signal asked for again is recomputed; one that failed on some samples this time leaves them without it
    write_scores(shard, ScoreFile(storage.basename(shard), size, dict(sorted(signals.items())), rows))
    done.samples = len(rows)
    done.failed = sum(ERROR_FIELD in r for r in rows.values())
    return done


def score_datasets(paths: list[str], options: ScoreOptions, run: RunSettings | None = None) -> ScoreSummary:
    """Score every shard named by ``paths`` (folders, shards, brace patterns; local, s3://, http(s)://) on the
    executor ``run`` names (local processes or Ray), one job per folder (:class:`ScoreJob`). Under torchrun, shard
    ``i`` of each folder's selection is this rank's when ``i mod world == rank`` (each rank reports its share);
    rank 0 waits for the other ranks' score files and writes each folder's ``scores.json``."""
    from fgdata import storage
    from fgdata.jobs.driver import RunSettings, run_job
    from fgdata.shards.select import resolve_shards

    from fgdata.score.models import check_files

    run = run or RunSettings()
    check_files(options.model_dir, options.signals, options.device)
    if run.workers > 1 or run.engine == "ray":
        from fgdata.score.models import scorer

        scorer.cache_clear()  # each worker process loads its own copy; this one need not hold the model meanwhile
    selection = resolve_shards(paths)
    read_only = [s for s in selection.shards if s.startswith(("http://", "https://"))]
    if read_only:
        raise OptionError(f"{read_only[0]}: score files are written beside the shards, and http(s) is read-only; "
                          "copy the shards to a local folder or s3:// first")
    summary = ScoreSummary()
    for folder, shards in selection.datasets.items():
        job = ScoreJob(folder, shards, selection.sizes, options, selection.given_whole(shards[0]))
        done = run_job(job, run)
        summary.rank, summary.world = done.rank, done.world
        summary.shards += [scored for _, scored in sorted(job.scored)]
        if done.whole_job:
            storage.remove_tree(job.dest)
    return summary


@dataclass(frozen=True)
class ScoreUnit:
    """One unit: the ``number``-th shard of a folder, and its inputs' fingerprint (the shard's path and size)."""

    number: int
    inputs: str
    shard: str


@dataclass(frozen=True)
class ScoredPayload:
    """``score``'s own field of a unit's marker: the samples that could not be scored (``score_error``)."""

    failed: int

    def to_json(self) -> dict[str, Any]:
        return {"failed": self.failed}


def _inputs(shard: str, size: int | None) -> str:
    import hashlib
    import json

    from fgdata import storage

    return hashlib.sha256(json.dumps([storage.absolute(shard), size]).encode()).hexdigest()[:24]


class ScoreJob(JobDefinition[ScoreUnit]):
    """One folder's shards for :func:`fgdata.jobs.driver.run_job`: DST is the job's state folder
    ``FOLDER/.fgdata-score`` (its lock; nothing else), the units' outputs are the score files beside the shards and
    those files are the units' markers (see the module docstring)."""

    command = "score"

    def __init__(self, folder: str, shards: list[str], sizes: dict[str, int], options: ScoreOptions, whole: bool):
        from fgdata import storage

        self.folder_path, self.shards, self.sizes, self.options, self.whole = folder, shards, sizes, options, whole
        self.dest = storage.join(folder, STATE_FOLDER)
        self.scored: list[tuple[int, ShardScored]] = []  # this process's shards: (unit, what it did)

    def fingerprint(self) -> str:
        import hashlib
        import json

        records = {name: signal_record(name, self.options) for name in self.options.signals}
        return hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()[:24]

    def start(self, settings: RunSettings, rank: int, world: int) -> None:
        if world > 1 and not settings.resume:
            flag = "--overwrite" if settings.overwrite else "--no-resume"
            raise OptionError(f"{flag}: under torchrun rank 0 cannot tell this launch's score files from an earlier "
                              "run's; run it in one process (or remove the score files first)")

    def prepare(self, ctx: Context) -> None:
        """``--overwrite`` removes the shards' score files (every signal's fields, and ``scores.json`` of a folder
        given whole), saying so; ``--no-resume`` says it scores every shard again."""
        from fgdata import storage
        from fgdata.shards.scores import META_FILE, scores_path

        notify, signals = ctx.notify, "+".join(self.options.signals)
        if ctx.settings.overwrite and ctx.rank == 0:
            files = [p for p in (scores_path(s) for s in self.shards) if storage.exists(p)]
            meta = storage.join(self.folder_path, META_FILE)
            if self.whole and storage.exists(meta):
                files.append(meta)
            if files and notify:
                shown = ", ".join(storage.basename(f) for f in files[:5]) + (" and more" if len(files) > 5 else "")
                notify(f"--overwrite: removing {len(files)} score file(s) from {self.folder_path}: {shown}")
            for path in files:
                storage.remove(path)
        elif not ctx.resume and notify:
            notify(f"--no-resume: scoring every shard of {self.folder_path} again with {signals} (the fields of "
                   "other signals in their score files are kept)")

    def plan(self) -> Iterator[ScoreUnit]:
        from fgdata import storage

        for number, shard in enumerate(self.shards):
            size = self.sizes.get(shard)
            yield ScoreUnit(number, _inputs(shard, storage.size(shard) if size is None else size), shard)

    def units_left(self) -> set[int]:
        from fgdata import storage
        from fgdata.shards.scores import SUFFIX

        names = set(storage.list_names(self.folder_path))
        return {n for n, shard in enumerate(self.shards) if storage.basename(shard) + SUFFIX in names}

    def unit_state(self, number: int) -> Marker | None:
        """A shard's score file as its unit's marker: this job's options when it holds every asked-for signal as
        this run computes it, its inputs the shard bytes it describes (None: no readable score file)."""
        from fgdata.errors import FgdataError
        from fgdata.shards.scores import ERROR_FIELD, read_scores

        if number >= len(self.shards):
            return None
        shard = self.shards[number]
        try:
            found = read_scores(shard)
        except FgdataError:
            return None  # torn or foreign: scored again
        if found is None:
            return None
        holds = all(found.signals.get(n) == signal_record(n, self.options) for n in self.options.signals)
        failed = sum(ERROR_FIELD in r for r in found.rows.values())
        return self._marker(number, shard, self.fingerprint() if holds else "", _inputs(shard, found.shard_size),
                            len(found.rows), failed)

    @staticmethod
    def _marker(number: int, shard: str, options: str, inputs: str, samples: int, failed: int,
                error: str | None = None) -> Marker:
        from fgdata.jobs.units import Entry

        return Marker(unit=number, first=number, count=samples, options=options, inputs=inputs, stamps=[],
                      names=[shard], shards=[], written=samples, warnings=[],
                      failures=[Entry(shard, error, None)] if error else [], payload=ScoredPayload(failed))

    def keep(self, marker: Marker, ctx: Context) -> None:
        failed = marker.payload.failed if isinstance(marker.payload, ScoredPayload) else 0
        self.scored.append((marker.unit, ShardScored(self.shards[marker.unit], marker.count, failed, skipped=True)))

    def execute(self, pending: Iterator[ScoreUnit], executor: Executor, ctx: Context) -> Iterator[Marker]:
        from fgdata.jobs import outputs
        from fgdata.jobs.executor import run_units

        units: dict[str, ScoreUnit] = {}

        def calls() -> Iterator[str]:
            for unit in pending:
                units[unit.shard] = unit
                yield unit.shard

        for n, done in enumerate(run_units(score_shard, calls(), executor, self.options), 1):
            unit = units.pop(done.shard)
            self.scored.append((unit.number, done))
            marker = self._marker(unit.number, done.shard, ctx.stamp[0], unit.inputs, done.samples, done.failed,
                                  done.error)
            ctx.progress(marker.count, 0)
            yield marker
            outputs.reached(n)

    def sweep(self, ctx: Context) -> None:
        """Nothing to sweep: the markers are the score files, and those of shards not selected are the dataset's."""

    def write_final(self, ctx: Context) -> Totals:
        """``scores.json``: what each signal in the folder's score files is (written once every unit is in)."""
        from fgdata.shards.scores import read_meta, write_meta

        meta = read_meta(self.folder_path)
        new = {name: signal_record(name, self.options) for name in self.options.signals}
        if any(meta.get(k) != v for k, v in new.items()):
            write_meta(self.folder_path, dict(sorted({**meta, **new}.items())))
        return Totals()


def score_into(path: str, options: ScoreOptions, run: RunSettings | None = None) -> JobSummary:
    """``score --into``: write the scores into each sample's json member instead, for readers that read only the tar.

    The shards of ``path`` are rewritten in place by the job core, as ``encode text --into`` rewrites them (each
    shard replaced atomically, resumable per shard); every member but the json is kept byte for byte, and the
    json keeps every field it had, with the scores set at its top level. A sample whose json is not an object, or
    whose image cannot be scored, keeps every member it had and is reported as not updated. A score file beside
    a shard would describe the old bytes, so a shard that has one is refused: score it one way only.
    """
    import json

    from fgdata import storage
    from fgdata.encode.jobs import task_samples, user_json
    from fgdata.errors import FgdataError
    from fgdata.encode.tasks import Result, Task, TaskDefinition, TaskJob, shard_tasks
    from fgdata.jobs.driver import run_job
    from fgdata.score.models import check_files
    from fgdata.shards.scores import ERROR_FIELD, scores_path, write_meta

    check_files(options.model_dir, options.signals, options.device)
    tasks = shard_tasks(path)
    for t in tasks:
        if t.source is not None and storage.exists(scores_path(t.source)):
            raise FgdataError(f"{scores_path(t.source)}: this shard's scores are kept beside it; --into would leave "
                              "that file describing old bytes (remove it, or score without --into)")

    def readable(task: Task) -> Iterator[Any]:
        """Each sample with its json object, or a Result to pass on (skipped, or a json that is not an object)."""
        for s in task_samples(task):
            if isinstance(s, Result):
                yield s
                continue
            try:
                yield s, user_json(s.members.get("json"))
            except FgdataError as exc:
                yield Result(s.index, s.key, None, str(exc), original=s.members)

    def produce(task: Task) -> Any:
        for item, fields in scored(readable(task), lambda it: None if isinstance(it, Result) else it[0].members,
                                   options):
            if fields is None:
                yield item
                continue
            s, doc = item
            if ERROR_FIELD in fields:
                yield Result(s.index, s.key, None, f"score: {fields[ERROR_FIELD]}", original=s.members)
                continue
            members = dict(s.members)
            members["json"] = json.dumps({**doc, **fields}, sort_keys=True, separators=(",", ":"),
                                         allow_nan=False).encode()
            yield Result(s.index, s.key, members)

    def provenance() -> dict[str, Any]:
        return {"signals": {name: signal_record(name, options) for name in options.signals}}

    # one job (state folder, resume record, provenance entry) per signal set: scoring another signal later is a
    # job of its own that adds its fields, while a rerun of the same set resumes
    job = TaskJob(dest=path, command="score " + "+".join(options.signals), tasks=tasks, options=options, produce=produce, provenance=provenance,
                  in_place=True)
    summary = run_job(TaskDefinition(job), run)
    from fgdata.shards.scores import read_meta

    meta = read_meta(path)
    write_meta(path, dict(sorted({**meta, **provenance()["signals"]}.items())))
    return summary
