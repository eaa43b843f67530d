"""`fgdata report --threshold` and the clips of a scene split, on shards fgdata's own commands wrote: the kept
count and the samples just above and just below each threshold, and the clip length and motion histograms with
the filtered counts per reason, each checked against numpy on the values read back from the shards."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fgdata.shards import discover_shards, iter_samples
from fgdata.shards.scores import read_scores
from inprocess import fgdata
from test_report import check_page

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scenes_synth import build, encode  # noqa: E402


def fg(*args: str | Path) -> subprocess.CompletedProcess:
    """``fgdata ARGS`` in this process, the summary's lines unwrapped."""
    return fgdata(*args, env={"COLUMNS": "400"})


def _values(dest: Path, field: str) -> dict[str, float]:
    """key -> ``field`` of every sample, from its json member or its shard's score file (as the loaders join)."""
    out: dict[str, float] = {}
    for shard in discover_shards(str(dest)):
        scores = read_scores(shard)
        for s in iter_samples(shard):
            doc = {**json.loads(s.members["json"]), **(scores.rows.get(s.key, {}) if scores else {})}
            if field in doc:
                out[s.key] = float(doc[field])
    return out


def _nearest(values: dict[str, float], t: float, n: int = 6) -> tuple[list[str], list[str]]:
    keys = np.array(list(values))
    v = np.array(list(values.values()))
    above, below = v >= t, v < t
    up = keys[above][np.argsort(v[above] - t, kind="stable")][:n]
    down = keys[below][np.argsort(t - v[below], kind="stable")][:n]
    return list(up), list(down)


@pytest.fixture(scope="module")
def scored(tmp_path_factory, sample_images) -> Path:
    """21 photos (the sample photos three times over) in 6 shards by `fgdata shard images`, each with a
    clip_score in its json, then `fgdata score --with sharpness,size` beside the shards."""
    src = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(7)
    for copy in "abc":
        for p in sample_images:
            stem = f"{copy}_{p.stem}"
            shutil.copyfile(p, src / f"{stem}{p.suffix}")
            (src / f"{stem}.txt").write_text(f"copy {copy} of {p.stem}")
            (src / f"{stem}.json").write_text(json.dumps({"clip_score": round(float(rng.uniform(0.2, 0.36)), 5)}))
    dest = tmp_path_factory.mktemp("wds")
    for args in (("shard", "images", src, dest, "--maxcount", "4", "--no-progress"),
                 ("score", dest, "--with", "sharpness,size")):
        done = fg(*args)
        assert done.returncode == 0, done.stderr
    return dest


