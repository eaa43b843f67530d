"""The resume fingerprint: what a rerun must match to continue an earlier job's outputs.

Each writing command describes the options that change its output bytes as one frozen
dataclass (workers, engines, progress bars and the like stay out of it). The job record keeps
``options_record(options)``; a rerun whose record differs is refused, naming the option.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from fgdata.errors import FgdataError


def options_record(options: Any) -> dict[str, Any]:
    """The options as plain JSON data (tuples become lists, as they would after a round trip)."""
    if not dataclasses.is_dataclass(options) or isinstance(options, type):
        raise TypeError("options must be a dataclass instance")
    return json.loads(json.dumps(dataclasses.asdict(options), sort_keys=True, default=str))


def fingerprint(record: dict[str, Any]) -> str:
    """A short hash of an options record."""
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]


def flag(name: str) -> str:
    """The command-line spelling of an option field: ``max_side`` -> ``--max-side``."""
    return "--" + name.replace("_", "-")


def check_same(where: str, old: dict[str, Any], new: dict[str, Any], restart: str = "--no-resume") -> None:
    """Refuse to continue ``where`` when an option that changes bytes differs from the earlier run."""
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if not changed:
        return
    what = "; ".join(f"{flag(k)} was {old.get(k)!r}, now {new.get(k)!r}" for k in changed[:3])
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    raise FgdataError(f"{where}: an earlier run wrote it with other options ({what}{more}); "
                      f"rerun with the same options, or with {restart} to start over")
