"""A job's lease on an ``s3://`` destination: one job writes a prefix at a time, whatever host or cache it runs from.

The local lock (:mod:`fgdata.jobs.dest`) guards one host's cache; the lease lives in the destination itself,
so every job that writes it sees it.

- **The object.** ``DST/.fgdata/lease.json`` (a torchrun rank r > 0: ``lease.rank<r>.json``) names the job:
  ``job`` (a random id), ``host``, ``pid``, ``pid_start`` and ``boot`` (so a reused pid or a rebooted host
  is not taken for the holder), ``start`` and ``heartbeat`` (Unix times) and ``expires_after`` (seconds).
- **Taking it.** Only when it is absent or expired: its ``heartbeat`` is more than ``expires_after`` seconds
  old, or it names a process of this host that no longer runs (so a killed job's rerun starts at once).
  The job writes its own, waits :func:`settle_seconds`, and reads it back: a job that raced it and wrote
  later is seen, and only the job whose lease is read back goes on. This relies on S3's strong
  read-after-write consistency (every read after a completed write returns it, as AWS S3 guarantees
  since December 2020; an S3-compatible store must do the same) and on the two writes of a race
  landing within the settle time of each other; a later check (below) catches the rest.
- **Holding it.** A heartbeat thread rewrites it every :func:`heartbeat_seconds` (a quarter of the
  expiry); a renewal that finds another job's lease marks this one lost.
- **Writing under it.** Files bound for a final name are uploaded under ``DST/.fgdata/staging/<job>/``
  and moved into place only after :meth:`Lease.confirm`: the lease read back is still this job's, and
  its last renewal is younger than three quarters of the expiry (so it cannot have expired meanwhile
  on a clock that agrees with this one). Removals and job-state writes are checked the same way. An
  upload that outlived its job (see :mod:`fgdata.children` for why none should) can land only under
  that job's staging prefix.
- **Followers.** A Ray task of the job writes under the driver's lease (:func:`following`): it stages under
  the driver's prefix and confirms that the lease read back still names the driver's job before each move.
- **Leftovers.** The job that takes a lease removes the staging prefixes of every job that holds no
  live lease; a job removes its own prefix and its lease when it ends.

Timing assumptions: ``FGDATA_S3_LEASE_SECONDS`` (default 60) is the expiry; hosts' clocks agree to well
within a quarter of it (NTP); two racing lease writes land within ``FGDATA_S3_LEASE_SETTLE_SECONDS``
(default 1, at most a twentieth of the expiry) of each other; one renewal (a read and a write) takes less than a quarter of it. A
job whose renewals fail for that long stops at its next write with a one-line error instead of
writing on. Host names must tell hosts apart (containers sharing one host name and one kernel but not
one pid namespace would judge each other's pids wrongly).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from typing import TypedDict, cast

from fgdata import storage
from fgdata.children import process_start
from fgdata.errors import FgdataError, StorageError
from fgdata.storage import guard

LEASE_ENV = "FGDATA_S3_LEASE_SECONDS"
DEFAULT_LEASE_S = 60.0
SETTLE_ENV = "FGDATA_S3_LEASE_SETTLE_SECONDS"
DEFAULT_SETTLE_S = 1.0
STATE_DIR = ".fgdata"
STAGING = "staging"


def lease_seconds() -> float:
    """The lease's expiry: ``$FGDATA_S3_LEASE_SECONDS``, else 60."""
    raw = os.environ.get(LEASE_ENV, "").strip()
    if not raw:
        return DEFAULT_LEASE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise FgdataError(f"{LEASE_ENV}={raw!r}: expected a positive number of seconds")
    return value


def heartbeat_seconds(expiry: float) -> float:
    """How often a held lease is renewed: four times per expiry."""
    return expiry / 4


def settle_seconds(expiry: float) -> float:
    """How long a job waits after writing its lease before it reads it back (a racing writer shows by then):
    ``$FGDATA_S3_LEASE_SETTLE_SECONDS`` (0 or more, at most a twentieth of the expiry), else 1 s or a
    twentieth of the expiry, whichever is shorter.

    The setting exists for a store whose writes land together faster (the test suite's loopback server
    uses 0.05 s); a longer settle catches races between writes that land further apart.
    """
    raw = os.environ.get(SETTLE_ENV, "").strip()
    if not raw:
        return min(DEFAULT_SETTLE_S, expiry / 20)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise FgdataError(f"{SETTLE_ENV}={raw!r}: expected a number of seconds, 0 or more")
    return min(value, expiry / 20)


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


