"""A writing job's destination: one lock, private temporary files, and what fgdata owns there.

- **Lock.** ``DST/.fgdata/lock`` (for an s3:// DST: in this host's staging folder) holds the
  owner's host and pid under an exclusive ``flock``. A second job on the same DST is refused in
  one line naming the owner; a lock whose process died is free again (the kernel drops the
  ``flock`` with the process), so a killed job never blocks its rerun. A lock naming another
  host is refused too: remove the file once that job is known to be gone. ``.fgdata`` is opened
  without following a link and refused unless it is a plain folder. An s3:// DST is also held
  through a lease in DST itself (:mod:`fgdata.jobs.lease`), which jobs from other hosts and
  other caches see.
- **Temporary files** are created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` under unpredictable names
  (``.<final>.fgtmp-<random>``) in the folder of their final name, so a planted symlink is
  never followed and never reused; the job that makes one renames or removes it. A rerun
  (holding the lock, so no live job owns them) removes those a killed job left.
- **Staging** for an s3:// DST is a folder in this host's fgdata cache
  (``$FGDATA_CACHE/staging/<hash of DST>``), never the system temp folder; a rerun empties it.
- **Ownership.** fgdata writes shards that have an offset index (``NAME.tar`` with
  ``NAME.tar.idx.json``), its side files and ``.fgdata/``. Index files other tools write beside
  shards (:func:`other_index`: Energon's ``.nv-meta/`` and ``NAME.tar.idx``, DALI's ``NAME.idx``,
  wids' ``*shardindex.json``) are neither: they are left alone, except that a shard job removes a
  per-shard one once its shard is removed or written again, and warns that a dataset-wide one
  must be regenerated (:func:`drop_stale_indexes`). Anything else in DST is someone else's: the
  job refuses to start unless ``--overwrite``, which removes it (and says so), then replaces
  fgdata's earlier outputs whatever options made them (``--no-resume`` replaces only those).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import TypedDict, cast

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.jobs import lease
from fgdata.progress import Notify
from fgdata.storage import staging_dir, temps

STATE_DIR = ".fgdata"
LOCK_FILE = "lock"
INDEX_SUFFIX = ".idx.json"
#: Side files fgdata writes beside its outputs (every writing command).
SIDE_FILES = frozenset({STATE_DIR, "shard_count.json", "failures.json", "provenance.json", "shard_job.json",
                        "shard_stats.json", "scores.json"})
#: ``fgdata score``'s file beside a shard (:mod:`fgdata.shards.scores`).
SCORES_SUFFIX = ".scores.jsonl"



# -- temporary files -------------------------------------------------------------------------------------


def is_temp(name: str) -> bool:
    """A temporary name of fgdata's in a destination (its side files count as outputs)."""
    return temps.is_temp(name, SIDE_FILES)


def clean_temps(directory: str) -> list[str]:
    """Remove the temporary files a killed job left in ``directory``."""
    return temps.clean_temps(directory, SIDE_FILES)


# -- the lock --------------------------------------------------------------------------------------------


class LockOwner(TypedDict, total=False):
    """What the lock file holds while a job runs (``{"host", "pid"}``); empty, or as read when foreign."""

    host: str
    pid: int


class NotedFile(TypedDict):
    """A file another command wrote into a job's DST, as ``outputs.json`` notes it (:func:`note_output`)."""

    command: str
    size: int
    sha256: str


def _read_owner(fd: int) -> LockOwner:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 4096)
        owner = json.loads(data) if data.strip() else {}
        return cast(LockOwner, owner) if isinstance(owner, dict) else {}
    except (OSError, ValueError):
        return {}


def _state_dir(folder: str) -> int:
    """A descriptor of ``folder`` (``.fgdata``), created when missing; a link (never followed) or a file is refused."""
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o755)
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise FgdataError(f"{folder}: not a plain folder (a symbolic link or a file); fgdata keeps its job "
                              "state there and never follows it: remove it") from None
        raise FgdataError(f"{folder}: cannot open the job state folder ({exc.strerror})") from None


def refuse_links(folder: str) -> None:
    """Refuse a job state folder (``DST/.fgdata``, or an s3:// DST's local staging copy) holding a symbolic link at
    any depth: the job writes and removes below it, and a link would carry those writes and removals out of DST.
    Each entry's own type is read (never following it) before the job changes anything there."""
    stack = [folder]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except (FileNotFoundError, NotADirectoryError):
            continue
        with entries:
            for entry in entries:
                if entry.is_symlink():
                    raise FgdataError(f"{entry.path}: a symbolic link inside fgdata's job state folder; fgdata never "
                                      "follows one there (its writes and removals would leave DST): remove it")
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)


