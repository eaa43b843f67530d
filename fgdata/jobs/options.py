"""The resume fingerprint: what a rerun must match to continue an earlier job's outputs.

The one rule: a job's options are a frozen dataclass, and every field changes the output bytes unless it is
declared with ``field(metadata=RUNTIME)`` (workers, engines, timeouts, where to write). :func:`byte_options`
collects the others (a nested option dataclass declared ``FLATTEN`` gives its fields as the job's own), and
the job record keeps them; a rerun whose record
differs is refused, naming the option.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Collection
from typing import TypedDict, Union

from fgdata import storage
from fgdata.catalog import RUNTIME
from fgdata.errors import FgdataError

__all__ = ["FLATTEN", "RUNTIME", "byte_options", "check_record", "check_same", "fingerprint", "flag"]


#: A JSON value, as a job record holds an option's value.
JsonValue = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]
#: An options record: each option that changes bytes, by field name, as plain JSON data (:func:`byte_options`).
OptionRecord = dict[str, JsonValue]


class JobRecord(TypedDict):
    """A job's record (``shard_job.json``, ``fid-refs``' record): what :func:`check_record` checks and writes."""

    format: str
    version: int
    command: str
    options: OptionRecord

#: Field metadata: a nested option dataclass whose fields are recorded as the job's own.
FLATTEN = {"flatten": True}
#: Field metadata: an option recorded only when it is set (not None or False): a later option that leaves earlier
#: records, and their resume fingerprints, as they were when it is not used.
WHEN_SET = {"when_set": True}


def byte_options(options: object) -> OptionRecord:
    """Every field of ``options`` not declared :data:`RUNTIME`, as plain JSON data (see the module docstring)."""
    if not dataclasses.is_dataclass(options) or isinstance(options, type):
        raise TypeError("options must be a dataclass instance")
    record: OptionRecord = {}
    for f in dataclasses.fields(options):
        if f.metadata.get("runtime"):
            continue
        value = getattr(options, f.name)
        if f.metadata.get("when_set") and (value is None or value is False):
            continue
        if f.metadata.get("flatten"):
            record.update(byte_options(value))
        else:
            record[f.name] = json.loads(json.dumps(_plain(value), sort_keys=True, default=str))
    return record


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return byte_options(value)
    return value


def fingerprint(record: OptionRecord) -> str:
    """A short hash of an options record."""
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]


#: Option fields whose flag is not their name spelled with dashes (a URL job's download settings among them).
_FLAG_NAMES = {"image_format": "--format", "threads": "--fetch-threads", "max_bytes": "--max-download-size",
               "honour_opt_out": "--honour-opt-out/--ignore-opt-out"}


def flag(name: str) -> str:
    """The command-line spelling of an option field: ``max_side`` -> ``--max-side``."""
    return _FLAG_NAMES.get(name) or "--" + name.replace("_", "-")


def _shown(value: object) -> str:
    """An option's value as a user would read it: an option left out is "not set", not ``None``."""
    return "not set" if value is None else repr(value)


def _differences(old: OptionRecord, new: OptionRecord) -> list[tuple[str, JsonValue, JsonValue]]:
    """``(field, old value, new value)`` for each recorded option that differs; a nested option record (a URL
    job's download settings) by its own fields, so each is named by its flag. A field the new record lacks is one
    this fgdata does not record (declared RUNTIME since, as ``--fetch-threads``): what an earlier run recorded
    for it is not compared."""
    out: list[tuple[str, JsonValue, JsonValue]] = []
    for k in sorted(new.keys() | old.keys()):
        if k not in new:
            continue
        a, b = old.get(k), new[k]
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b)
        elif a != b:
            out.append((k, a, b))
    return out


def check_same(where: str, old: OptionRecord, new: OptionRecord, restart: str = "--no-resume",
               facts: Collection[str] = ()) -> None:
    """Refuse to continue ``where`` when an option that changes bytes differs from the earlier run.

    Keys in ``facts`` are not options but facts about the inputs (a count, a checksum); they are named only
    when no option differs, since a changed option usually changes them too.
    """
    changed = _differences(old, new)
    if not changed:
        return
    options = [c for c in changed if c[0] not in facts]
    keys, names, why = (options, flag, "with other options") if options else (changed, str, "from other inputs")
    what = "; ".join(f"{names(k)} was {_shown(a)}, now {_shown(b)}" for k, a, b in keys[:3])
    more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
    raise FgdataError(f"{where}: an earlier run wrote it {why} ({what}{more}); "
                      f"rerun with the same options, with {restart} to start over, or with --overwrite to "
                      "replace what it holds")


def check_record(path: str, where: str, record: JobRecord, resume: bool, write: bool, earlier: str) -> None:
    """A job's record at ``path`` (``{"format", "version", "command", "options"}``): resuming, the earlier
    record must be of this version (else ``earlier``: one line saying what to do) and hold the same options
    (else the option is named, :func:`check_same`); then the record is written (``write``: by the one process
    that does)."""
    if resume and storage.exists(path):
        try:
            old = json.loads(storage.read_bytes(path))
        except ValueError:
            old = {}
        if not isinstance(old, dict) or old.get("version") != record["version"]:
            raise FgdataError(f"{where}: {earlier}")
        check_same(where, old.get("options") or {}, record["options"])
    if write:
        storage.write_bytes(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
