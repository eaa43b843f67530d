"""The ``json`` member of a sample: the user's fields at the top level, fgdata's own under one ``fgdata`` key.

Every writer that records something about a sample (``shard``: where it came from, image size, video
probe, clip bounds; ``encode``/``kd``: the model and numerics) puts it inside ``doc["fgdata"]``, so it can
never replace a field the user brought (``source``, ``width``, ``score``, ...), and readers of the user's
fields (``presets_filter``'s ``score``, ``key_map``) see exactly what the user wrote.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fgdata.errors import FgdataError

FGDATA_FIELD = "fgdata"


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is out of range (not a finite float)")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes | str) -> Any:
    """User metadata (a sidecar, a manifest line) as strict JSON, the JSON the ``json`` member is written as:
    ``NaN``, ``Infinity`` and numbers past a float's range are refused, and so is nesting deeper than
    Python's recursion limit; every refusal is a ``ValueError`` naming the cause."""
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None


def with_fgdata_fields(doc: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``doc`` with ``fields`` set inside its ``fgdata`` object (created when absent).

    Fields of earlier fgdata steps already there are kept unless ``fields`` names them again; a
    ``fgdata`` value that is not an object was not written by fgdata and is refused, never replaced.
    """
    own = doc.get(FGDATA_FIELD, {})
    if not isinstance(own, dict):
        raise FgdataError(f"the sample's json has its own {FGDATA_FIELD!r} field (not an object); "
                          "it is reserved for fgdata's metadata")
    return {**doc, FGDATA_FIELD: {**own, **fields}}


def fgdata_fields(doc: dict[str, Any] | None) -> dict[str, Any]:
    """The fields fgdata recorded in a sample's json (empty when it has none or the json is not fgdata's)."""
    own = (doc or {}).get(FGDATA_FIELD)
    return own if isinstance(own, dict) else {}