class DestLock:
    """An exclusive, crash-safe lock on one destination (see the module docstring)."""

    def __init__(self, dest: str, name: str = LOCK_FILE):
        folder = os.path.join(staging_dir(dest), STATE_DIR)
        self.dest = dest
        self.path = os.path.join(folder, name)
        self._fd: int | None = None
        self.lease: lease.Lease | None = None  # set while held through :func:`claimed` on shared storage

    def acquire(self) -> None:
        folder = _state_dir(os.path.dirname(self.path))
        try:
            refuse_links(os.path.dirname(self.path))
        except FgdataError:
            os.close(folder)
            raise
        try:
            fd = os.open(os.path.basename(self.path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise FgdataError(f"{self.path}: the lock file is a symbolic link; refusing to use it") from None
            raise FgdataError(f"{self.path}: cannot create the lock file ({exc.strerror})") from None
        finally:
            os.close(folder)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            raise FgdataError(f"{self.dest}: another fgdata job is writing here (host {owner.get('host', '?')}, "
                              f"pid {owner.get('pid', '?')}); wait for it to finish") from None
        owner = _read_owner(fd)
        host = socket.gethostname()
        if owner.get("host") not in (None, host):
            os.close(fd)
            raise FgdataError(f"{self.dest}: locked by a job on host {owner['host']} (pid {owner.get('pid')}); "
                              f"if that job is gone, remove {self.path}")
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps({"host": host, "pid": os.getpid()}).encode())
        except OSError as exc:  # a full disk fails here first: name the file
            os.close(fd)
            raise FgdataError(f"{self.path}: cannot write the lock file ({exc.strerror})") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)  # empty: free (the file stays, so no one locks a stale inode)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "DestLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- ownership -------------------------------------------------------------------------------------------


def _entries(dest: str) -> list[str]:
    """Top-level names in ``dest``, folders (s3: prefixes) included."""
    return storage.list_names(dest)


#: Dataset-wide index files of other tools: Energon's metadata folder, wids' shard index.
_DATASET_INDEXES = (".nv-meta",)
_DATASET_INDEX_SUFFIX = "shardindex.json"
#: Per-shard index files of other tools, beside ``NAME.tar``: Energon's offsets, DALI's index.
_SHARD_INDEX_SUFFIXES = (".tar.idx", ".idx")


def other_index(name: str) -> str | None:
    """The shard an index file of another tool describes, ``""`` for a dataset-wide one, None for any other name."""
    if name in _DATASET_INDEXES or name.endswith(_DATASET_INDEX_SUFFIX):
        return ""
    for suffix in _SHARD_INDEX_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)] + ".tar"
    return None


def shard_versions(dest: str, listed: Callable[[], None] | None = None) -> dict[str, tuple[int, str]]:
    """Each ``.tar`` in ``dest``: its size and version (what changes when it is written again). Another rank may
    rename or remove files meanwhile: one gone before it is looked at is left out (``listed``: see
    :func:`fgdata.storage.list_dir`)."""
    return {info.name: (info.size, info.version) for info in storage.list_dir(dest, ".tar", listed)} \
        if storage.is_dir(dest) else {}


def drop_stale_indexes(dest: str, before: dict[str, tuple[int, str]], notify: Notify | None) -> None:
    """After a job: remove other tools' per-shard index files whose shard it removed or wrote again (``before``:
    :func:`shard_versions` when it started), saying so, and warn that a dataset-wide one must be regenerated."""
    after = shard_versions(dest)
    if after == before:
        return
    names = _entries(dest)
    stale = [n for n in names if (shard := other_index(n)) and shard in before and after.get(shard) != before[shard]]
    remove_files(dest, stale, "their shards were removed or written again", notify)
    dataset = [n for n in names if other_index(n) == ""]
    if dataset and notify:
        notify(f"{', '.join(dataset)} in {dest} describe(s) the shards as they were before this job: "
               "regenerate it with the tool that wrote it (e.g. energon prepare)")


#: Files other fgdata commands wrote into a job's DST (``verify --write-ignore``, ``report -o``), by name.
OUTPUTS_FILE = "outputs.json"
OUTPUTS_FORMAT = "fgdata.outputs"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _noted_record(folder: str) -> str | None:
    """``folder``'s record of the files other fgdata commands wrote there; None when ``folder`` holds no job
    state folder (or a local one that is not a plain folder: never read or written through a link)."""
    state = storage.join(folder, STATE_DIR)
    if not storage.is_url(state) and os.path.islink(state) or not storage.is_dir(state):
        return None
    return storage.join(state, OUTPUTS_FILE)


