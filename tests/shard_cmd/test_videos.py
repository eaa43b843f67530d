"""fgdata shard videos: probe metadata, audio, clips, camera sidecars, truncated input."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fgdata.media import probe_video
from fgdata.shards import discover_shards, iter_samples

pytest.importorskip("av")


def _samples(dest: Path) -> list:
    return [s for shard in discover_shards(str(dest)) for s in iter_samples(shard)]


def _camera(t: int) -> tuple[np.ndarray, np.ndarray]:
    poses = np.tile(np.eye(4, dtype=np.float32), (t, 1, 1))
    poses[:, 0, 3] = np.arange(t)  # a camera moving along x
    intrinsics = np.tile(np.array([50.0, 50.0, 32.0, 32.0], dtype=np.float32), (t, 1))
    return poses, intrinsics


def test_bundled_clip_pass_through_with_probe_and_audio(cli, sample_video: Path, sample_data: Path, tmp_path: Path):
    src = tmp_path / "videos"
    src.mkdir()
    shutil.copyfile(sample_video, src / "bbb.mp4")
    shutil.copyfile(sample_data / "bigbuckbunny.txt", src / "bbb.txt")
    dest = tmp_path / "out"
    cli("shard", "videos", src, dest, "--no-progress")
    (sample,) = _samples(dest)
    assert sample.members["mp4"] == sample_video.read_bytes()
    meta = json.loads(sample.members["json"])["fgdata"]
    assert meta["frame_count"] == 132 and meta["fps"] == 25.0 and (meta["width"], meta["height"]) == (1280, 720)
    assert meta["codec"] == "h264" and meta["keyframe_times"][0] == 0.0 and abs(meta["duration"] - 5.28) < 0.05
    assert meta["audio_codec"] == "aac" and meta["audio_sample_rate"] == 48000 and meta["audio_channels"] >= 1
    assert sample.members["txt"].decode().startswith("A big rabbit")


def test_keyframe_clips_and_camera_slices(cli, keyframed_clip: Path, tmp_path: Path, snapshot):
    src = tmp_path / "videos"
    src.mkdir()
    shutil.copyfile(keyframed_clip, src / "tone.mp4")
    poses, intrinsics = _camera(72)
    np.save(src / "tone.poses.npy", poses)
    np.save(src / "tone.intrinsics.npy", intrinsics)
    dest = tmp_path / "out"
    cli("shard", "videos", src, dest, "--clip-seconds", "1", "--maxcount", "2", "--no-progress")
    samples = _samples(dest)
    assert [s.key for s in samples] == ["sample_000000_0000", "sample_000000_0001", "sample_000000_0002"]
    for j, s in enumerate(samples):
        info = probe_video(s.members["mp4"])
        assert info.frame_count == 24 and info.audio_codec == "aac"
        meta = json.loads(s.members["json"])["fgdata"]
        assert meta["clip"] == {"index": j, "start": float(j), "end": float(j + 1)}
        clip_poses = np.load(io.BytesIO(s.members["poses.npy"]), allow_pickle=False)
        assert clip_poses.shape == (24, 4, 4) and clip_poses[0, 0, 3] == 24 * j
    report = json.loads((dest / "failures.json").read_text())
    assert (report["seen"], report["written"], report["samples"]) == (1, 1, 3)
    again = tmp_path / "again"
    cli("shard", "videos", src, again, "--clip-seconds", "1", "--maxcount", "2", "--no-progress")
    assert snapshot(again) == snapshot(dest)


def test_exact_reencoded_clips_with_fps_and_max_side(cli, keyframed_clip: Path, tmp_path: Path):
    src = tmp_path / "videos"
    src.mkdir()
    shutil.copyfile(keyframed_clip, src / "tone.mp4")
    poses, intrinsics = _camera(72)
    np.save(src / "tone.poses.npy", poses)
    np.save(src / "tone.intrinsics.npy", intrinsics)
    dest = tmp_path / "out"
    cli("shard", "videos", src, dest, "--clip-seconds", "1.5", "--exact", "--fps", "8", "--max-side", "32",
        "--no-progress")
    samples = _samples(dest)
    assert len(samples) == 2
    for s in samples:
        info = probe_video(s.members["mp4"])
        assert (info.width, info.height, info.frame_count, info.fps) == (32, 32, 12, 8.0)
        assert info.audio_codec == "aac"
        k = np.load(io.BytesIO(s.members["intrinsics.npy"]), allow_pickle=False)
        assert k.shape == (12, 4) and np.allclose(k[0], [25.0, 25.0, 16.0, 16.0])


def test_wrong_camera_length_and_truncated_video_are_rejected(cli, keyframed_clip: Path, sample_video, tmp_path):
    src = tmp_path / "videos"
    src.mkdir()
    shutil.copyfile(keyframed_clip, src / "good.mp4")
    shutil.copyfile(keyframed_clip, src / "badcam.mp4")
    poses, intrinsics = _camera(71)  # the clip has 72 frames
    np.save(src / "badcam.poses.npy", poses)
    np.save(src / "badcam.intrinsics.npy", intrinsics)
    data = sample_video.read_bytes()
    (src / "cut.mp4").write_bytes(data[: len(data) // 3])
    dest = tmp_path / "out"
    result = cli("shard", "videos", src, dest, "--no-progress", "--json")
    doc = json.loads(result.stdout)
    assert (doc["seen"], doc["written"], doc["failed"]) == (3, 1, 2)
    report = json.loads((dest / "failures.json").read_text())
    reasons = {f["input"]: f["reason"] for f in report["failures"]}
    assert reasons["badcam.mp4"].startswith("camera:") and "72" in reasons["badcam.mp4"]
    assert reasons["cut.mp4"].split(":")[0] in ("video-decode", "video-truncated")
    assert [json.loads(s.members["json"])["fgdata"]["source"] for s in _samples(dest)] == ["good.mp4"]


def test_quickstart_videos(tmp_path: Path):
    from fgdata.sharding.job import quickstart_videos

    out = quickstart_videos(tmp_path)
    assert out["samples"] == out["written"] == out["seen"] == 1 and out["failed"] == 0
    assert Path(out["shards"][0]).is_file()


def test_camera_estimate_without_vipe_says_how_to_install(cli, sample_video, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    result = cli("camera", "estimate", sample_video, expect=1)
    assert "pip install" in str(result.exception) and "vipe" in str(result.exception)


def test_clips_without_a_caption_are_counted_per_input_and_require_caption_fails_them(cli, sample_video: Path,
                                                                                       sample_data: Path, tmp_path: Path):
    """One captioned and one uncaptioned copy of the clip: "no caption" counts the uncaptioned input; with
    --require-caption it fails with reason caption and the other is written."""
    src = tmp_path / "videos"
    src.mkdir()
    for name in ("a.mp4", "b.mp4"):
        shutil.copyfile(sample_video, src / name)
    shutil.copyfile(sample_data / "bigbuckbunny.txt", src / "a.txt")
    doc = json.loads(cli("shard", "videos", src, tmp_path / "out", "--no-progress", "--json").stdout)
    assert (doc["written"], doc["uncaptioned"]) == (2, 1)
    strict = json.loads(cli("shard", "videos", src, tmp_path / "strict", "--require-caption", "--no-progress",
                            "--json").stdout)
    assert (strict["written"], strict["failed"], strict["failed_by_reason"], strict["uncaptioned"]) == \
        (1, 1, {"caption": 1}, 0)
    assert {json.loads(s.members["json"])["fgdata"]["source"] for s in _samples(tmp_path / "strict")} == {"a.mp4"}
