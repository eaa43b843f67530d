"""Private temporary files for outputs being built, and the cleaning of those a killed process left.

A temporary file is created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` under an unpredictable name
(``.<final>.fgtmp-<random>``) in the folder where it is built, so a planted symlink is never followed and
never reused; whoever makes one renames or removes it. Cleaning is the caller's decision: only a process
that knows no live writer uses the folder (a job holding its destination's lock, a work unit in its own
folder) may remove what is there.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Collection

TEMP_MARK = ".fgtmp-"
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: Outputs whose :func:`fgdata.storage.atomic_path` temporaries (``.X.tmp-…``) are recognised as leftovers.
_OUTPUT_SUFFIXES = (".tar", ".tar.idx.json", ".zip", ".json", ".npy", ".log")
#: The exact name :func:`fgdata.storage.atomic_path` gives (``.X.tmp-<pid>-<8 hex>``): fgdata's, whatever X is, so
#: another rank's chunk being written (``.chunk-00001.npz.tmp-…``) is never taken for a stranger's file.
_ATOMIC_NAME = re.compile(r"\..+\.tmp-\d+-[0-9a-f]{8}")


def open_temp(directory: str, final_name: str) -> tuple[int, str]:
    """A new private file for ``final_name`` in ``directory``: ``(fd, path)``; never follows or reuses a link."""
    os.makedirs(directory, exist_ok=True)
    while True:
        path = os.path.join(directory, f".{final_name}{TEMP_MARK}{secrets.token_hex(8)}")
        try:
            return os.open(path, _FLAGS, 0o644), path
        except FileExistsError:  # a collision of 64 random bits (or a planted name): draw again
            continue


def is_temp(name: str, outputs: Collection[str] = ()) -> bool:
    """A temporary name of fgdata's: :func:`open_temp`'s, or an ``atomic_path`` one (``.X.tmp-…``) for an output
    (``outputs``: side-file names that count as outputs besides the usual suffixes)."""
    if not name.startswith("."):
        return False
    if TEMP_MARK in name or _ATOMIC_NAME.fullmatch(name):
        return True
    target = name[1:].split(".tmp-", 1)[0] if ".tmp-" in name else None
    return target is not None and (target in outputs or target.endswith(_OUTPUT_SUFFIXES))


def clean_temps(directory: str, outputs: Collection[str] = ()) -> list[str]:
    """Remove the temporary files a killed process left in ``directory`` (links are removed, never followed)."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for name in names:
        path = os.path.join(directory, name)
        if is_temp(name, outputs) and (os.path.islink(path) or not os.path.isdir(path)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            removed.append(name)
    return removed
