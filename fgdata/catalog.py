"""Names that the preparing, loading and reporting sides of fgdata share: preset texts, the ``score`` filter's
rule, dataset locations, the bundled sample media, the names of the files a job leaves beside its outputs, and the
mark of an option that does not change output bytes.

Kept apart from all sides so that none imports another: ``fgdata.encode`` embeds the same negative prompts
that ``presets_map`` delivers, ``fgdata report`` counts what the loaders' ``score`` filter keeps by the
filter's own rule, and ``fgdata prepare`` (and ``fid-refs``) find the zips exactly where the class-conditional
loader configs look for them.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from fgdata.errors import FgdataError

#: Field metadata of an options dataclass: this option does not change the output bytes, so it stays out of a
#: job's resume record (:mod:`fgdata.jobs.options`); here because option classes below the job core (a URL job's
#: download settings, in ``fgdata.storage.http``) declare it too.
RUNTIME = {"runtime": True}

#: The one failure report every writing command leaves beside its outputs (:mod:`fgdata.jobs.report` writes it) and
#: its ``format`` field; ``fgdata report`` reads the filter and selection counts from it.
FAILURES_FILE = "failures.json"
FAILURES_FORMAT = "fgdata.failures"

#: A URL job's successes and failures per shard (:mod:`fgdata.jobs.stats` writes it) and its ``format`` field;
#: ``fgdata report`` shows its totals.
STATS_FILE = "shard_stats.json"
STATS_FORMAT = "fgdata.shard-stats"

#: The sample media that ships inside the package (photos, a clip, captions, their licences in ATTRIBUTION.md):
#: ``fgdata quickstart`` runs on it from an installed wheel, and the tests use it.
SAMPLE_DATA = Path(__file__).resolve().parent / "sample_data"

#: Wan's English negative prompt, byte-exact (sha256 e488b060...2fac, pinned by a test).
NEG_PROMPT_WAN = (
    "Bright tones, overexposed, static, blurred details, subtitles, style, works, paintings, images, "
    "static, overall gray, worst quality, low quality, JPEG compression residue, ugly, incomplete, "
    "extra fingers, poorly drawn hands, poorly drawn faces, deformed, disfigured, misshapen limbs, "
    "fused fingers, still picture, messy background, three legs, many people in the background, "
    "walking backwards"
)

#: Cosmos's negative prompt, byte-exact (sha256 6d7ca930...239f, pinned by a test).
NEG_PROMPT_COSMOS = (
    "The video captures a series of frames showing ugly scenes, static with no motion, motion blur, "
    "over-saturation, shaky footage, low resolution, grainy texture, pixelated images, poorly lit areas, "
    "underexposed and overexposed scenes, poor color balance, washed out colors, choppy sequences, "
    "jerky movements, low frame rate, artifacting, color banding, unnatural transitions, outdated "
    "special effects, fake elements, unconvincing visuals, poorly edited content, jump cuts, visual "
    "noise, and flickering. Overall, the video is of poor quality."
)

# The four texts below are fgdata-defined, NOT verified against the reference: the
# reference publishes only their names. Override them by assigning to
# PRESET_CONSTANTS[name] before constructing a loader.

#: fgdata-defined, not verified against the reference.
NEG_PROMPT_LINGBOT_WORLD = (
    "static scene, frozen camera, jittery camera motion, inconsistent geometry, warped structures, "
    "flickering textures, motion blur, low resolution, blurry details, overexposed, underexposed, "
    "subtitles, watermark, text overlay, worst quality, low quality, compression artifacts, "
    "deformed objects, duplicated objects, unnatural physics"
)

#: fgdata-defined, not verified against the reference.
NEG_PROMPT_COSMOS3 = (
    "The video is of poor quality: ugly and static scenes with no motion, motion blur, over-saturation, "
    "shaky footage, low resolution, grainy or pixelated texture, poor lighting, poor color balance, "
    "choppy or jerky movement, low frame rate, artifacts, color banding, unnatural transitions, "
    "fake or unconvincing visuals, jump cuts, visual noise and flickering."
)

#: fgdata-defined, not verified against the reference.
NEG_PROMPT_LTX2 = (
    "worst quality, low quality, blurry, jittery, distorted, inconsistent motion, static frames, "
    "flickering, compression artifacts, watermark, subtitles, text, deformed faces, deformed hands, "
    "extra limbs, out of sync audio, muffled audio, distorted audio, background noise, silence"
)

#: fgdata-defined, not verified against the reference.
NEG_PROMPT_LTX2_SHORT = "worst quality, blurry, jittery, distorted, watermark, out of sync audio"

#: Name -> text for ``presets_map``. Entries marked fgdata-defined above may be overridden.
PRESET_CONSTANTS: dict[str, str] = {
    "empty_string": "",
    "neg_prompt_wan": NEG_PROMPT_WAN,
    "neg_prompt_cosmos": NEG_PROMPT_COSMOS,
    "neg_prompt_lingbot_world": NEG_PROMPT_LINGBOT_WORLD,
    "neg_prompt_cosmos3": NEG_PROMPT_COSMOS3,
    "neg_prompt_ltx2": NEG_PROMPT_LTX2,
    "neg_prompt_ltx2_short": NEG_PROMPT_LTX2_SHORT,
}

#: The presets whose texts fgdata wrote itself (documented as unverified).
FGDATA_DEFINED_PRESETS = frozenset(
    {"neg_prompt_lingbot_world", "neg_prompt_cosmos3", "neg_prompt_ltx2", "neg_prompt_ltx2_short"}
)


#: The ``score`` filter's threshold when ``presets_filter={"score": {}}`` names none.
SCORE_THRESHOLD = 5.0


def score_verdict(value: object, score_key: str, threshold: float) -> str | None:
    """The ``score`` filter's rule for the value of a sample's json field ``score_key``: None keeps the sample,
    else why it is dropped (not a number, NaN, or below ``threshold``). A sample without the field never gets here:
    it is kept. The loaders' filter applies it to each sample, ``fgdata report`` to the values it collected."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return f"score: non-numeric {score_key!r}"
    return None if value >= threshold else "score: below threshold"


