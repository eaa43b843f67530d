"""Folder source: every media file below a folder (local or s3://), with its sidecars, as work items.

Order: sorted relative paths (``a/b.jpg`` < ``a/c.jpg`` < ``b.jpg``), so a listing is the same
on every machine. Hidden files and folders (a name starting with ``.``) are skipped.

Sidecars share the media file's stem (its name without the last extension), in the same folder:

- ``NAME.txt``: the caption (UTF-8);
- ``NAME.json``: a JSON object of metadata, kept in the sample's ``json`` member;
- ``NAME.poses.npy`` ``[T,4,4]`` and ``NAME.intrinsics.npy`` ``[T,4]``: a camera track (videos).

Sidecars are only located here; they are read by the worker that transforms the item, so
listing a large folder stays one ``list`` call.

Key scheme (shared by every source): the sample key is ``sample_%06d`` of the item's
``index``, its position in the source order (sorted relative paths here, row order in a
manifest), *before* any ``--shuffle-seed`` reordering. The same file or row therefore keeps
its key across reruns, shuffles, worker counts and engines, and a failure report entry
points straight back at it. Clips cut from one video add ``_%04d`` (the clip number).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from fgdata import storage
from fgdata.errors import FgdataError

KEY_FORMAT = "sample_%06d"

CAPTION_SUFFIX = ".txt"
METADATA_SUFFIX = ".json"
POSES_SUFFIX = ".poses.npy"
INTRINSICS_SUFFIX = ".intrinsics.npy"


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


def _extension(name: str) -> str:
    return name.rpartition(".")[2].lower() if "." in name else ""


def _relative(root: str, path: str) -> str:
    if storage.is_s3(root):
        return path[len(root.rstrip("/")) + 1 :]
    import os

    return os.path.relpath(path, root).replace(os.sep, "/")


def list_folder(root: str, extensions: Collection[str]) -> list[WorkItem]:
    """Media files below ``root`` whose extension is in ``extensions``, with their sidecars located."""
    infos = storage.list_recursive(root)
    rel_to_path = {}
    for info in infos:
        rel = _relative(root, info.path)
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        rel_to_path[rel] = info.path
    media = sorted(rel for rel in rel_to_path if _extension(rel) in extensions)
    if not media:
        raise FgdataError(f"{root}: no files with extensions {', '.join(sorted(extensions))} found")

    def sidecar(stem: str, suffix: str) -> str | None:
        return rel_to_path.get(stem + suffix)

    items = []
    for index, rel in enumerate(media):
        stem = rel.rpartition(".")[0]
        items.append(
            WorkItem(
                index=index,
                name=rel,
                path=rel_to_path[rel],
                caption_path=sidecar(stem, CAPTION_SUFFIX),
                metadata_path=sidecar(stem, METADATA_SUFFIX),
                poses_path=sidecar(stem, POSES_SUFFIX),
                intrinsics_path=sidecar(stem, INTRINSICS_SUFFIX),
            )
        )
    return items
