"""The WebDataset naming rule.

A member ``<key>.<ext>`` splits at the first dot of its basename; the key keeps
any in-tar directories and the extension is lower-cased. Writers must produce
keys that survive that split unchanged, so a key has no dot in its basename.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from fgdata.errors import ShardError

T = TypeVar("T")


def split_member_name(name: str) -> tuple[str, str]:
    """Split a tar member name into (key, extension) by the first dot of the basename."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :].lower()


def validate_key(key: str) -> None:
    """Raise ShardError unless ``key`` is a safe, splittable sample key."""
    if not key:
        raise ShardError("sample key is empty")
    if key.startswith("/") or "\\" in key:
        raise ShardError(f"sample key {key!r} must be a relative path with '/' separators")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ShardError(f"sample key {key!r} has an empty, '.' or '..' path component")
    if "." in parts[-1]:
        raise ShardError(f"sample key {key!r} has a dot in its basename (the key rule splits at the first dot)")


def validate_extension(ext: str) -> str:
    """Return the lower-cased extension, or raise ShardError if it cannot name a member."""
    if not ext or "/" in ext or ext.startswith(".") or ext.endswith("."):
        raise ShardError(f"member extension {ext!r} is invalid")
    return ext.lower()


def sort_shards(items: Iterable[T], name: Callable[[T], str] = str) -> list[T]:
    """Items in shard order, the one ordering rule for shard lists and shard-keyed files.

    Shards sort by the integer value of their stem (the basename before its first dot)
    when every stem is all digits; otherwise all sort by name (the reference's fallback
    for foreign shards). The sort is stable, so equal stems keep their given order.
    """
    items = list(items)
    stems = [name(x).rsplit("/", 1)[-1].split(".", 1)[0] for x in items]
    if all(s.isdigit() for s in stems):
        order = sorted(range(len(items)), key=lambda i: int(stems[i]))
    else:
        order = sorted(range(len(items)), key=lambda i: name(items[i]))
    return [items[i] for i in order]