#: Output zips per dataset name, relative to the data root (hyphens for 64, underscores for 256).
DATASET_ZIPS: dict[str, tuple[str, ...]] = {
    "cifar10": ("cifar10/cifar10-32x32.zip",),
    "imagenet-64": ("imagenet-64/imagenet-64x64.zip", "imagenet-64/imagenet-64x64-edmv2.zip"),
    "imagenet-256": ("imagenet-256/imagenet_256_rgb.zip", "imagenet-256/imagenet_256_sd.zip"),
}

CIFAR10_ZIP = DATASET_ZIPS["cifar10"][0]
IMAGENET64_ZIP, IMAGENET64_EDMV2_ZIP = DATASET_ZIPS["imagenet-64"]
IMAGENET256_RGB_ZIP, IMAGENET256_SD_ZIP = DATASET_ZIPS["imagenet-256"]


def output_root_dir() -> Path:
    """``$FASTGEN_OUTPUT_ROOT`` (default ``FASTGEN_OUTPUT``), made absolute so logs say where data went."""
    return Path(os.environ.get("FASTGEN_OUTPUT_ROOT") or "FASTGEN_OUTPUT").expanduser().resolve()


def data_root_dir() -> Path:
    """``$DATA_ROOT_DIR``, defaulting to ``$FASTGEN_OUTPUT_ROOT/DATA`` as the reference does, absolute."""
    value = os.environ.get("DATA_ROOT_DIR")
    if value:
        if value.startswith("s3://"):
            raise FgdataError(f"DATA_ROOT_DIR={value} is an s3:// URL; set S3_DATA_ROOT_DIR for the S3 root instead")
        return Path(value).expanduser().resolve()
    return output_root_dir() / "DATA"


def resolve_data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """``root`` made absolute, or the data root when None: where a prepare call writes its zips."""
    return Path(root).expanduser().resolve() if root is not None else data_root_dir()


def s3_data_root_dir() -> str:
    """``$S3_DATA_ROOT_DIR`` (default ``s3://data``); a separate variable so a local data root never leaks into S3 paths."""
    value = os.environ.get("S3_DATA_ROOT_DIR") or "s3://data"
    if not value.startswith("s3://") or len(value.rstrip("/")) <= len("s3://"):
        raise FgdataError(f"S3_DATA_ROOT_DIR={value} must be an s3:// URL such as s3://data")
    return value.rstrip("/")


def dataset_zip_paths(dataset: str, root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Absolute paths of the zips a dataset name produces, under ``root`` or the data root."""
    if dataset not in DATASET_ZIPS:
        raise FgdataError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASET_ZIPS)}")
    base = resolve_data_root(root)
    return [base / rel for rel in DATASET_ZIPS[dataset]]
