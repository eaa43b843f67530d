"""``prepare imagenet-64`` and the pixel step of ``prepare imagenet-256``.

Each source JPEG is decoded once per pass; when the EDM and EDM2 orders agree (always for ImageNet), one pass
feeds both 64-px zips, which is where most of the speed-up over running the two reference tools comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from fgdata.jobs.driver import RunSettings
from fgdata.media.errors import ImageDecodeError
from fgdata.media.image import pixel_limit
from fgdata.prepare.build import Block, ZipJob, ZipSummary, ZipTarget, build_zips
from fgdata.prepare.options import Fingerprint, ImagenetOptions
from fgdata.prepare.paths import IMAGENET64_EDMV2_ZIP, IMAGENET64_ZIP, IMAGENET256_RGB_ZIP, resolve_data_root
from fgdata.prepare.transforms import CROPS, open_rgb, png_bytes
from fgdata.sources.folder import printable_name
from fgdata.sources.imagenet import (edm2_order, edm_order, escaped_links, folder_labels, list_images,
                                     resolve_train_dir)

_PATHS: list[str] = []
_REFUSED: dict[int, str] = {}
_KINDS: list[tuple[str, int]] = []
_STRICT = False
_MAX_PIXELS: int | None = None
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError, ImageDecodeError)


def _init(paths: list[str], refused: dict[int, str], kinds: list[tuple[str, int]], strict: bool,
          max_pixels: int | None) -> None:
    global _PATHS, _REFUSED, _KINDS, _STRICT, _MAX_PIXELS
    _PATHS, _REFUSED, _KINDS, _STRICT, _MAX_PIXELS = paths, refused, kinds, strict, max_pixels


def _convert(_: None, block: Block) -> list[tuple[list[bytes] | None, str | None]]:
    out: list[tuple[list[bytes] | None, str | None]] = []
    for i in range(*block.span):
        if i in _REFUSED:  # never opened
            out.append((None, _REFUSED[i]))
            continue
        try:
            with pixel_limit(_MAX_PIXELS):
                img, mode = open_rgb(_PATHS[i], strict=_STRICT)
            out.append(([png_bytes(CROPS[kind](img, size)) for kind, size in _KINDS], mode))
        except _DECODE_ERRORS as exc:
            if _STRICT:
                raise
            out.append((None, f"{type(exc).__name__}: {exc}"))
    return out


def _run(targets: list[ZipTarget], tree: _Tree, names: list[str], kinds: list[tuple[str, int]], *,
         options: ImagenetOptions, dataset: str, run: RunSettings) -> list[ZipSummary]:
    paths = [str(tree.root / name) for name in names]
    refused = {i: tree.refused[name] for i, name in enumerate(names) if name in tree.refused}
    fingerprint = Fingerprint.of(options, dataset=dataset, source=str(tree.root), inputs=len(names))
    job = ZipJob(f"prepare {dataset}", targets, len(names), _convert, fingerprint, describe=lambda j: printable_name(paths[j]),
                 block=16, initializer=_init, initargs=(paths, refused, kinds, options.strict, options.max_pixels))
    return build_zips(job, run)


@dataclass(frozen=True)
class _Tree:
    """The train folder, its images (relative names), their class labels, and the images refused as links out."""

    root: Path
    names: list[str]
    labels: dict[str, int]
    refused: dict[str, str]


def _labelled_images(options: ImagenetOptions) -> _Tree:
    root = resolve_train_dir(options.imagenet_source, options.allow_any_tree)
    names = list_images(root)
    refused = {} if options.follow_symlinks else escaped_links(root, names)
    return _Tree(root, names, folder_labels(root, names), refused)


def prepare_imagenet64(options: ImagenetOptions, run: RunSettings = RunSettings()) -> list[ZipSummary]:
    """Write ``imagenet-64x64.zip`` (EDM crop) and ``imagenet-64x64-edmv2.zip`` (ADM crop)."""
    out = resolve_data_root(options.data_root)  # a bad DATA_ROOT_DIR fails before the tree is listed
    tree = _labelled_images(options)
    labels, first = tree.labels, options.max_images
    edm_names, edm2_names = edm_order(tree.names)[:first], edm2_order(tree.names)[:first]
    edm = ZipTarget(out / IMAGENET64_ZIP, [labels.get(n) for n in edm_names], "edm center-crop 64 LANCZOS")
    edm2 = ZipTarget(out / IMAGENET64_EDMV2_ZIP, [labels.get(n) for n in edm2_names], "adm center-crop 64")
    common: dict[str, Any] = {"options": options, "dataset": "imagenet-64", "run": run}
    if edm_names == edm2_names:
        return _run([edm, edm2], tree, edm_names, [("edm", 64), ("adm", 64)], **common)
    return (_run([edm], tree, edm_names, [("edm", 64)], **common)
            + _run([edm2], tree, edm2_names, [("adm", 64)], **common))


def prepare_imagenet256_rgb(options: ImagenetOptions, run: RunSettings = RunSettings()) -> list[ZipSummary]:
    """Write ``imagenet_256_rgb.zip``: the EDM2 flavour at 256 px, kept for FID statistics."""
    out = resolve_data_root(options.data_root)  # a bad DATA_ROOT_DIR fails before the tree is listed
    tree = _labelled_images(options)
    ordered = edm2_order(tree.names)[:options.max_images]
    target = ZipTarget(out / IMAGENET256_RGB_ZIP, [tree.labels.get(n) for n in ordered], "adm center-crop 256")
    return _run([target], tree, ordered, [("adm", 256)], options=options, dataset="imagenet-256", run=run)
