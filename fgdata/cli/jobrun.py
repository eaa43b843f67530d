"""What every writing command does around its library call: the progress bar, the interrupt line and exit code,
notices, and the closing summary (a table, one JSON document, or nothing with ``-q``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import typer

from fgdata.cli.render import err_console

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from fgdata.jobs.summary import JobSummary

T = TypeVar("T")


def notify(line: str) -> None:
    """Library notices (what is about to be deleted) go to stderr, one line each."""
    err_console.print(line, highlight=False, markup=False, soft_wrap=True)


def notes(quiet: bool) -> Callable[[str], None] | None:
    """The notice callback a job gets: :func:`notify`, or none with ``-q``."""
    return None if quiet else notify


def run_job(call: Callable[[], T]) -> T:
    """Run a job; on SIGINT/SIGTERM print how to continue and exit 130/143 (the job left only complete outputs)."""
    from fgdata.jobs.signals import Interrupted

    try:
        return call()
    except Interrupted as stop:
        err_console.print(stop.line(), highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(stop.exit_code) from None


class JobBar:
    """One bar on stderr for a job's inputs, with samples/s (and MB/s once bytes are reported)."""

    def __init__(self, bar: Progress, label: str, total: int | None):
        self._bar = bar
        self._task: TaskID = bar.add_task(label, total=total, rate="")
        self._started = time.perf_counter()
        self._done = 0
        self._bytes = 0

    def total(self, total: int | None) -> None:
        """Set the number of inputs once it is known (after listing them)."""
        self._bar.update(self._task, total=total)

    def advance(self, inputs: int, nbytes: int = 0) -> None:
        self._done += inputs
        self._bytes += nbytes
        dt = max(time.perf_counter() - self._started, 1e-9)
        rate = f"{self._done / dt:,.1f} samples/s"
        if self._bytes:
            rate += f"  {self._bytes / dt / 1e6:,.1f} MB/s"
        self._bar.update(self._task, advance=inputs, rate=rate)


@contextmanager
def job_progress(label: str, *, enabled: bool, total: int | None = None) -> Iterator[JobBar]:
    """The job's bar (drawing nothing when not ``enabled``); closed before an interrupt line is printed."""
    from fgdata.cli.render import progress

    with progress(enabled=enabled) as bar:
        yield JobBar(bar, label, total)


@dataclass(kw_only=True)
class Outcome:
    """What a writing command reports, the same fields for every command, in the table and in ``--json``.

    ``seen`` is every input the job accounted for (``written + failed``); ``failures_file`` is the job's
    failures.json (None where this process did not write one, e.g. a non-final torchrun rank). ``details``
    are command-specific JSON fields and ``rows`` the command-specific table rows. ``whole_job`` is False for a
    torchrun rank that reports only its share: the rank that finishes the job decides the exit code.
    """

    command: str
    source: str
    output: str
    seen: int
    written: int
    failed: int
    failures_file: str | None
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)
    rows: list[tuple[str, str]] = field(default_factory=list)
    whole_job: bool = True

    def document(self) -> dict[str, Any]:
        """The ``--json`` document: the shared fields first, then the command's own."""
        return {"command": self.command, "source": self.source, "output": self.output, "seen": self.seen,
                "written": self.written, "failed": self.failed, "failures_file": self.failures_file,
                **self.details, "seconds": round(self.seconds, 3)}


def finish(outcome: Outcome, *, quiet: bool, json_out: bool) -> None:
    """Print the outcome (one JSON document on stdout, or a table; nothing with ``-q``), then exit 1 when every
    input failed."""
    from fgdata.cli import options
    from fgdata.cli.render import console, print_json

    if json_out:
        print_json(outcome.document())
    elif not quiet:
        from rich.table import Table

        console.print(f"[bold]{outcome.command}[/]: {outcome.source} → {outcome.output}", highlight=False,
                      soft_wrap=True)
        table = Table(show_header=False)
        table.add_column("", style="bold", no_wrap=True)
        table.add_column("", justify="right")
        table.add_row("inputs seen", f"{outcome.seen:,}")
        table.add_row("written", f"{outcome.written:,}")
        table.add_row("failed", f"{outcome.failed:,}")
        for name, value in outcome.rows:
            table.add_row(name, value)
        table.add_row("time", f"{outcome.seconds:.1f} s")
        console.print(table)
        if outcome.failed and outcome.failures_file:
            console.print(f"failures: {outcome.failures_file}", highlight=False, soft_wrap=True)
    if outcome.whole_job:
        options.exit_if_all_failed(outcome.written, outcome.failed, outcome.failures_file)


class Details(Protocol):
    """A command's own fields of its ``--json`` document, as a typed value of the command's."""

    def to_json(self) -> dict[str, object]: ...


@dataclass(frozen=True)
class ShardsDone:
    """The fields of a job of tasks, which writes shards per input shard (encode, kd, score --into): output shards
    written and found complete, samples per second (encode, kd) and the samples an in-place run kept as they were."""

    written: int
    resumed: int
    rate: float | None = None
    not_updated: int = 0

    @classmethod
    def of(cls, summary: JobSummary, *, rate: bool) -> ShardsDone:
        """From the job's summary and its :class:`fgdata.encode.tasks.TaskFigures` (``rate``: report samples/s)."""
        from fgdata.encode.tasks import TaskFigures
        from fgdata.jobs.summary import payload_of

        figures = payload_of(summary, TaskFigures)
        return cls(figures.shards_done, figures.shards_skipped, summary.rate if rate else None, figures.not_updated)

    def rows(self) -> list[tuple[str, str]]:
        """The table's rows."""
        rows = [("output shards written", f"{self.written:,}"), ("output shards resumed", f"{self.resumed:,}")]
        if self.not_updated:  # --into in place: failed samples kept as they were
            rows.insert(0, ("  not updated (kept)", f"{self.not_updated:,}"))
        return rows

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"shards_written": self.written, "shards_resumed": self.resumed}
        if self.rate is not None:
            doc["samples_per_second"] = round(self.rate, 2)
        if self.not_updated:
            doc["not_updated"] = self.not_updated
        return doc


def finish_job(summary: JobSummary, *, source: str, seconds: float, rows: list[tuple[str, str]],
               details: Details, quiet: bool, json_out: bool) -> None:
    """:func:`finish` for a job core's summary (``rows`` and ``details``: the command's own), a torchrun rank's
    share marked as such (rank 0 reports the job and alone decides the exit code)."""
    fields = details.to_json()
    if not summary.whole_job:
        fields |= {"rank": summary.rank, "world": summary.world}
        rows = [("rank", f"{summary.rank} of {summary.world} (its share only)"), *rows]
    finish(Outcome(command=summary.command, source=source, output=summary.path, seen=summary.seen,
                   written=summary.written, failed=summary.failed, failures_file=summary.failures_path,
                   seconds=seconds, details=fields, rows=rows, whole_job=summary.whole_job),
           quiet=quiet, json_out=json_out)
