"""The end-to-end demo behind ``fgdata quickstart``: every main job on the bundled sample media.

Each step calls the same library function a user would; nothing here is demo-only logic
beyond choosing inputs and small sizes. No network is needed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

SAMPLE_DATA = Path(__file__).resolve().parents[1] / "examples" / "data"


def run_quickstart(outdir: str, log: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
    """Run each step and pass its result to ``log(step, result)``; return all results."""
    from fgdata.jobs.shard import ShardJob, quickstart_videos, run_shard_job
    from fgdata.producers.media import ShardOptions
    from fgdata.loaders.quickstart import quickstart_batch
    from fgdata.shards import count_shards
    from fgdata.verify.inspect import inspect_shard

    if not SAMPLE_DATA.is_dir():
        from fgdata.errors import FgdataError

        raise FgdataError(f"{SAMPLE_DATA}: bundled sample media not found (run from a source checkout)")
    out = Path(outdir)
    results: dict[str, Any] = {}

    images = str(out / "image_shards")
    job = ShardJob(src=str(SAMPLE_DATA), dest=images, options=ShardOptions(kind="images", max_side=512, image_format="jpg"), maxcount=4)
    report = run_shard_job(job)
    results["shard images"] = {"dest": images, "seen": report.seen, "written": report.written, "failed": report.failed, "shards": len(report.shards)}
    log("shard images", results["shard images"])

    rows = count_shards(images)
    results["count-shards"] = {"shards": len(rows), "samples": sum(r.samples for r in rows), "count_file": os.path.join(images, "shard_count.json")}
    log("count-shards", results["count-shards"])

    shard_report, _ = inspect_shard(os.path.join(images, "00000.tar"), limit=1)
    results["inspect"] = {"shard": shard_report.shard, "samples": shard_report.samples, "extension_sets": shard_report.ext_sets}
    log("inspect", results["inspect"])

    results["load a batch"] = {"loader": "ImageWDSLoader", "shapes": quickstart_batch(images)}
    log("load a batch", results["load a batch"])

    results["shard videos"] = quickstart_videos(out)
    log("shard videos", results["shard videos"])

    results["class-conditional zip"] = quickstart_demo(out / "class_conditional")
    log("class-conditional zip", results["class-conditional zip"])
    return results


def quickstart_demo(outdir: str | os.PathLike[str]) -> dict[str, Any]:
    """Build a small labelled 64-px zip from the bundled photos and load one batch through ImageLoader.

    The photos go into two class folders (JPEGs vs PNGs), so the zip has real labels and a one-hot
    condition; returns the zip paths, the image count and the batch's shapes.
    """
    import shutil

    from fgdata.loaders.image_loader import ImageLoader
    from fgdata.prepare import prepare_imagenet64

    out = Path(outdir)
    tree = out / "class-tree"
    for path in sorted(SAMPLE_DATA.iterdir()):
        if path.suffix.lower() in (".jpg", ".png"):
            (tree / path.suffix.lower()[1:]).mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, tree / path.suffix.lower()[1:] / path.name)
    summaries = prepare_imagenet64(tree, out, workers=2, allow_any_tree=True)  # two made-up classes
    loader = ImageLoader(str(summaries[1]["path"]), None, batch_size=4, num_workers=0)
    batch = next(iter(loader))
    return {
        "zips": [s["path"] for s in summaries],
        "images": summaries[1]["written"],
        "converted": summaries[1]["converted_modes"],
        "batch": {key: list(value.shape) for key, value in batch.items()},
    }
