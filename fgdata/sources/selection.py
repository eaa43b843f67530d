"""Row selection of a source: ``--where EXPR`` (:mod:`fgdata.sources.where`) and ``--keep-top F --by FIELD``.

The inputs that do not pass are *filtered*: never written and never failed, counted by reason (``where``,
``keep-top``) so that ``seen = written + failed + filtered``. Their keys stay free (a key is the row's index).

Each filtered input counts for an output shard: the inputs left out after an input that is not (those before the
first one too) travel with it (``WorkItem.filtered``), so they count for the shard it is written to, or, when it
fails, for the shard its failure counts for (the next one its work unit closes). ``shard_stats.json`` gives them per
shard, and the job's totals are their sum; a rerun redoes a work unit whose inputs' filtered neighbours changed.

``--keep-top F --by FIELD`` keeps, of the N rows that pass ``--where`` (all rows without it), exactly
floor(F x N) rows with the highest FIELD, ties broken by input order (the earlier row first), as pandas'
``df[mask].nlargest(k, FIELD, keep="first")``; a null or NaN value never qualifies, so fewer rows are kept when
fewer than k have a value. F is taken as the decimal the user typed (``0.29`` is 29/100, not the float just
below it). Two streamed passes: the first reads the rows once and writes the FIELD values of the rows that pass
(8 bytes each, as order-preserving integers) to a temporary file, then finds the k-th largest value exactly by
four 16-bit radix rounds over that file (65,536 counters; the file is read in chunks of :data:`CHUNK` values),
never holding the column in memory; the second is the job's own stream, which keeps a row when its value is above
that threshold, or equal to it and among the first rows equal to it still needed. The threshold and the counts
are in the job's report (``selection`` in ``failures.json`` and ``--json``).
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from fgdata.errors import OptionError
from fgdata.workitem import WorkItem
from fgdata.sources.where import CellTypeError, Where, article, field_kind, field_value, is_null, kind_of, row_kinds

#: Values of the temporary file of ``--keep-top`` read at once (8 bytes each).
CHUNK = 1 << 20
_SIGN = 1 << 63
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class Selection:
    """What ``--where``, ``--keep-top`` and ``--by`` ask for (all None: every row)."""

    where: str | None = None
    keep_top: float | None = None
    by: str | None = None

    def __bool__(self) -> bool:
        return self.where is not None or self.keep_top is not None

    def check(self) -> Where | None:
        """The parsed ``--where`` (None without it); a bad expression or flag pair is a one-line usage error."""
        if (self.keep_top is None) != (self.by is None):
            raise OptionError("--keep-top and --by go together: --keep-top 0.3 --by similarity")
        if self.keep_top is not None and not 0 <= self.keep_top <= 1:
            raise OptionError(f"--keep-top must be a fraction from 0 to 1, not {self.keep_top}")
        return Where(self.where) if self.where is not None else None

    def fraction(self) -> Fraction:
        """``--keep-top`` as the decimal the user typed."""
        assert self.keep_top is not None
        return Fraction(repr(float(self.keep_top)))


@dataclass(frozen=True)
class TopCut:
    """The outcome of ``--keep-top``'s first pass: keep a value above ``key``, or equal to it while fewer than
    ``ties`` rows equal to it were kept (``key`` None: keep none)."""

    rows: int  # rows that passed --where
    kept: int  # rows --keep-top keeps
    key: int | None
    ties: int

    def to_json(self, selection: Selection) -> dict[str, Any]:
        threshold = _float_of(self.key) if self.key is not None else None
        return {"by": selection.by, "keep_top": selection.keep_top, "rows": self.rows, "kept": self.kept,
                "threshold": threshold}


def _key(value: float) -> int:
    """An unsigned 64-bit integer ordered as the float is (-0.0 and 0.0 the same)."""
    import struct

    bits = struct.unpack("<Q", struct.pack("<d", float(value) + 0.0))[0]
    return (~bits & _MASK) if bits & _SIGN else bits | _SIGN


def _float_of(key: int) -> float:
    import struct

    bits = (key & ~_SIGN) if key & _SIGN else (~key & _MASK)
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


def kth_largest(path: str, k: int) -> tuple[int, int]:
    """The k-th largest of the uint64 keys in the file ``path`` (1 <= k <= their number) and how many of
    the k largest equal it, in four 16-bit radix rounds of bounded memory."""
    import numpy as np

    prefix = 0
    need = k
    for shift in (48, 32, 16, 0):
        high = np.uint64((_MASK << (shift + 16)) & _MASK) if shift < 48 else np.uint64(0)
        counts = np.zeros(1 << 16, dtype=np.int64)
        with open(path, "rb") as f:
            while True:
                keys = np.fromfile(f, dtype="<u8", count=CHUNK)
                if not len(keys):
                    break
                keys = keys[(keys & high) == np.uint64(prefix)]
                counts += np.bincount(((keys >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.int64),
                                      minlength=1 << 16)
        above = np.cumsum(counts[::-1])  # above[i]: keys in the top i + 1 buckets
        top = int(np.searchsorted(above, need))  # the first top-bucket count that reaches need
        bucket = (1 << 16) - 1 - top
        need -= int(above[top - 1]) if top else 0
        prefix |= bucket << shift
    return prefix, need


class Selector:
    """Applies a :class:`Selection` to a manifest's work items and counts what it filters out (by reason)."""

    def __init__(self, selection: Selection, columns: tuple[str, str], text_cells: bool):
        self.selection = selection
        self.where = selection.check()
        self.columns = columns  # (path column, caption column)
        self.text_cells = text_cells  # CSV: an empty cell is null, as pandas reads it
        self.filtered: Counter[str] = Counter()
        self._handed: Counter[str] = Counter()  # of those, the ones handed on with an item
        self.cut: TopCut | None = None
        self._ties = 0
        self._checked = False

    def row(self, item: WorkItem) -> dict[str, Any]:
        """The fields of a manifest row as the expression sees them."""
        path_column, caption_column = self.columns
        row: dict[str, Any] = dict(item.metadata)
        row[path_column] = item.name if item.path else None
        row[caption_column] = item.caption
        if self.text_cells:
            row = {k: None if v == "" else v for k, v in row.items()}
        return row

    def _check(self, row: Mapping[str, Any]) -> None:
        """On the first row: refuse unknown fields and mismatched types before any input is used."""
        if self._checked:
            return
        self._checked = True
        kinds = row_kinds(row)
        if self.where is not None:
            self.where.check(kinds)
        by = self.selection.by
        if by is not None:
            kind = field_kind(by, kinds)
            present = ", ".join(sorted(kinds))
            if kind is False:
                raise OptionError(f"--by: no field {by!r} (fields: {present})")
            if kind not in ("number", None):
                raise OptionError(f"--by: field {by!r} holds {article(kind)}, not numbers (fields: {present})")

    def _passes(self, item: WorkItem) -> tuple[bool, dict[str, Any] | None, str | None]:
        """Whether an item passes ``--where`` (with its row), or the reason it is refused."""
        if item.refused:
            return True, None, None  # it fails as it is: a row that cannot be read is not filtered
        row = self.row(item)
        self._check(row)
        try:
            return (self.where is None or self.where(row)), row, None
        except CellTypeError as e:
            return True, row, str(e)

    def _by_key(self, row: Mapping[str, Any]) -> int | None:
        """The order key of the row's ``--by`` value; None for null or NaN; a value that is not a number is a
        :class:`CellTypeError`."""
        assert self.selection.by is not None
        value = field_value(self.selection.by, row)
        if is_null(value):
            return None
        if kind_of(value) != "number":
            raise CellTypeError(f"keep-top: field {self.selection.by!r} holds {article(kind_of(value))} here, not a number")
        return _key(value)

    def plan(self, items: Iterable[WorkItem]) -> None:
        """``--keep-top``'s first pass over the whole stream: find the threshold (see the module docstring)."""
        if self.selection.keep_top is None:
            return
        from array import array

        rows = count = 0
        with tempfile.NamedTemporaryFile(prefix=".keep-top-") as spill:
            buffer: array[int] = array("Q")
            for item in items:
                passes, row, refused = self._passes(item)
                if row is None or refused or not passes:
                    continue
                rows += 1
                try:
                    key = self._by_key(row)
                except CellTypeError:
                    continue  # that row is refused in the second pass
                if key is None:
                    continue
                buffer.append(key)
                count += 1
                if len(buffer) >= CHUNK:
                    spill.write(buffer.tobytes())
                    buffer = array("Q")
            spill.write(buffer.tobytes())
            spill.flush()
            k = min(math.floor(self.selection.fraction() * rows), count)
            if k == 0:
                self.cut = TopCut(rows=rows, kept=0, key=None, ties=0)
                return
            key, ties = kth_largest(spill.name, k)
        self.cut = TopCut(rows=rows, kept=k, key=key, ties=ties)

    def __call__(self, items: Iterable[WorkItem]) -> Iterator[WorkItem]:
        """The items that pass, in order, each with the inputs filtered after it (the first: before it too,
        :attr:`WorkItem.filtered`); the others counted in :attr:`filtered` (as the source itself counts the
        samples it leaves out: a failed download's ``status``). A row whose cell has another type than the
        expression's value is refused (it fails, with its reason). Each item is held until the next one passes
        (or the stream ends), so the inputs filtered after it are known when it is handed on."""
        held: WorkItem | None = None
        for item in items:
            out = self._select(item)
            if out is None:
                continue
            if held is not None:
                yield self._with_filtered(held)
            held = out
        if held is not None:
            yield self._with_filtered(held)

    def _with_filtered(self, item: WorkItem) -> WorkItem:
        """``item`` with the inputs filtered since the last item handed on."""
        if sum(self.filtered.values()) == sum(self._handed.values()):
            return item
        since = self.filtered - self._handed
        self._handed.update(since)
        return replace(item, filtered=dict(sorted(since.items())))

    def _select(self, item: WorkItem) -> WorkItem | None:
        """The item as it goes on (refused: with its reason), or None: filtered (and counted)."""
        passes, row, refused = self._passes(item)
        if refused:
            return replace(item, refused=refused)
        if not passes:
            self.filtered["where"] += 1
            return None
        if self.cut is not None and row is not None:
            try:
                keep = self._keeps(row)
            except CellTypeError as e:
                return replace(item, refused=str(e))
            if not keep:
                self.filtered["keep-top"] += 1
                return None
        return item

    def _keeps(self, row: Mapping[str, Any]) -> bool:
        assert self.cut is not None
        key = self._by_key(row)
        if key is None or self.cut.key is None or key < self.cut.key:
            return False
        if key > self.cut.key:
            return True
        self._ties += 1
        return self._ties <= self.cut.ties

    def report(self) -> dict[str, Any]:
        """What the selection did, for the job's report: the filtered inputs by reason, and ``--keep-top``'s cut."""
        out: dict[str, Any] = {"filtered": sum(self.filtered.values()),
                               "filtered_by_reason": dict(sorted(self.filtered.items()))}
        if self.cut is not None:
            out["selection"] = self.cut.to_json(self.selection)
        if self.selection.where is not None:
            out.setdefault("selection", {})["where"] = self.selection.where
        return out

