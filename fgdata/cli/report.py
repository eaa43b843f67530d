"""``fgdata report``: a dataset at a glance, as one self-contained HTML page, a terminal summary and JSON."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import typer

from fgdata.cli.flaggroups import flag, flag_groups
from fgdata.cli.options import OVERWRITE, OutputFlags, say_removed, say_repeated
from fgdata.cli.render import console, err_console, print_json, progress


def _thresholds(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise typer.BadParameter(f"{item!r} is not FIELD=NUMBER, e.g. aesthetic_score=5.5") from None
        if not sep or not name.strip():
            raise typer.BadParameter(f"{item!r} is not FIELD=NUMBER, e.g. aesthetic_score=5.5")
    return out


def _dataset_name(paths: list[str]) -> str:
    from fgdata import storage

    first = paths[0].rstrip("/")
    base = storage.basename(first)
    if first.endswith(".tar") or len(paths) > 1:
        base = storage.basename(storage.parent(first).rstrip("/")) or base
    return base or first


def numeric_field_line(f: dict[str, Any]) -> str:
    """One numeric json field in the terminal summary: in how many samples it is, its spread, and what the score
    filter keeps among those samples and in all (samples without the field pass the filter)."""
    from fgdata.formatting import number

    sf = f["score_filter"]
    t = sf["presets_filter"]["score"]["threshold"]
    present, total = f["present"], f["samples"]
    spread = f"{number(f['p50'])} median ({number(f['min'])}–{number(f['max'])})"
    if present == total:
        return f"in all {total:,} samples; {spread}; ≥ {t:g} keeps {sf['kept']:,} ({sf['kept_share']:.1%})"
    share = f" ({sf['kept_share']:.1%})" if sf["kept_share"] is not None else ""
    return (f"in {present:,} of {total:,} samples; {spread}; ≥ {t:g} keeps {sf['kept_with_field']:,} of those "
            f"{present:,}, and the {sf['passed_without_field']:,} without it pass: {sf['kept']:,} of {total:,} "
            f"kept{share}")


def dist(d: Optional[dict], unit: str = "") -> str:
    """A distribution (see ``fgdata.report.summary.distribution``) in a few words: median (min–max)."""
    from fgdata.formatting import number

    return f"{number(float(d['p50']))}{unit} median ({number(float(d['min']))}–{number(float(d['max']))})" if d else "–"


def threshold_line(name: str, th: dict[str, Any], total: int) -> str:
    """A threshold the user passed: what the score filter keeps, and the values nearest it on each side."""
    from fgdata.formatting import number

    t = th["presets_filter"]["score"]["threshold"]
    share = f" ({th['kept_share']:.1%})" if th["kept_share"] is not None else ""
    line = f"{name} ≥ {number(t)} keeps {th['kept']:,} of {total:,}{share}, drops {th['dropped']:,}"
    if not th["present"]:
        return line + f"; no sample has {name}"
    near = [f"{side} {', '.join(number(n['value']) for n in th[side][:3])}" for side in ("above", "below") if th[side]]
    return line + (f"; nearest {'; '.join(near)} (contact sheet in the page)" if near else "")


def clips_line(c: dict[str, Any]) -> str:
    """A scene split's clips: how many, their length and motion, and what its filters dropped, by reason."""
    dropped = ", ".join(f"{reason} {n:,}" for reason, n in c.get("filtered", {}).items()) or "none"
    return (f"{c['clips']:,}; length {dist(c['length_s'], ' s')}; motion_mean {dist(c['motion_mean'])}; "
            f"filtered: {dropped}")


def download_line(d: dict[str, Any]) -> str:
    """A URL job's successes and failures by reason (its shard_stats.json), in one line."""
    seen = d["successes"] + d["failed"]
    reasons = ", ".join(f"{reason} {n:,}" for reason, n in d["failed_by_reason"].items())
    retry = f"; {d['retryable']:,} retryable (shard again with --retry-failed)" if d["retryable"] else ""
    filtered = ", ".join(f"{reason} {n:,}" for reason, n in d.get("filtered_by_reason", {}).items())
    return (f"{d['successes']:,} of {seen:,} URLs written, {d['failed']:,} failed" + (f" ({reasons})" if reasons else "")
            + retry + (f"; {d['filtered']:,} rows filtered ({filtered})" if d.get("filtered") else ""))


