"""The job core's work units: inputs streamed in fixed-size units, each written under its own final names.

**Units.** A job reads its inputs in source order and cuts them into units of ``unit_size`` inputs as it reads
(unit ``u`` holds positions ``u * unit_size`` up to the next unit's first), so the driver holds only the units
in flight, never the whole input list. A unit is planned from its inputs alone: their order (a seeded shuffle
within the unit, when asked) and a fingerprint of their names and content stamps
(:mod:`fgdata.sources.stamps`).

**Names.** Unit ``u`` writes its ``j``-th shard as ``"%05d.tar" % (u * slots + j)``: a name fixed by the unit,
so a local run, torchrun ranks and Ray give the same files by construction, a unit can be redone alone, and
nothing is renamed afterwards (on S3 a rename is a copy and a delete). ``slots`` is
``ceil(unit_size / maxcount)`` when each input gives at most one sample and shards have no byte cap (then
shard names run on without gaps, except where a whole shard's inputs failed), else :data:`WIDE_SLOTS`; a unit
that would need more shards than its slots stops the job with one line saying to lower ``--unit-size``.

**Plans.** When a unit starts, before it writes anything, it leaves its :class:`Plan` (its position range,
its inputs' and options' fingerprints, the launch) under its marker's name; the marker replaces it when the
unit ends. A plan in place is a unit started and not finished: a rerun counts it as one it writes again from
its start, and rank 0's wait says which missing units their rank has started.

**Markers.** Once a unit's last shard is in place it leaves ``DST/.fgdata/units/NNNNNN.json`` (``encode`` and
``kd``, whose unit is one task: ``DST/.fgdata/<key>/units/``, :func:`units_dir`) (:class:`Marker`): the
fingerprint of the options that change bytes, its inputs' fingerprint and stamps, its shards with their sample
counts, its failures and warnings, the inputs a row selection left out that belong to it (per shard too), and
this run's figures. A torn or foreign marker reads as absent. A rerun
skips the units whose marker matches and whose shards are all in place with their sizes (one listing of DST
tells: :func:`resumable`, the one rule), redoes a unit whose inputs changed (naming the inputs) or whose shards
went missing, and redoes a unit that was stopped half-way from its start (its complete shards are written
again with the same bytes).

**Finalize.** The process that finishes the job (the only process, the Ray driver, or torchrun rank 0 after
waiting for every marker) reads the markers in unit order once, spooled to a local file as they are met, and
streams ``shard_count.json``, ``failures.json`` and (URL jobs) ``shard_stats.json`` from them without reading a
shard again; shards and markers that no unit of this job claims (a shorter input list, an earlier run's
shards) are removed, saying so.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any, BinaryIO, Generic, Protocol, TypedDict, TypeVar

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.jobs.report import FAILURES_FILE, FORMAT, VERSION, FailureDoc, ReportFields, category

UNITS_DIR = ".fgdata/units"
WORK_DIR = ".fgdata/work"
MARKER_FORMAT = "fgdata.unit"
MARKER_VERSION = 2  # 2: the command's own fields moved into ``payload``; a marker of 1 reads as foreign
PLAN_FORMAT = "fgdata.unit-plan"
#: Shard slots of a unit whose inputs may give several samples each (clips) or whose shards have a byte cap.
WIDE_SLOTS = 10_000
SHARD_FORMAT = "%05d.tar"


def shard_name(unit: int, j: int, slots: int) -> str:
    """The ``j``-th shard of unit ``unit`` (see the module docstring)."""
    if j >= slots:
        raise FgdataError(f"work unit {unit} needs more than {slots} shards; rerun with a smaller --unit-size "
                          "(with --no-resume)")
    return SHARD_FORMAT % (unit * slots + j)


def slots_per_unit(unit_size: int, maxcount: int, one_sample_per_input: bool) -> int:
    if one_sample_per_input:
        return -(-unit_size // maxcount)
    return WIDE_SLOTS


class _EntryFields(FailureDoc):
    index: int | None


class EntryDoc(_EntryFields, total=False):
    """An :class:`Entry` as a marker, the spool and ``failures.json`` write it (``kept``: in-place jobs only)."""

    kept: bool


@dataclass(frozen=True)
class Entry:
    """A failure (or a warning) of one input: its name, why, and its index in the source order (``kept``: an
    in-place job wrote the input back unchanged, reported as not updated)."""

    input: str
    reason: str
    index: int | None
    kept: bool = False

    def to_json(self) -> EntryDoc:
        doc: EntryDoc = {"input": self.input, "reason": self.reason, "index": self.index}
        if self.kept:  # only in-place jobs write the key, so other reports keep their bytes
            doc["kept"] = True
        return doc

    @classmethod
    def from_json(cls, doc: EntryDoc) -> "Entry":
        return cls(str(doc["input"]), str(doc["reason"]), doc.get("index"), bool(doc.get("kept", False)))


@dataclass(frozen=True)
class ShardDone:
    """One shard a unit wrote: its name, samples, byte size, and the failures met while it was open (by
    category) and the inputs a row selection left out that count for it (by reason)."""

    name: str
    samples: int
    size: int
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    filtered_by_reason: dict[str, int] = field(default_factory=dict)


class Input(Protocol):
    """What the engine needs of one input of a unit: its position in the source order and its name in reports
    (a command's own record, e.g. ``shard``'s :class:`fgdata.sources.folder.WorkItem`)."""

    @property
    def index(self) -> int: ...

    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Input)


@dataclass(frozen=True)
class Unit(Generic[T]):
    """One unit of work: its number, the position of its first input and its inputs in writing order."""

    number: int
    first: int
    items: tuple[T, ...]
    stamps: tuple[str, ...]  # per item, in writing order
    inputs: str  # fingerprint of the unit's inputs (names, order, stamps)

    @property
    def positions(self) -> range:
        return range(self.first, self.first + len(self.items))


class Payload(Protocol):
    """A command's own fields of a marker (``shard``'s bytes read, clips, captions...): JSON data it writes and
    reads back itself (the engine keeps what it reads as :class:`Opaque`)."""

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Opaque:
    """A payload read without its command's type: kept as read and written back as it was."""

    doc: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.doc


