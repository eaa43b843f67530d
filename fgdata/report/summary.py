"""The report as a JSON-ready document: what ``--json`` prints and what the HTML page and terminal table show."""

from __future__ import annotations

import datetime
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from fgdata import __version__
from fgdata.catalog import SCORE_THRESHOLD, score_verdict
from fgdata.report.collect import Stats

_TOP = 20  # most common first words and resolutions listed
_EXAMPLES = 5


def distribution(values: Sequence[float]) -> dict[str, float] | None:
    """count, min, 10th/50th/90th percentile, max and mean of a sequence (None when empty)."""
    if not len(values):
        return None
    ordered = sorted(values)
    n = len(ordered)

    def pct(q: float) -> float:
        pos = q * (n - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return {"count": n, "min": ordered[0], "p10": pct(0.1), "p50": pct(0.5), "p90": pct(0.9), "max": ordered[-1],
            "mean": math.fsum(ordered) / n}


def kept_by_score_filter(stats: Stats, field: str, threshold: float) -> tuple[int, int]:
    """(samples, samples with the field) the loaders' ``score`` filter keeps with ``score_key=field``, by the
    filter's own rule: it keeps those without a json member or without the field, and those whose value passes;
    invalid json and non-numeric (or NaN) values are dropped."""
    invalid = stats.problems["invalid json"].count if "invalid json" in stats.problems else 0
    values = stats.numeric.get(field, ())
    passing = sum(1 for v in values if score_verdict(v, field, threshold) is None)
    return stats.samples - invalid - stats.non_numeric.get(field, 0) - (len(values) - passing), passing


#: The motion fields of a scene split's clips (docs/FORMATS.md), shown beside the clip lengths.
CLIP_MOTION = ("motion_mean", "motion_min_patch")


def _at_threshold(stats: Stats, key: str, threshold: float) -> dict[str, Any]:
    """What the loaders' ``score`` filter keeps at a threshold the user passed, and the samples nearest it on each
    side (their contact sheet is on the page)."""
    total = stats.samples
    kept, with_field = kept_by_score_filter(stats, key, threshold)
    present = len(stats.numeric.get(key, ())) + stats.non_numeric.get(key, 0)
    sides = stats.near.get(key, {})
    return {"presets_filter": {"score": {"score_key": key, "threshold": threshold}}, "present": present,
            "kept": kept, "kept_share": kept / total if total else None, "kept_with_field": with_field,
            "dropped": total - kept,
            **{side: [{"shard": n.shard, "key": n.key, "value": n.value} for n in sides.get(side, [])]
               for side in ("above", "below")}}


def datasets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shards, samples and bytes per dataset (folder), in first-seen order: the report's figures are of them all."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        d = out.setdefault(row.get("dataset", ""), {"path": row.get("dataset", ""), "shards": 0, "samples": 0,
                                                      "bytes": 0, "damaged": 0})
        d["shards"] += 1
        d["samples"] += row["samples"]
        d["bytes"] += row["bytes"]
        d["damaged"] += bool(row["damage"])
    return list(out.values())


def _threshold(values: Sequence[float], chosen: float | None) -> float:
    if chosen is not None:
        return chosen
    t = SCORE_THRESHOLD  # the filter's own default, so the report shows what the loader would do
    lo, hi = min(values), max(values)
    if lo < t <= hi:
        return t
    return float(f"{distribution(values)['p50']:.3g}")  # type: ignore[index]  # the median, to 3 digits


