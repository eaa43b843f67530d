"""One input of ``fgdata shard``: the record every source yields and the producers transform, and its sample key.

It sits below both, so that :mod:`fgdata.producers` (pure, picklable transforms) never imports
:mod:`fgdata.sources` (listings, manifests, tables, existing shards). The key scheme is documented with the
folder source (:mod:`fgdata.sources.folder`), which every source follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KEY_FORMAT = "sample_%06d"


def sample_key(index: int) -> str:
    """The documented key of the item at ``index`` in the source order (see the module docstring)."""
    return KEY_FORMAT % index


@dataclass(frozen=True)
class WorkItem:
    """One input: where its media is, and its caption and metadata (inline or as sidecar paths)."""

    index: int  # position in the source order; the sample key comes from it
    name: str  # what reports call it: the relative path, manifest path or "FILE:line"
    path: str = ""  # local path or s3:// URL of the media; "" for prompt-only items
    caption: str | None = None
    caption_path: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    metadata_path: str | None = None
    poses_path: str | None = None
    intrinsics_path: str | None = None
    refused: str | None = None  # "<category>: <message>" when the source already knows the item fails
    warning: str | None = None  # "<category>: <message>" when the source knows a part is lost (a caption)
    data: bytes | None = None  # the media bytes themselves (a table cell, a shard's member), not read from ``path``
    data_at: tuple[int, int] | None = None  # (offset, size) of the media inside the local file ``path`` (a source
    # shard's member): the worker reads it, so the driver holds references, not media
    key: str | None = None  # the sample key the source keeps (an existing shard's); else sample_key(index)
    members: dict[str, bytes] | None = None  # a source sample's other members, carried as they are
    # inputs a row selection left out right after this one (the first input: before it too), by reason: they
    # count for the output shard this one goes to (see fgdata.sources.selection)
    filtered: dict[str, int] | None = None
