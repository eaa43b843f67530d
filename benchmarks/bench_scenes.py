"""Raw videos -> single-shot clips: fgdata ``--split scenes`` vs PySceneDetect 0.7 and video2dataset's two steps.

The test set is generated (tests/scenes_synth.py): ``--videos`` 720p h264 mp4s (x264's default preset, medium:
B-frames and CABAC as in real x264 output; a keyframe every second, AAC audio), each ``--seconds`` long, cut
into shots of 0.8-2 s over the sample photos, panning at 0-6 px/frame, with hard cuts and, in a quarter of the videos each, a 12-frame dissolve, a fade to black and
back, and a one-frame white flash. The truth is every transition's frame span.

(a) Cut detection, same files, same number of processes (``--processes``, a pool over the videos on both
sides): fgdata's analysis (one decode of the reference frames, thumbnails, motion vectors, cuts) against
PySceneDetect 0.7's
``ContentDetector(threshold=27, min_scene_len=15)`` and ``AdaptiveDetector(adaptive_threshold=3.5,
window_width=3, min_scene_len=15)`` through its own API (``open_video``, ``SceneManager``) at
video2dataset's downscale (``width // 64``). Frames/s = frames of all videos / wall clock. F1: a detected
cut matches an unmatched truth transition when it is within one frame of a hard cut or inside (one frame
of slack) a fade or dissolve; a flash has no truth transition, so a cut there is a false positive.

(b) The whole split: ``fgdata shard videos SRC DST --split scenes --workers P`` (clips stream-copied into
tar shards) against video2dataset's two steps per video in a pool of P: PySceneDetect's ContentDetector as
above, then one ``ffmpeg -ss START -i VIDEO -t LENGTH -c copy -map 0`` per scene (the ffmpeg binary of the
``imageio-ffmpeg`` wheel), the clips then written into one tar per video. Videos/s = videos / wall clock.
(a) also prints frames per CPU-second of the pool's processes (user + system, children included): on a
loaded box the wall clock favours the side with more decoder threads (PySceneDetect's OpenCV reader uses
FFmpeg's frame threads; fgdata's analysis one decoder thread per process). (b) runs twice: with
``--processes`` (wall clock only: fgdata's job core starts its workers from a fork server this process does
not reap, so their CPU time is not counted here), then both sides with one process (fgdata's job runs in
the command's process), where videos per CPU-second (ffmpeg's processes included) is counted too.

With the ``scenes-ml`` extra installed, (a) also runs ``--cut-detector transnetv2`` on the CPU in the same pool
(``analyse_video(network_frames=True)``: every frame decoded and scaled to 48x27, then TransNetV2 at its
default threshold 0.5, one torch thread per process); ``--no-transnet`` leaves it out.

PySceneDetect and imageio-ffmpeg run in their own venv (created on first use, like bench_download.py's
img2dataset): ``--venv /tmp/scenes-bench-venv``.

    python benchmarks/bench_scenes.py --videos 50 --seconds 4 --processes 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

SIZE = (1280, 720)
FPS = 25
PRESET = "medium"  # x264's default: B-frames, as the videos users bring (ultrafast has none)

PEER = r'''
import json, os, subprocess, sys, tarfile, time
from multiprocessing import Pool

def detect(args):
    path, kind = args
    from scenedetect import AdaptiveDetector, ContentDetector, SceneManager, open_video
    video = open_video(path)
    sm = SceneManager()
    sm.add_detector(ContentDetector(threshold=27, min_scene_len=15) if kind == "content"
                    else AdaptiveDetector(adaptive_threshold=3.5, window_width=3, min_scene_len=15))
    sm.auto_downscale = False
    sm.downscale = max(1, video.frame_size[0] // 64)
    sm.detect_scenes(video)
    scenes = sm.get_scene_list()
    return path, [s[0].get_frames() for s in scenes[1:]], [(s[0].get_seconds(), s[1].get_seconds()) for s in scenes]

def split(args):
    path, out = args
    import imageio_ffmpeg
    ffmpeg = imageio_ffmpeg.get_ffmpeg_exe()
    _, _, scenes = detect((path, "content"))
    if not scenes:
        scenes = [(0.0, None)]
    stem = os.path.splitext(os.path.basename(path))[0]
    names = []
    for k, (a, b) in enumerate(scenes):
        clip = os.path.join(out, f"{stem}_{k:04d}.mp4")
        cmd = [ffmpeg, "-v", "error", "-y", "-ss", f"{a:.3f}", "-i", path]
        if b is not None:
            cmd += ["-t", f"{b - a:.3f}"]
        subprocess.run(cmd + ["-c", "copy", "-map", "0", clip], check=True)
        names.append(clip)
    with tarfile.open(os.path.join(out, stem + ".tar"), "w") as tar:
        for n in names:
            tar.add(n, arcname=os.path.basename(n))
            os.remove(n)
    return len(names)

if __name__ == "__main__":
    mode, procs, paths, out = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    t = time.perf_counter()
    with Pool(procs) as pool:
        if mode == "split":
            result = sum(pool.map(split, [(p, out) for p in paths], chunksize=1))
        else:
            result = {p: cuts for p, cuts, _ in pool.map(detect, [(p, mode) for p in paths], chunksize=1)}
    print(json.dumps({"seconds": time.perf_counter() - t, "result": result}))
'''


def make_videos(folder: Path, n: int, seconds: float, seed: int) -> dict[str, list[tuple[str, int, int]]]:
    """``n`` edited videos; returns each file's truth: (kind, first, last) frames of every transition."""
    from scenes_synth import build, encode

    rng = random.Random(seed)
    truths = {}
    for v in range(n):
        plan: list[tuple] = []
        frames = 0
        special = ["dissolve", "fade", "flash", None][v % 4]
        while frames < seconds * FPS:
            length = rng.randint(20, 50)
            if plan:
                plan.append(("cut",) if special not in ("dissolve", "fade") or frames < 40 or plan[-1][0] != "shot"
                            else (("dissolve", 12) if special == "dissolve" else ("fade", 6, 4, 6)))
                if plan[-1][0] != "cut":
                    special = None
            plan.append(("shot", rng.randrange(7), length, rng.choice([0.0, 0.5, 1.0, 2.0, 4.0, 6.0])))
            if special == "flash" and frames > 20:
                plan.append(("flash", 1.0))
                plan.append(("shot", plan[-2][1], 15, plan[-2][3], 1.0, length + 1))
                special = None
            frames += length
        truth = build(SIZE, plan, seed=v)
        path = folder / f"v{v:03d}.mp4"
        path.write_bytes(encode(truth.frames, fps=FPS, gop=FPS, audio=True, preset=PRESET))
        truths[str(path)] = [("hard", c, c) for c in truth.hard] + list(truth.soft)
    return truths


