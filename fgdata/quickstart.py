"""The end-to-end demo behind ``fgdata quickstart``: every main job on the bundled sample media.

Each step calls the same library function a user would; nothing here is demo-only logic
beyond choosing inputs and small sizes. No network is needed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fgdata.catalog import SAMPLE_DATA
from fgdata.errors import FgdataError

#: What a quickstart run writes under its folder; ``--overwrite`` removes exactly these.
OUTPUTS = ("image_shards", "video_shards", "video-src", "class_conditional", "report.html", "contact_sheet.png")


@dataclass
class Step:
    """One demo step: ``run()`` returns ``(result, summary)``, a JSON-ready dict and one line for people."""

    name: str
    run: Callable[[], tuple[dict[str, Any], str]]


def default_outdir() -> str:
    """A fresh folder in the system temp folder, so a demo never litters a source checkout."""
    return tempfile.mkdtemp(prefix="fgdata-quickstart-")


def existing_outputs(outdir: str) -> list[str]:
    """The quickstart outputs already under ``outdir`` (what ``--overwrite`` removes)."""
    return [str(Path(outdir) / name) for name in OUTPUTS if (Path(outdir) / name).exists()]


def _shapes(shapes: dict[str, Any]) -> str:
    """``real_raw [2,3,64,64] + 5 more keys``: the tensors, then how many other batch keys."""
    tensors = [f"{k} [{','.join(map(str, v))}]" for k, v in shapes.items() if len(v) > 1]
    rest = len(shapes) - len(tensors)
    return ", ".join(tensors) + (f" + {rest} more key{'s' if rest > 1 else ''}" if rest else "")


def steps(outdir: str) -> list[Step]:
    """The demo as named steps, in order, writing under ``outdir``."""
    from fgdata.sharding.job import ShardJob, quickstart_videos, run_shard
    from fgdata.loaders.quickstart import quickstart_batch
    from fgdata.producers.media import ShardOptions
    from fgdata.shards import count_shards
    from fgdata.verify.inspect import inspect_shard

    if not SAMPLE_DATA.is_dir():
        raise FgdataError(f"{SAMPLE_DATA}: bundled sample media not found (reinstall fgdata)")
    out = Path(outdir)
    images = str(out / "image_shards")

    def shard_images() -> tuple[dict[str, Any], str]:
        job = ShardJob(src=str(SAMPLE_DATA), dest=images,
                       options=ShardOptions(kind="images", max_side=512, image_format="jpg"), maxcount=4)
        r = run_shard(job)
        result = {"dest": images, "seen": r.seen, "written": r.written, "failed": r.failed, "shards": len(r.shards)}
        return result, f"{r.written} of {r.seen} photos written, {r.failed} failed, {len(r.shards)} shards"

    def count() -> tuple[dict[str, Any], str]:
        rows = count_shards(images)
        total = sum(r.samples for r in rows)
        result = {"shards": len(rows), "samples": total, "count_file": os.path.join(images, "shard_count.json")}
        return result, f"{total} samples in {len(rows)} shards, counts in shard_count.json"

    def inspect() -> tuple[dict[str, Any], str]:
        report, _ = inspect_shard(os.path.join(images, "00000.tar"), limit=1)
        sets = ", ".join(f"{exts} ({n})" for exts, n in report.ext_sets.items())
        result = {"shard": report.shard, "samples": report.samples, "extension_sets": report.ext_sets}
        return result, f"00000.tar: {report.samples} samples; members {sets}"

    def load_batch() -> tuple[dict[str, Any], str]:
        shapes = quickstart_batch(images)
        return {"loader": "ImageWDSLoader", "shapes": shapes}, f"ImageWDSLoader batch: {_shapes(shapes)}"

    def shard_videos() -> tuple[dict[str, Any], str]:
        r = quickstart_videos(out)
        return r, f"{r['written']} of {r['seen']} videos written ({r['samples']} samples), {r['failed']} failed"

    def class_zip() -> tuple[dict[str, Any], str]:
        r = quickstart_demo(out / "class_conditional")
        return r, f"{r['images']} images in {Path(r['zips'][-1]).name}; ImageLoader batch: {_shapes(r['batch'])}"

    def report() -> tuple[dict[str, Any], str]:
        from fgdata.report.build import build_report, write_contact_sheet
        from fgdata.shards import require_shards

        shards = require_shards(images) + require_shards(str(out / "video_shards"))
        r = build_report(shards, name="fgdata quickstart", paths=[images, str(out / "video_shards")])
        html, sheet = out / "report.html", out / "contact_sheet.png"
        html.write_text(r.html, encoding="utf-8")
        write_contact_sheet(r.stats.tiles, str(sheet))
        problems = sum(p["count"] for p in r.doc["problems"])
        return ({"html": str(html), "contact_sheet": str(sheet), "samples": r.doc["total_samples"],
                 "problems": problems},
                f"report.html and contact_sheet.png: {r.doc['total_samples']} samples, {len(r.stats.tiles)} tiles, "
                f"{problems} problems")

    return [Step("shard images", shard_images), Step("count-shards", count), Step("inspect", inspect),
            Step("load a batch", load_batch), Step("shard videos", shard_videos),
            Step("class-conditional zip", class_zip), Step("report", report)]


def quickstart_demo(outdir: str | os.PathLike[str]) -> dict[str, Any]:
    """Build a small labelled 64-px zip from the bundled photos and load one batch through ImageLoader.

    The photos go into two class folders (JPEGs vs PNGs), so the zip has real labels and a one-hot
    condition; returns the zip paths, the image count and the batch's shapes.
    """
    import shutil

    from fgdata.loaders.image_loader import ImageLoader
    from fgdata.prepare import ImagenetOptions, RunSettings, prepare_imagenet64

    out = Path(outdir)
    tree = out / "class-tree"
    for path in sorted(SAMPLE_DATA.iterdir()):
        if path.suffix.lower() in (".jpg", ".png"):
            (tree / path.suffix.lower()[1:]).mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, tree / path.suffix.lower()[1:] / path.name)
    summaries = prepare_imagenet64(ImagenetOptions(tree, out, allow_any_tree=True), RunSettings(workers=2))  # two made-up classes
    loader = ImageLoader(summaries[1].path, None, batch_size=4, num_workers=0)
    batch = next(iter(loader))
    return {
        "zips": [s.path for s in summaries],
        "images": summaries[1].written,
        "converted": [c.to_json() for c in summaries[1].converted],
        "batch": {key: list(value.shape) for key, value in batch.items()},
    }
