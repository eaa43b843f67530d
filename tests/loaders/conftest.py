"""Real shards for the loader tests, written by fgdata's own ShardWriter (session-scoped, built once)."""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from fgdata.shards import ShardWriter

settings.register_profile(
    "loaders", deadline=None, max_examples=20, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
settings.load_profile("loaders")


@pytest.fixture(autouse=True)
def _quiet_construction_warnings():
    """The construction warnings are asserted in their own tests; elsewhere they are noise."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="deterministic mode")
        yield


def npy_bytes(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def pth_bytes(obj) -> bytes:
    import torch

    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def grid_key(shard: int, i: int) -> str:
    return f"{shard:05d}_{i:05d}"


def write_grid(dest: str, shards: int = 3, per: int = 8, skip: set[tuple[int, int]] = frozenset()) -> str:
    """'s grid: keys ``<shard>_<i>``, ``npy`` value shard*per+i, ``txt`` caption.

    ``skip`` = (shard, i) pairs written without their ``npy`` member.
    """
    with ShardWriter(dest, maxcount=per) as w:
        for s in range(shards):
            for i in range(per):
                members = {"txt": f"caption {s} {i}".encode()}
                if (s, i) not in skip:
                    members["npy"] = npy_bytes(np.full((1, 2, 2), s * per + i, dtype=np.float32))
                w.write(grid_key(s, i), members)
    return dest


@pytest.fixture(scope="session")
def grid(tmp_path_factory) -> str:
    """3 shards x 8 samples, with shard_count.json and offset indexes."""
    return write_grid(str(tmp_path_factory.mktemp("grid") / "shards"))


def camera_track(frames: int, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """Poses moving along x (translation = frame index) and constant intrinsics."""
    poses = np.tile(np.eye(4, dtype=np.float32), (frames, 1, 1))
    poses[:, 0, 3] = np.arange(frames)
    intr = np.tile(np.array([100.0, 100.0, w / 2, h / 2], dtype=np.float32), (frames, 1))
    return poses, intr


def _jpeg(path: Path, max_side: int = 320, flip: bool = False) -> bytes:
    from PIL import Image

    im = Image.open(path).convert("RGB")
    im.thumbnail((max_side, max_side))
    if flip:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    b = io.BytesIO()
    im.save(b, "JPEG", quality=90)
    return b.getvalue()


def write_images(dest: str, sample_images: list[Path]) -> str:
    """Bundled images as jpg (+ a mirrored ``src.jpg`` for image-edit) with their captions, 4 per shard."""
    with ShardWriter(dest, maxcount=4) as w:
        for n, p in enumerate(sample_images):
            caption = p.with_suffix(".txt").read_text() if p.with_suffix(".txt").exists() else p.stem
            w.write(f"sample_{n:06d}", {"jpg": _jpeg(p), "src.jpg": _jpeg(p, flip=True), "txt": caption.encode()})
    return dest


@pytest.fixture(scope="session")
def image_shards(tmp_path_factory, sample_images) -> str:
    return write_images(str(tmp_path_factory.mktemp("img") / "shards"), sample_images)


def write_videos(dest: str, encode_clip: Callable[..., bytes]) -> str:
    """Four clips (one silent) with captions and camera tracks, 2 per shard; ``encode_clip`` is the
    ``clip_encoder`` fixture."""
    with ShardWriter(dest, maxcount=2) as w:
        for n in range(4):
            frames, size = 36 + 6 * n, (80, 48) if n % 2 == 0 else (64, 64)
            poses, intr = camera_track(frames, *size)
            w.write(
                f"clip_{n:06d}",
                {
                    "mp4": encode_clip(frames=frames, size=size, audio_channels=None if n == 3 else 2),
                    "txt": f"clip {n}".encode(),
                    "poses.npy": npy_bytes(poses),
                    "intrinsics.npy": npy_bytes(intr),
                },
            )
    return dest


@pytest.fixture(scope="session")
def video_shards(tmp_path_factory, clip_encoder) -> str:
    return write_videos(str(tmp_path_factory.mktemp("vid") / "shards"), clip_encoder)


LATENT = (4, 8, 8)
EMB = (7, 16)


def write_latents(root: Path, n: int = 6) -> str:
    """Latent/embedding/KD shards under ``root/shards`` plus ``root/neg_prompt_emb.npy`` ('s parent rule)."""
    import torch

    g = torch.Generator().manual_seed(0)
    dest = str(root / "shards")
    with ShardWriter(dest, maxcount=4) as w:
        for i in range(n):
            latent = torch.randn(LATENT, generator=g)
            w.write(
                f"sample_{i:06d}",
                {
                    "latent.pth": pth_bytes(latent),
                    "noise.pth": pth_bytes(torch.randn(LATENT, generator=g)),
                    "path.pth": pth_bytes(torch.randn((4, *LATENT), generator=g)),
                    "depth_latent.pth": pth_bytes(torch.randn(LATENT, generator=g)),
                    "txt_emb.pth": pth_bytes(torch.randn(EMB, generator=g)),
                    "json": f'{{"score": {i}}}'.encode(),
                },
            )
    np.save(root / "neg_prompt_emb.npy", np.zeros(EMB, dtype=np.float32))
    return dest


@pytest.fixture(scope="session")
def latent_shards(tmp_path_factory) -> str:
    return write_latents(tmp_path_factory.mktemp("lat"))


@pytest.fixture(autouse=True)
def _quiet_worker_count_warning():
    """torch warns when a test asks for more workers than this 2-core machine has."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        yield
