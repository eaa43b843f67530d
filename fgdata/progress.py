"""The one progress and notification protocol of every command: low enough that the loaders, the report, the
commands and the job core all use it without importing one another."""

from __future__ import annotations

from collections.abc import Callable

#: ``progress(inputs, nbytes)``: increments, called as inputs are written or failed (``nbytes``: input bytes read,
#: 0 where a command does not count them).
ProgressFn = Callable[[int, int], None]
#: ``notify(line)``: one line for the user (what is about to be deleted, what was redone), on stderr in the CLI.
Notify = Callable[[str], None]
