"""Shot detection and motion on videos whose ground truth the test builds (tests/scenes_synth.py)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

from fgdata.media.scenes import MV_FIELDS, CutSettings, _motion_vectors, analyse_video, detect_transitions, scenes_from
from fgdata.producers.scenes import SceneOptions, plan_clips

pytest.importorskip("av")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scenes_synth import EDITED, build, check_transitions, encode, photo, view  # noqa: E402

SIZE = (256, 144)
@pytest.fixture(scope="module")
def edited():
    truth = build(SIZE, EDITED)
    return truth, analyse_video(encode(truth.frames))


def test_cuts_fades_dissolves_found_flashes_pans_zooms_ignored(edited):
    truth, analysis = edited
    assert len(analysis.times) == len(truth.frames)
    # x264's B-frames that no frame references are not decoded; at most two in a row are skipped
    assert len(analysis.sample) < len(truth.frames) and np.diff(analysis.sample).max() <= 3
    check_transitions(truth, detect_transitions(analysis, CutSettings()))


def test_transition_frames_belong_to_no_scene(edited):
    truth, analysis = edited
    scenes = scenes_from(detect_transitions(analysis, CutSettings()), len(analysis.times))
    covered = {i for s in scenes for i in range(s.first, s.last + 1)}
    for _, first, last in truth.soft:
        assert not covered & set(range(first + 1, last))  # a fade's dark frames, a dissolve's blends
    assert [s.before for s in scenes][:3] == ["start", "hard", "dissolve"]
    assert [s.after for s in scenes][-1] == "end"


def test_min_clip_and_max_clip(edited):
    truth, analysis = edited
    frame = 1 / analysis.fps
    scenes = scenes_from(detect_transitions(analysis, CutSettings()), len(analysis.times))
    clips, dropped, method = plan_clips(analysis, SceneOptions(min_clip_seconds=1.7))
    long_enough = [s for s in scenes if analysis.times[s.last] - analysis.times[s.first] + frame >= 1.7 - 1e-6]
    assert 0 < len(clips) == len(long_enough) < len(scenes) and method == "motion-vectors"
    assert len(dropped) == len(scenes) - len(clips) and all(d.startswith("too-short") for d in dropped)
    clips, dropped, _ = plan_clips(analysis, SceneOptions(min_clip_seconds=0.6, max_clip_seconds=1.0))
    for c in clips:
        length = analysis.times[c.last] - analysis.times[c.first] + frame
        assert 0.6 - 1e-6 <= length <= 1.0 + 1e-6
    assert any(c.before == "split" for c in clips) and any(c.after == "split" for c in clips)


def _talking_head(n: int) -> list[np.ndarray]:
    """A still photo with a small window of moving texture in the middle (a face talking)."""
    still = view(photo(3, SIZE), SIZE, 4, 4)
    other = photo(0, SIZE)
    frames = []
    for t in range(n):
        f = still.copy()
        f[48:96, 104:152] = view(other, (48, 48), 10 + 2 * (t % 6), 10)
        frames.append(f)
    return frames


def test_motion_orders_static_talking_slow_fast():
    still = photo(2, SIZE)
    shots = [[view(still, SIZE, 4, 4)] * 40, _talking_head(40),
             build(SIZE, [("shot", 4, 40, 1.0)]).frames, build(SIZE, [("shot", 5, 40, 8.0)]).frames]
    analysis = analyse_video(encode([f for s in shots for f in s]))
    clips, dropped, method = plan_clips(analysis, SceneOptions())
    assert len(clips) == 4 and not dropped and method == "motion-vectors"
    means = [c.motion_mean for c in clips]
    assert means == sorted(means) and len(set(means)) == 4, means
    assert all(c.motion_min_patch <= c.motion_mean * (1 + 1e-5) for c in clips)  # float32 sums


def test_variable_frame_rate_times_and_cut():
    frames = build(SIZE, [("shot", 0, 30, 1.0), ("cut",), ("shot", 1, 30, 1.0)]).frames
    steps = [0.04 if i % 3 else 0.1 for i in range(len(frames))]
    times = list(np.cumsum([0.0] + steps[:-1]))
    analysis = analyse_video(encode(frames, times=times))
    assert np.allclose(analysis.times, times, atol=2e-3)
    hard = [t.first for t in detect_transitions(analysis, CutSettings()) if t.kind == "hard"]
    assert len(hard) == 1 and abs(hard[0] - 30) <= 1


def test_intra_only_mjpeg_motion_from_frame_differences():
    truth = build(SIZE, [("shot", 0, 30, 0.0), ("cut",), ("shot", 1, 30, 4.0)])
    analysis = analyse_video(encode(truth.frames, codec="mjpeg"))
    assert analysis.codec == "mjpeg" and not analysis.has_mvs
    assert analysis.sample.tolist() == list(range(len(truth.frames)))  # intra-only: every frame is decoded
    clips, _, method = plan_clips(analysis, SceneOptions())
    assert method == "frame-diff" and len(clips) == 2 and abs(clips[1].first - 30) <= 1
    assert clips[0].motion_mean < clips[1].motion_mean


def test_trim_and_pieces_of_the_maximum_length(edited):
    truth, analysis = edited
    frame = 1 / analysis.fps
    scenes = scenes_from(detect_transitions(analysis, CutSettings()), len(analysis.times))
    clips, _, _ = plan_clips(analysis, SceneOptions(trim_seconds=0.2))
    assert len(clips) == len(scenes)
    for c, s in zip(clips, scenes):  # 0.2 s (5 frames) off both ends of every shot
        assert (c.first - s.first, s.last - c.last) == (5, 5)
    # 1.6 s shots with pieces of 1.0-1.5 s: equal halves (0.8 s) would be too short, so one 1.48 s piece each
    clips, dropped, _ = plan_clips(analysis, SceneOptions(min_clip_seconds=1.0, max_clip_seconds=1.5))
    for c in clips:
        assert 1.0 - 1e-6 <= analysis.times[c.last] - analysis.times[c.first] + frame <= 1.5 + 1e-6
    assert any("the rest of a shot" in d for d in dropped)


def test_motion_vectors_are_read_without_holding_the_frame():
    """Each frame's motion vectors come out as copies, and reading them leaves no reference to the frame:
    ``frame.side_data`` caches a container that points back at the frame (a cycle), which kept every decoded
    picture out of the decoder's buffer pool until the garbage collector ran."""
    import av

    data = encode(build(SIZE, [("shot", 0, 12, 2.0)]).frames)
    read = 0
    with av.open(io.BytesIO(data)) as container:
        vs = container.streams.video[0]
        vs.codec_context.options = {"flags2": "+export_mvs"}
        for frame in container.decode(vs):
            before = sys.getrefcount(frame)
            fields = _motion_vectors(frame)
            assert sys.getrefcount(frame) == before
            if fields is not None:
                read += 1
                assert sorted(fields) == sorted(MV_FIELDS)
                assert all(a.base is None and len(a) for a in fields.values())
    assert read  # the pan's predicted frames have motion vectors