def test_kept_count_and_the_samples_either_side_of_each_threshold(scored, tmp_path):
    clip, sharp = _values(scored, "clip_score"), _values(scored, "sharpness")
    assert len(clip) == len(sharp) == 21
    t_sharp = float(np.median(list(sharp.values())))
    res = fg("report", scored, "-o", tmp_path / "r.html", "--json", "-w", "1", "--threshold", "clip_score=0.28",
             "--threshold", f"sharpness={t_sharp}", "--threshold", "nope=1")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    for field, t, values in (("clip_score", 0.28, clip), ("sharpness", t_sharp, sharp)):
        th = doc["thresholds"][field]
        kept = int(np.sum(np.array(list(values.values())) >= t))
        assert (th["kept"], th["dropped"], th["present"]) == (kept, 21 - kept, 21)
        assert th["presets_filter"] == {"score": {"score_key": field, "threshold": t}}
        up, down = _nearest(values, t)
        assert [n["key"] for n in th["above"]] == up and [n["key"] for n in th["below"]] == down
        assert all(values[n["key"]] == n["value"] for n in th["above"] + th["below"])
    assert len(doc["thresholds"]["clip_score"]["above"]) == 6 == len(doc["thresholds"]["clip_score"]["below"])
    nope = doc["thresholds"]["nope"]
    assert (nope["present"], nope["kept"], nope["above"], nope["below"]) == (0, 21, [], [])

    page = check_page(tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    section = html[html.index('<section id="thresholds">'):]
    section = section[: section.index("</section>")]
    shown = [n for f in ("clip_score", "sharpness") for side in ("above", "below") for n in doc["thresholds"][f][side]]
    assert section.count('class="tile"') == len(shown)  # every sample near a threshold, drawn once per threshold
    for n in doc["thresholds"]["clip_score"]["above"] + doc["thresholds"]["clip_score"]["below"]:
        assert f"<b>{n['key']}</b> clip_score {n['value']:.4g} · copy " in section
    assert "No sample has <code>nope</code>" in section and len(page.images) > len(shown)

    text = fg("report", scored, "-o", tmp_path / "t.html", "-w", "1", "--threshold", "clip_score=0.28",
              "--threshold", "nope=1").stdout
    kept = doc["thresholds"]["clip_score"]["kept"]
    assert f"clip_score ≥ 0.28 keeps {kept} of 21 ({kept / 21:.1%}), drops {21 - kept}; nearest above" in text
    assert "nope ≥ 1 keeps 21 of 21 (100.0%), drops 0; no sample has nope" in text


@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_thresholds_on_s3_pick_and_draw_the_same_samples(scored, s3_bucket, tmp_path):
    """On s3:// the shards are streamed (twice for the shards holding samples near a threshold) and the score files
    read beside them: the same counts, picks and tiles as on the local copy."""
    from fgdata import storage

    for p in sorted(x for x in scored.iterdir() if x.is_file()):
        storage.upload(str(p), f"{s3_bucket}/photos/{p.name}")
    docs, sections = [], []
    for where, page in ((scored, tmp_path / "local.html"), (f"{s3_bucket}/photos", tmp_path / "s3.html")):
        res = fg("report", where, "-o", page, "--json", "-w", "1", "--threshold", "clip_score=0.3",
                 "--threshold", "sharpness=1000")
        assert res.returncode == 0, res.stderr
        docs.append(json.loads(res.stdout)["thresholds"])
        html = page.read_text()
        sections.append(html[html.index('<section id="thresholds">'):].split("</section>")[0])
    assert docs[0] == docs[1] and sections[0] == sections[1]
    assert sections[0].count('class="tile"') == sum(len(t[side]) for t in docs[0].values() for side in ("above", "below"))


def test_a_threshold_on_a_media_field_counts_it(scored, tmp_path):
    """width (from `score --with size`) is one of the media's own fields, not listed among the numeric fields, yet
    a threshold on it counts what the filter keeps."""
    from fgdata.report.build import build_report
    from fgdata.shards import require_shards

    widths = list(_values(scored, "width").values())
    assert len(widths) == 21
    t = float(np.median(widths))
    doc = build_report(require_shards(str(scored)), name="t", paths=[str(scored)], thresholds={"width": t}).doc
    assert doc["thresholds"]["width"]["kept"] == int(np.sum(np.array(widths) >= t))
    assert doc["thresholds"]["width"]["present"] == len(widths)


# -- the clips of `shard videos --split scenes` --------------------------------

#: shots of the sample photos: a pan, a still shot (below --min-motion), a 20-frame shot (below
#: --min-clip-seconds), two more pans
PLAN = [("shot", 0, 40, 1.0), ("cut",), ("shot", 1, 40, 0.0), ("cut",), ("shot", 2, 50, 2.0), ("cut",),
        ("shot", 3, 20, 1.0), ("cut",), ("shot", 4, 40, 4.0)]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("raw")
    (src / "edit.mp4").write_bytes(encode(build((256, 144), PLAN).frames, gop=10))
    (src / "edit.txt").write_text("an edited film")
    dest = tmp_path_factory.mktemp("clips")
    done = fg("shard", "videos", src, dest, "--split", "scenes", "--min-clip-seconds", "1", "--min-motion", "1e-4",
              "--no-progress")
    assert done.returncode == 0, done.stderr
    return dest


def test_scene_split_clip_lengths_motion_and_filtered_reasons(clips, tmp_path):
    docs = [json.loads(s.members["json"]) for p in discover_shards(str(clips)) for s in iter_samples(p)]
    length = np.array([d["clip_end_s"] - d["clip_start_s"] for d in docs])
    motion = np.array([d["motion_mean"] for d in docs])
    warnings = json.loads((clips / "failures.json").read_text())["warnings"]
    reasons = [w["reason"].split(": ")[2] for w in warnings]  # "filtered: INPUT: REASON: details"
    assert sorted(reasons) == ["motion-below-min", "too-short"] and len(docs) == 3
    t = float(np.median(motion))
    res = fg("report", clips, "-o", tmp_path / "r.html", "--json", "-w", "1", "--threshold", f"motion_mean={t}")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    c = doc["clips"]
    assert c["clips"] == len(docs)
    for name, values in (("length_s", length), ("motion_mean", motion)):
        assert c[name]["min"] == pytest.approx(values.min()) and c[name]["max"] == pytest.approx(values.max())
        assert c[name]["p50"] == pytest.approx(np.median(values)) and c[name]["mean"] == pytest.approx(values.mean())
    assert c["filtered"] == {r: reasons.count(r) for r in reasons}
    th = doc["thresholds"]["motion_mean"]
    assert th["kept"] == int(np.sum(motion >= t)) and len(th["above"]) + len(th["below"]) == len(docs)

    check_page(tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    section = html[html.index('<section id="clips">'):]
    section = section[: section.index("</section>")]
    assert 'alt="clip length and motion histograms"' in section
    assert "<td>too-short</td>" in section and "<td>motion-below-min</td>" in section
    near = html[html.index('<section id="thresholds">'):]
    assert near[: near.index("</section>")].count('class="tile"') == len(docs)  # first frames of the clips

    text = fg("report", clips, "-o", tmp_path / "t.html", "-w", "1").stdout
    line = next(line for line in text.splitlines() if line.split()[:2] == ["clips", f"{len(docs)};"])
    assert "; length " in line and "filtered: motion-below-min 1, too-short 1" in line
