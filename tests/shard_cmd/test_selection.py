"""``shard images --where / --keep-top`` end to end: the rows written are the rows pandas selects, every row is
accounted (seen = written + failed + filtered), NaN cells are written as null, bad expressions stop before DST
exists, and the selection is part of the job record."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fgdata.shards import discover_shards, iter_samples


@pytest.fixture
def scored(tmp_path: Path, sample_images: list[Path]) -> tuple[Path, pd.DataFrame]:
    """A LAION-style Parquet manifest of the bundled photos (twice over), with NaN and null scores and ties."""
    paths = [str(p) for p in sample_images] * 2
    n = len(paths)
    df = pd.DataFrame({"path": paths, "caption": [f"photo {i}" for i in range(n)],
                       "similarity": [0.31, np.nan, 0.28, 0.35, 0.35, None, 0.2, 0.35, 0.4, 0.1, 0.33, np.nan,
                                      0.3, 0.29][:n],
                       "pwatermark": [0.1, 0.2, 0.9, 0.05, 0.4, 0.3, 0.6, 0.1, 0.95, 0.0, 0.2, 0.1, 0.5, 0.45][:n],
                       "source": ["a", "b", "a", "c", None, "a", "b", "a", "c", "a", "b", "a", "c", "a"][:n]})
    manifest = tmp_path / "laion.parquet"
    df.to_parquet(manifest)
    return manifest, df


def _written(dest: Path) -> list[tuple[str, dict]]:
    return [(s.key, json.loads(s.members["json"])) for shard in discover_shards(str(dest))
            for s in iter_samples(shard)]


def test_where_and_keep_top_write_the_rows_pandas_selects(cli, scored, tmp_path):
    manifest, df = scored
    dest = tmp_path / "out"
    result = cli("shard", "images", manifest, dest, "--where", "pwatermark < 0.5 and source != 'c'",
                 "--keep-top", "0.5", "--by", "similarity", "--maxcount", "3", "--no-progress", "--json")
    doc = json.loads(result.stdout)
    passed = df[(df.pwatermark < 0.5) & (df.source != "c")]
    k = math.floor(0.5 * len(passed))
    expected = sorted(passed.similarity.dropna().nlargest(k, keep="first").index)
    assert [key for key, _ in _written(dest)] == [f"sample_{i:06d}" for i in expected]
    assert doc["seen"] == len(df) == doc["written"] + doc["failed"] + doc["filtered"]
    assert doc["filtered_by_reason"] == {"keep-top": len(passed) - k, "where": len(df) - len(passed)}
    assert doc["selection"]["kept"] == k and doc["selection"]["rows"] == len(passed)
    assert doc["selection"]["threshold"] == passed.similarity.dropna().nlargest(k).min()
    report = json.loads((dest / "failures.json").read_text())
    assert (report["seen"], report["filtered"], report["selection"]) == (doc["seen"], doc["filtered"],
                                                                         doc["selection"])
    record = json.loads((dest / "provenance.json").read_text())["jobs"]["shard images"]
    assert record == {"filtered": doc["filtered"], "filtered_by_reason": doc["filtered_by_reason"],
                      "selection": doc["selection"]}


def test_a_nan_cell_is_written_as_null(cli, scored, tmp_path):
    manifest, df = scored
    dest = tmp_path / "out"
    result = cli("shard", "images", manifest, dest, "--where", "similarity is null", "--no-progress", "--json")
    doc = json.loads(result.stdout)
    nulls = list(np.flatnonzero(df.similarity.isna()))
    assert (doc["written"], doc["failed"], doc["filtered"]) == (len(nulls), 0, len(df) - len(nulls))
    written = _written(dest)
    assert [key for key, _ in written] == [f"sample_{i:06d}" for i in nulls]
    assert all(meta["similarity"] is None for _, meta in written)


@pytest.mark.parametrize("args", [["--where", "similarity >"], ["--where", "simlarity > 0.3"],
                                  ["--where", "source > 1"], ["--keep-top", "0.3"],
                                  ["--keep-top", "0.3", "--by", "source"], ["--keep-top", "2", "--by", "similarity"]])
def test_bad_selections_stop_before_anything_is_written(cli, scored, tmp_path, args):
    manifest, _ = scored
    dest = tmp_path / "out"
    result = cli("shard", "images", manifest, dest, *args, "--no-progress", expect=2)
    assert "--where" in result.output or "--keep-top" in result.output or "--by" in result.output
    assert not dest.exists()


def test_an_unknown_field_lists_the_fields_present(cli, scored, tmp_path):
    manifest, _ = scored
    result = cli("shard", "images", manifest, tmp_path / "out", "--where", "aesthetic > 5", expect=2)
    assert "no field 'aesthetic'" in result.output
    assert "caption, path, pwatermark, similarity, source" in " ".join(result.output.replace("│", " ").split())


def test_a_rerun_resumes_and_another_selection_is_refused(cli, scored, tmp_path, snapshot):
    manifest, _ = scored
    dest = tmp_path / "out"
    args = ["shard", "images", manifest, dest, "--keep-top", "0.4", "--by", "similarity", "--maxcount", "2",
            "--no-progress"]
    cli(*args)
    first = snapshot(dest)
    again = json.loads(cli(*args, "--json").stdout)
    assert again["resumed"] == again["written"] + again["failed"]
    assert snapshot(dest) == first
    other = cli(*args[:5], "0.6", *args[6:], expect=1)
    assert "(--keep-top was 0.4, now 0.6)" in str(other.exception)


def test_where_needs_a_manifest(cli, image_folder, tmp_path):
    result = cli("shard", "images", image_folder, tmp_path / "out", "--where", "score > 1", expect=2)
    assert "is none of them" in " ".join(result.output.replace("│", " ").split())


def test_report_shows_what_the_selection_left_out(cli, scored, tmp_path):
    manifest, df = scored
    dest = tmp_path / "out"
    cli("shard", "images", manifest, dest, "--where", "source != 'c'", "--keep-top", "0.5", "--by", "similarity",
        "--no-progress", "-q")
    result = cli("report", dest, "--output", tmp_path / "report.html", "--json")
    doc = json.loads(result.stdout)["selection"]
    passed = df[df.source != "c"]
    k = len(passed) // 2
    assert (doc["seen"], doc["rows"], doc["kept"]) == (len(df), len(passed), k)
    assert doc["filtered_by_reason"] == {"keep-top": len(passed) - k, "where": len(df) - len(passed)}
    assert doc["where"] == "source != 'c'" and "Selection" in (tmp_path / "report.html").read_text()


def _per_shard(df: pd.DataFrame, reasons: pd.Series, written: pd.Series, maxcount: int) -> dict[str, dict[str, int]]:
    """pandas' count of the rows left out that each shard owns: a row left out belongs to the last row before it
    that went on (the rows before the first one: to that one); shard j holds the rows that went on j * maxcount on
    (no failures). ``reasons``: why each row was left out (None: it went on)."""
    owner = written.astype(int).cumsum().clip(lower=1) - 1
    left = pd.DataFrame({"shard": owner // maxcount, "reason": reasons})[reasons.notna()]
    out: dict[str, dict[str, int]] = {}
    for (shard, reason), n in left.groupby(["shard", "reason"]).size().items():
        out.setdefault(f"{int(shard):05d}.tar", {})[str(reason)] = int(n)
    return out


def _selected(df: pd.DataFrame, fraction: float) -> tuple[pd.Series, pd.Series]:
    """``--where 'pwatermark < 0.5' --keep-top FRACTION --by similarity`` in pandas: per row, why it is left out
    (None: kept), and whether it is kept."""
    where = df.pwatermark < 0.5
    passed = df[where]
    kept = df.index.isin(passed.similarity.dropna().nlargest(math.floor(fraction * len(passed)), keep="first").index)
    reasons = pd.Series(np.where(~where, "where", np.where(kept, None, "keep-top")), index=df.index)
    return reasons, pd.Series(kept, index=df.index)


def test_each_shard_counts_the_rows_left_out_after_its_rows(cli, scored, tmp_path):
    """shard_stats.json gives each shard the rows left out that follow its rows (pandas' count), the totals are
    their sum and equal the summary's; ``fgdata report`` shows each shard's count."""
    manifest, df = scored
    dest = tmp_path / "out"
    doc = json.loads(cli("shard", "images", manifest, dest, "--where", "pwatermark < 0.5", "--keep-top", "0.6",
                         "--by", "similarity", "--maxcount", "2", "--no-progress", "--json").stdout)
    reasons, kept = _selected(df, 0.6)
    stats = json.loads((dest / "shard_stats.json").read_text())
    got = {name: row["filtered_by_reason"] for name, row in stats["shards"].items() if row["filtered_by_reason"]}
    assert got == _per_shard(df, reasons, kept, 2) and len(got) >= 2
    assert all(row["filtered"] == sum(row["filtered_by_reason"].values()) for row in stats["shards"].values())
    total = sum((Counter(row["filtered_by_reason"]) for row in stats["shards"].values()), Counter())
    assert dict(total) == stats["filtered_by_reason"] == doc["filtered_by_reason"] == dict(reasons.value_counts())
    assert (stats["downloads"], stats["successes"], doc["seen"]) == (False, kept.sum(), len(df))
    shown = json.loads(cli("report", dest, "--output", tmp_path / "report.html", "--json").stdout)
    assert {Path(r["path"]).name: r["filtered_by_reason"] for r in shown["shards"] if r["filtered"]} == got
    assert "downloads" not in shown and shown["selection"]["per_shard"]["max"] == max(map(sum, map(dict.values, got.values())))


def test_rows_left_out_appended_to_the_source_rewrite_the_last_unit_only(cli, scored, tmp_path):
    """A rerun after rows that do not pass were appended: the earlier units are kept, the last one is written again
    (the same shard bytes) and now owns the new rows; the counts equal a fresh run's."""
    manifest, df = scored
    dest = tmp_path / "out"
    args = ["--where", "pwatermark < 0.5", "--maxcount", "2", "--no-progress", "--json"]
    cli("shard", "images", manifest, dest, *args)
    more = pd.concat([df, df.iloc[:3].assign(pwatermark=0.9)], ignore_index=True)
    more.to_parquet(manifest)
    again = json.loads(cli("shard", "images", manifest, dest, *args).stdout)
    fresh = json.loads(cli("shard", "images", manifest, tmp_path / "fresh", *args).stdout)
    assert again["resumed"] > 0 and again["filtered_by_reason"] == fresh["filtered_by_reason"] == \
        {"where": int((more.pwatermark >= 0.5).sum())}
    stats, fresh_stats = (json.loads((d / "shard_stats.json").read_text()) for d in (dest, tmp_path / "fresh"))
    assert stats == fresh_stats
    last = max(stats["shards"])
    assert stats["shards"][last]["filtered_by_reason"]["where"] >= 3
