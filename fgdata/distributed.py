"""Which process this is among torchrun's: the one reading of ``RANK`` and ``WORLD_SIZE``.

Both the writing jobs (:mod:`fgdata.jobs.ranks`) and the loaders (:mod:`fgdata.loaders.ranks`)
start from here, so a malformed value gets the same one-line error everywhere.
"""

from __future__ import annotations

import os

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
