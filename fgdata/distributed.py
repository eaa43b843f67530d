"""Which process this is among torchrun's: the one reading of ``RANK`` and ``WORLD_SIZE``.

Both the writing jobs (:mod:`fgdata.jobs.ranks`) and the loaders (:mod:`fgdata.loaders.ranks`)
start from here, so a malformed value gets the same one-line error everywhere.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from fgdata.errors import FgdataError


def env_rank_world() -> tuple[int, int]:
    """(rank, world size) from torchrun's ``RANK`` / ``WORLD_SIZE``; (0, 1) when they are unset."""
    values = {}
    for name, default in (("RANK", "0"), ("WORLD_SIZE", "1")):
        raw = os.environ.get(name, "").strip() or default
        try:
            values[name] = int(raw)
        except ValueError:
            raise FgdataError(f"{name}={raw!r} is not an integer (torchrun sets it; check your launcher)") from None
    rank, world = values["RANK"], values["WORLD_SIZE"]
    if world < 1 or not 0 <= rank < world:
        raise FgdataError(f"RANK={rank}, WORLD_SIZE={world}: need 0 <= RANK < WORLD_SIZE")
    return rank, world


#: Where rank 0 leaves the launch id in torchrun's store (one key per restart of the worker group).
LAUNCH_KEY = "fgdata/launch-id/{restart}"
_launch: dict[str, str] = {}  # this process's launch id, once read
_store: list[object] = []  # rank 0's store when it hosts one: kept open so later ranks can still read the key


def launch_id(timeout: float) -> str | None:
    """An id every rank of this torchrun launch shares and no other launch has; None in one process.

    File-only jobs cannot tell an earlier launch's markers from this one's by looking at them, so
    ``--no-resume`` asks for this id and accepts only markers that carry it. Rank 0 draws it and sets it
    in a TCPStore at ``MASTER_ADDR:MASTER_PORT``; every other rank reads it, waiting at most
    ``timeout`` seconds. The store is reached as ``init_process_group(init_method="env://")`` reaches it:
    every rank is a client of the agent's store when torchrun says ``TORCHELASTIC_USE_AGENT_STORE=True``,
    else rank 0 hosts it. The key names ``TORCHELASTIC_RESTART_COUNT``, because the agent's store
    outlives a restart of the workers. No process group is made, so no collective timeout applies.
    """
    rank, world = env_rank_world()
    if world == 1:
        return None
    if "id" in _launch:
        return _launch["id"]
    addr, port_text = os.environ.get("MASTER_ADDR", "").strip(), os.environ.get("MASTER_PORT", "").strip()
    where = f"MASTER_ADDR:MASTER_PORT={addr or '?'}:{port_text or '?'}"
    if not addr or not port_text.isdigit() or not 0 < int(port_text) < 2**16:
        raise FgdataError(f"--no-resume with WORLD_SIZE={world} needs torchrun's store at {where} to tell this "
                          "launch from earlier ones; launch with torchrun (with --master-port 0 the port cannot "
                          "be reached: use --standalone or a fixed port), or rerun with --resume")
    value = _exchange(addr, int(port_text), rank, time.monotonic() + timeout)
    if isinstance(value, _NoId):
        raise FgdataError(f"rank {rank}: no launch id from rank 0 through torchrun's store at {where} within "
                          f"{timeout:g} s (--wait-timeout): {value.why}")
    _launch["id"] = value
    return value


@dataclass(frozen=True)
class _NoId:
    """Why no id came (returned, so :func:`launch_id` words the one error)."""

    why: str


def _exchange(addr: str, port: int, rank: int, deadline: float) -> str | _NoId:
    """Rank 0 sets a new id in the store, every rank reads it; waits are polled here, in Python, because
    torch's own waits print pages of C++ warnings before they give up."""
    import secrets
    from datetime import timedelta

    from torch.distributed import TCPStore

    host = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True)
    key = LAUNCH_KEY.format(restart=os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if not host and not _until(deadline, lambda: _listening(addr, port)):
        return _NoId("nothing listens there")
    try:
        store = TCPStore(addr, port, is_master=host, wait_for_workers=False, multi_tenant=True,
                         timeout=timedelta(seconds=max(1.0, deadline - time.monotonic())))
        if rank == 0:
            store.set(key, secrets.token_hex(16))
            _store.append(store)
        if not _until(deadline, lambda: store.check([key])):
            return _NoId("rank 0 set no id there")
        return store.get(key).decode()
    except RuntimeError as exc:  # torch's DistNetworkError / DistStoreError
        return _NoId((str(exc).strip().splitlines() or [type(exc).__name__])[0])


def _listening(addr: str, port: int) -> bool:
    try:
        socket.create_connection((addr, port), timeout=1.0).close()
    except OSError:
        return False
    return True


def _until(deadline: float, ready: Callable[[], bool]) -> bool:
    """Poll ``ready`` until it holds (True) or ``deadline`` passes (False)."""
    while not ready():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
