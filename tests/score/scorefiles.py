"""The score files beside a folder of shards, read back for the score tests."""

from __future__ import annotations

from pathlib import Path

from fgdata.shards.scores import read_scores


def score_rows(folder: Path) -> dict[str, dict]:
    """Sample key -> its scores, over every shard of ``folder``; each shard must have its score file."""
    out: dict[str, dict] = {}
    for shard in sorted(folder.glob("*.tar")):
        found = read_scores(str(shard))
        assert found is not None, f"{shard}: no score file"
        out.update(found.rows)
    return out
