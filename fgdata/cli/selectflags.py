"""``--where``, ``--keep-top`` and ``--by``: which rows of a source a writing command takes (see "Selecting rows"
in the README and :mod:`fgdata.sources.selection`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import typer

from fgdata.cli.flaggroups import flag


@dataclass(frozen=True, kw_only=True)
class SelectFlags:
    """Row selection: the rows left out are counted as filtered (neither written nor failed)."""

    where: Optional[str] = flag(typer.Option(
        None, "--where",
        help="Keep the manifest rows that pass EXPR, e.g. \"similarity >= 0.3 and pwatermark < 0.5\" (=, !=, <, <=, "
             ">, >=, and, or, not, in (...), is null, is not null; a comparison with a null or NaN cell is false, "
             "!= true, as in pandas)."))
    keep_top: Optional[float] = flag(typer.Option(
        None, "--keep-top", help="Keep exactly floor(F x N) of the N rows that pass --where: those with the highest "
                                 "--by (null and NaN never qualify; ties in row order)."))
    by: Optional[str] = flag(typer.Option(None, "--by", help="The numeric field --keep-top ranks by."))
