"""Folder source: every media file below a folder (local or s3://), with its sidecars, as work items.

Order: sorted relative paths (``a-b.jpg`` < ``a/b.jpg`` < ``a/c.jpg`` < ``b.jpg``), so a listing is the same
on every machine. Hidden files and folders (a name starting with ``.``) are skipped.

The walk (:func:`walk_folder`) streams: it lists one folder at a time, depth first, sorting each folder's media
files and sub-folders with a sub-folder ``d`` compared as ``d/`` (every path below it starts with that), which
gives the sorted relative paths of the whole tree without holding it. A local walk holds the listings of the
folders on the current path (one per depth level) and nothing else: memory grows with the largest folder
(about 0.5 KB per entry), not with the tree. An s3:// folder is listed whole first (one recursive listing: an
estimated 1-2 KB per object while it is parsed) and then walked the same way: s5cmd's listing is read to its
end before its output is used (it is watched for stalls and retried as one call), and a listing per prefix
instead would cost one s5cmd call for every folder of the tree.

Sidecars share the media file's stem (its name without the last extension), in the same folder:

- ``NAME.txt``: the caption (UTF-8);
- ``NAME.json``: a JSON object of metadata, kept in the sample's ``json`` member;
- ``NAME.poses.npy`` ``[T,4,4]`` and ``NAME.intrinsics.npy`` ``[T,4]``: a camera track (videos).

Sidecars are only located here (in the listing of their folder); they are read by the worker that transforms
the item.

Inputs the listing can already judge become *refused* items (a failure with its reason, counted
like any other), never a job-wide error:

- a file name that is not valid UTF-8 (a surrogate-escaped ``str`` from the OS): reported by its
  name with the bad bytes written as backslash escapes (``bad\xff.jpg``);
- a media file or sidecar that is a symbolic link resolving outside the source folder, unless
  ``follow_symlinks`` (``--follow-symlinks``) is given. Links that stay inside are fine.

Everything else below the folder is a :class:`Skipped` entry (reported, never counted as an input):
files of other formats, sidecars without a media file, and what the listing does not take
(:func:`fgdata.storage.list_tree`: special files, broken links, linked folders; with
``follow_symlinks`` a linked folder leading out of the source is walked instead).

Key scheme (shared by every source): the sample key is ``sample_%06d`` of the item's
``index``, its position in the source order (sorted relative paths here, row order in a
manifest), *before* any ``--shuffle-seed`` reordering. The same file or row therefore keeps
its key across reruns, shuffles, worker counts and engines, and a failure report entry
points straight back at it. Clips cut from one video add ``_%04d`` (the clip number).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.workitem import WorkItem

CAPTION_SUFFIX = ".txt"
METADATA_SUFFIX = ".json"
POSES_SUFFIX = ".poses.npy"
INTRINSICS_SUFFIX = ".intrinsics.npy"


def printable_name(name: str) -> str:
    """``name`` with bytes that are not valid UTF-8 as backslash escapes, safe to print and store as JSON."""
    try:
        raw = name.encode("utf-8", "surrogateescape")  # the OS's undecodable bytes come back as \xNN
    except UnicodeEncodeError:  # other lone surrogates (from JSON escapes) as \udNNN
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def link_refusal(path: str, real_root: str, through_link: bool = False) -> str | None:
    """Why ``path`` is refused when it is a symbolic link (or lies below a linked folder: ``through_link``) that
    resolves outside ``real_root``, or None. The one rule of every source that reads a local tree."""
    if not (through_link or os.path.islink(path)):
        return None
    target = os.path.realpath(path)
    if target == real_root or target.startswith(real_root.rstrip(os.sep) + os.sep):
        return None
    return (f"symlink: {printable_name(os.path.basename(path))} points to {printable_name(target)}, "
            "outside the source folder; pass --follow-symlinks to read it")


def _extension(name: str) -> str:
    return name.rpartition(".")[2].lower() if "." in name else ""


def _refusal(rel: str, paths: list[str], real_root: str | None) -> str | None:
    """Why the item ``rel`` (with its media and sidecar ``paths``) cannot be read, or None."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return "name: the file name is not valid UTF-8; rename it"
    if real_root is None:  # object stores have no links; --follow-symlinks reads whatever they point at
        return None
    for path in paths:
        refused = link_refusal(path, real_root)
        if refused:
            return refused
    return None


