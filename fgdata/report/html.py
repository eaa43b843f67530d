"""The report page: one HTML file with its styles inline and every picture a PNG data URI, so it opens
offline, can be mailed or attached to an issue, and shows the same thing everywhere."""

from __future__ import annotations

import base64
import html
import json
from typing import Any, Callable

from fgdata.report import plots
from fgdata.media.preview import Tile
from fgdata.report.collect import Stats
from fgdata.formatting import human_bytes, number, terminal_safe

_CSS = """
:root { --bg:#f5f6f8; --card:#fff; --ink:#1f242b; --muted:#5d6570; --line:#e3e6eb; --accent:#3b6fd4;
        --good:#2e9e6a; --bad:#c8463d; --warn:#e8833a; }
* { box-sizing:border-box; }
body { margin:0; background:var(--bg); color:var(--ink); font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,
       "Helvetica Neue",Arial,sans-serif; }
main { max-width:1080px; margin:0 auto; padding:28px 24px 64px; }
header .eyebrow { text-transform:uppercase; letter-spacing:.08em; font-size:12px; color:var(--accent);
                  font-weight:600; }
h1 { font-size:30px; margin:2px 0 6px; }
h2 { font-size:20px; margin:0 0 4px; }
h3 { font-size:16px; margin:18px 0 4px; }
.meta { color:var(--muted); font-size:13px; margin:0; overflow-wrap:anywhere; }
.meta code { font-size:12px; }
nav { margin:18px 0 8px; display:flex; flex-wrap:wrap; gap:6px; }
nav a { font-size:13px; color:var(--accent); text-decoration:none; padding:3px 10px; border-radius:999px;
        background:#e9effb; }
nav a:hover { background:#d8e3f8; }
.cards { display:grid; grid-template-columns:repeat(auto-fit,minmax(150px,1fr)); gap:12px; margin:20px 0; }
.card { background:var(--card); border-radius:12px; padding:14px 16px; box-shadow:0 1px 2px rgba(20,30,50,.06),
        0 0 0 1px var(--line); }
.card .v { font-size:24px; font-weight:650; font-variant-numeric:tabular-nums; }
.card .l { font-size:12px; color:var(--muted); text-transform:uppercase; letter-spacing:.05em; }
.card.good .v { color:var(--good); } .card.bad .v { color:var(--bad); }
section { background:var(--card); border-radius:14px; padding:20px 22px; margin:16px 0;
          box-shadow:0 1px 2px rgba(20,30,50,.06), 0 0 0 1px var(--line); }
section > p.lead { color:var(--muted); margin:0 0 12px; }
img.plot { width:100%; height:auto; display:block; margin:8px 0; }
table { border-collapse:collapse; width:100%; font-size:13.5px; margin:8px 0; font-variant-numeric:tabular-nums; }
th, td { text-align:left; padding:6px 10px; border-bottom:1px solid var(--line); vertical-align:top; }
th { font-weight:600; color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
td.n, th.n { text-align:right; }
tr.damaged td { color:var(--bad); }
code, pre { font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; }
pre { background:#f3f5f8; border:1px solid var(--line); border-radius:8px; padding:10px 12px; overflow-x:auto;
      font-size:12.5px; }
.chips { display:flex; flex-wrap:wrap; gap:8px; margin:6px 0 4px; }
.chip { background:#f0f3f7; border-radius:8px; padding:5px 10px; font-size:13px; }
.chip b { font-variant-numeric:tabular-nums; }
details summary { cursor:pointer; color:var(--accent); font-size:14px; margin-top:6px; }
.sheet { display:grid; grid-template-columns:repeat(auto-fill,minmax(150px,1fr)); gap:14px; margin-top:10px; }
.sheet figure { margin:0; }
.sheet .thumb { aspect-ratio:1; background:#eef0f3; border-radius:8px; display:flex; align-items:center;
                justify-content:center; overflow:hidden; }
.sheet img { max-width:100%; max-height:100%; display:block; }
.sheet figcaption { font-size:12px; color:var(--muted); margin-top:5px; line-height:1.35; overflow:hidden;
                    display:-webkit-box; -webkit-line-clamp:3; -webkit-box-orient:vertical; }
.sheet figcaption b { color:var(--ink); font-weight:600; font-family:ui-monospace,Menlo,monospace; font-size:11px; }
.problems li { margin:6px 0; } .problems .count { font-weight:650; color:var(--bad); }
.problems ul.ex { margin:4px 0 0; padding-left:18px; color:var(--muted); font-size:13px; }
.ok { color:var(--good); font-weight:600; }
footer { color:var(--muted); font-size:12.5px; text-align:center; margin-top:28px; }
"""