def f1(truths: dict, found: dict) -> tuple[float, int, int, int]:
    """(F1, true positives, false positives, false negatives) over all videos (see the module docstring)."""
    tp = fp = fn = 0
    for path, truth in truths.items():
        left = list(truth)
        for cut in found.get(path, []):
            hit = next((t for t in left if (t[0] == "hard" and abs(cut - t[1]) <= 1)
                        or (t[0] != "hard" and t[1] - 1 <= cut <= t[2] + 1)), None)
            if hit is None:
                fp += 1
            else:
                left.remove(hit)
                tp += 1
        fn += len(left)
    return (2 * tp / (2 * tp + fp + fn) if tp else 0.0), tp, fp, fn


def _fgdata_detect(path: str) -> tuple[str, list[int], int]:
    from fgdata.media.scenes import CutSettings, analyse_video, detect_transitions

    analysis = analyse_video(path)
    cuts = [t.first for t in detect_transitions(analysis, CutSettings())]
    return path, cuts, len(analysis.times)


def _transnet_detect(path: str) -> tuple[str, list[int], int]:
    from fgdata.media.scenes import analyse_video
    from fgdata.media.transnet import DEFAULT_THRESHOLD, detect_transitions

    analysis = analyse_video(path, network_frames=True)
    cuts = [t.first for t in detect_transitions(analysis, DEFAULT_THRESHOLD, 0.6)]
    return path, cuts, len(analysis.times)


