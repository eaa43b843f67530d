"""The one summary every writing command returns: :class:`OutputSummary`, the counts each reports, and its
extensions (:class:`JobSummary` for the jobs of :func:`fgdata.jobs.driver.run_job`, with the command's own figures
as its typed ``payload``; ``fgdata.prepare.build.ZipSummary``; ``fgdata.fid.refs.RefResult``), which the CLI
renders the same way for each (the table, ``--json`` and ``-q``: :mod:`fgdata.cli.jobrun`).

A torchrun rank other than 0 returns its own share (``whole_job`` False, no ``failures_path``): rank 0 reports
the job and alone decides the exit code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict, TypeVar


class SelectionDoc(TypedDict, total=False):
    """A row selection's outcome as the summary and the provenance give it: ``--keep-top``'s cut (``by``,
    ``keep_top``, ``rows``, ``kept``, ``threshold``) and ``--where``'s expression, each when given."""

    by: str | None
    keep_top: float | None
    rows: int
    kept: int
    threshold: float | None
    where: str


@dataclass(kw_only=True)
class OutputSummary:
    """What a pass of a writing command did to one output, in the counts every command reports.

    ``path`` is the output (a shard folder, a zip, a reference file); ``seen`` every input accounted for
    (``written + failed + filtered``, the last only where a row selection left inputs out); ``failures_path`` the report that lists the failures (None where this process wrote
    none: a torchrun rank's share); ``kept``: the output was already complete with these options and nothing
    ran; ``whole_job`` is False for a rank that reports only its share.
    """

    path: str
    seen: int = 0
    written: int = 0
    failed: int = 0
    failures_path: str | None = None
    kept: bool = False
    seconds: float = 0.0
    whole_job: bool = True


@dataclass(kw_only=True)
class JobSummary(OutputSummary):
    """What a job of the job core did (or one torchrun rank's share of it); ``path`` is DST.

    It holds what every job has; the command's own figures are one typed ``payload`` (a dataclass defined with the
    command's code: ``fgdata.sharding.job.ShardFigures``, ``fgdata.encode.tasks.TaskFigures``), which the
    definition's ``summarize`` hook sets and the command's renderer reads back with :func:`payload_of`, as a
    unit's :class:`~fgdata.jobs.units.Marker` carries its command's payload. The engine never reads it.
    """

    command: str
    samples: int = 0  # samples in the output shards (clips: several per input)
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    filtered: int = 0  # inputs a row selection left out (counted in seen, neither written nor failed)
    filtered_by_reason: dict[str, int] = field(default_factory=dict)
    selection: SelectionDoc | None = None  # the row selection's cut (threshold, rows, kept)
    rank: int = 0
    world: int = 1
    resumed: int = 0  # inputs of units already complete when the job started
    restarted: int = 0  # work units an earlier run started and did not finish, written again from their start
    shards: list[str] = field(default_factory=list)  # the output shards (paths)
    counts: dict[str, int] = field(default_factory=dict)  # shard name -> samples
    payload: object | None = None  # the command's own figures (see above); None: the command has none

    @property
    def rate(self) -> float:
        """Samples written per second of this process's work."""
        return self.written / self.seconds if self.seconds > 0 else 0.0


P = TypeVar("P")


def payload_of(summary: JobSummary, kind: type[P]) -> P:
    """The command's own figures in ``summary``, of the type its definition sets (a mismatch is a bug, not input)."""
    if not isinstance(summary.payload, kind):
        raise TypeError(f"{summary.command}: its summary carries {type(summary.payload).__name__}, "
                        f"not {kind.__name__}")
    return summary.payload
