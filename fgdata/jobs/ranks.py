"""The torchrun executor: ranks own tasks round-robin and meet only through files, each wait bounded.

There is no process group: rank ``r`` of ``world`` owns tasks ``i`` with ``i mod world == r``
and leaves a marker per finished task; the finishing rank waits for every marker. Each wait
has a timeout (``--wait-timeout``, default :data:`DEFAULT_WAIT_S`) and its error names the
outputs still missing and which ranks own them, so a dead rank is never waited for forever.

Files alone cannot tell this launch's marker from one an earlier launch left: with ``--no-resume`` a
rank that has not yet removed its earlier markers would look finished. So under ``--no-resume`` every
marker carries the launch id (:func:`run_launch`) and the finishing rank accepts only those that carry
it (:func:`this_launch`); with ``--resume`` earlier markers count, which is what resuming means. A stale
marker is left to the rank that owns it, which removes it before it redoes the work: the finishing
rank removing it could race with the owner's new marker under the same name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from fgdata.distributed import env_rank_world, launch_id
from fgdata.errors import FgdataError

T = TypeVar("T")
DEFAULT_WAIT_S = 3600.0


def dist_env() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) otherwise."""
    return env_rank_world()


def run_launch(resume: bool, timeout: float | None = None) -> str | None:
    """The launch id this run's markers carry and must carry to count: None when earlier markers are welcome
    (``--resume``, or one process). Ranks other than 0 wait up to ``timeout`` (default :data:`DEFAULT_WAIT_S`)."""
    return None if resume else launch_id(DEFAULT_WAIT_S if timeout is None else timeout)


def this_launch(doc: object, launch: str | None) -> bool:
    """Whether a marker (a JSON object) counts in a run whose :func:`run_launch` is ``launch``."""
    return launch is None or (isinstance(doc, dict) and doc.get("launch") == launch)


def owner(index: int, world: int) -> int:
    return index % world


def owned(tasks: Sequence[T], rank: int, world: int) -> list[T]:
    """Task i belongs to rank ``i mod world`` (round robin balances tasks of different sizes)."""
    if world < 1 or not 0 <= rank < world:
        raise FgdataError(f"rank {rank} is outside world size {world}")
    return [t for i, t in enumerate(tasks) if owner(i, world) == rank]


def wait_for(missing: Callable[[], list[str]], what: str, timeout: float | None = None, poll: float = 1.0,
             log: Callable[[str], None] | None = None) -> None:
    """Wait until ``missing()`` is empty; after ``timeout`` seconds raise an error naming what is missing.

    ``missing()`` returns one description per missing piece (e.g. ``"00003.tar (rank 1)"``).
    """
    limit = DEFAULT_WAIT_S if timeout is None else timeout
    deadline = time.monotonic() + limit
    announced = False
    while True:
        left = missing()
        if not left:
            return
        if time.monotonic() >= deadline:
            shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
            raise FgdataError(f"{what}: still missing after {limit:g} s: {shown} "
                              "(is that rank still running? rerun the same command to resume)")
        if not announced and log:
            log(f"waiting for {what}: {len(left)} missing")
            announced = True
        time.sleep(poll)
