"""Camera tracks from VIPE (NVIDIA's video pose engine), written as the sidecars ``fgdata shard videos`` reads.

VIPE is a separate, GPU-only install. When its ``vipe`` command is on PATH we run
``vipe infer VIDEO --output TMP`` (argument list, no shell) and convert its per-video
``pose/NAME.npz`` ([T,4,4] camera-to-world) and ``intrinsics/NAME.npz`` ([T,4]) arrays, stored
under ``data``, into ``NAME.poses.npy`` and ``NAME.intrinsics.npy``, checked against the
video's frame count before anything is written.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tempfile

import numpy as np

from fgdata import storage
from fgdata.children import die_with_parent
from fgdata.errors import FgdataError

VIPE_INSTALL = (
    "VIPE is not installed (no 'vipe' command on PATH). It needs a CUDA GPU; install it with: "
    "git clone https://github.com/nv-tlabs/vipe && pip install --no-build-isolation -e ./vipe"
)


def _load_track(folder: str, stem: str) -> np.ndarray:
    candidates = sorted(n for n in os.listdir(folder) if n.startswith(stem) and n.endswith((".npz", ".npy"))) \
        if os.path.isdir(folder) else []
    if not candidates:
        raise FgdataError(f"VIPE wrote no track for {stem} under {folder}")
    with np.load(os.path.join(folder, candidates[0]), allow_pickle=False) as arrays:
        if isinstance(arrays, np.ndarray):
            return arrays
        return arrays["data"] if "data" in arrays.files else arrays[arrays.files[0]]


def estimate_camera(video: str, output: str | None = None) -> tuple[str, str]:
    """Run VIPE on ``video``; return the paths of the poses and intrinsics sidecars it produced."""
    from fgdata.media import probe_video, validate_camera

    exe = shutil.which("vipe")
    if exe is None:
        raise FgdataError(VIPE_INSTALL)
    if not storage.exists(video):
        raise FgdataError(f"{video}: file not found")
    stem = storage.basename(video).rpartition(".")[0]
    out_dir = output or storage.parent(video)
    with tempfile.TemporaryDirectory(prefix="fgdata-vipe-") as tmp:
        local = storage.local_copy(video, tmp)
        results = os.path.join(tmp, "results")
        proc = subprocess.run([exe, "infer", os.path.abspath(local), "--output", results],
                              capture_output=True, text=True, **die_with_parent())
        if proc.returncode != 0:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise FgdataError(f"vipe infer failed on {video}: {last[0]}")
        poses = _load_track(os.path.join(results, "pose"), stem)
        intrinsics = _load_track(os.path.join(results, "intrinsics"), stem)
        validate_camera(poses, intrinsics, probe_video(local).frame_count)
    paths = []
    for suffix, array in ((".poses.npy", poses), (".intrinsics.npy", intrinsics)):
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
        path = storage.join(out_dir, stem + suffix)
        storage.write_bytes(path, buf.getvalue())
        paths.append(path)
    return paths[0], paths[1]
