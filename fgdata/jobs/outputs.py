"""The points of a run that the job core and producers outside it report: an output is complete, a
``--no-resume`` run is about to redo what an earlier launch left, a model was loaded. The only module that calls
the test hooks (:mod:`fgdata.jobs.testhook`).

``prepare``'s zip passes, ``fid-refs``' chunks and ``score``'s shards call the first two, every model load (``encode``'s
:func:`~fgdata.compute.load_pretrained`) the last; the test hooks of :mod:`fgdata.jobs.testhook`
hang off them, so no producer knows about tests and kill tests stop every command at the same kind of point.
"""

from __future__ import annotations

from fgdata.jobs import testhook

_finished = 0


def output_done() -> int:
    """One more output (a block of zip members, a chunk of feature moments) is complete on disk; returns how many
    this process has finished. Every pass of a command adds to one count, so a kill test can stop a command of
    two passes (``prepare imagenet-256``) or several outputs (``fid-refs all``) in any of them."""
    global _finished
    _finished += 1
    testhook.output_done(_finished)
    return _finished


def redoing(rank: int) -> None:
    """Rank ``rank`` of a ``--no-resume`` run is about to redo or replace what an earlier launch left; a test may
    hold it here to order two ranks' steps."""
    testhook.hold("no-resume", rank)


def model_loaded(what: str) -> None:
    """A model (``what``: "VAE", "text encoder", ...) finished loading in this process; a test counts the loads
    of every process of a job, to see that a Ray worker loads its model once, not once per unit."""
    testhook.model_loaded(what)


def reached(done: int) -> None:
    """The job core finished its ``done``-th output of this run (a shard under its final name, an output shard):
    a kill test may stop the job here."""
    testhook.output_done(done)


def hold(point: str, rank: int) -> None:
    """Rank ``rank`` reached the named ``point`` of the job core (``dest-listed``); a test may hold it there."""
    testhook.hold(point, rank)


def worker_result() -> None:
    """A pool worker has its result in hand and is about to send it: where a kill test stops a worker."""
    testhook.hold(testhook.WORKER_RESULT, 0)
