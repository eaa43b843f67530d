"""Weight-free per-sample signals, computed with numpy from one decode of the image.

Every image signal reads the image as a viewer shows it (:func:`fgdata.media.image.decode_display`: EXIF
orientation applied, alpha on white), decoded once per sample. Definitions (also in docs/FORMATS.md):

- ``width``, ``height``: the displayed image's size in pixels; ``aspect``: long side / short side (>= 1).
- The *analysis image*: the image converted to 8-bit luma (Pillow's ``L``: ``(299 R + 587 G + 114 B) / 1000``),
  shrunk with Pillow's ``BOX`` filter so its longer side is at most :data:`ANALYSIS_SIZE` (never enlarged). A fixed
  size makes sharpness comparable across resolutions, and the box filter is the plain average of the pixels it
  covers.
- ``sharpness``: the variance of the 4-neighbour Laplacian (``[[0,1,0],[1,-4,1],[0,1,0]]``, OpenCV's ``ksize=1``)
  over the analysis image's interior pixels, on the 0..255 scale. Higher is sharper.
- ``exposure_dark`` / ``exposure_bright``: the fractions of analysis pixels with luma <= :data:`DARK_MAX` and >=
  :data:`BRIGHT_MIN` (clipped shadows and highlights), 0..1.
- ``uniformity``: the fraction of the whole :data:`BLOCK` x :data:`BLOCK` blocks of the analysis image whose luma
  standard deviation is below :data:`FLAT_STD` (flat: empty backgrounds, banners, blank frames), 0..1.
- ``caption_words`` / ``caption_chars``: the caption's whitespace-separated words and its characters (Unicode code
  points) after stripping surrounding whitespace; a sample without a caption member has 0 of both.

A sample whose media is a video (no image member) is scored on frames: :data:`VIDEO_FRAMES_PER_S` frames per second
of video, at most :data:`VIDEO_MAX_FRAMES` spread evenly over a longer one, each at the middle of its equal share of
the duration (:func:`video_times`), shown as a player shows them (rotation applied). Every per-frame field is
written twice: ``FIELD``, the mean over the frames, and ``FIELD_min``, the smallest (``width``, ``height`` and
``aspect`` are the video's own, once); ``score_frames`` says how many frames were scored. The model signals use
the same frames and the same two reductions.

Every value is a finite JSON number (``width``, ``height`` and the caption counts are integers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from PIL import Image

ANALYSIS_SIZE = 512
DARK_MAX = 8
BRIGHT_MIN = 247
BLOCK = 16
FLAT_STD = 2.0

#: Signal name -> the fields it writes. ``basic`` names every weight-free signal.
WEIGHT_FREE: dict[str, tuple[str, ...]] = {
    "size": ("width", "height", "aspect"),
    "sharpness": ("sharpness",),
    "exposure": ("exposure_dark", "exposure_bright"),
    "uniformity": ("uniformity",),
    "caption": ("caption_words", "caption_chars"),
}
IMAGE_SIGNALS = frozenset({"size", "sharpness", "exposure", "uniformity"})
#: Video frames scored per second of video, and the most scored per video.
VIDEO_FRAMES_PER_S = 1.0
VIDEO_MAX_FRAMES = 16
#: Fields of a video that are the video's own, not reduced over frames.
VIDEO_CONSTANT_FIELDS = frozenset({"width", "height", "aspect"})
#: How many frames a video sample's fields were reduced over.
FRAMES_FIELD = "score_frames"
VIDEO_SAMPLING = (f"videos: {VIDEO_FRAMES_PER_S:g} frame per second of video (at most {VIDEO_MAX_FRAMES}, spread "
                  "evenly), each at the middle of its share of the duration; FIELD is the mean over the frames, "
                  "FIELD_min the smallest")

#: What each weight-free signal records once per dataset (no model: its definition and scale).
DESCRIPTIONS: dict[str, dict[str, Any]] = {
    "size": {"preprocessing": "displayed image (EXIF orientation applied)",
             "scale": "pixels; aspect = long side / short side (>= 1)",
             "videos": VIDEO_SAMPLING},
    "sharpness": {"preprocessing": f"8-bit luma (Pillow L), BOX-shrunk to a longer side <= {ANALYSIS_SIZE}",
                  "scale": "variance of the 4-neighbour Laplacian on 0..255 luma, interior pixels",
                  "videos": VIDEO_SAMPLING},
    "exposure": {"preprocessing": f"8-bit luma (Pillow L), BOX-shrunk to a longer side <= {ANALYSIS_SIZE}",
                 "scale": f"fractions 0..1 of pixels with luma <= {DARK_MAX} (dark) and >= {BRIGHT_MIN} (bright)",
                 "videos": VIDEO_SAMPLING},
    "uniformity": {"preprocessing": f"8-bit luma (Pillow L), BOX-shrunk to a longer side <= {ANALYSIS_SIZE}",
                   "scale": f"fraction 0..1 of whole {BLOCK}x{BLOCK} blocks with luma std < {FLAT_STD}",
                   "videos": VIDEO_SAMPLING},
    "caption": {"preprocessing": "caption member decoded as UTF-8, surrounding whitespace stripped",
                "scale": "words (whitespace-separated) and characters (code points); 0 without a caption"},
}


@dataclass(frozen=True)
class Analysis:
    """One decoded image: its displayed size and its analysis luma (float64 for the statistics)."""

    width: int
    height: int
    luma: np.ndarray


def analyse(data: bytes) -> Analysis:
    """Decode ``data`` once and derive the analysis image (see the module docstring)."""
    from fgdata.media.image import decode_display

    return analyse_image(decode_display(data)[0])


def analyse_image(im: Image.Image) -> Analysis:
    """The analysis image of a decoded, displayed image (a photo or a video frame)."""
    from PIL import Image

    width, height = im.size
    gray = im.convert("L")
    longer = max(width, height)
    if longer > ANALYSIS_SIZE:
        scale = ANALYSIS_SIZE / longer
        gray = gray.resize((max(1, round(width * scale)), max(1, round(height * scale))), Image.Resampling.BOX)
    return Analysis(width, height, np.asarray(gray, dtype=np.float64))


def laplacian_variance(luma: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian over the interior (0.0 for an image under 3x3)."""
    if luma.shape[0] < 3 or luma.shape[1] < 3:
        return 0.0
    lap = (luma[:-2, 1:-1] + luma[2:, 1:-1] + luma[1:-1, :-2] + luma[1:-1, 2:]) - 4.0 * luma[1:-1, 1:-1]
    return float(lap.var())


