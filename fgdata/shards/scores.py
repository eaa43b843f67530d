"""Score files: per-sample scores kept beside a shard, joined into the sample's json when it is read.

``SHARD.tar.scores.jsonl`` (written by ``fgdata score``) is JSON lines: the first line is the header
``{"format": "fgdata.scores", "version": 1, "shard": NAME, "shard_size": BYTES, "signals": {SIGNAL: {...}},
"fields": [...]}``; each further line is one sample in tar order, ``{"__key__": KEY, FIELD: NUMBER, ...}``, with
``"score_error": REASON`` (and no fields of the signals that failed) when a sample could not be scored.
``FOLDER/scores.json`` records each signal once per dataset (model file sha256, preprocessing, scale).

Readers join a sample's scores as **flat top-level fields** of its json (a sample without a json member gets one):
the reference ``presets_filter`` reads one flat key, so scores are the documented exception to the rule that
fgdata's own facts live under the json's ``fgdata`` object. A score replaces a top-level field of the same name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from fgdata import storage
from fgdata.errors import FgdataError

FORMAT = "fgdata.scores"
VERSION = 1
SUFFIX = ".scores.jsonl"
META_FILE = "scores.json"
ERROR_FIELD = "score_error"


def scores_path(shard: str) -> str:
    """Where ``shard``'s scores live: beside it, the shard's name plus :data:`SUFFIX`."""
    return shard + SUFFIX


@dataclass
class ScoreFile:
    """One shard's scores: the header and key -> fields (in tar order)."""

    shard: str
    shard_size: int | None
    signals: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def fields(self) -> list[str]:
        """Every numeric field name present in some row, sorted."""
        return sorted({k for row in self.rows.values() for k in row if k != ERROR_FIELD})

    def to_bytes(self) -> bytes:
        header = {"format": FORMAT, "version": VERSION, "shard": self.shard, "shard_size": self.shard_size,
                  "signals": self.signals, "fields": self.fields}
        lines = [json.dumps(header, sort_keys=True, allow_nan=False)]
        for key, row in self.rows.items():
            lines.append(json.dumps({"__key__": key, **row}, sort_keys=True, allow_nan=False))
        return ("\n".join(lines) + "\n").encode()


def _number(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FgdataError(f"{where}: {value!r} is not a finite number")


def parse_scores(path: str, data: bytes) -> ScoreFile:
    """A score file's bytes -> :class:`ScoreFile`; anything else is a one-line error naming ``path``."""
    lines = data.decode("utf-8", errors="replace").splitlines()
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise FgdataError(f"{path}: not an fgdata score file (its first line is not a {FORMAT} header)")
    if header.get("version") != VERSION:
        raise FgdataError(f"{path}: score file version {header.get('version')!r}; this fgdata reads {VERSION}")
    out = ScoreFile(str(header.get("shard")), header.get("shard_size"), dict(header.get("signals") or {}))
    for n, line in enumerate(lines[1:], start=2):
        try:
            row = json.loads(line)
            key = row.pop("__key__")
        except (ValueError, KeyError, AttributeError, TypeError):
            raise FgdataError(f"{path}: line {n} is not a score row") from None
        for name, value in row.items():
            if name != ERROR_FIELD:
                _number(value, f"{path}: line {n} field {name!r}")
        out.rows[str(key)] = row
    return out


def read_scores(shard: str) -> ScoreFile | None:
    """The shard's scores, or None when it has no score file."""
    path = scores_path(shard)
    if not storage.exists(path):
        return None
    return parse_scores(path, storage.read_bytes(path))


def write_scores(shard: str, scores: ScoreFile) -> None:
    storage.write_bytes(scores_path(shard), scores.to_bytes())


def read_meta(folder: str) -> dict[str, Any]:
    """``FOLDER/scores.json``'s signals (empty when absent)."""
    path = storage.join(folder, META_FILE)
    if not storage.exists(path):
        return {}
    try:
        doc = json.loads(storage.read_bytes(path))
    except ValueError as exc:
        raise FgdataError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT + "-meta":
        raise FgdataError(f"{path}: not an fgdata score record")
    return dict(doc.get("signals") or {})


def write_meta(folder: str, signals: dict[str, Any]) -> None:
    doc = {"format": FORMAT + "-meta", "version": VERSION, "signals": signals}
    storage.write_bytes(storage.join(folder, META_FILE),
                        (json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n").encode())


def joined_json(raw: bytes | None, fields: dict[str, Any]) -> bytes:
    """A json member with ``fields`` set at its top level (``raw`` None: a new object). A json that is not an
    object is kept unchanged (there is nowhere to put a field)."""
    if not fields:
        return raw if raw is not None else b"{}"
    if raw is None:
        doc: Any = {}
    else:
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return raw  # invalid json: the filters report it, as without scores
        if not isinstance(doc, dict):
            return raw
    doc.update(fields)
    return json.dumps(doc, ensure_ascii=False, allow_nan=False).encode()


def numeric_fields(row: dict[str, Any]) -> dict[str, Any]:
    """A score row without its error note: the fields a reader joins."""
    return {k: v for k, v in row.items() if k != ERROR_FIELD}