def summarise(stats: Stats, *, name: str, paths: Sequence[str], thresholds: dict[str, float] | None = None,
              sample: int = 0) -> dict[str, Any]:
    """The report document; ``thresholds`` maps numeric json fields to the score threshold to show."""
    thresholds = thresholds or {}
    total = stats.samples
    doc: dict[str, Any] = {
        "dataset": name,
        "paths": list(paths),
        "generated": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "fgdata_version": __version__,
        "total_samples": total,
        "total_bytes": stats.bytes,
        "datasets": datasets(stats.shards),
        "shards": stats.shards,
        "extension_sets": dict(stats.ext_sets.most_common()),
        "extension_set_examples": {k: stats.ext_examples[k] for k in stats.ext_sets},
        "extensions": {ext: {"samples": n, "bytes": stats.ext_bytes[ext]} for ext, n in stats.ext_counts.most_common()},
        "sample_budget": sample,
        "decoded_members": stats.decoded,
    }
    if stats.not_loaded:
        from fgdata.verify.inspect import MEMBER_LIMIT

        doc["not_loaded"] = {"limit_bytes": MEMBER_LIMIT, "members": dict(stats.not_loaded.most_common())}
    if stats.image_members:
        aspect = [w / h for w, h in zip(stats.image_w, stats.image_h) if h]
        doc["images"] = {"members": stats.image_members, "sized": len(stats.image_w),
                         "sizes_from_json": stats.image_sizes_from_json, "width": distribution(stats.image_w),
                         "height": distribution(stats.image_h), "aspect_ratio": distribution(aspect)}
    if stats.video_members:
        described = len(stats.video_duration)
        doc["videos"] = {"members": stats.video_members, "described": described,
                         "facts_from_json": stats.video_facts_from_json,
                         "duration_s": distribution(stats.video_duration), "fps": distribution(stats.video_fps),
                         "frames": distribution(stats.video_frames),
                         "resolutions": dict(stats.video_res.most_common(_TOP)),
                         "with_audio": stats.video_audio,
                         "audio_share": stats.video_audio / described if described else None}
    if stats.captions:
        doc["captions"] = {"samples": stats.captions, "words": distribution(stats.caption_words),
                           "chars": distribution(stats.caption_chars),
                           "first_words": stats.first_words.most_common(_TOP)}
    fields = {}
    invalid = stats.problems["invalid json"].count if "invalid json" in stats.problems else 0
    for key, values in sorted(stats.numeric.items(), key=lambda kv: -len(kv[1])):
        if not values:
            continue
        t = _threshold(values, thresholds.get(key))
        kept, with_field = kept_by_score_filter(stats, key, t)
        present = len(values) + stats.non_numeric[key]
        fields[key] = {**distribution(values), "present": present, "samples": total,  # type: ignore[dict-item]
                       "missing": stats.json_members - len(values) - stats.non_numeric[key],
                       "non_numeric": stats.non_numeric[key],
                       "score_filter": {"presets_filter": {"score": {"score_key": key, "threshold": t}},
                                        "kept": kept, "kept_share": kept / total if total else None,
                                        "kept_with_field": with_field,
                                        "kept_with_field_share": with_field / present if present else None,
                                        "passed_without_field": total - present - invalid}}
    if fields:
        doc["numeric_fields"] = fields
    if thresholds:
        doc["thresholds"] = {key: _at_threshold(stats, key, t) for key, t in thresholds.items()}
    if stats.clip_seconds:  # clips of `shard videos --split scenes` (its filtered counts: build.py adds them)
        doc["clips"] = {"clips": len(stats.clip_seconds), "length_s": distribution(stats.clip_seconds),
                        **{key: distribution(stats.numeric.get(key, ())) for key in CLIP_MOTION}}
    if stats.tensors:
        doc["tensors"] = dict(stats.tensors.most_common())
    doc["contact_sheet"] = [{"shard": t.shard, "key": t.key} for t in stats.tiles]
    doc["problems"] = _problems(stats)
    return doc


def _role(ext: str) -> str:
    """What a member is for: any image or video extension serves as the sample's media."""
    from fgdata.media.decode import member_kind

    return "an image or video" if member_kind(ext) in ("image", "video") else f".{ext}"


def _problems(stats: Stats) -> list[dict[str, Any]]:
    """Damage and key problems as collected, plus missing members: samples without a member (an image, a
    video, or an extension) that most samples have."""
    out = [{"kind": p.kind, "count": p.count, "examples": p.examples} for p in stats.problems.values()]
    total = stats.samples
    roles: dict[str, int] = {}
    sets_with: dict[str, set[str]] = {}
    for ext_set, n in stats.ext_sets.items():
        for role in {_role(e) for e in ext_set.split(",") if e}:
            roles[role] = roles.get(role, 0) + n
            sets_with.setdefault(role, set()).add(ext_set)
    from fgdata.media.decode import mixed_image_formats

    per_dataset: dict[str, Counter[str]] = {}  # the one-format rule is per dataset (docs/FORMATS.md)
    for row in stats.shards:
        per_dataset.setdefault(row.get("dataset", ""), Counter()).update(row.get("image_exts", {}))
    several = len(per_dataset) > 1
    for folder, exts in per_dataset.items():
        mixed = mixed_image_formats(exts)
        if mixed:
            out.append({"kind": "mixed image formats", "count": mixed[1],
                        "examples": [f"{folder}: {mixed[0]}" if several else mixed[0]]})
    for role, n in sorted(roles.items(), key=lambda kv: -kv[1]):
        if total and total / 2 < n < total:
            lacking = [s for s in stats.ext_sets if s not in sets_with[role]]
            out.append({"kind": f"missing {role}", "count": total - n,
                        "examples": [f"{stats.ext_examples[s]} has no {role}" for s in lacking[:_EXAMPLES]]})
    return sorted(out, key=lambda p: -p["count"])
