"""What a rerun compares to tell that an input changed: one short stamp per work item.

A stamp is a digest of the item's files (media and sidecars: size and version, i.e. the modification time of a
local file or the ETag of an S3 object, each file named by one spelling of its path, so that rerunning with SRC
spelled another way finds every input unchanged) and of its inline text (a manifest row's caption and metadata). Stamps are
kept as 8 bytes each, so a million inputs cost 8 MB.

The job core stamps its inputs one unit at a time, so a batch is a unit's inputs, not the whole source. Remote
files (S3) are looked up by listing once each folder (prefix) that holds one of the batch, which costs one listing
per folder and batch rather than one request per file; a flat prefix of N objects cut into batches of B inputs is
therefore listed N/B times. Local files are asked for one by one (one ``stat`` each): listing their folder instead
would read a whole folder of a million files again for every batch of a thousand.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import fields

from fgdata import storage
from fgdata.errors import StorageError
from fgdata.workitem import WorkItem

STAMP_BYTES = 8


#: The fields of a work item that name one of its files: its media and every sidecar.
_PATH_FIELDS = tuple(f.name for f in fields(WorkItem) if f.name == "path" or f.name.endswith("_path"))


def _paths(item: WorkItem) -> list[str]:
    """The files an item is made of (those it has) on storage that versions them; an http(s) URL has no version
    to compare, so its stamp is its text alone."""
    return [value for name in _PATH_FIELDS if isinstance(value := getattr(item, name), str) and value
            and storage.backend_for(value).versioned]


def _listings(paths: Sequence[list[str]]) -> dict[str, storage.FileInfo]:
    """The listing entry of every item file (``paths``: per item) on storage where a listing saves requests, one
    listing per folder; a file that is gone has none."""
    folders: set[str] = set()
    for files in paths:
        folders.update(storage.parent(p) for p in files if not storage.backend_for(p).cheap_stat)
    found: dict[str, storage.FileInfo] = {}
    for folder in sorted(folders):
        try:
            found.update((info.path, info) for info in storage.list_dir(folder))
        except StorageError:  # a folder that is gone: its files read as missing
            continue
    return found


class InputStamps:
    """The stamps of a batch of items (the job core makes one per unit of inputs), by position in the batch."""

    def __init__(self, items: Sequence[WorkItem]):
        paths = [_paths(item) for item in items]
        listed = _listings(paths)
        parts = []
        for item, item_paths in zip(items, paths):
            files = []
            for path in item_paths:
                info = listed.get(path) or storage.stat(path)  # not listed under that spelling: ask for it
                key = storage.same_file_key(path)  # however SRC is spelled (./a, /abs/a, ../x/a, a link)
                files.append([key, info.size, info.version] if info else [key, None, None])
            text = [item.name, item.caption, item.metadata, item.refused, files]
            if item.data is not None:  # media inside a table: its bytes are what may change
                text.append(hashlib.blake2b(item.data, digest_size=16).hexdigest())
            if item.data_at is not None:  # a member of a source shard, whose size and version are in ``files``
                text.append("{}+{}".format(*item.data_at))
            raw = json.dumps(text, sort_keys=True, default=str, ensure_ascii=False).encode("utf-8", "surrogateescape")
            parts.append(hashlib.blake2b(raw, digest_size=STAMP_BYTES).digest())
        self._stamps = b"".join(parts)

    def __len__(self) -> int:
        return len(self._stamps) // STAMP_BYTES

    def __getitem__(self, index: int) -> str:
        """The stamp of the item at position ``index`` of the batch, as hex (what job records store)."""
        return self._stamps[index * STAMP_BYTES:(index + 1) * STAMP_BYTES].hex()
