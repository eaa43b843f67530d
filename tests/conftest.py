"""Shared fixtures: the bundled sample media, a loopback S3 server, a quiet environment."""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fgdata.catalog import SAMPLE_DATA  # inside the package, so an installed wheel has it too

SAMPLE_IMAGES = sorted(
    p for p in SAMPLE_DATA.iterdir() if p.suffix.lower() in {".jpg", ".png"}
)
SAMPLE_VIDEO = SAMPLE_DATA / "bigbuckbunny.mp4"

# No test may reach a hub or the network; set before any model library is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The loopback S3 server's writes land together: a lease's settle of 1 s (for a real store) would only make
# every S3 test wait (fgdata.jobs.lease; child processes inherit it).
os.environ.setdefault("FGDATA_S3_LEASE_SETTLE_SECONDS", "0.05")


#: The test files that take longest (seconds of wall clock each, measured under ``-n 3 --dist loadfile``), handed
#: out first so that the workers finish together instead of one running a long file alone at the end (the README's
#: command passes ``--no-loadscope-reorder``: pytest-xdist otherwise hands out the files with most tests first). Files that
#: use ``ray_local`` are not listed: they must stay after the process-tree tests of tests/faults and tests/jobs.
LONGEST_FIRST = (
    "tests/encode/test_encode.py", "tests/faults/test_s3_stalls.py", "tests/jobs/test_ray_cluster.py",
    "tests/fid/test_fid_refs.py", "tests/faults/test_kill_resume.py", "tests/determinism/test_same_bytes.py",
    "tests/faults/test_s3_requests.py", "tests/prepare/test_imagenet.py", "tests/faults/test_s3_lease.py",
    "tests/shard_cmd/test_url_safety.py", "tests/report/test_report_thresholds.py", "tests/dedup/test_dedup.py",
    "tests/shard_cmd/test_urls.py", "tests/media/test_transnet.py", "tests/shard_cmd/test_changed_inputs.py",
    "tests/jobs/test_ray_stop.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Collect the longest files first (``LONGEST_FIRST``); every other test keeps its place."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A private TMPDIR for a child process, at a short path: its process pool's forkserver puts a Unix socket
    there, whose path may be at most 107 bytes, and ``tmp_path`` is longer under pytest-xdist (``popen-gw0/``)."""
    path = Path(tempfile.mkdtemp(prefix="fgt-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def sample_data() -> Path:
    return SAMPLE_DATA


@pytest.fixture(scope="session")
def sample_images() -> list[Path]:
    return SAMPLE_IMAGES


@pytest.fixture(scope="session")
def sample_video() -> Path:
    return SAMPLE_VIDEO


@pytest.fixture(scope="session")
def bombs() -> dict[str, bytes]:
    """Decompression bombs by extension: real 8x8 JPEG and PNG files whose headers claim 65000x65000
    (a few hundred bytes each; the PNG's IHDR CRC is valid)."""
    import struct
    import zlib

    from PIL import Image

    out = {}
    for ext, fmt in (("jpg", "JPEG"), ("png", "PNG")):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, fmt)
        data = bytearray(buf.getvalue())
        if ext == "jpg":
            sof = data.index(b"\xff\xc0")
            data[sof + 5 : sof + 9] = struct.pack(">HH", 65000, 65000)
        else:
            data[16:24] = struct.pack(">II", 65000, 65000)
            data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
        out[ext] = bytes(data)
    return out


def encode_test_clip(
    *,
    frames: int = 48,
    fps: int = 24,
    size: tuple[int, int] = (64, 48),
    audio_channels: int | None = None,
    rotation: int | None = None,
) -> bytes:
    """A tiny h264 mp4 (g=12): frame i is grey level 4*i with its left quarter white (shows flips and
    rotations); with ``audio_channels`` (1 or 2) also a 440 Hz AAC tone."""
    import av

    w, h = size
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        vs = out.add_stream("libx264", rate=fps, options={"preset": "ultrafast", "g": "12"})
        vs.width, vs.height, vs.pix_fmt = w, h, "yuv420p"
        if rotation is not None:
            vs.set_display_rotation(rotation)
        aus = None
        if audio_channels:
            aus = out.add_stream("aac", rate=48000)
            aus.layout = "mono" if audio_channels == 1 else "stereo"
        for i in range(frames):
            img = np.full((h, w, 3), (4 * i) % 256, np.uint8)
            img[:, : w // 4] = 255
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts = i
            for p in vs.encode(f):
                out.mux(p)
        for p in vs.encode():
            out.mux(p)
        if aus is not None:
            n = int(48000 * frames / fps)
            wave = np.tile((0.5 * np.sin(2 * np.pi * 440 * np.arange(n) / 48000)).astype(np.float32), (audio_channels, 1))
            for s in range(0, n, 1024):
                af = av.AudioFrame.from_ndarray(np.ascontiguousarray(wave[:, s : s + 1024]), format="fltp",
                                                layout=aus.layout.name)
                af.sample_rate, af.pts = 48000, s
                for p in aus.encode(af):
                    out.mux(p)
            for p in aus.encode():
                out.mux(p)
    return buf.getvalue()


@pytest.fixture(scope="session")
def clip_encoder():
    """:func:`encode_test_clip` for the conftests below this one (they cannot import it: every folder's
    conftest module is named ``conftest``)."""
    return encode_test_clip


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3 server (moto) on 127.0.0.1, with dummy credentials in the environment."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as mp:
        for k, v in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }.items():
            mp.setenv(k, v)
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        mp.setenv("S3_ENDPOINT_URL", url)
        yield url
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint) -> str:
    """A fresh, empty bucket; returns its ``s3://name`` URL."""
    import boto3

    name = f"fgtest-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.fixture(scope="session")
def tiny_vae_dir(tmp_path_factory) -> Path:
    """A 4-block AutoencoderKL (SD-shaped latents, 0.25 M parameters) saved for the real from_pretrained path."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 16, 32, 32),
                        layers_per_block=1, latent_channels=4, norm_num_groups=8, scaling_factor=0.18215)
    path = tmp_path_factory.mktemp("vae") / "tiny-vae"
    vae.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def _ray_session():
    """Shuts down, at the session's end, the in-process Ray instance :func:`ray_local` started."""
    yield
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def ray_local(_ray_session):
    """One local Ray instance in this process for the in-process ``--engine ray`` tests (the job joins it instead
    of starting and stopping its own, ~5 s each). Started again if a test shut it down (tests/jobs/
    test_ray_cluster.py does, to start its multi-node cluster). It stays up until the session ends, with its
    processes and signal handlers in this process: only tests/shard_cmd uses it, which runs after the kill and
    process-tree tests of tests/faults and tests/jobs."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    return ray