def flat_fraction(luma: np.ndarray) -> float:
    """Fraction of whole BLOCK x BLOCK blocks with a luma std below FLAT_STD (0.0 when none fits)."""
    rows, cols = luma.shape[0] // BLOCK, luma.shape[1] // BLOCK
    if rows == 0 or cols == 0:
        return 0.0
    blocks = luma[: rows * BLOCK, : cols * BLOCK].reshape(rows, BLOCK, cols, BLOCK)
    std = blocks.std(axis=(1, 3))
    return float((std < FLAT_STD).mean())


def image_fields(a: Analysis, signals: frozenset[str]) -> dict[str, float | int]:
    """The fields of the image signals in ``signals`` for one analysed image."""
    out: dict[str, float | int] = {}
    if "size" in signals:
        out.update(width=a.width, height=a.height, aspect=max(a.width, a.height) / max(1, min(a.width, a.height)))
    if "sharpness" in signals:
        out["sharpness"] = laplacian_variance(a.luma)
    if "exposure" in signals:
        n = max(1, a.luma.size)
        out["exposure_dark"] = float(np.count_nonzero(a.luma <= DARK_MAX)) / n
        out["exposure_bright"] = float(np.count_nonzero(a.luma >= BRIGHT_MIN)) / n
    if "uniformity" in signals:
        out["uniformity"] = flat_fraction(a.luma)
    return out


def video_times(duration: float) -> list[float]:
    """Where a video of ``duration`` seconds is scored: the middle of each of ``n`` equal shares of it."""
    n = max(1, min(VIDEO_MAX_FRAMES, math.floor(duration * VIDEO_FRAMES_PER_S)))
    return [(k + 0.5) * max(duration, 0.0) / n for k in range(n)]


def reduce_frames(per_frame: Sequence[Mapping[str, float | int]]) -> dict[str, float | int]:
    """One video's fields from its frames' (see the module docstring): the mean as ``FIELD``, the smallest as
    ``FIELD_min``, the video's own size once, and :data:`FRAMES_FIELD`. A field some frame lacks is left out."""
    out: dict[str, float | int] = {}
    for name in sorted(set.intersection(*(set(f) for f in per_frame))) if per_frame else []:
        values = [f[name] for f in per_frame]
        if name in VIDEO_CONSTANT_FIELDS:
            out[name] = values[0]
        else:
            out[name] = math.fsum(values) / len(values)
            out[f"{name}_min"] = min(values)
    out[FRAMES_FIELD] = len(per_frame)
    return out


def caption_fields(text: str | None) -> dict[str, float | int]:
    """``caption_words`` and ``caption_chars`` of a caption (None: no caption, 0 and 0)."""
    text = (text or "").strip()
    return {"caption_words": len(text.split()), "caption_chars": len(text)}


def caption_text(members: Mapping[str, bytes], text_ext: str) -> str | None:
    """The caption member as text (undecodable bytes replaced), None when the sample has none."""
    raw = members.get(text_ext)
    return None if raw is None else raw.decode("utf-8", errors="replace")
