"""Errors that reach the user as one line.

Library code raises :class:`FgdataError` (or a subclass) for bad input, bad data
and unreachable storage. The CLI prints the message on one line and exits 1, but for
:class:`OptionError` (a bad option value), a usage error that exits 2 like Typer's own;
anything else is a bug and prints a traceback only with ``--debug``.
"""


class FgdataError(Exception):
    """A problem the user can act on; the message names the file or URL."""


class OptionError(FgdataError):
    """An option's value is not one the command accepts (the message names the flag); the CLI exits 2."""


class StorageError(FgdataError):
    """A local or s3:// path could not be listed, read or written."""


class ShardError(FgdataError):
    """A shard breaks the WebDataset format (bad key, damaged tar, ...)."""


class DamagedShardError(ShardError):
    """A shard is truncated or corrupt; ``good`` samples were readable before the damage."""

    def __init__(self, shard: str, good: int, reason: str):
        super().__init__(f"{shard}: damaged after {good} good samples ({reason})")
        self.shard = shard
        self.good = good
        self.reason = reason