def selection_line(d: dict[str, Any]) -> str:
    """What the job's --where / --keep-top left out (from its failures.json), in one line."""
    reasons = ", ".join(f"{reason} {n:,}" for reason, n in d["filtered_by_reason"].items())
    top = f"; top {d['kept']:,} of {d['rows']:,} by {d['by']} (threshold {d['threshold']})" if "by" in d else ""
    spread = d.get("per_shard")
    shards = (f"; {spread['min']:,}–{spread['max']:,} per shard (most in {spread['most']})"
              if spread and spread["max"] else "")
    return f"{d['filtered']:,} of {d['seen']:,} inputs filtered" + (f" ({reasons})" if reasons else "") + top + shards


def _summary_table(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from fgdata.formatting import human_bytes

    total = doc["total_samples"]
    table = Table(title=f"{doc['dataset']}", title_justify="left", show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    damaged = sum(1 for s in doc["shards"] if s["damage"])
    table.add_row("samples", f"{total:,} in {len(doc['shards']):,} shards" + (f" ({damaged} damaged)" if damaged else ""))
    if len(doc["datasets"]) > 1:
        for d in doc["datasets"]:
            table.add_row("dataset", f"{d['path']}: {d['samples']:,} samples in {d['shards']:,} shards, "
                          f"{human_bytes(d['bytes'])}")
    table.add_row("size", f"{human_bytes(doc['total_bytes'])}, {human_bytes(doc['total_bytes'] / total) if total else '–'}"
                  " per sample")
    sets = list(doc["extension_sets"].items())
    table.add_row("members", ("; ".join(f"{k or '(none)'} ×{n:,}" for k, n in sets[:3]) or "–")
                  + (f"; {len(sets) - 3} more set{'s' if len(sets) > 4 else ''}" if len(sets) > 3 else ""))
    if "images" in doc:
        im = doc["images"]
        table.add_row("images", f"{im['members']:,}; width {dist(im['width'], ' px')}, height {dist(im['height'], ' px')}")
    if "videos" in doc:
        v = doc["videos"]
        audio = f", {v['audio_share']:.0%} with audio" if v["audio_share"] is not None else ""
        table.add_row("videos", f"{v['members']:,}; {dist(v['duration_s'], ' s')}, {dist(v['fps'], ' fps')}{audio}")
    if "captions" in doc:
        c = doc["captions"]
        first = ", ".join(f"“{w}”" for w, _ in c["first_words"][:3])
        table.add_row("captions", f"{c['samples']:,}; {dist(c['words'], ' words')}; often starting {first}")
    if "clips" in doc:
        table.add_row("clips", clips_line(doc["clips"]))
    for name, f in doc.get("numeric_fields", {}).items():
        table.add_row(name, numeric_field_line(f))
    for name, th in doc.get("thresholds", {}).items():
        table.add_row("threshold", threshold_line(name, th, total))
    if "downloads" in doc:
        table.add_row("downloads", download_line(doc["downloads"]))
    if "selection" in doc:
        table.add_row("selected", selection_line(doc["selection"]))
    if "filtered" in doc:
        table.add_row("filtered", ", ".join(f"{reason} {n:,}" for reason, n in doc["filtered"].items())
                      + " (outputs the job's filters dropped, failures.json)")
    for key, n in list(doc.get("tensors", {}).items())[:3]:
        table.add_row("tensors", f"{key} ×{n:,}")
    problems = doc["problems"]
    table.add_row("problems", "[green]none[/]" if not problems else
                  "[red]" + "; ".join(f"{p['count']:,} × {p['kind']}" for p in problems[:4]) + "[/]")
    console.print(table)


@dataclass(frozen=True, kw_only=True)
class ReportFlags:
    """What ``report`` writes and how much of the dataset it decodes."""

    output: str = flag(typer.Option("report.html", "--output", "-o", metavar="FILE",
                                    help="The HTML page to write (local or s3://)."))
    sample: int = flag(typer.Option(1000, "--sample", min=0, metavar="N", help="Decode the media of at most N "
                                    "samples (image headers without json sizes, video probes, tensors), spread "
                                    "evenly over the dataset."))
    tiles: int = flag(typer.Option(24, "--tiles", min=0, metavar="N", help="Samples in the contact sheet."))
    contact_sheet: Optional[str] = flag(typer.Option(None, "--contact-sheet", metavar="PNG",
                                                     help="Also write the contact sheet as a PNG."))
    threshold: list[str] = flag(typer.Option([], "--threshold", metavar="FIELD=VALUE", help="The score threshold "
                                             "shown for a numeric json field, with the kept count and the samples "
                                             "just above and just below it (repeatable; default: the score "
                                             "filter's, else the median)."))
    name: Optional[str] = flag(typer.Option(None, "--name",
                                            help="The dataset's name in the report (default: its folder)."))
    workers: int = flag(typer.Option(4, "--workers", "-w", min=1, help="Shards read in parallel."))
    overwrite: bool = flag(OVERWRITE)


@flag_groups
def report_cmd(
    paths: list[str] = typer.Argument(..., help="A folder or s3:// prefix of .tar shards, shards, or a brace pattern "
                                      "like 'data/{00000..00099}.tar'."),
    *,
    flags: ReportFlags,
    out: OutputFlags,
) -> None:
    """Describe a dataset of WebDataset shards (fgdata's or anyone's) in one self-contained HTML page.

    Example: fgdata report /data/photos-wds -o photos.html --sample 2000

    The page shows samples and bytes per shard, extension sets, image sizes and aspect ratios, video durations,
    frame rates and audio, caption lengths and first words, numeric json fields with what a score filter would
    keep, a contact sheet, and any damaged shards or missing members. Tar headers, json and captions are read for
    every sample; media are decoded only for --sample samples. Several folders are several datasets: one page of
    their figures together, a line of each's shards, samples and bytes, keys and shard_count.json checked per folder,
    and shards named by path. Exit code 1 when problems were found.
    """
    from fgdata import storage
    from fgdata.errors import FgdataError
    from fgdata.jobs.executor import process_map
    from fgdata.report.build import build_report, write_contact_sheet
    from fgdata.workers import OrderedMap, serial_map

    wanted = _thresholds(flags.threshold)
    outputs = [p for p in (flags.output, flags.contact_sheet) if p]
    existing = [p for p in outputs if storage.exists(p)]
    if existing and not flags.overwrite:
        raise FgdataError(f"{existing[0]} exists; pass --overwrite to replace it")
    from fgdata.shards import resolve_shards

    selection = resolve_shards(paths)
    shards = selection.shards
    say_repeated(selection, quiet=out.quiet)
    pool: OrderedMap = serial_map
    if flags.workers > 1 and len(shards) > 1:
        pool = process_map(flags.workers, "reading the shards", ("fgdata.report.collect", "fgdata.media.decode"))
    started = time.perf_counter()
    with progress(enabled=out.bars) as bar:
        task = bar.add_task("reading shards", total=len(shards), rate="")

        def tick(_shard: str) -> None:
            done = bar.tasks[task].completed + 1
            bar.update(task, advance=1, rate=f"{done / max(time.perf_counter() - started, 1e-9):.1f} shards/s")
            if done == len(shards):
                bar.update(task, description="drawing")

        report = build_report(selection, name=flags.name or _dataset_name(paths), paths=paths, sample=flags.sample,
                              tiles=flags.tiles, pool=pool, thresholds=wanted, progress=tick)
    doc = report.doc
    say_removed(existing, quiet=out.quiet)
    from fgdata.jobs.dest import note_output

    storage.write_bytes(flags.output, report.html.encode())
    note_output(flags.output, "report")  # written into a job's DST: the job's reruns take it as fgdata's
    doc["html"] = flags.output
    if flags.contact_sheet:
        write_contact_sheet(report.stats.tiles, flags.contact_sheet)
        note_output(flags.contact_sheet, "report")
        doc["contact_sheet_png"] = flags.contact_sheet
    doc["seconds"] = round(time.perf_counter() - started, 3)
    if out.json_out:
        print_json(doc)
    else:
        _summary_table(doc)
        if not out.quiet:
            sheet = f" and {flags.contact_sheet}" if flags.contact_sheet else ""
            console.print(f"wrote {flags.output}{sheet}", highlight=False, soft_wrap=True)
    if doc["problems"]:
        found = "; ".join(f"{p['count']:,} × {p['kind']}" for p in doc["problems"])
        err_console.print(f"[red]problems found: {found}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
