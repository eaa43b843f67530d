"""The one summary a writing job on the job core returns (``shard``, ``encode``, ``kd``), which the CLI renders
the same way for each (:func:`fgdata.cli.jobrun.finish_job`: the table, ``--json`` and ``-q``).

The shared fields come first; a command fills those of its own below and leaves the others at their
defaults. A torchrun rank other than 0 returns its own share (``whole_job`` False, no ``failures_path``):
rank 0 reports the job and alone decides the exit code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fgdata.producers.media import ClipTally


@dataclass
class JobSummary:
    """What a writing job did (or one torchrun rank's share of it)."""

    command: str
    dest: str
    seen: int = 0  # inputs accounted for: written + failed
    written: int = 0
    failed: int = 0
    samples: int = 0  # samples in the output shards (clips: several per input)
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    failures_path: str | None = None  # None: a torchrun rank's share (rank 0 writes the job's report)
    rank: int = 0
    world: int = 1
    whole_job: bool = True  # False: only this torchrun rank's share; rank 0 reports the job
    resumed: int = 0  # inputs of units already complete when the job started
    shards: list[str] = field(default_factory=list)  # the output shards (paths)
    counts: dict[str, int] = field(default_factory=dict)  # shard name -> samples
    seconds: float = 0.0  # this process's work
    # encode / kd
    shards_done: int = 0  # output shards written by this run
    shards_skipped: int = 0  # output shards found complete
    not_updated: int = 0  # in place: samples written back unchanged (failures with "kept")
    # shard
    nbytes: int = 0  # input bytes read in this run
    normalised: dict[str, int] = field(default_factory=dict)  # images changed to display as a viewer does (this run)
    warned: int = 0  # inputs written without a part (a caption), listed in failures.json
    warned_by_reason: dict[str, int] = field(default_factory=dict)
    skipped: list[dict[str, Any]] = field(default_factory=list)  # files below SRC that are not inputs
    clips: ClipTally | None = None  # --clip-seconds: the clips written in this run
    changed: int = 0  # inputs replaced since the earlier run
    changed_names: list[str] = field(default_factory=list)  # the first of them
    rewritten: list[str] = field(default_factory=list)  # shards of the earlier run written again for them
    stats_path: str | None = None  # URL jobs: shard_stats.json (per-shard successes and failures by reason)
    retried: int = 0  # --retry-failed: retryable failures of complete units tried again
    recovered: int = 0  # of those, the ones written now

    @property
    def rate(self) -> float:
        """Samples written per second of this process's work."""
        return self.written / self.seconds if self.seconds > 0 else 0.0
