"""Constant strings for ``presets_map`` and raw-bytes predicates for ``presets_filter``.

Presets are resolved once, in the process that builds the loader, so a user who
overrides an entry of :data:`PRESET_CONSTANTS` before constructing a loader sees
the override in every worker, whatever the multiprocessing start method.

Filters run on the raw member bytes **before** anything is decoded, so a dropped
sample never costs a decode. A filter returns ``None`` to keep a sample or a short
reason to drop it; the reason feeds the loader's per-reason drop counters.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fgdata.catalog import FGDATA_DEFINED_PRESETS, PRESET_CONSTANTS, SCORE_THRESHOLD, score_verdict
from fgdata.errors import FgdataError
from fgdata.media.decode import unwrap_gz
from fgdata.media.errors import MemberDecodeError

__all__ = ["FGDATA_DEFINED_PRESETS", "PRESET_CONSTANTS", "PRESET_FILTERS", "MemberFilter", "build_filters", "resolve_presets"]

#: A filter sees the raw members of one sample (extension -> bytes).
SampleFilter = Callable[[Mapping[str, bytes]], "str | None"]


@dataclass(frozen=True)
class MemberFilter:
    """A named filter and the member extensions it reads (the loaders read only needed members)."""

    name: str
    check: SampleFilter
    needs: frozenset[str]


def _json_member(members: Mapping[str, bytes]) -> bytes | None:
    """The sample's ``json`` member (plain or gzipped), raw; ``None`` if it has none."""
    if "json" in members:
        return members["json"]
    if "json.gz" in members:
        return unwrap_gz("json.gz", members["json.gz"])[1]
    return None


def score_filter(threshold: float = SCORE_THRESHOLD, score_key: str = "score") -> SampleFilter:
    """Drop a sample whose JSON ``score_key`` is below ``threshold`` (the rule: :func:`fgdata.catalog.score_verdict`).

    Samples without a ``json`` member or without the field are kept. Invalid
    JSON or a non-numeric score drops the sample with a reason instead of ending the
    iteration as the reference does.
    """
    threshold = float(threshold)

    def check(members: Mapping[str, bytes]) -> str | None:
        try:
            raw = _json_member(members)
        except MemberDecodeError as exc:
            return f"score: {exc}"
        if raw is None:
            return None
        try:
            meta = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return "score: invalid JSON"
        if not isinstance(meta, dict) or score_key not in meta:
            return None
        return score_verdict(meta[score_key], score_key, threshold)

    return check


def empty_keys_filter(keys: list[str] | tuple[str, ...] = ()) -> SampleFilter:
    """Drop a sample when one of ``keys`` (extensions) is present with zero length."""
    wanted = tuple(k.lower() for k in keys)

    def check(members: Mapping[str, bytes]) -> str | None:
        for ext in wanted:
            if ext in members and len(members[ext]) == 0:
                return f"empty_keys: empty {ext!r}"
        return None

    return check


#: Name -> factory taking the filter's keyword arguments (``presets_filter`` values).
PRESET_FILTERS: dict[str, Callable[..., SampleFilter]] = {
    "score": score_filter,
    "empty_keys": empty_keys_filter,
}

# The members each filter reads, from the keyword arguments it was built with.
_FILTER_NEEDS: dict[str, Callable[[dict], frozenset[str]]] = {
    "score": lambda kwargs: frozenset({"json", "json.gz"}),
    "empty_keys": lambda kwargs: frozenset(k.lower() for k in kwargs.get("keys", ())),
}


def resolve_presets(presets_map: Mapping[str, str] | None) -> dict[str, str]:
    """Output key -> constant text; an unknown preset name is a construction error."""
    out: dict[str, str] = {}
    for key, name in (presets_map or {}).items():
        if name not in PRESET_CONSTANTS:
            raise FgdataError(
                f"presets_map[{key!r}]: unknown preset {name!r}; choose one of {sorted(PRESET_CONSTANTS)}"
            )
        out[key] = PRESET_CONSTANTS[name]
    return out


def build_filters(presets_filter: Mapping[str, Mapping | None] | None) -> list[MemberFilter]:
    """Instantiate ``{name: kwargs}``; unknown names and bad keywords fail at construction.

    A filter added to :data:`PRESET_FILTERS` without an entry in the needs table sees every member.
    """
    filters: list[MemberFilter] = []
    for name, kwargs in (presets_filter or {}).items():
        if name not in PRESET_FILTERS:
            raise FgdataError(f"presets_filter: unknown filter {name!r}; choose one of {sorted(PRESET_FILTERS)}")
        args = dict(kwargs or {})
        try:
            check = PRESET_FILTERS[name](**args)
        except TypeError as exc:
            raise FgdataError(f"presets_filter[{name!r}]: {exc}") from exc
        needs = _FILTER_NEEDS[name](args) if name in _FILTER_NEEDS else None
        filters.append(MemberFilter(name, check, needs if needs is not None else frozenset({"*"})))
    return filters