@dataclass
class Marker:
    """What a finished unit leaves in ``DST/.fgdata/units/``: its plan and its result (plain JSON data), the
    command's own fields (``payload``: None for commands that have none) and the inputs a row selection left out
    that belong to the unit (``filtered``, by reason: counted in ``seen``, neither written nor failed; those of
    its shards are in each :class:`ShardDone`)."""

    unit: int
    first: int
    count: int
    options: str
    inputs: str
    stamps: list[str]
    names: list[str]  # its inputs' names, in writing order (to say which changed)
    shards: list[ShardDone]
    written: int
    failures: list[Entry]
    warnings: list[Entry]
    launch: str | None = None
    payload: Payload | None = None
    filtered: dict[str, int] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        doc = {"format": MARKER_FORMAT, "version": MARKER_VERSION, **asdict(replace(self, payload=None)),
               "payload": None if self.payload is None else self.payload.to_json()}
        return json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes) -> "Marker | None":
        """The marker in ``data``; None when it is torn, foreign or of another version."""
        try:
            doc = json.loads(data)
            if doc.get("format") != MARKER_FORMAT or doc.get("version") != MARKER_VERSION:
                return None
            payload = doc["payload"]
            return cls(unit=int(doc["unit"]), first=int(doc["first"]), count=int(doc["count"]),
                       options=str(doc["options"]), inputs=str(doc["inputs"]), stamps=list(doc["stamps"]),
                       names=list(doc["names"]),
                       shards=[ShardDone(str(s["name"]), int(s["samples"]), int(s["size"]), dict(s["failed_by_reason"]),
                                         dict(s.get("filtered_by_reason", {}))) for s in doc["shards"]],
                       written=int(doc["written"]), failures=[Entry.from_json(f) for f in doc["failures"]],
                       warnings=[Entry.from_json(w) for w in doc["warnings"]], launch=doc.get("launch"),
                       payload=None if payload is None else Opaque(dict(payload)),
                       filtered=dict(doc.get("filtered", {})))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)


