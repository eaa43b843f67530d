"""``fgdata score``: per-sample scores of every shard, written beside it (:mod:`fgdata.shards.scores`).

One work unit per shard, run by :func:`fgdata.jobs.executor.run_units`. The unit's output, the score file, is
also its marker: it is written whole and atomically once the shard is read, and it records the shard's byte size
and the signals it holds. A rerun skips a shard whose score file holds every asked-for signal for the same shard
size, so a run stopped at any point (SIGKILL included) and rerun gives the bytes of an uninterrupted run.
Scoring another signal later reads the file, adds the new fields to each row and rewrites it: the shard itself
is only read, never written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fgdata.errors import OptionError
from fgdata.score.models import MODEL_SIGNALS
from fgdata.score.signals import DESCRIPTIONS, IMAGE_SIGNALS, WEIGHT_FREE

if TYPE_CHECKING:
    from fgdata.jobs.summary import JobSummary
    from fgdata.jobs.driver import RunSettings

#: An object's address in an error message (Pillow names the BytesIO it read): dropped, so reruns write the same bytes.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")
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
    shards: list[ShardScored] = field(default_factory=list)

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
        return {"samples": self.samples, "failed_samples": self.failed,
                "shards": [vars(s) for s in self.shards]}


def signal_record(name: str, options: ScoreOptions) -> dict[str, Any]:
    """What a signal is, recorded with its scores: its fields, model file and sha256 (None: no model),
    preprocessing and scale."""
    if name in MODEL_SIGNALS:
        from fgdata.score import models

        assert options.model_dir is not None  # checked up front by models.check_files
        return models.signal_record(name, options.model_dir)
    return {"fields": list(WEIGHT_FREE[name]), "model": None, "model_sha256": None, **DESCRIPTIONS[name]}


def _image_member(members: dict[str, bytes], image_ext: str | None) -> tuple[str, bytes] | None:
    from fgdata.media.image import SourceImageExtensions

    if image_ext is not None:
        return (image_ext, members[image_ext]) if image_ext in members else None
    exts = SourceImageExtensions()
    return next(((e, d) for e, d in members.items() if e in exts), None)


def sample_scores(members: dict[str, bytes], options: ScoreOptions) -> dict[str, Any]:
    """One sample's fields (and ``score_error`` when its image signals could not be computed)."""
    from fgdata.media.errors import MediaError
    from fgdata.score.signals import analyse, caption_fields, caption_text, image_fields
    from fgdata.shards.scores import ERROR_FIELD

    out: dict[str, Any] = {}
    wanted = IMAGE_SIGNALS.intersection(options.signals)
    if wanted:
        found = _image_member(members, options.image_ext)
        if found is None:
            out[ERROR_FIELD] = f"no {options.image_ext or 'image'} member"
        else:
            try:
                out.update(image_fields(analyse(found[1]), frozenset(wanted)))
            except MediaError as exc:
                out[ERROR_FIELD] = f".{found[0]}: {_ADDRESS.sub('>', str(exc))}"
    if "caption" in options.signals:
        out.update(caption_fields(caption_text(members, options.text_ext)))
    return out


def scored(items: Iterable[Any], members_of: Callable[[Any], dict[str, bytes] | None], options: ScoreOptions
           ) -> Iterator[tuple[Any, dict[str, Any] | None]]:
    """Each item with its sample's fields, in order (None for an item ``members_of`` gives no sample for). The
    weight-free fields are computed per sample; the model signals run on batches of ``options.batch_size``."""
    if not options.model_signals:
        for item in items:
            members = members_of(item)
            yield item, None if members is None else sample_scores(members, options)
        return
    batch: list[tuple[Any, dict[str, Any] | None, dict[str, bytes] | None]] = []
    for item in items:
        members = members_of(item)
        batch.append((item, None if members is None else sample_scores(members, options), members))
        if sum(m is not None for _, _, m in batch) >= options.batch_size:
            yield from _model_pass(batch, options)
            batch = []
    yield from _model_pass(batch, options)