@dataclass(frozen=True)
class Skipped:
    """A file (or folder) below SRC that is not an input, and why: reported, never counted as seen.

    ``reason`` reads ``"<category>: <message>"``; categories: ``extension`` (not a format of this command, or
    its decoder is not installed), ``sidecar`` (a caption or metadata file with no media file of its stem),
    and the listing's own (:class:`fgdata.storage.Unlisted`): ``special``, ``linked-folder``, ``broken-link``,
    ``unreadable``.
    """

    name: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"input": self.name, "reason": self.reason}


@dataclass(frozen=True)
class Listing:
    """A source's inputs in source order, and what lies below a folder source without being one."""

    items: list[WorkItem]
    skipped: list[Skipped]


_SIDECAR_SUFFIXES = (CAPTION_SUFFIX, METADATA_SUFFIX, POSES_SUFFIX, INTRINSICS_SUFFIX)


def _not_taken(rel: str, missing_decoder: Callable[[str], str | None]) -> Skipped:
    """Why the file ``rel``, which is neither a media file nor a sidecar of one, is not an input."""
    ext = _extension(rel)
    if rel.endswith(_SIDECAR_SUFFIXES):
        return Skipped(printable_name(rel), "sidecar: no media file with its name beside it")
    why = missing_decoder(ext) or (f".{ext} is not a format this command reads" if ext else "no extension")
    return Skipped(printable_name(rel), f"extension: {why}")


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))


@dataclass
class _FolderPart:
    """One folder's part of a walk: its inputs and sub-folders still to go, in walk order, and its visible files
    (where the sidecars of its media files are)."""

    entries: Iterator[tuple[str, Any]]
    files: dict[str, storage.FileInfo]


def _folder_part(root: str, listed: storage.Folder, extensions: Collection[str],
                 missing_decoder: Callable[[str], str | None], skipped: list[Skipped],
                 left_out: str | None = None) -> _FolderPart:
    """The media files and sub-folders of one listed folder as ``(relative path, FileInfo)`` and
    ``(relative path + "/", folder path)`` pairs sorted by that key. Every path below a sub-folder starts with its
    key, so sorting each folder so, depth first, gives the sorted relative paths of the whole tree. What the
    folder holds that is not an input is appended to ``skipped``; the sub-folder at ``left_out`` (relative to
    ``root``) is passed over."""
    rels = {info.name: (rel, info) for info in listed.files if not _hidden(rel := storage.relative(root, info.path))}
    media = [(rel, info) for rel, info in rels.values() if _extension(info.name) in extensions]
    taken = {info.name for _, info in media}
    for _, info in media:
        stem = info.name.rpartition(".")[0]
        taken.update(stem + suffix for suffix in _SIDECAR_SUFFIXES if stem + suffix in rels)
    skipped.extend(_not_taken(rel, missing_decoder) for name, (rel, _) in rels.items() if name not in taken)
    for entry in listed.unlisted:
        if not _hidden(rel := storage.relative(root, entry.path)):
            skipped.append(Skipped(printable_name(rel), f"{entry.kind}: {entry.detail}"))
    entries: list[tuple[str, Any]] = list(media)
    entries += [(rel + "/", folder) for folder in listed.folders
                if not _hidden(rel := storage.relative(root, folder)) and rel != left_out]
    entries.sort(key=lambda entry: entry[0])
    return _FolderPart(iter(entries), {name: info for name, (_, info) in rels.items()})


