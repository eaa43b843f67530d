"""Flags of table sources: ``--where``, ``--keep-top`` and ``--by`` (which rows a writing command takes: "Selecting
rows" in the README, :mod:`fgdata.sources.selection`), and ``--image-column`` / ``--video-column`` (media inside
Parquet and Arrow: :mod:`fgdata.sources.tables`)."""

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

    def media(self) -> tuple[Optional[str], bool]:
        """The media column of a table source and ``--rekey`` (the commands whose group has them)."""
        return None, False


REKEY = typer.Option(False, "--rekey", help="Existing shards as SRC: number the samples sample_000000... in source "
                                           "order instead of keeping their keys.")
_TABLE_HELP = ("column of a Parquet/Arrow source (a file, a datasets save_to_disk folder, a folder of *.parquet) "
               "holding the {what}: binary, or a struct of bytes and path (datasets' {feature}() layout); default: "
               "the {feature}() column of a save_to_disk folder, else {name}.")


@dataclass(frozen=True, kw_only=True)
class ImageTableFlags(SelectFlags):
    """``shard images``' rows: selection, and a Parquet or Arrow table with the images inside or existing shards."""

    image_column: Optional[str] = flag(typer.Option(
        None, "--image-column", help="The " + _TABLE_HELP.format(what="images", feature="Image", name="image")))
    rekey: bool = flag(REKEY)

    def media(self) -> tuple[Optional[str], bool]:
        return self.image_column, self.rekey


@dataclass(frozen=True, kw_only=True)
class VideoTableFlags(SelectFlags):
    """``shard videos``' rows: selection, and a Parquet or Arrow table with the videos inside or existing shards."""

    video_column: Optional[str] = flag(typer.Option(
        None, "--video-column", help="The " + _TABLE_HELP.format(what="videos", feature="Video", name="video")))
    rekey: bool = flag(REKEY)

    def media(self) -> tuple[Optional[str], bool]:
        return self.video_column, self.rekey
