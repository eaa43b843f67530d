"""The one summary every writing command returns: :class:`OutputSummary`, the counts each reports, and its
command-specific extensions (:class:`JobSummary` for the job core's ``shard``, ``encode`` and ``kd``;
``fgdata.prepare.build.ZipSummary``; ``fgdata.fid.refs.RefResult``), which the CLI renders the same way for
each (the table, ``--json`` and ``-q``: :mod:`fgdata.cli.jobrun`).

The shared fields come first; a command fills those of its own below and leaves the others at their
defaults. A torchrun rank other than 0 returns its own share (``whole_job`` False, no ``failures_path``):
rank 0 reports the job and alone decides the exit code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from fgdata.jobs.report import Failure
    from fgdata.jobs.units import ClipTally, InputDiff


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
    """What a job of the job core did (or one torchrun rank's share of it); ``path`` is DST."""

    command: str
    samples: int = 0  # samples in the output shards (clips: several per input)
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    rank: int = 0
    world: int = 1
    resumed: int = 0  # inputs of units already complete when the job started
    shards: list[str] = field(default_factory=list)  # the output shards (paths)
    counts: dict[str, int] = field(default_factory=dict)  # shard name -> samples
    # encode / kd
    shards_done: int = 0  # output shards written by this run
    shards_skipped: int = 0  # output shards found complete
    not_updated: int = 0  # in place: samples written back unchanged (failures with "kept")
    # shard
    nbytes: int = 0  # input bytes read in this run
    normalised: dict[str, int] = field(default_factory=dict)  # images changed to display as a viewer does (this run)
    warned: int = 0  # inputs written without a part (a caption), listed in failures.json
    warned_by_reason: dict[str, int] = field(default_factory=dict)
    skipped: list[Failure] = field(default_factory=list)  # files below SRC that are not inputs, and why
    clips: ClipTally | None = None  # --clip-seconds: the clips written in this run
    inputs: InputDiff | None = None  # inputs added, removed and replaced since the earlier run
    rewritten: list[str] = field(default_factory=list)  # shards of the earlier run written again for them
    restarted: int = 0  # work units an earlier run started and did not finish, written again from their start
    stats_path: str | None = None  # URL jobs: shard_stats.json (per-shard successes and failures by reason)
    filtered: int = 0  # inputs --where / --keep-top left out (counted in seen, neither written nor failed)
    filtered_by_reason: dict[str, int] = field(default_factory=dict)
    selection: SelectionDoc | None = None  # --where and --keep-top's cut (threshold, rows, kept)
    retried: int = 0  # --retry-failed: retryable failures of complete units tried again
    recovered: int = 0  # of those, the ones written now
    uncaptioned: int = 0  # inputs written without a caption, over the whole dataset (images, videos)
    formats: dict[str, int] = field(default_factory=dict)  # image member -> inputs written with it, whole dataset

    @property
    def rate(self) -> float:
        """Samples written per second of this process's work."""
        return self.written / self.seconds if self.seconds > 0 else 0.0
