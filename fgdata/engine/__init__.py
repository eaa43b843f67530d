"""How work runs: sources -> a pure per-item transform -> ShardWriter, on a local process pool or Ray.

Public API: :class:`ShardJob`, :class:`ShardOptions`, :func:`run_shard_job` -> :class:`JobReport`,
and :func:`quickstart_videos` for ``fgdata quickstart``. Heavy libraries (av, PIL, ray,
pyarrow) are imported inside the functions that use them.
"""

from __future__ import annotations

import os
from pathlib import Path

from fgdata.engine.job import FAILURES_FILE, JOB_FILE, JobReport, ShardJob, run_shard_job
from fgdata.engine.transform import ShardOptions

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"


def quickstart_videos(outdir: str | os.PathLike[str]) -> dict:
    """Shard the bundled clip (video + audio + caption) into ``outdir/video_shards``; return paths and counts."""
    import shutil

    out = Path(outdir)
    src = out / "video-src"
    src.mkdir(parents=True, exist_ok=True)
    for name in ("bigbuckbunny.mp4", "bigbuckbunny.txt"):
        shutil.copyfile(EXAMPLES / name, src / name)
    dest = out / "video_shards"
    report = run_shard_job(ShardJob(src=str(src), dest=str(dest), options=ShardOptions(kind="videos")))
    return {
        "shards": report.shards,
        "samples": report.samples,
        "seen": report.seen,
        "written": report.written,
        "failed": report.failed,
        "counts": str(dest / "shard_count.json"),
        "failures": report.failures_path,
    }


__all__ = ["FAILURES_FILE", "JOB_FILE", "JobReport", "ShardJob", "ShardOptions", "quickstart_videos", "run_shard_job"]