def ensure_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "scenedetect-headless==0.7.2", "imageio-ffmpeg"],
                       check=True)
    return python


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children and theirs: on a shared, loaded box
    the figure that does not depend on what else runs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def peer(python: Path, mode: str, procs: int, paths: list[str], out: str) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(PEER)
    try:
        done = subprocess.run([str(python), f.name, mode, str(procs), json.dumps(paths), out], check=True,
                              capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    return json.loads(done.stdout.strip().splitlines()[-1])


def fgdata_split(src: Path, dest: Path, procs: int) -> tuple[float, float, int]:
    """``fgdata shard videos SRC DEST --split scenes --workers PROCS``: (wall s, CPU s, clips). The CPU figure
    counts only with one process: fgdata's job then runs in the command's process, while with more its workers
    come from a fork server this process does not reap."""
    t, cpu = time.perf_counter(), children_cpu()
    subprocess.run([sys.executable, "-m", "fgdata", "shard", "videos", str(src), str(dest), "--split", "scenes",
                    "--workers", str(procs), "--no-progress", "--quiet"], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds, cpu_s = time.perf_counter() - t, children_cpu() - cpu
    return seconds, cpu_s, json.loads((dest / "failures.json").read_text())["samples"]


def v2d_split_run(python: Path, paths: list[str], out: Path, procs: int) -> tuple[float, float, int]:
    """video2dataset's two steps in a pool of PROCS: (wall s, CPU s with the ffmpeg children, clips)."""
    out.mkdir()
    t, cpu = time.perf_counter(), children_cpu()
    res = peer(python, "split", procs, paths, str(out))
    return time.perf_counter() - t, children_cpu() - cpu, res["result"]


DECODE_MODES = (  # (label, thread type, decoder options, skip_frame)
    ("all frames: slice threads, motion vectors", "SLICE", {"flags2": "+export_mvs", "skip_loop_filter": "all"}, None),
    ("slice threads, no motion vectors", "SLICE", {"skip_loop_filter": "all"}, None),
    ("frame threads, motion vectors (racy)", "AUTO", {"flags2": "+export_mvs", "skip_loop_filter": "all"}, None),
    ("frame threads, no motion vectors", "AUTO", {"skip_loop_filter": "all"}, None),
    ("slice threads, motion vectors, skip non-ref", "SLICE", {"flags2": "+export_mvs", "skip_loop_filter": "all"},
     "NONREF"),
    ("frame threads, no motion vectors, skip non-ref", "AUTO", {"skip_loop_filter": "all"}, "NONREF"),
)


def decode_modes(paths: list[str]) -> None:
    """What a reduced analysis decode would save: decoder frames/s of the videos in one process (best of 2),
    per thread type, with and without exported motion vectors, and skipping non-reference frames."""
    import av

    print(f"decode modes, {len(paths)} videos, one process, best of 2")
    for label, threads, options, skip in DECODE_MODES:
        best, frames, kinds = float("inf"), 0, {}
        for _ in range(2):
            t, frames, kinds = time.perf_counter(), 0, {}
            for path in paths:
                with av.open(path) as c:
                    vs = c.streams.video[0]
                    vs.thread_type = threads
                    vs.codec_context.options = dict(options)
                    if skip:
                        vs.codec_context.skip_frame = skip
                    for f in c.decode(vs):
                        frames += 1
                        kind = {1: "I", 2: "P", 3: "B"}.get(int(f.pict_type), str(f.pict_type))
                        kinds[kind] = kinds.get(kind, 0) + 1
            best = min(best, time.perf_counter() - t)
        print(f"{label:50s} {best:6.2f} s {frames:6d} frames decoded {frames / best:5.0f}/s  {dict(sorted(kinds.items()))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--venv", default="/tmp/scenes-bench-venv")
    parser.add_argument("--no-transnet", action="store_true", help="leave TransNetV2 out of (a)")
    parser.add_argument("--videos-dir", help="keep the generated videos here and reuse them on the next run")
    parser.add_argument("--decode-modes", type=int, metavar="K",
                        help="only time the decoder's modes on the first K videos (see decode_modes), then stop")
    args = parser.parse_args()
    python = ensure_venv(Path(args.venv))
    work = Path(tempfile.mkdtemp(prefix="bench-scenes-"))
    try:
        src = Path(args.videos_dir) if args.videos_dir else work / "src"
        record = src.parent / f"{src.name}.truth.json"
        wanted = {"videos": args.videos, "seconds": args.seconds, "seed": args.seed, "preset": PRESET}
        if record.exists() and json.loads(record.read_text())["wanted"] == wanted:
            truths = {k: [tuple(t) for t in v] for k, v in json.loads(record.read_text())["truths"].items()}
        else:
            src.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            truths = make_videos(src, args.videos, args.seconds, args.seed)
            print(f"generated {len(truths)} videos of {SIZE[0]}x{SIZE[1]} in {time.perf_counter() - t:.0f} s")
            record.write_text(json.dumps({"wanted": wanted, "truths": truths}))
        paths = sorted(truths)
        if args.decode_modes:
            decode_modes(paths[: args.decode_modes])
            return

        t, cpu = time.perf_counter(), children_cpu()
        with Pool(args.processes) as pool:
            done = pool.map(_fgdata_detect, paths, chunksize=1)
        fg_seconds, fg_cpu = time.perf_counter() - t, children_cpu() - cpu
        frames = sum(n for _, _, n in done)
        rows = [("fgdata (adaptive, flashes, fades, dissolves)", fg_seconds, fg_cpu, {p: c for p, c, _ in done})]
        from fgdata.media.transnet import available

        if available() and not args.no_transnet:
            t, cpu = time.perf_counter(), children_cpu()
            with Pool(args.processes) as pool:
                found = {p: c for p, c, _ in pool.map(_transnet_detect, paths, chunksize=1)}
            rows.append(("fgdata --cut-detector transnetv2 (CPU)", time.perf_counter() - t, children_cpu() - cpu, found))
        for mode, label in (("content", "PySceneDetect ContentDetector(27)"),
                            ("adaptive", "PySceneDetect AdaptiveDetector(3.5, 3)")):
            cpu = children_cpu()
            res = peer(python, mode, args.processes, paths, str(work))
            rows.append((label, res["seconds"], children_cpu() - cpu, res["result"]))
        print(f"\n(a) cut detection, {len(paths)} videos, {frames} frames, {args.processes} processes")
        print(f"{'detector':48s} {'frames/s':>9s} {'/CPU-s':>7s} {'F1':>6s} {'TP':>4s} {'FP':>4s} {'FN':>4s}")
        for label, seconds, cpu_s, found in rows:
            score, tp, fp, fn = f1(truths, found)
            print(f"{label:48s} {frames / seconds:9.0f} {frames / cpu_s:7.0f} {score:6.3f} {tp:4d} {fp:4d} {fn:4d}")
        content = rows[-2]
        print(f"fgdata / ContentDetector frames/s: {content[1] / rows[0][1]:.2f}x wall, "
              f"{content[2] / rows[0][2]:.2f}x per CPU-second")

        for procs in (args.processes, 1):
            fg_split, fg_cpu, clips = fgdata_split(src, work / f"fg{procs}", procs)
            v2d_split, v2d_cpu, v2d_clips = v2d_split_run(python, paths, work / f"v2d{procs}", procs)
            print(f"\n(b) whole split (detect + clip + shard), {len(paths)} videos, {procs} process(es)")
            print(f"fgdata --split scenes:        {len(paths) / fg_split:6.2f} videos/s ({clips} clips)"
                  + (f", {len(paths) / fg_cpu:5.2f} videos per CPU-second" if procs == 1 else ""))
            print(f"video2dataset's two steps:    {len(paths) / v2d_split:6.2f} videos/s ({v2d_clips} clips)"
                  + (f", {len(paths) / v2d_cpu:5.2f} videos per CPU-second" if procs == 1 else ""))
            print(f"ratio: {v2d_split / fg_split:.2f}x wall" + (f", {v2d_cpu / fg_cpu:.2f}x per CPU-second" if procs == 1 else ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
