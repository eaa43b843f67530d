"""The flags every fgdata command shares: one definition each, so names and help text never drift.

Use them as parameter defaults (``show: Optional[bool] = PROGRESS``) and turn the values into behaviour with
the helpers below, never by hand:

- ``--progress/--no-progress`` (``PROGRESS``) and ``-q/--quiet`` (``QUIET``): pass both, with ``--json``, to
  :func:`show_progress`; it decides whether bars are drawn (auto: only when stderr is a terminal).
  ``-q`` also drops notes such as "wrote ..." lines, and a writing command's closing summary; errors and a
  reading command's result are always printed.
- ``--json`` (``JSON``): the result as one JSON document on stdout through ``fgdata.cli.render.print_json``;
  nothing else may go to stdout then (bars and notes go to stderr). Writing commands print their summary
  through ``fgdata.cli.jobrun.finish``, which does all three the same way for each.
- Writing commands: ``--resume/--no-resume`` (``RESUME``) keeps the complete outputs of an earlier run of the
  same job and continues after them; ``--no-resume`` starts the job from its first input, replacing fgdata's
  own outputs (files it did not write still make the job refuse). ``--overwrite`` (``OVERWRITE``) replaces
  whatever DST holds: fgdata's earlier outputs, whatever options made them, and files it did not write; the
  command says what it removes (:func:`say_removed`) before removing it, then runs fresh.
- Commands that read a local source tree: ``--follow-symlinks`` (``FOLLOW_SYMLINKS``) reads inputs that are
  symbolic links resolving outside it; without it each such input is a failure naming the link's target
  (``shard``: a linked folder is listed as skipped, and walked with the flag when it leads outside).
- Commands that decode images from a source: ``--max-pixels`` (``MAX_PIXELS``, or the ``FGDATA_MAX_PIXELS``
  variable that every decoding process also reads) raises Pillow's decompression-bomb limit for one job.
- Jobs that run under torchrun: ``--wait-timeout`` (``WAIT_TIMEOUT``) bounds how long rank 0 waits for the other
  ranks' outputs before it fails, naming the missing ones and their ranks.

Commands take these as flag groups (:mod:`fgdata.cli.flaggroups`): :class:`OutputFlags` (``--progress``,
``-q``, ``--json``), :class:`JobFlags` (``--resume``, ``--overwrite``) and :class:`TorchrunJobFlags` (those and
``--wait-timeout``); a command with only some of them declares those fields in its own group with
:func:`~fgdata.cli.flaggroups.flag` and the objects below.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import typer

from fgdata.cli.flaggroups import flag

if TYPE_CHECKING:
    from fgdata.shards import ShardSet

PROGRESS = typer.Option(
    None, "--progress/--no-progress", show_default=False,
    help="Draw progress bars on stderr (default: only when stderr is a terminal).",
)
QUIET = typer.Option(False, "--quiet", "-q",
                     help="No progress bars, notes or job summary: only a reading command's result, and errors.")
JSON = typer.Option(False, "--json", help="Print the result as one JSON document on stdout, and nothing else there.")
RESUME = typer.Option(
    True, "--resume/--no-resume", show_default=False,
    help="Keep complete outputs of an earlier run of the same job and continue after them (default: resume); "
         "--no-resume redoes the job, replacing fgdata's own outputs only.",
)
OVERWRITE = typer.Option(
    False, "--overwrite",
    help="Replace what DST holds: fgdata's earlier outputs (whatever options made them) and files it did not "
         "write, listing what is removed, then run fresh.",
)
FOLLOW_SYMLINKS = typer.Option(
    False, "--follow-symlinks",
    help="Read inputs that are symlinks to files, or lie in linked folders, outside the source folder "
         "(refused per input, or listed as skipped, otherwise).",
)
MAX_PIXELS = typer.Option(
    None, "--max-pixels", min=1, envvar="FGDATA_MAX_PIXELS",
    help="Decode images up to N pixels; a larger one fails as a possible decompression bomb (default: "
         "FGDATA_MAX_PIXELS, else Pillow's MAX_IMAGE_PIXELS: 89,478,485 unless your code changed it).",
)
WAIT_TIMEOUT = typer.Option(None, "--wait-timeout",
                            help="Under torchrun: seconds rank 0 waits for the other ranks' outputs (default 3600).")

#: Flag spelling -> the one definition, for the tests and for anyone adding a command.
SHARED = {"--progress": PROGRESS, "--quiet": QUIET, "--json": JSON, "--resume": RESUME, "--overwrite": OVERWRITE,
          "--follow-symlinks": FOLLOW_SYMLINKS, "--wait-timeout": WAIT_TIMEOUT, "--max-pixels": MAX_PIXELS}


@dataclass(frozen=True, kw_only=True)
class OutputFlags:
    """How a command reports: ``--progress/--no-progress``, ``-q``, ``--json``."""

    progress: Optional[bool] = flag(PROGRESS)
    quiet: bool = flag(QUIET)
    json_out: bool = flag(JSON)

    @property
    def bars(self) -> bool:
        """Whether to draw progress bars (:func:`show_progress`)."""
        return show_progress(self.progress, quiet=self.quiet, json_out=self.json_out)


@dataclass(frozen=True, kw_only=True)
class JobFlags:
    """What a writing command does with the outputs of an earlier run: ``--resume/--no-resume``, ``--overwrite``."""

    resume: bool = flag(RESUME)
    overwrite: bool = flag(OVERWRITE)


@dataclass(frozen=True, kw_only=True)
class TorchrunJobFlags(JobFlags):
    """:class:`JobFlags` and ``--wait-timeout``, for writing jobs that can run under torchrun."""

    wait_timeout: Optional[float] = flag(WAIT_TIMEOUT)


def show_progress(progress: bool | None, *, quiet: bool = False, json_out: bool = False) -> bool:
    """Whether to draw bars: never with -q or --json, as asked with --progress/--no-progress, else only on a tty."""
    if quiet or json_out:
        return False
    if progress is not None:
        return progress
    return sys.stderr.isatty()


def quiet_model_libraries(*, bars: bool, quiet: bool) -> None:
    """transformers, diffusers and the hub draw their own bars (loading weights, downloads) and advisories on
    stderr: without our bars theirs go too, and ``-q`` keeps only their errors.

    Each library reads these settings from the environment when it loads (``fgdata.compute`` tells diffusers,
    which reads no variable for its bars), so nothing heavy is imported here: a missing model still fails in a
    second, not after diffusers' import. A library already loaded is told directly."""
    if quiet:
        os.environ["TRANSFORMERS_VERBOSITY"] = os.environ["DIFFUSERS_VERBOSITY"] = "error"
    if not bars:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # for the processes this one starts, too
    for name in ("transformers.utils.logging", "diffusers.utils.logging", "huggingface_hub.utils"):
        library: Any = sys.modules.get(name)
        if library is None:
            continue
        if not bars:
            getattr(library, "disable_progress_bars" if name.startswith("huggingface") else "disable_progress_bar")()
        if quiet and not name.startswith("huggingface"):
            library.set_verbosity_error()


def say_removed(paths: Iterable[str], *, quiet: bool = False) -> list[str]:
    """Tell the user, on stderr, which outputs ``--overwrite`` is about to remove; returns them."""
    from fgdata.cli.render import err_console

    paths = list(paths)
    if not quiet:
        for path in paths:
            err_console.print(f"removing {path} (--overwrite)", highlight=False, markup=False)
    return paths


def say_repeated(selection: ShardSet, *, quiet: bool = False) -> None:
    """Tell the user, on stderr, that some shards were named twice (``a`` and ``./a``) and are read once."""
    from fgdata.cli.render import err_console

    note = selection.repeated_note()
    if note and not quiet:
        err_console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)


def exit_if_all_failed(written: int, failed: int, failures: str | None = None) -> None:
    """A job whose every input failed wrote nothing useful: say so and exit 1 (after its report was printed)."""
    if written == 0 and failed > 0:
        from fgdata.cli.render import err_console

        where = f"; reasons in {failures}" if failures else ""
        err_console.print(f"[red]error: nothing written: all {failed} input(s) failed{where}[/]", highlight=False,
                          soft_wrap=True)
        raise typer.Exit(1)