def _media_item(index: int, rel: str, info: storage.FileInfo, siblings: dict[str, storage.FileInfo],
                real_root: str | None) -> WorkItem:
    """The work item of one media file, with the sidecars of its stem in its folder located."""
    stem = info.name.rpartition(".")[0]

    def sidecar(suffix: str) -> str | None:
        found = siblings.get(stem + suffix)
        return found.path if found else None

    item = WorkItem(index=index, name=rel, path=info.path, caption_path=sidecar(CAPTION_SUFFIX),
                    metadata_path=sidecar(METADATA_SUFFIX), poses_path=sidecar(POSES_SUFFIX),
                    intrinsics_path=sidecar(INTRINSICS_SUFFIX))
    paths = [p for p in (item.path, item.caption_path, item.metadata_path, item.poses_path, item.intrinsics_path) if p]
    refused = _refusal(rel, paths, real_root)
    if refused:  # nothing of it is read, and only printable text reaches reports and job records
        return WorkItem(index=index, name=printable_name(rel), refused=refused)
    return item


def walk_folder(root: str, extensions: Collection[str], follow_symlinks: bool = False,
                missing_decoder: Callable[[str], str | None] = lambda ext: None,
                skipped: list[Skipped] | None = None, leave_out: str | None = None) -> Iterator[WorkItem]:
    """Media files below ``root`` whose extension is in ``extensions``, with their sidecars located, in source
    order, streamed (see the module docstring for the memory bound). The files that are neither
    (``missing_decoder(ext)``: why a known extension cannot be read here) are appended to ``skipped`` as the walk
    finds them, and sorted by name when it ends; a walk that ends without a media file is an error.
    ``leave_out``: a folder (the job's DST) whose files are neither inputs nor skipped when it lies below ``root``,
    however either is spelled."""
    found: list[Skipped] = [] if skipped is None else skipped
    lister = storage.tree_lister(root, follow_links=follow_symlinks)
    real_root = None if storage.is_url(root) or follow_symlinks else os.path.realpath(root)
    left_out = (storage.within(leave_out, root) or None) if leave_out else None
    index = 0

    def enter(folder: str) -> _FolderPart:
        return _folder_part(root, lister(folder), extensions, missing_decoder, found, left_out)

    stack = [enter(root)]
    while stack:
        entry = next(stack[-1].entries, None)
        if entry is None:
            stack.pop()
        elif isinstance(entry[1], str):
            stack.append(enter(entry[1]))
        else:
            yield _media_item(index, entry[0], entry[1], stack[-1].files, real_root)
            index += 1
    found.sort(key=lambda s: s.name)
    if not index:
        summary = f"; skipped {len(found)}: {skip_summary(found)}" if found else ""
        wanted = ", ".join(sorted(extensions)) if len(extensions) <= 12 else f"the {len(extensions)} readable formats"
        raise FgdataError(f"{root}: no files with extensions {wanted} found{summary}")


def list_folder(root: str, extensions: Collection[str], follow_symlinks: bool = False,
                missing_decoder: Callable[[str], str | None] = lambda ext: None) -> Listing:
    """All of :func:`walk_folder` at once: the items, and the sorted skipped entries."""
    skipped: list[Skipped] = []
    items = list(walk_folder(root, extensions, follow_symlinks, missing_decoder, skipped))
    return Listing(items, skipped)


_SKIP_WORDS = {"sidecar": ("sidecar without media", "sidecars without media"),
               "linked-folder": ("linked folder", "linked folders"), "special": ("special file", "special files"),
               "broken-link": ("broken link", "broken links"), "unreadable": ("unreadable entry", "unreadable entries")}


def skip_summary(skipped: Sequence[Skipped]) -> str:
    """``".heic ×3, .xyz ×2; 1 linked folder"``: skipped files by extension, then the other entries by kind."""
    by_ext: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    for entry in skipped:
        name, reason = entry.name, entry.reason
        category = reason.partition(":")[0]
        if category == "extension":
            ext = _extension(name.rpartition("/")[2])
            by_ext["." + ext if ext else "no extension"] += 1
        else:
            by_kind[category] += 1
    exts = ", ".join(f"{ext} ×{n}" for ext, n in sorted(by_ext.items(), key=lambda kv: (-kv[1], kv[0])))
    kinds = ", ".join(f"{n} {_SKIP_WORDS.get(kind, (kind, kind))[n > 1]}" for kind, n in sorted(by_kind.items()))
    return "; ".join(part for part in (exts, kinds) if part)