def _model_pass(batch: list[tuple[Any, dict[str, Any] | None, dict[str, bytes] | None]], options: ScoreOptions
                ) -> Iterator[tuple[Any, dict[str, Any] | None]]:
    """Add the model fields to one batch: images that cannot be decoded get ``score_error`` and no model fields."""
    from fgdata.media.errors import MediaError
    from fgdata.score.models import preprocess, scorer
    from fgdata.score.signals import caption_text
    from fgdata.shards.scores import ERROR_FIELD

    if not batch:
        return
    assert options.model_dir is not None
    model = scorer(options.model_dir, options.device, options.model_signals)
    ready: list[int] = []
    images, captions = [], []
    for i, (_, fields, members) in enumerate(batch):
        if members is None or fields is None:
            continue
        found = _image_member(members, options.image_ext)
        if found is None:
            fields[ERROR_FIELD] = f"no {options.image_ext or 'image'} member"
            continue
        try:
            images.append(preprocess(found[1], model.image_size))
        except MediaError as exc:
            fields[ERROR_FIELD] = f".{found[0]}: {_ADDRESS.sub('>', str(exc))}"
            continue
        ready.append(i)
        captions.append(caption_text(members, options.text_ext))
    if images:
        for i, got in zip(ready, model.score(images, captions, options.model_signals)):
            fields = batch[i][1]
            assert fields is not None
            bad = sorted(k for k, v in got.items() if not math.isfinite(v))
            if bad:  # never a NaN where a number is expected: the sample is reported instead
                fields[ERROR_FIELD] = f"the model gave a non-finite {', '.join(bad)}"
            fields.update({k: v for k, v in got.items() if k not in bad})
    for item, fields, _ in batch:
        yield item, fields


def score_shard(options: ScoreOptions, shard: str) -> ShardScored:
    """Score one shard and write its score file (the unit; see the module docstring)."""
    from fgdata import storage
    from fgdata.errors import FgdataError
    from fgdata.shards import iter_samples
    from fgdata.shards.scores import ERROR_FIELD, ScoreFile, read_scores, write_scores

    size = storage.size(shard)
    old = read_scores(shard)
    if old is not None and old.shard_size != size:
        old = None  # the shard was rewritten: its old scores describe other bytes
    done = ShardScored(shard)
    if old is not None and all(old.signals.get(n) == signal_record(n, options) for n in options.signals):
        done.samples = len(old.rows)
        done.failed = sum(ERROR_FIELD in r for r in old.rows.values())
        done.skipped = True
        return done
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


def score_datasets(paths: list[str], options: ScoreOptions, *, workers: int = 1,
                   progress: Callable[[ShardScored], None] | None = None) -> ScoreSummary:
    """Score every shard named by ``paths`` (folders, shards, brace patterns; local, s3://, http(s)://)."""
    from fgdata.jobs import outputs
    from fgdata.jobs.executor import Pool, run_units
    from fgdata.shards.scores import read_meta, write_meta
    from fgdata.shards.select import resolve_shards

    from fgdata.score.models import check_files

    if workers < 1:
        raise OptionError("--workers must be at least 1")
    check_files(options.model_dir, options.signals, options.device)
    if workers > 1:
        from fgdata.score.models import scorer

        scorer.cache_clear()  # each worker process loads its own copy; this one need not hold the model meanwhile
    selection = resolve_shards(paths)
    read_only = [s for s in selection.shards if s.startswith(("http://", "https://"))]
    if read_only:
        raise OptionError(f"{read_only[0]}: score files are written beside the shards, and http(s) is read-only; "
                          "copy the shards to a local folder or s3:// first")
    summary = ScoreSummary()
    for result in run_units(score_shard, selection.shards, Pool(workers), options):
        summary.shards.append(result)
        if progress is not None:
            progress(result)
        outputs.output_done()
    for folder in selection.folders:
        meta = read_meta(folder)
        new = {name: signal_record(name, options) for name in options.signals}
        if any(meta.get(k) != v for k, v in new.items()):
            write_meta(folder, dict(sorted({**meta, **new}.items())))
    return summary


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