@dataclass(frozen=True)
class Plan:
    """What a unit leaves under its marker's name when it starts (:func:`start_unit`): its position range
    (``count`` None: a task whose input's sample count is not known before it is read), its inputs'
    fingerprint, the byte options and the launch. The unit's :class:`Marker` replaces it when the unit ends,
    so a plan in place means the unit was started and not finished: a rerun says it writes that unit again
    from its start, and rank 0's wait says which missing units their rank has started."""

    unit: int
    first: int
    count: int | None
    options: str
    inputs: str
    launch: str | None = None

    def to_bytes(self) -> bytes:
        doc = {"format": PLAN_FORMAT, "version": MARKER_VERSION, **asdict(self)}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes) -> "Plan | None":
        """The plan in ``data``; None when it is torn, foreign, a marker or of another version."""
        try:
            doc = json.loads(data)
            if doc.get("format") != PLAN_FORMAT or doc.get("version") != MARKER_VERSION:
                return None
            count = doc["count"]
            return cls(unit=int(doc["unit"]), first=int(doc["first"]), count=None if count is None else int(count),
                       options=str(doc["options"]), inputs=str(doc["inputs"]), launch=doc.get("launch"))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def marker_path(dest: str, unit: int, folder: str = UNITS_DIR) -> str:
    """Unit ``unit``'s marker (``folder``: the command's markers folder under DST, see :func:`units_dir`)."""
    return storage.join(dest, folder, "%06d.json" % unit)


def units_dir(key: str | None) -> str:
    """The markers folder of a command: ``.fgdata/units`` for ``shard``, ``.fgdata/<key>/units`` for the
    shard-to-shard commands (``key``: ``latents``, ``text``, ``kd-pairs``...), which may write into a folder
    another command's markers describe (``encode text DST DST --into DST``)."""
    return UNITS_DIR if key is None else f".fgdata/{key}/units"


def read_unit(dest: str, unit: int, folder: str = UNITS_DIR) -> Marker | Plan | None:
    """What unit ``unit`` left: its marker (finished), its plan (started, not finished) or None (missing, torn,
    foreign or another unit's)."""
    try:
        data = storage.read_bytes(marker_path(dest, unit, folder))
    except FgdataError:
        return None
    found = Marker.parse(data) or Plan.parse(data)
    return found if found is not None and found.unit == unit else None


def read_marker(dest: str, unit: int, folder: str = UNITS_DIR) -> Marker | None:
    """Unit ``unit``'s marker, or None (missing, started and not finished, torn, foreign or another unit's)."""
    found = read_unit(dest, unit, folder)
    return found if isinstance(found, Marker) else None


def start_unit(dest: str, plan: Plan, folder: str = UNITS_DIR) -> None:
    """Leave the unit's plan under its marker's name before it writes anything (an earlier run's marker of the
    unit goes with it: the unit is being redone)."""
    from fgdata.jobs.signals import critical

    with critical():
        storage.write_bytes(marker_path(dest, plan.unit, folder), plan.to_bytes())


def existing_markers(dest: str, folder: str = UNITS_DIR) -> set[int]:
    """The unit numbers that have a marker file (one listing, so a rerun reads only the markers that exist)."""
    found = set()
    for name in storage.list_names(storage.join(dest, folder)):
        stem = name.removesuffix(".json")
        if name.endswith(".json") and stem.isdigit():
            found.add(int(stem))
    return found


def unit_stage(dest: str, unit: int) -> str:
    """The unit's own local folder where its shards are built (emptied here: only this unit writes there). The
    job refused links in its state folder when it took DST (:func:`fgdata.jobs.dest.refuse_links`); one planted
    since is refused here, before anything below it is emptied."""
    root = storage.staging_dir(dest)
    path = os.path.join(root, WORK_DIR, "%06d" % unit)
    for step in (os.path.dirname(os.path.join(root, WORK_DIR)), os.path.join(root, WORK_DIR), path):
        if os.path.islink(step):
            raise FgdataError(f"{step}: a symbolic link inside fgdata's job state folder; fgdata never follows one "
                              "there (its writes and removals would leave DST): remove it")
    if os.path.isdir(path):
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
    os.makedirs(path, exist_ok=True)
    return path