def _noted(dest: str) -> dict[str, NotedFile]:
    record = _noted_record(dest)
    if record is None or not storage.exists(record):
        return {}
    try:
        doc = json.loads(storage.read_bytes(record))
    except ValueError:
        return {}
    files = doc.get("files") if isinstance(doc, dict) and doc.get("format") == OUTPUTS_FORMAT else None
    return {k: cast(NotedFile, v) for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else {}


def note_output(path: str, command: str) -> None:
    """Record a file another command wrote directly into a job's DST (``verify --write-ignore``, ``report -o`` and
    its contact sheet) in ``DST/.fgdata/outputs.json``, with its size and SHA-256: while it still holds those
    bytes, a rerun of the job takes it as fgdata's (neither foreign nor the job's own: left in place). A folder
    without a job state folder is not a job's DST: nothing is recorded."""
    folder, name = storage.parent(path), storage.basename(path)
    record = _noted_record(folder)
    if record is None:
        return
    data = storage.read_bytes(path)
    files = _noted(folder)
    files[name] = {"command": command, "size": len(data), "sha256": _digest(data)}
    doc = {"format": OUTPUTS_FORMAT, "version": 1, "files": dict(sorted(files.items()))}
    storage.write_bytes(record, (json.dumps(doc, indent=1) + "\n").encode())


def _still_noted(dest: str, name: str, noted: dict[str, NotedFile]) -> bool:
    """Whether ``name`` is a file another fgdata command wrote into ``dest`` and still holds the bytes it wrote."""
    entry = noted.get(name)
    if entry is None:
        return False
    info = storage.stat(storage.join(dest, name))
    return (info is not None and info.size == entry.get("size")
            and _digest(storage.read_bytes(storage.join(dest, name))) == entry.get("sha256"))


def own_outputs(dest: str, keep: Iterable[str] = ()) -> list[str]:
    """Names in ``dest`` that the job's command wrote (its state folder, temporaries and the files other fgdata
    commands wrote there aside; ``keep``: names to leave)."""
    foreign = set(foreign_files(dest))
    kept = set(keep)
    noted = _noted(dest)
    return [n for n in _entries(dest) if n not in foreign and n not in kept and n != STATE_DIR and not is_temp(n)
            and other_index(n) is None and n not in noted]


def foreign_files(dest: str, keep: Iterable[str] = ()) -> list[str]:
    """Names in ``dest`` that fgdata did not write (``keep``: inputs of an in-place job); other tools' index
    files (:func:`other_index`) and files other fgdata commands wrote there (:func:`note_output`) are not
    counted."""
    names = _entries(dest)
    present = set(names)
    kept = set(keep)
    noted = _noted(dest) if STATE_DIR in present else {}
    foreign = []
    for name in names:
        if name in SIDE_FILES or name in kept or is_temp(name) or other_index(name) is not None:
            continue
        if name.endswith(INDEX_SUFFIX) and name[: -len(INDEX_SUFFIX)].endswith(".tar"):
            continue
        if name.endswith(SCORES_SUFFIX) and name[: -len(SCORES_SUFFIX)] in present:
            continue
        if name.endswith(".tar") and name + INDEX_SUFFIX in present:
            continue
        if _still_noted(dest, name, noted):
            continue
        foreign.append(name)
    return foreign


def _remove(dest: str, name: str) -> None:
    storage.remove_tree(storage.join(dest, name))


def _listing(names: list[str], most: int = 5) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


#: Folders of version-control systems: a DST holding one (at any depth of what would go) is someone's working
#: copy, and fgdata never removes it, ``--overwrite`` or not.
VCS_DIRS = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", "CVS", ".jj", ".pijul", ".fslckout", "_FOSSIL_"})


def _vcs_below(name: str, path: str, below: list[storage.FileInfo]) -> str | None:
    """The first version-control folder below the folder ``name`` (``path``; ``below``: its files), as a name
    relative to DST."""
    for info in below:
        parts = storage.relative(path, info.path).split("/")[:-1]
        for depth, part in enumerate(parts):
            if part in VCS_DIRS:
                return "/".join([name, *parts[: depth + 1]])
    return None


def _removal(dest: str, names: list[str]) -> tuple[list[str], list[str], int]:
    """What removing ``names`` from ``dest`` takes, described: the files (``name (size)``), the folders
    (``name/ (N files, size)``) and the bytes in all. A version-control folder among them, or below one of the
    folders, is refused before anything is removed."""
    from fgdata.formatting import human_bytes

    sizes = {info.name: info.size for info in storage.list_dir(dest)} if storage.is_dir(dest) else {}
    files, folders, total = [], [], 0
    for name in names:
        if name in sizes:
            files.append(f"{name} ({human_bytes(sizes[name])})")
            total += sizes[name]
            continue
        path = storage.join(dest, name)
        below = storage.list_tree(path)[0] if storage.is_dir(path) else []
        vcs = name if name in VCS_DIRS else _vcs_below(name, path, below)
        if vcs is not None:
            raise FgdataError(f"{storage.join(dest, vcs)}: a version-control folder would go; fgdata never removes "
                              "one, even with --overwrite: choose another DST, or move it away yourself")
        size = sum(info.size for info in below)
        folders.append(f"{name}/ ({len(below)} file(s), {human_bytes(size)})")
        total += size
    return files, folders, total


def remove_files(dest: str, names: list[str], why: str, notify: Notify | None) -> None:
    """Delete ``names`` (files or folders) from ``dest``, saying first what goes, by kind and size; refused whole,
    before anything goes, when a version-control folder would go (:data:`VCS_DIRS`)."""
    if not names:
        return
    from fgdata.formatting import human_bytes

    files, folders, total = _removal(dest, names)
    if notify:
        kinds = " and ".join(k for k in (f"{len(files)} file(s)" if files else "",
                                          f"{len(folders)} folder(s)" if folders else "") if k)
        notify(f"{why}: removing {kinds} from {dest} ({human_bytes(total)}): {_listing(files + folders)}")
    for name in names:
        _remove(dest, name)


def check_foreign(dest: str, keep: Iterable[str] = (), overwrite: bool = False, notify: Notify | None = None) -> None:
    """Refuse a destination holding files fgdata did not write, unless ``overwrite`` (then remove them)."""
    foreign = foreign_files(dest, keep)
    if not foreign:
        return
    if not overwrite:
        raise FgdataError(f"{dest} holds files fgdata did not write ({_listing(foreign, 3)}); "
                          "choose an empty folder, or pass --overwrite to remove them")
    remove_files(dest, foreign, "--overwrite", notify)


def check_removable(dest: str, keep: Iterable[str] = ()) -> None:
    """``--overwrite``'s check before anything is created: what it would remove holds no version-control folder."""
    foreign = foreign_files(dest, keep)
    if foreign:
        _removal(dest, foreign)


def check_sources(dest: str, sources: Iterable[str | None], in_place: bool = False) -> None:
    """Refuse a DST that is a source of the job or holds one (whatever either's spelling: links followed, s3://
    compared as bucket and prefix), before anything is created or removed: ``--overwrite`` and a rerun's sweep
    would remove the inputs. A DST inside SRC is fine (the folder walk leaves it out). ``in_place``: an
    ``encode``/``kd`` job that adds members to its input shards may write into that source itself."""
    for src in sources:
        where = storage.within(src, dest) if src else None
        if where is None or where == "" and in_place:
            continue
        what = f"is SRC ({src})" if where == "" else f"holds SRC {src} (as {where})"
        raise FgdataError(f"{dest}: DST {what}; fgdata never writes where its inputs are (--overwrite or a rerun "
                          "would remove them): choose another DST (a folder inside SRC is fine)")


def rank_lock(rank: int) -> str:
    """The lock a torchrun rank holds: rank 0 the DST's own (so another job is refused), each other rank its own
    beside it (so the ranks of one job never fight over DST, and a second job's rank r is still refused)."""
    return LOCK_FILE if rank == 0 else f"{LOCK_FILE}.rank{rank}"


def clear_leftovers(dest: str) -> None:
    """Remove what a killed job left: the temporaries in DST, or all but the locks in its separate staging
    folder (s3)."""
    stage = staging_dir(dest)
    if stage == dest:  # built in place: only the temporaries are the job's, its records' (a marker) included
        clean_temps(dest)
        for folder, _, _ in os.walk(os.path.join(dest, STATE_DIR)):  # never follows a link
            clean_temps(folder)
        return
    for name in os.listdir(stage):
        if name != STATE_DIR:
            _remove(stage, name)


@contextlib.contextmanager
def claimed(dest: str, lock_name: str = LOCK_FILE, check: Callable[[], None] | None = None,
            ranks: int = 1) -> Iterator[DestLock]:
    """Hold ``dest``'s lock (and an s3:// DST's lease) and clear what a killed job left (:func:`clear_leftovers`).
    Under torchrun (``ranks`` > 1) nothing is cleared here: rank 0 may start after another rank began moving its
    shards into place through temporary names, so it clears only once every rank's units are in.

    ``check`` (a read-only refusal, such as :func:`check_foreign` without ``overwrite``) runs before anything
    is created, so a refused DST is left exactly as it was found. Only the holder of the DST's own lock
    clears: a rank's lock (:func:`rank_lock`) is taken while rank 0 of the same job may already be writing,
    and those files are not leftovers.
    """
    if check is not None:
        check()
    storage.make_dirs(dest)
    lock = DestLock(dest, lock_name)
    lock.acquire()
    try:
        if lock_name == LOCK_FILE and ranks == 1:
            clear_leftovers(dest)
        with lease.held(dest, lock_name) as held:
            lock.lease = held
            yield lock
    finally:
        lock.release()
