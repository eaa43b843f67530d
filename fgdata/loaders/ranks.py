"""Who this process is: its rank among the training processes and its worker slot within the rank.

Every loader resolves both here, so the rules are written once: explicit keywords win,
then an initialised ``torch.distributed``, then the ``RANK`` / ``WORLD_SIZE`` variables
that torchrun sets.
"""

from __future__ import annotations

import numbers
import os
import sys
from typing import Any

from fgdata.distributed import env_rank_world
from fgdata.errors import FgdataError
from fgdata.loaders.selection import LoaderConfigError


#: The largest ``sampler_start_idx`` / resume position: positions plus a batch and the drop
#: rule's look-ahead stay far inside int64.
MAX_POSITION = 1 << 62


def checked_position(value: Any, what: str) -> int:
    """A global position (samples consumed by all ranks): an integer, not a boolean, in ``[0, MAX_POSITION]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) <= MAX_POSITION:
        raise LoaderConfigError(f"{what}={value!r}: must be an integer in [0, 2**62] (global samples already consumed)")
    return int(value)


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): the keywords, else torch.distributed if initialised, else RANK / WORLD_SIZE."""
    if rank is None or world_size is None:
        dist = sys.modules.get("torch.distributed")  # only when the trainer imported torch: never import it here
        if dist is not None and dist.is_available() and dist.is_initialized():
            r, w = dist.get_rank(), dist.get_world_size()
        else:
            try:
                r, w = env_rank_world()
            except FgdataError as exc:
                raise LoaderConfigError(str(exc)) from None
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise LoaderConfigError(f"rank={rank}, world_size={world_size}: need 0 <= rank < world_size")
    return rank, world_size


def default_workers(deterministic: bool, world_size: int) -> int:
    """One worker in deterministic mode (the reference's order); else the CPUs shared by the ranks, at most 8."""
    return 1 if deterministic else max(0, min((os.cpu_count() or 1) // world_size, 8))


def worker_slot() -> tuple[int, int]:
    """(worker id, worker count) inside a torch DataLoader worker; (0, 1) in the main process."""
    torch_data = sys.modules.get("torch.utils.data")
    info = torch_data.get_worker_info() if torch_data is not None else None
    return (info.id, info.num_workers) if info is not None else (0, 1)
