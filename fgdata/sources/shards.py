"""Existing WebDataset shards as a source: every sample of every source shard is one input.

A *shard source* is a ``.tar`` shard, a brace pattern (``s3://bucket/laion/{00000..00999}.tar``), a folder or
prefix holding ``.tar`` shards and no media files of the command's kind, or a text file (``.txt``) listing shard
paths or URLs, one a line (blank lines and lines starting with ``#`` skipped); local, ``s3://`` or ``http(s)://``.

Each sample's media member (the first member, in tar order, whose extension the command reads: an image for
``shard images``, a video for ``shard videos``) goes through the same normalisation and format rules as a file;
``txt`` is the caption; ``json`` is kept and extended (fgdata's fields under its ``fgdata`` key, those of an
earlier fgdata step kept unless named again); every other member is carried as it is. The sample keeps its key
(``--rekey``: ``sample_%06d`` of its position in the source, counted across the shards in order). The input is
named ``SHARD#KEY.EXT`` in reports and in the json's ``fgdata.source``.

Samples whose json ``status`` is not ``success`` (img2dataset's and video2dataset's failed downloads, which hold
no media) are not inputs to write: they are counted as *filtered*, reason ``status``. A sample without a media
member, or with a json that is not a JSON object, fails with its reason. A damaged shard gives its good samples
and one failure for the rest (reason ``shard``).

Reading is streamed: one source shard is open at a time (a remote one is first copied to fgdata's cache folder,
as a remote manifest is, and removed after). From a local shard the driver reads every member but the media, and
each item holds its media member's offset and size: the worker that writes the item reads those bytes, so no
process holds more than the samples it is writing (a remote shard's media are read by the driver, since its copy
is removed once read). Each input's content stamp is its source shard's size and version (modification time, or ETag on S3) with its
media member's place in the shard (or, read inline, a digest of its bytes), so a rerun redoes exactly the work units whose source shards changed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator
from typing import Any

from fgdata import storage
from fgdata.errors import DamagedShardError, FgdataError
from fgdata.shards.metadata import parse_json
from fgdata.workitem import WorkItem, sample_key
from fgdata.sources.manifest import _local

#: A text file listing shards: one path or URL a line.
LIST_SUFFIX = ".txt"
#: Members a sample's text comes from; every other member that is not the media is carried as it is.
CAPTION_MEMBER = "txt"
JSON_MEMBER = "json"
#: The field ``--where`` reads a sample's input name from (``SHARD#KEY.EXT``); its json's fields are the others.
SHARD_KEY_FIELD = "__key__"


def _is_shard_path(path: str) -> bool:
    return path.lower().endswith(".tar") or ("{" in path and ".." in path)


def shard_list(src: str, media_exts: Collection[str]) -> list[str] | None:
    """The source shards ``src`` names, in order; None when ``src`` is not a shard source (see the module
    docstring). A folder is one when it holds ``.tar`` files and no file with one of ``media_exts``."""
    from fgdata.errors import ShardError
    from fgdata.shards import resolve_shards

    if src.lower().endswith(LIST_SUFFIX):
        lines = [line.strip() for line in storage.read_bytes(src).decode("utf-8", "replace").splitlines()]
        paths = [line for line in lines if line and not line.startswith("#")]
        if not paths:
            raise FgdataError(f"{src}: lists no shards")
        paths = [p if storage.is_absolute(p) else storage.join(storage.parent(src), p) for p in paths]
        spec: str | list[str] = paths
    elif _is_shard_path(src):
        spec = src
    elif storage.is_dir(src):
        names = storage.list_names(src)
        if not any(n.lower().endswith(".tar") for n in names) or \
                any(n.rpartition(".")[2].lower() in media_exts for n in names):
            return None
        spec = src
    else:
        return None
    given = [spec] if isinstance(spec, str) else spec
    if all(p.startswith(("http://", "https://")) for p in given):  # http(s) cannot be listed: the names as given (braces expanded)
        from fgdata.shards.select import expand_braces

        return [name for p in given for name in (expand_braces(p) if "{" in p else [p])]
    try:
        return resolve_shards(spec).shards
    except ShardError as e:
        raise FgdataError(str(e)) from None


def iter_shard_items(shards: list[str], media_exts: Collection[str], rekey: bool,
                     filtered: Counter[str]) -> Iterator[WorkItem]:
    """One work item per sample of ``shards``, in order, streamed; samples that are not inputs (a failed
    download's ``status``) counted in ``filtered`` instead. A local shard's media member is not read here: its
    item holds the member's offset and size, and the worker that writes the item reads it."""
    index = 0
    for shard in shards:
        label = storage.basename(shard)
        with _local(shard) as local:
            refer = local == shard  # a remote shard's cached copy is removed after this loop: its media inline
            try:
                for key, members, spans in _samples(local, media_exts, refer):
                    item = _item(shard, label, index, key, members, spans, media_exts, rekey)
                    if isinstance(item, str):
                        filtered[item] += 1
                    else:
                        yield item
                    index += 1
            except DamagedShardError as e:
                yield WorkItem(index=index, name=f"{label}#after-{e.good}",
                               refused=f"shard: {label} is damaged after {e.good} sample(s): {e.reason}")
                index += 1
    if index == 0:
        raise FgdataError(f"{shards[0]}: the source shards hold no samples")


def _samples(local: str, media_exts: Collection[str], refer: bool
             ) -> Iterator[tuple[str, dict[str, bytes], dict[str, tuple[int, int]]]]:
    """(key, members read, every member's (offset, size)) of each sample of the local shard ``local``; with
    ``refer``, the first media member of each sample is left unread (its span is what the item carries)."""
    import os

    from fgdata.shards.scan import TarDamage, group_samples, iter_members, pread_exact

    count = 0
    problems: list[str] = []
    with open(local, "rb") as f:
        fd = f.fileno()
        read = (lambda name: name.rpartition("/")[2].partition(".")[2].lower() not in media_exts) if refer else True
        try:
            for entry, data in group_samples(iter_members(f, total=os.fstat(fd).st_size, with_data=read), problems):
                media = next((ext for ext in entry.members if ext in media_exts), None)
                for ext, (offset, size) in entry.members.items():  # other media members are carried: read them
                    if ext not in data and ext != media:
                        data[ext] = pread_exact(fd, size, offset)
                yield entry.key, data, entry.members
                count += 1
        except TarDamage as exc:
            raise DamagedShardError(local, count, str(exc)) from exc


def _item(shard: str, label: str, index: int, key: str, members: dict[str, bytes], spans: dict[str, tuple[int, int]],
          media_exts: Collection[str], rekey: bool) -> WorkItem | str:
    """The work item of one sample (its media inline, or by its span when ``members`` lacks it), or the reason it
    is filtered out."""
    media = next((ext for ext in spans if ext in media_exts), None)
    doc: Any = {}
    refused = None
    if JSON_MEMBER in members:
        try:
            doc = parse_json(members[JSON_MEMBER])
        except (ValueError, UnicodeDecodeError) as e:
            refused = f"metadata: the json of {label}#{key} is not valid JSON ({e})"
        else:
            if not isinstance(doc, dict):
                refused = f"metadata: the json of {label}#{key} holds no JSON object"
                doc = {}
    status = doc.get("status")
    if status is not None and status != "success":
        return "status"
    name = f"{label}#{key}.{media}" if media else f"{label}#{key}"
    out_key = sample_key(index) if rekey else key
    if refused is None and media is None:
        found = ", ".join(sorted(members)) or "none"
        refused = f"missing-media: {label}#{key} has no member the command reads (members: {found})"
    if refused is not None:
        return WorkItem(index=index, name=name, key=out_key, refused=refused)
    assert media is not None
    caption = None
    extra = {ext: data for ext, data in members.items() if ext not in (media, JSON_MEMBER)}
    if CAPTION_MEMBER in extra:
        try:
            caption = extra[CAPTION_MEMBER].decode("utf-8")
            del extra[CAPTION_MEMBER]
        except UnicodeDecodeError:  # carried as it is
            caption = None
    return WorkItem(index=index, name=name, key=out_key, path=shard, data=members.get(media), caption=caption,
                    metadata=doc, members=extra, data_at=None if media in members else spans[media])