def inputs_fingerprint(items: Sequence[Input], stamps: Sequence[str]) -> str:
    h = hashlib.sha256()
    for item, stamp in zip(items, stamps, strict=True):
        h.update(f"{item.index}\t{item.name}\t{stamp}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:32]


def plan_units(items: Iterable[T], unit_size: int, shuffle_seed: int | None,
               stamp: Callable[[Sequence[T]], list[str]]) -> Iterator[Unit[T]]:
    """Cut the input stream into units as it is read (``stamp``: the stamps of a batch of items)."""
    batch: list[T] = []
    number = 0

    def unit() -> Unit[T]:
        ordered = list(batch)
        if shuffle_seed is not None:  # seeded per unit: the same order whatever runs the unit
            random.Random(f"{shuffle_seed}/{number}").shuffle(ordered)
        stamps = stamp(ordered)
        return Unit(number, number * unit_size, tuple(ordered), tuple(stamps), inputs_fingerprint(ordered, stamps))

    for item in items:
        batch.append(item)
        if len(batch) == unit_size:
            yield unit()
            number += 1
            batch = []
    if batch:
        yield unit()


# -- resuming and waiting -----------------------------------------------------------------------------------

#: ``size_of(name)``: a shard's byte size in DST, or None when it is missing.
SizeOf = Callable[[str], "int | None"]


def listed_sizes(present: dict[str, tuple[int, str]]) -> SizeOf:
    """``size_of`` from one listing of DST taken when the job started (name -> (size, version))."""
    return lambda name: present[name][0] if name in present else None


def stat_sizes(dest: str) -> SizeOf:
    """``size_of`` asking the storage now (another rank's shards, written after the job started)."""
    def size_of(name: str) -> int | None:
        info = storage.stat(storage.join(dest, name))
        return info.size if info is not None else None
    return size_of


def resumable(marker: Marker, options_fp: str, size_of: SizeOf) -> bool:
    """The one resume rule, with the same inputs (``marker.inputs``, which the caller compares: ``shard`` names
    the inputs that changed): a unit is kept as it is when its marker has the same byte options and every shard
    it records is in DST with the size it records."""
    return marker.options == options_fp and all(size_of(s.name) == s.size for s in marker.shards)


def is_final(marker: Marker, stamp: tuple[str, str | None], inputs: str, resume: bool, size_of: SizeOf,
             redo: Callable[[Marker], bool] = lambda _m: False) -> bool:
    """Whether another rank's marker is this run's last word on its unit: written in this launch (``stamp``:
    the options fingerprint and the launch id), or (resuming) one its owner keeps (:func:`resumable`, and not
    one ``redo`` says the owner runs again)."""
    options_fp, launch = stamp
    if marker.options != options_fp:
        return False
    if launch is not None and marker.launch == launch:
        return True
    return resume and marker.inputs == inputs and not redo(marker) and resumable(marker, options_fp, size_of)


def is_started(plan: Plan, stamp: tuple[str, str | None], inputs: str) -> bool:
    """Whether another rank's plan is of this run's unit: same options and inputs, and (under a launch id) this
    launch's; without a launch id a plan a stopped run left reads as started too."""
    options_fp, launch = stamp
    return (plan.options, plan.inputs) == (options_fp, inputs) and (launch is None or plan.launch == launch)


def wait_for_units(read: Callable[[int], Marker | Plan | None], missing: Iterable[int],
                   judges: tuple[Callable[[Marker], bool], Callable[[Plan], bool]], add: Callable[[Marker], None],
                   world: int, what: str, timeout: float | None, log: Callable[[str], None] | None,
                   name: Callable[[int], str] = lambda u: "unit %06d" % u) -> None:
    """Rank 0: wait (bounded by ``timeout``) until every unit in ``missing`` has a marker ``final`` accepts
    (``read(unit)``: what the unit left, :func:`read_unit` of the job's markers folder; ``judges``: ``final`` and
    ``started``), handing each to ``add`` as it is met; the error names the units still missing, their ranks and
    whether their rank has started them (a plan ``started`` accepts: this run's, not one a killed run left)."""
    from fgdata.jobs.ranks import owner, wait_for

    final, started = judges
    left = list(missing)

    def still_missing() -> list[str]:
        nonlocal left
        waiting = []
        said = []
        for u in left:
            found = read(u)
            if isinstance(found, Marker) and final(found):
                add(found)
                continue
            waiting.append(u)
            state = "started" if isinstance(found, Plan) and started(found) else "not started"
            said.append(f"{name(u)} (rank {owner(u, world)}, {state})")
        left = waiting
        return said

    wait_for(still_missing, what, timeout, log=log)


def drop_markers_from(dest: str, units: int, folder: str = UNITS_DIR) -> None:
    """Remove the markers of units past the job's last (an earlier run over more inputs)."""
    for unit in sorted(u for u in existing_markers(dest, folder) if u >= units):
        storage.remove(marker_path(dest, unit, folder))


# -- the spool and the finalize ------------------------------------------------------------------------------


class Spool:
    """Every unit's marker, appended as met (in any order) to a local temporary file, read back in unit order:
    the driver keeps 8 bytes per unit, not the markers."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()
        self._offsets: dict[int, tuple[int, int]] = {}

    def add(self, marker: Marker) -> None:
        data = marker.to_bytes()
        self._file.seek(0, os.SEEK_END)
        self._offsets[marker.unit] = (self._file.tell(), len(data))
        self._file.write(data)

    def __contains__(self, unit: int) -> bool:
        return unit in self._offsets

    def __len__(self) -> int:
        return len(self._offsets)

    def in_order(self) -> Iterator[Marker]:
        for unit in sorted(self._offsets):
            offset, size = self._offsets[unit]
            self._file.seek(offset)
            marker = Marker.parse(self._file.read(size))
            assert marker is not None
            yield marker

    def close(self) -> None:
        self._file.close()


@dataclass
class Totals:
    """What the finalize counted over every unit."""

    inputs: int = 0
    written: int = 0
    failed: int = 0
    samples: int = 0
    shards: int = 0
    warned: int = 0
    failed_by_reason: Counter[str] = field(default_factory=Counter)
    warned_by_reason: Counter[str] = field(default_factory=Counter)
    retryable: int = 0
    filtered_by_reason: Counter[str] = field(default_factory=Counter)  # the markers' sum

    @property
    def filtered(self) -> int:
        return sum(self.filtered_by_reason.values())


class _ShardStatsFields(TypedDict):
    samples: int
    failed_by_reason: dict[str, int]


class ShardStatsDoc(_ShardStatsFields, total=False):
    """One shard's line of ``shard_stats.json`` (``filtered``: jobs that leave inputs out)."""

    filtered: int
    filtered_by_reason: dict[str, int]


def _json_lines(out: BinaryIO, key: str, lines: BinaryIO, last: bool = False) -> None:
    """Write ``"key": [ ... ]`` from a file of one JSON value per line."""
    out.write(f' "{key}": ['.encode())
    lines.seek(0)
    first = True
    for line in lines:
        out.write(b"\n  " if first else b",\n  ")
        out.write(line.rstrip(b"\n"))
        first = False
    out.write(b"\n ]" if not first else b"]")
    out.write(b"\n}\n" if last else b",\n")


def write_side_file(path: str, build: Callable[[BinaryIO], None]) -> None:
    """Write a side file that may be large (built by ``build`` into a local file) atomically, local or s3://."""
    if storage.is_url(path):
        stage = storage.staging_dir(storage.parent(path))
        os.makedirs(stage, exist_ok=True)
        fd, local = tempfile.mkstemp(dir=stage, prefix=".side-")
        with open(fd, "wb") as f:
            build(f)
        try:
            storage.upload(local, path)
        finally:
            os.unlink(local)
        return
    with storage.atomic_path(path) as tmp, open(tmp, "wb") as f:
        build(f)


def finalize(dest: str, command: str, spool: Spool, fields: ReportFields, stats: bool,
             retryable: Callable[[str], bool]) -> Totals:
    """Stream ``shard_count.json``, ``failures.json`` (and with ``stats`` ``shard_stats.json``) from the
    spooled markers in unit order; return the totals. ``fields``: the report's own fields (``skipped``; with
    ``filtered``, the inputs a row selection left out, which ``seen`` counts too: they must equal the sum of the
    markers' ``filtered``, which ``shard_stats.json`` gives per shard)."""
    from fgdata.shards.index import COUNT_FILE, write_count_entries

    totals = Totals()
    selects = fields.filtered_by_reason is not None
    with tempfile.TemporaryFile() as counts, tempfile.TemporaryFile() as failures, \
            tempfile.TemporaryFile() as warnings, tempfile.TemporaryFile() as per_shard:
        for marker in spool.in_order():
            totals.inputs += marker.count
            totals.written += marker.written
            totals.failed += len(marker.failures)
            totals.warned += len(marker.warnings)
            totals.filtered_by_reason.update(marker.filtered)
            for s in marker.shards:
                counts.write(json.dumps([s.name, s.samples]).encode() + b"\n")
                row: ShardStatsDoc = {"samples": s.samples, "failed_by_reason": dict(sorted(s.failed_by_reason.items()))}
                if selects:
                    row["filtered"] = sum(s.filtered_by_reason.values())
                    row["filtered_by_reason"] = dict(sorted(s.filtered_by_reason.items()))
                per_shard.write(json.dumps([s.name, row]).encode() + b"\n")
                totals.samples += s.samples
                totals.shards += 1
            for f in marker.failures:
                failures.write(json.dumps(f.to_json(), ensure_ascii=False).encode() + b"\n")
                totals.failed_by_reason[category(f.reason)] += 1
                totals.retryable += retryable(f.reason)
            for w in marker.warnings:
                warnings.write(json.dumps(w.to_json(), ensure_ascii=False).encode() + b"\n")
                totals.warned_by_reason[category(w.reason)] += 1
        if totals.inputs != totals.written + totals.failed:
            raise FgdataError(f"{dest}: accounting mismatch: {totals.inputs} inputs seen, {totals.written} written, "
                              f"{totals.failed} failed")
        if totals.filtered_by_reason != Counter(fields.filtered_by_reason or {}):
            raise FgdataError(f"{dest}: accounting mismatch: {fields.filtered} inputs filtered, "
                              f"{totals.filtered} in the work units")

        def count_file(out: BinaryIO) -> None:  # shards in unit order, which is their numeric order
            counts.seek(0)
            write_count_entries(out, (tuple(json.loads(line)) for line in counts))

        def report(out: BinaryIO) -> None:
            head = {"format": FORMAT, "version": VERSION, "command": command,
                    "seen": totals.inputs + totals.filtered,
                    "written": totals.written, "failed": totals.failed, "samples": totals.samples,
                    "failed_by_reason": dict(sorted(totals.failed_by_reason.items())), **fields.to_json()}
            out.write(b"{\n")
            for key, value in head.items():
                out.write(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},\n".encode())
            _json_lines(out, "warnings", warnings)
            _json_lines(out, "failures", failures, last=True)

        write_side_file(storage.join(dest, COUNT_FILE), count_file)
        write_side_file(storage.join(dest, FAILURES_FILE), report)
        if stats:
            from fgdata.jobs.stats import STATS_FILE, write_stats

            write_side_file(storage.join(dest, STATS_FILE), partial(write_stats, totals=totals, per_shard=per_shard,
                                                                    fields=fields.stats_fields(), filtered=selects))
    return totals


def sweep(dest: str, claimed: Callable[[str], bool], units: int, notify: Callable[[str], None] | None) -> list[str]:
    """Remove the shards (with their indexes) that no unit of this job wrote, and the markers of units past
    the last one; return the shards removed. ``claimed(name)``: whether a shard belongs to this job."""
    from fgdata.jobs.dest import remove_files
    from fgdata.shards.index import INDEX_SUFFIX

    stale = sorted(info.name for info in storage.list_dir(dest, ".tar")
                   if info.name[:-4].isdigit() and not claimed(info.name)) if storage.is_dir(dest) else []
    names = set(storage.list_names(dest)) if stale else set()
    remove_files(dest, [n for s in stale for n in (s, s + INDEX_SUFFIX) if n in names],
                 "shards of an earlier run that this run does not write", notify)
    drop_markers_from(dest, units)
    return stale
