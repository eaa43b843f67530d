"""The Ray executor: the only place fgdata calls ``ray.remote``.

Every Ray-backed command hands this module a module-level function and one keyword set per
work unit; units are idempotent (each writes only its own files and resumes from them), so
Ray may retry a unit whose worker or node died. A unit that still cannot finish ends the job
with one line naming it; results are returned in unit order, never with a silent gap.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypedDict, TypeVar

from fgdata.errors import FgdataError
from fgdata.jobs import signals

C = TypeVar("C")
S = TypeVar("S")
R = TypeVar("R")

#: Retries of a unit whose worker process or node died (Ray's own failure detection).
MAX_RETRIES = 3
#: The driver waits for its tasks in steps this long, so a stop signal is acted on within one step.
WAIT_STEP_S = 0.5


_watchdogs: list[Any] = []  # the watchdog of the local cluster this process started (fgdata.jobs.raywatch)


def connect(address: str | None) -> bool:
    """Join ``address`` (or ``RAY_ADDRESS``), else start this job's own local instance; True when this call
    started or joined one (the job then shuts its connection, and its own instance, down).

    Without an address Ray would join the newest cluster it finds on the machine, which may be another
    user's: ``"local"`` starts a private one instead; ``--ray-address auto`` asks for the joining.
    Ray's ``init`` installs its own SIGTERM handler (exit at once, with a stack dump from its core): the
    job's stop handlers are put back after it. A local cluster gets a watchdog that ends its processes if the
    driver is killed (:mod:`fgdata.jobs.raywatch`).
    """
    try:
        import ray
    except ImportError:
        raise FgdataError("--engine ray needs Ray: pip install 'fgdata[ray]'") from None
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    target = address or os.environ.get("RAY_ADDRESS") or "local"
    if target == "local":
        from fgdata.jobs import raywatch

        _watchdogs.extend(w for w in [raywatch.start()] if w is not None)
    ray.init(address=target, include_dashboard=False, log_to_driver=False)
    signals.rearm()
    return True


def disconnect() -> None:
    """Leave the cluster (shutting down the local one this process started) and dismiss its watchdog."""
    import ray

    ray.shutdown()
    while _watchdogs:
        from fgdata.jobs import raywatch

        raywatch.stop(_watchdogs.pop())


def _unit_error(exc: BaseException, unit: int) -> FgdataError:
    import ray

    cause = getattr(exc, "cause", None)
    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, FgdataError):
        return cause
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return FgdataError(f"Ray work unit {unit} failed ({type(exc).__name__}: {first}); "
                       "rerun the same command to resume")


class _Limits(TypedDict, total=False):
    max_calls: int  # left out: Ray's default


def stream_units(fn: Callable[[S, C], R], units: Iterable[C], shared: S, *, address: str | None = None,
                 num_gpus: float = 0.0, in_flight: int | None = None,
                 max_calls: int | None = None) -> Iterator[tuple[int, R]]:
    """``fn(shared, unit)`` for each unit of a stream, as Ray tasks; yields ``(i, result)`` as they finish.

    At most ``in_flight`` tasks are submitted at a time (default: twice the cluster's CPUs), so a stream of
    any length is read only as fast as the cluster works through it. ``shared`` is put in the object store
    once and reaches every unit by reference. ``max_calls``: how many units one worker process runs before
    it exits (0: no limit); Ray's default is 1 for tasks with ``num_gpus > 0``, so a unit that keeps its loaded
    model for the next unit in its process passes 0.
    """
    started = connect(address)
    import ray

    try:
        limit = in_flight or max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
        ref_shared = ray.put(shared)
        limits: _Limits = {} if max_calls is None else {"max_calls": max_calls}
        remote = ray.remote(num_gpus=num_gpus, max_retries=MAX_RETRIES, retry_exceptions=False, **limits)(fn)
        stream = enumerate(units)
        index: dict[Any, int] = {}
        pending: list[Any] = []
        exhausted = False
        try:
            with signals.critical():  # a stop is recorded, and raised between two short waits
                while True:
                    while not exhausted and len(pending) < limit:
                        nxt = next(stream, None)
                        if nxt is None:
                            exhausted = True
                            break
                        ref = remote.remote(ref_shared, nxt[1])
                        index[ref] = nxt[0]
                        pending.append(ref)
                    if not pending:
                        return
                    signals.stop_if_signalled()
                    done, pending = ray.wait(pending, num_returns=1, timeout=WAIT_STEP_S)
                    for ref in done:
                        i = index.pop(ref)
                        try:
                            result = ray.get(ref)
                        except (ray.exceptions.RayError, OSError) as exc:
                            raise _unit_error(exc, i) from None
                        yield i, result
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
    finally:
        if started:
            disconnect()