class Holder(TypedDict, total=False):
    """The lease object as read (the module docstring says each field); a torn or foreign one may lack any."""

    job: str
    host: str
    pid: int
    pid_start: int | None
    boot: str | None
    start: float
    heartbeat: float
    expires_after: float


def _runs_here(holder: Holder) -> bool | None:
    """Whether the holder's process still runs on this host (None: it is another host's, or this host cannot tell)."""
    if holder.get("host") != socket.gethostname() or holder.get("boot") != _boot_id() or _boot_id() is None:
        return None
    pid = holder.get("pid")
    return isinstance(pid, int) and process_start(pid) is not None and process_start(pid) == holder.get("pid_start")


def _expired(holder: Holder, now: float) -> bool:
    if _runs_here(holder) is False:
        return True
    try:
        return now - float(holder["heartbeat"]) > float(holder["expires_after"])
    except (KeyError, TypeError, ValueError):
        return True  # not a lease fgdata wrote: nobody holds it


def _describe(holder: Holder | None, now: float) -> str:
    if not holder:
        return "no lease"
    try:
        age = f", last heartbeat {max(0.0, now - float(holder['heartbeat'])):.0f} s ago"
    except (KeyError, TypeError, ValueError):
        age = ""
    return f"job {holder.get('job', '?')}, host {holder.get('host', '?')}, pid {holder.get('pid', '?')}{age}"


def lease_name(lock_name: str) -> str:
    """``lock`` -> ``lease.json``, ``lock.rank3`` -> ``lease.rank3.json``."""
    return "lease" + lock_name.removeprefix("lock") + ".json"