def _e(text: Any) -> str:
    """Text for the page, escaped for HTML after the data's control characters and bidi overrides are written out
    as the terminal shows them (raw, they would reach whoever copies the text, or reorder the line)."""
    return html.escape(terminal_safe(str(text)), quote=True)


def _img(png: bytes, alt: str, cls: str = "plot") -> str:
    return f'<img class="{cls}" alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _chips(items: list[tuple[str, str]]) -> str:
    return '<div class="chips">' + "".join(f'<span class="chip">{_e(k)} <b>{_e(v)}</b></span>' for k, v in items) + "</div>"


def _dist(d: dict[str, float] | None, unit: str = "") -> str:
    if not d:
        return "–"
    return f"{number(float(d['min']))}–{number(float(d['max']))}{unit}, median {number(float(d['p50']))}{unit}"


def _share(n: int, total: int) -> str:
    return f"{n / total:.1%}" if total else "–"


def _table(headers: list[str], rows: list[list[str]], numeric: set[int], row_class: list[str] | None = None) -> str:
    head = "".join(f'<th class="n">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>" for i, h in enumerate(headers))
    body = []
    for r, row in enumerate(rows):
        cls = f' class="{row_class[r]}"' if row_class and row_class[r] else ""
        body.append(f"<tr{cls}>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                          for i, c in enumerate(row)) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


Section = tuple[str, str, str]  # (id, title, body): one card of the page, and its link in the navigation


def render(doc: dict[str, Any], stats: Stats) -> str:
    """The page for a report document (see ``summarise``) and the statistics it came from: each section the
    document has, in the order of ``_SECTIONS``, then the page around them."""
    sections = [section for make in _SECTIONS if (section := make(doc, stats)) is not None]
    return _page(doc, sections)


def _shards(doc: dict[str, Any], stats: Stats) -> Section:
    """Every shard's samples, bytes and status; with several datasets, each one's share first."""
    shards = doc["shards"]
    damaged = [s for s in shards if s["damage"]]
    rows = [[_e(s["shard"]), f"{s['samples']:,}", _e(human_bytes(s["bytes"])), _e(s["damage"] or "ok")]
            for s in shards]
    body = (f'<p class="lead">{len(shards):,} shards, {doc["total_samples"]:,} samples, '
            f'{_e(human_bytes(doc["total_bytes"]))}'
            f"{f'; {len(damaged)} damaged (in orange)' if damaged else ''}.</p>"
            + _img(plots.per_shard(shards), "samples and bytes per shard")
            + f"<details><summary>all {len(shards):,} shards</summary>"
            + _table(["shard", "samples", "bytes", "status"], rows, {1, 2},
                     ["damaged" if s["damage"] else "" for s in shards]) + "</details>")
    if len(doc["datasets"]) > 1:  # the figures are of them all; here is each one's share
        body = ("<p>Datasets (each folder checked on its own: keys, count file):</p>"
                + _table(["dataset", "shards", "samples", "bytes", "damaged shards"],
                         [[_e(d["path"]), f"{d['shards']:,}", f"{d['samples']:,}", _e(human_bytes(d["bytes"])),
                           f"{d['damaged']:,}"] for d in doc["datasets"]], {1, 2, 3, 4}) + body)
    return ("shards", "Shards", body)


def _members(doc: dict[str, Any], stats: Stats) -> Section:
    """Which member extensions the samples carry, their sets, and the members too large to load."""
    total = doc["total_samples"]
    exts = doc["extensions"]
    rows = [[f"<code>.{_e(ext)}</code>", f"{e['samples']:,}", _share(e["samples"], total),
             _e(human_bytes(e["bytes"])), _e(human_bytes(e["bytes"] / e["samples"])) if e["samples"] else "–"]
            for ext, e in exts.items()]
    sets = doc["extension_sets"]
    body = ('<p class="lead">Which members the samples carry. A sample\'s extension set lists what follows the '
            "first dot of its member names" + (f": every sample has <code>{_e(next(iter(sets)))}</code>." if len(sets) == 1
                                               else f"; {len(sets):,} different sets.") + "</p>")
    if len(sets) > 1:
        body += _img(plots.extension_sets(sets), "samples per extension set")
    body += _table(["member", "samples", "share", "bytes", "per sample"], rows, {1, 2, 3, 4})
    if "not_loaded" in doc:
        over = ", ".join(f"{n:,} <code>.{_e(ext)}</code>" for ext, n in doc["not_loaded"]["members"].items())
        body += (f'<p class="lead">Not loaded (over the {doc["not_loaded"]["limit_bytes"] >> 20} MiB per-member '
                 f"limit, as <code>fgdata inspect</code>): {over}.</p>")
    return ("members", "Members", body)


def _images(doc: dict[str, Any], stats: Stats) -> Section | None:
    if "images" not in doc or not stats.image_w:
        return None
    im = doc["images"]
    source = (f"{im['sizes_from_json']:,} from fgdata's json metadata, {im['sized'] - im['sizes_from_json']:,} "
              "from image headers")
    body = (f'<p class="lead">{im["members"]:,} image members; sizes of {im["sized"]:,} ({source}).</p>'
            + _chips([("width", _dist(im["width"], " px")), ("height", _dist(im["height"], " px")),
                      ("aspect ratio", _dist(im["aspect_ratio"]))])
            + _img(plots.images(stats.image_w, stats.image_h), "image sizes and aspect ratios"))
    return ("images", "Images", body)


def _videos(doc: dict[str, Any], stats: Stats) -> Section | None:
    if "videos" not in doc or not stats.video_duration:
        return None
    v = doc["videos"]
    audio = f"{v['audio_share']:.0%}" if v["audio_share"] is not None else "–"
    body = (f'<p class="lead">{v["members"]:,} video members; {v["described"]:,} described '
            f"({v['facts_from_json']:,} from fgdata's json metadata, the rest probed).</p>"
            + _chips([("duration", _dist(v["duration_s"], " s")), ("frame rate", _dist(v["fps"], " fps")),
                      ("frames", _dist(v["frames"])), ("with audio", audio)])
            + _img(plots.videos(stats.video_duration, stats.video_fps, stats.video_frames, v["resolutions"]),
                   "video duration, frame rate, frame count and resolution"))
    return ("videos", "Videos", body)


def _captions(doc: dict[str, Any], stats: Stats) -> Section | None:
    if "captions" not in doc or not stats.caption_words:
        return None
    c = doc["captions"]
    body = (f'<p class="lead">{c["samples"]:,} captions ({_share(c["samples"], doc["total_samples"])} of samples).</p>'
            + _chips([("words", _dist(c["words"])), ("characters", _dist(c["chars"]))])
            + _img(plots.captions(stats.caption_words, [tuple(x) for x in c["first_words"]]),
                   "caption lengths and first words"))
    return ("captions", "Captions", body)


def _numeric_fields(doc: dict[str, Any], stats: Stats) -> Section | None:
    """Each numeric json field: its range, and what the loaders' ``score`` filter would keep at its threshold."""
    if "numeric_fields" not in doc:
        return None
    total = doc["total_samples"]
    body = ('<p class="lead">Numeric fields of the json member. The loaders\' <code>score</code> filter keeps a '
            "sample whose field is at least the threshold, and samples without the field; the green part is "
            "what it would keep. Choose the threshold with <code>--threshold FIELD=VALUE</code>.</p>")
    for name, f in doc["numeric_fields"].items():
        sf = f["score_filter"]
        t = sf["presets_filter"]["score"]["threshold"]
        share = f"{sf['kept_share']:.1%}" if sf["kept_share"] is not None else "–"
        body += (f"<h3><code>{_e(name)}</code></h3>"
                 + _chips([("in samples", f"{f['present']:,} of {f['samples']:,}"),
                           ("range", f"{number(f['min'])}–{number(f['max'])}"),
                           ("median", number(f["p50"])), ("mean", number(f["mean"])),
                           (f"kept at ≥ {t:g}", f"{sf['kept_with_field']:,} of {f['present']:,} with it"),
                           ("kept in all", f"{sf['kept']:,} of {total:,} ({share}), "
                                           f"{sf['passed_without_field']:,} without it")])
                 + _img(plots.numeric_field(name, stats.numeric[name], t, sf["kept_with_field_share"]),
                        f"{name} histogram")
                 + f"<pre>presets_filter={_e(json.dumps(sf['presets_filter']))}</pre>")
    return ("fields", "Numeric fields", body)


def _tensors(doc: dict[str, Any], stats: Stats) -> Section | None:
    if "tensors" not in doc:
        return None
    rows = [[f"<code>{_e(k)}</code>", f"{n:,}"] for k, n in doc["tensors"].items()]
    body = ('<p class="lead">Tensor members of the sampled samples (decoded safely: weights-only '
            "<code>.pth</code>, no pickle in <code>.npy</code>/<code>.npz</code>).</p>"
            + _table(["member dtype[shape]", "samples"], rows, {1}))
    return ("tensors", "Tensors", body)


def _downloads(doc: dict[str, Any], stats: Stats) -> Section | None:
    """A URL-list job's successes and failures by reason."""
    if "downloads" not in doc:
        return None
    d = doc["downloads"]
    rows = [[_e(reason), f"{n:,}", _share(n, d["failed"])] for reason, n in d["failed_by_reason"].items()]
    body = (f'<p class="lead">Downloaded from a URL list (<code>{_e(d["file"])}</code>): '
            f"{d['successes']:,} of {d['successes'] + d['failed']:,} URLs written, {d['failed']:,} failed, "
            f"{d['retryable']:,} of them retryable (timeouts, dropped connections, 429, 5xx).</p>"
            + (_table(["failure reason", "URLs", "share"], rows, {1, 2}) if rows else ""))
    return ("downloads", "Downloads", body)


def _selection(doc: dict[str, Any], stats: Stats) -> Section | None:
    """The rows a manifest job selected (``--where``, ``--keep-top``) and what it filtered, by reason."""
    if "selection" not in doc:
        return None
    d = doc["selection"]
    rows = [[_e(reason), f"{n:,}", _share(n, d["seen"])] for reason, n in d["filtered_by_reason"].items()]
    where = f' <code>--where {_e(d["where"])}</code>' if "where" in d else ""
    top = (f' <code>--keep-top {d["keep_top"]} --by {_e(d["by"])}</code> kept {d["kept"]:,} of {d["rows"]:,} '
           f"(threshold {d['threshold']})" if "by" in d else "")
    spread = d.get("per_shard")
    shards = (f" Per shard: {spread['min']:,} to {spread['max']:,} (most in <code>{_e(spread['most'])}</code>; "
              "each shard's count in the JSON and <code>shard_stats.json</code>)." if spread and spread["max"] else "")
    body = (f'<p class="lead">Rows selected from the source ({_e(d["file"])}):{where}{top}; '
            f"{d['filtered']:,} of {d['seen']:,} inputs filtered.{shards}</p>"
            + (_table(["filtered by", "inputs", "share"], rows, {1, 2}) if rows else ""))
    return ("selection", "Selection", body)


def _filtered(doc: dict[str, Any], stats: Stats) -> Section | None:
    """What the job's filters dropped, by reason; a scene split's clips show it in their own section."""
    if "filtered" not in doc or "clips" in doc:
        return None
    rows = [[_e(reason), f"{n:,}"] for reason, n in doc["filtered"].items()]
    body = ('<p class="lead">Outputs the job\'s filters dropped (warnings of its failures.json).</p>'
            + _table(["filter reason", "outputs"], rows, {1}))
    return ("filtered", "Filtered", body)


def _samples(doc: dict[str, Any], stats: Stats) -> Section | None:
    """The contact sheet: a thumbnail and caption of samples spread over the dataset."""
    if not stats.tiles:
        return None
    body = (f'<p class="lead">{len(stats.tiles)} samples spread evenly over the dataset (images, and the first '
            "frame of videos).</p>" + _sheet(stats.tiles))
    return ("samples", "Samples", body)


def _sheet(tiles: list[Tile]) -> str:
    """The contact sheet of the page: each tile's picture with its key and the start of its caption."""
    figures = []
    for t in tiles:
        figures.append(f'<figure title="{_e(t.shard)} {_e(t.key)}: {_e(t.caption)}"><div class="thumb">'
                       + _img(t.png, f"{t.key}", cls="tile") + f"</div><figcaption><b>{_e(t.key)}</b> "
                       f"{_e(t.caption[:140])}</figcaption></figure>")
    return f'<div class="sheet">{"".join(figures)}</div>'


def _thresholds(doc: dict[str, Any], stats: Stats) -> Section | None:
    """Each threshold the user passed: what the ``score`` filter keeps, and the samples just above and just below
    it, to judge by eye whether the line falls where it should."""
    if "thresholds" not in doc:
        return None
    total = doc["total_samples"]
    body = ('<p class="lead">The thresholds passed with <code>--threshold FIELD=VALUE</code>: how many samples the '
            "loaders' <code>score</code> filter keeps (a value at or above the threshold, or no such field), and "
            "the samples nearest the threshold on each side.</p>")
    for name, th in doc["thresholds"].items():
        t = th["presets_filter"]["score"]["threshold"]
        share = f" ({th['kept_share']:.1%})" if th["kept_share"] is not None else ""
        body += (f"<h3><code>{_e(name)}</code> ≥ {_e(number(t))}</h3>"
                 + _chips([("kept", f"{th['kept']:,} of {total:,}{share}"), ("dropped", f"{th['dropped']:,}"),
                           ("with the field", f"{th['present']:,}"),
                           ("kept with it", f"{th['kept_with_field']:,}")]))
        if not th["present"]:
            body += f"<p>No sample has <code>{_e(name)}</code>: the filter keeps them all.</p>"
        tiles = stats.near_tiles.get(name, {})
        for side, words in (("above", "just above (kept)"), ("below", "just below (dropped)")):
            values = [number(n["value"]) for n in th[side]]
            if values:
                body += (f"<p>{len(values)} {words}, nearest first: {_e(', '.join(values))}</p>"
                         + (_sheet(tiles[side]) if tiles.get(side) else ""))
        body += f"<pre>presets_filter={_e(json.dumps(th['presets_filter']))}</pre>"
    return ("thresholds", "Thresholds", body)


def _clips(doc: dict[str, Any], stats: Stats) -> Section | None:
    """The clips of a scene split: their lengths and motion, and what its filters dropped, by reason."""
    if "clips" not in doc:
        return None
    c = doc["clips"]
    motion = stats.numeric.get("motion_mean", ())
    rows = [[_e(reason), f"{n:,}"] for reason, n in c.get("filtered", {}).items()]
    kept = f"{c['clips']:,} clips written"
    dropped = sum(c.get("filtered", {}).values())
    body = ('<p class="lead">Clips with <code>clip_start_s</code> and <code>clip_end_s</code> (as '
            f"<code>shard videos --split scenes</code> writes them): {kept}"
            + (f", {dropped:,} dropped by its filters" if dropped else "; its filters dropped none") + ".</p>"
            + _chips([("length", _dist(c["length_s"], " s")), ("motion_mean", _dist(c["motion_mean"])),
                      ("motion_min_patch", _dist(c["motion_min_patch"]))])
            + _img(plots.clips(stats.clip_seconds, motion), "clip length and motion histograms")
            + (_table(["filter reason", "clips dropped"], rows, {1}) if rows else ""))
    return ("clips", "Clips", body)


def _problems(doc: dict[str, Any], stats: Stats) -> Section:
    """Each kind of problem with its count and examples, or what "no problems" covers."""
    problems, sets = doc["problems"], doc["extension_sets"]
    if problems:
        items = []
        for p in problems:
            ex = "".join(f"<li>{_e(e)}</li>" for e in p["examples"])
            if p["examples"] and p["count"] > len(p["examples"]):
                ex += f"<li>and {p['count'] - len(p['examples']):,} more</li>"
            items.append(f'<li><span class="count">{p["count"]:,}</span> × {_e(p["kind"])}'
                         + (f'<ul class="ex">{ex}</ul>' if ex else "") + "</li>")
        body = f'<ul class="problems">{"".join(items)}</ul>'
    elif len(sets) == 1:
        body = '<p class="ok">No problems found: every shard read to its end, and every sample has the same members.</p>'
    else:
        body = (f'<p class="ok">No problems found: every shard read to its end. The samples carry {len(sets):,} '
                'different extension sets (see Members); none lacks a member most samples have.</p>')
    return ("problems", "Problems", body)


_SECTIONS: tuple[Callable[[dict[str, Any], Stats], Section | None], ...] = (
    _shards, _members, _images, _videos, _clips, _captions, _numeric_fields, _thresholds, _tensors, _downloads,
    _selection, _filtered, _samples, _problems)


def _cards(doc: dict[str, Any]) -> str:
    """The headline figures above the navigation."""
    total, n_problems = doc["total_samples"], sum(p["count"] for p in doc["problems"])
    cards = [(f"{total:,}", "samples", ""), (f"{len(doc['shards']):,}", "shards", ""),
             (human_bytes(doc["total_bytes"]), "on disk", ""),
             (human_bytes(doc["total_bytes"] / total) if total else "–", "per sample", ""),
             (f"{len(doc['extension_sets']):,}", "extension sets", ""),
             (f"{n_problems:,}", "problems", "bad" if n_problems else "good")]
    return "".join(f'<div class="card {c}"><div class="v">{_e(v)}</div><div class="l">{_e(label)}</div></div>'
                   for v, label, c in cards)


def _page(doc: dict[str, Any], sections: list[Section]) -> str:
    """The whole document: head with the styles, header, cards, navigation, the sections, footer."""
    nav = "".join(f'<a href="#{sid}">{_e(title)}</a>' for sid, title, _ in sections)
    paths = ", ".join(f"<code>{_e(p)}</code>" for p in doc["paths"][:3]) + (
        f" and {len(doc['paths']) - 3} more" if len(doc["paths"]) > 3 else "")
    sampled = (f"{doc['decoded_members']:,} members decoded (budget {doc['sample_budget']:,}); headers, json and "
               "captions read for every sample")
    body = "".join(f'<section id="{sid}"><h2>{_e(title)}</h2>{content}</section>' for sid, title, content in sections)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="generator" content="fgdata {_e(doc['fgdata_version'])}">
<title>{_e(doc['dataset'])} · fgdata report</title><style>{_CSS}</style></head>
<body><main>
<header><div class="eyebrow">fgdata dataset report</div><h1>{_e(doc['dataset'])}</h1>
<p class="meta">{paths}</p>
<p class="meta">generated {_e(doc['generated'])} by fgdata {_e(doc['fgdata_version'])} · {_e(sampled)}</p></header>
<div class="cards">{_cards(doc)}</div>
<nav>{nav}</nav>
{body}
<footer>fgdata report · {_e(doc['dataset'])} · {_e(doc['generated'])}</footer>
</main></body></html>
"""
