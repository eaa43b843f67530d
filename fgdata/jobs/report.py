"""The one failure report of every writing command: ``failures.json`` beside its outputs.

Schema (documented in docs/FORMATS.md)::

    {"format": "fgdata.failures", "version": 2, "command": "shard images",
     "seen": 120, "written": 117, "failed": 3,
     "failures": [{"input": "photos/broken.jpg", "reason": "image-decode: cannot identify image file"}]}

``seen == written + failed`` always; the writer refuses to write a report that breaks it.
Commands may add summary fields (``samples``, ``failed_by_reason``, ``not_updated``; ``shard``'s
``warnings`` and ``skipped``, which are not counted in ``seen``) and per-failure fields (``index``),
never remove these.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from fgdata import storage
from fgdata.catalog import FAILURES_FILE as FAILURES_FILE  # the name every writer imports from here
from fgdata.catalog import FAILURES_FORMAT as FORMAT
from fgdata.errors import FgdataError
from fgdata.jobs.options import JsonValue

VERSION = 2
_ADDRESS = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>| at 0x[0-9a-fA-F]+")


class FailureDoc(TypedDict):
    """A failure as ``failures.json`` lists it (a command may add its own fields: a marker's entry adds ``index``)."""

    input: str
    reason: str


@dataclass(frozen=True)
class Failure:
    """An input a job could not write, and why, as ``failures.json`` lists it."""

    input: str
    reason: str

    def to_json(self) -> FailureDoc:
        return {"input": self.input, "reason": self.reason}


class ReportFields:
    """A command's own fields of ``failures.json``, after the common ones: none here; a command's frozen dataclass
    subclasses it and says them in :meth:`to_json` (in the order they are written). ``filtered``: the inputs a row
    selection left out, which ``seen`` counts too; ``filtered_by_reason``: those by reason (None: the job selects
    no rows), which the work units' markers must add up to (``shard_stats.json`` gives them per shard)."""

    @property
    def filtered(self) -> int:
        return 0

    @property
    def filtered_by_reason(self) -> dict[str, int] | None:
        return None

    def to_json(self) -> dict[str, JsonValue]:
        return {}

    def stats_fields(self) -> dict[str, JsonValue]:
        """The command's own fields of ``shard_stats.json``'s totals (where the job writes one)."""
        return {}


@dataclass(frozen=True)
class Outputs(ReportFields):
    """The field of a command whose outputs are named files, not shards: ``outputs``, their names."""

    names: list[str]

    def to_json(self) -> dict[str, JsonValue]:
        return {"outputs": [*self.names]}


def clean_reason(reason: str) -> str:
    """One line, without object addresses (reports must be byte-identical on reruns)."""
    text = _ADDRESS.sub("", reason).strip()
    return text.splitlines()[0] if text else "error"


def category(reason: str) -> str:
    """The category of a reason that reads ``"<category>: <message>"``."""
    return reason.split(":", 1)[0].strip()


def write_failures(path: str, command: str, seen: int, written: int, failures: Sequence[FailureDoc],
                   fields: ReportFields = ReportFields()) -> None:
    """Check the accounting, then write the report atomically (local or s3://)."""
    if seen != written + len(failures):
        raise FgdataError(f"{path}: accounting mismatch: {seen} inputs seen, {written} written, "
                          f"{len(failures)} failed")
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "command": command, "seen": seen,
                           "written": written, "failed": len(failures), **fields.to_json(), "failures": failures}
    storage.write_bytes(path, (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode())