class Lease:
    """This job's lease on ``dest`` (an ``s3://`` prefix); a :class:`fgdata.storage.guard.Guard` while held."""

    def __init__(self, dest: str, name: str = "lease.json", job: str | None = None):
        """``job``: follow the lease that job holds (a Ray task of the job's driver) instead of taking one."""
        self.dest = dest.rstrip("/")
        self.state = storage.join(self.dest, STATE_DIR)
        self.url = storage.join(self.state, name)
        self.job = job or secrets.token_hex(8)
        self.follower = job is not None
        self.staging = storage.join(self.state, STAGING, self.job)
        self.expiry = lease_seconds()
        self.settle = settle_seconds(self.expiry)
        self._renewed = 0.0  # time.monotonic() when the last renewal started
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.time()

    # -- the object ----------------------------------------------------------------------------------

    def _read(self, url: str | None = None) -> Holder | None:
        url = url or self.url
        try:
            doc = json.loads(storage.read_bytes(url))
        except StorageError:
            if storage.stat(url) is None:
                return None
            raise
        except ValueError:
            return {}  # torn or foreign: holds nothing
        return cast(Holder, doc) if isinstance(doc, dict) else {}

    def _write(self) -> None:
        now = time.time()
        pid = os.getpid()
        record: Holder = {"job": self.job, "host": socket.gethostname(), "pid": pid, "pid_start": process_start(pid),
                          "boot": _boot_id(), "start": self._started, "heartbeat": now, "expires_after": self.expiry}
        started = time.monotonic()
        storage.write_bytes(self.url, json.dumps(record, sort_keys=True).encode())
        self._renewed = started

    # -- the guard the storage layer asks ---------------------------------------------------------------

    def exempt(self, path: str) -> bool:
        bare = path.rstrip("/")
        name = bare.rpartition("/")[2]
        own_state = bare.rpartition("/")[0] == self.state and name.startswith("lease") and name.endswith(".json")
        return own_state or bare == self.staging or bare.startswith(storage.join(self.state, STAGING) + "/")

    def stages(self, path: str) -> bool:
        rel = path.rstrip("/")[len(self.dest) + 1:]
        return bool(rel) and rel.split("/", 1)[0] != STATE_DIR

    def staging_url(self, path: str) -> str:
        return storage.join(self.staging, path.rstrip("/")[len(self.dest) + 1:])

    def confirm(self, path: str) -> None:
        if self._lost is None and not self.follower and \
                time.monotonic() - self._renewed > self.expiry - heartbeat_seconds(self.expiry):
            self._lost = f"not renewed for {time.monotonic() - self._renewed:.0f} s, the lease expires after " \
                         f"{self.expiry:g} s ({LEASE_ENV})"
        if self._lost is None:
            holder = self._read()
            if not holder or holder.get("job") != self.job:
                self._lost = f"now held by {_describe(holder, time.time())}"
        if self._lost is not None:
            raise FgdataError(f"{path}: not written: this job no longer holds the lease on {self.dest} "
                              f"({self._lost}); another job may be writing there")

    # -- taking, renewing, giving back --------------------------------------------------------------

    def acquire(self) -> None:
        holder = self._read()
        now = time.time()
        if holder and holder.get("job") != self.job and not _expired(holder, now):
            raise FgdataError(f"{self.dest}: another fgdata job is writing here ({_describe(holder, now)}); "
                              f"wait for it to finish, or for its lease to expire ({self.expiry:g} s after its "
                              f"last heartbeat, {LEASE_ENV})")
        guard.register(self)
        try:
            self._write()
            time.sleep(self.settle)
            back = self._read()
            if not back or back.get("job") != self.job:
                raise FgdataError(f"{self.dest}: another fgdata job started writing here at the same time "
                                  f"({_describe(back, time.time())}); wait for it to finish")
            self._clear_dead_staging()
        except BaseException:
            guard.unregister(self)
            with contextlib.suppress(FgdataError):  # refused or stopped: a lease written here is given back
                if (self._read() or {}).get("job") == self.job:
                    storage.remove(self.url)
            raise
        self._thread = threading.Thread(target=self._heartbeat, name="fgdata-lease", daemon=True)
        self._thread.start()

    def _clear_dead_staging(self) -> None:
        """Remove what jobs without a live lease staged (listed first: a job writes its lease before it stages)."""
        root = storage.join(self.state, STAGING)
        staged = storage.list_names(root)
        if not staged:
            return
        now = time.time()
        live = {self.job}
        for name in storage.list_names(self.state):
            if name.startswith("lease") and name.endswith(".json"):
                holder = self._read(storage.join(self.state, name))
                if holder and not _expired(holder, now):
                    live.add(str(holder.get("job")))
        for job in staged:
            if job not in live:
                storage.remove_tree(storage.join(root, job))

    def _heartbeat(self) -> None:
        interval = heartbeat_seconds(self.expiry)
        while not self._stop.wait(interval):
            try:
                holder = self._read()
                if self._stop.is_set():
                    return
                if not holder or holder.get("job") != self.job:
                    self._lost = f"now held by {_describe(holder, time.time())}"
                    return
                self._write()
            except FgdataError:
                continue  # retried at the next beat; confirm() stops the job if none succeeds in time

    def release(self) -> None:
        """Stop renewing; remove this job's staging prefix and its lease (when still its own)."""
        self._stop.set()
        if self._thread is not None:
            # A renewal in flight ends before the lease goes, or its upload would put the lease back; one that
            # takes longer than the expiry writes a lease already expired.
            self._thread.join(timeout=self.expiry)
        try:
            storage.remove_tree(self.staging)
            holder = self._read()
            if holder and holder.get("job") == self.job:
                storage.remove(self.url)
        except FgdataError:
            pass  # unreachable now: the lease expires by itself, and the next job clears the staging
        finally:
            guard.unregister(self)


@contextlib.contextmanager
def following(dest: str, name: str, job: str) -> Iterator[None]:
    """Write under the lease job ``job`` holds on ``dest`` (named ``name``): a Ray task of that job's driver,
    on any node. Its files are staged under the job's prefix and moved into place only while the lease read
    back still names the job, as the driver's are; the driver renews and gives back the lease."""
    if not storage.backend_for(dest).shared:
        yield
        return
    lease = Lease(dest, name, job)
    guard.register(lease)
    try:
        yield
    finally:
        guard.unregister(lease)


@contextlib.contextmanager
def held(dest: str, lock_name: str) -> Iterator[Lease | None]:
    """Hold the lease on ``dest`` while the block runs (storage several hosts share, such as ``s3://``; a local
    DST is held by its lock alone)."""
    if not storage.backend_for(dest).shared:
        yield None
        return
    lease = Lease(dest, lease_name(lock_name))
    lease.acquire()
    try:
        yield lease
    finally:
        lease.release()
