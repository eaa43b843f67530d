"""Fixtures for the shard commands: folders of real media (and corrupt copies), a keyframed clip, one Ray instance."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))  # faultkit, the fault-injection helpers
from keyframedclip import make_clip  # noqa: E402


@pytest.fixture
def image_folder(tmp_path: Path, sample_images: list[Path], sample_data: Path) -> Path:
    """The bundled photos with their captions, one in a subfolder, one with a metadata sidecar."""
    src = tmp_path / "photos"
    (src / "sub").mkdir(parents=True)
    for img in sample_images:
        dest = src / "sub" if img.stem == "rocket" else src
        shutil.copyfile(img, dest / img.name)
        shutil.copyfile(sample_data / f"{img.stem}.txt", dest / f"{img.stem}.txt")
    (src / "sub" / "rocket.json").write_text('{"score": 6.5, "tags": ["space"]}')
    return src


@pytest.fixture
def corrupt_folder(image_folder: Path, sample_data: Path) -> Path:
    """image_folder plus a truncated JPEG and a text file named .jpg."""
    data = (sample_data / "hubble_deep_field.jpg").read_bytes()
    (image_folder / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (image_folder / "notes.jpg").write_text("this is not an image\n")
    return image_folder


@pytest.fixture(scope="session")
def keyframed_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_clip(tmp_path_factory.mktemp("clip") / "tone.mp4")


def _invoke(*args: str, expect: int = 0):
    from typer.testing import CliRunner

    from fgdata.cli.main import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == expect, (result.output, result.exception)
    return result


@pytest.fixture
def cli():
    """Run ``fgdata ARGS`` in-process and assert the exit code."""
    return _invoke


def _snapshot(dest: Path) -> dict[str, bytes]:
    """Every shard and side file of a shard folder, by name (for byte-identical comparisons)."""
    return {p.name: p.read_bytes() for p in sorted(dest.iterdir()) if p.is_file()}


@pytest.fixture
def snapshot():
    return _snapshot
