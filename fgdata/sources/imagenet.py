"""ImageNet-style image trees: locate the train split, enumerate images in each tool's order, derive labels.

The EDM and EDM2 tools order files differently (path components vs plain strings, I-2 and I-7); both orders
are produced here from one directory walk so a fused pass can use them when they agree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePath

from fgdata.errors import FgdataError

KAGGLE_TRAIN = Path("ILSVRC/Data/CLS-LOC/train")


def resolve_train_dir(source: str | os.PathLike[str]) -> Path:
    """Accept the unzipped Kaggle root or the ``train`` folder itself (I-1)."""
    root = Path(source).expanduser()
    if not root.is_dir():
        raise FgdataError(f"{source}: ImageNet source is not a directory")
    if (root / KAGGLE_TRAIN).is_dir():
        return (root / KAGGLE_TRAIN).resolve()
    if any(entry.is_dir() for entry in os.scandir(root)):
        return root.resolve()
    raise FgdataError(f"{source}: neither a Kaggle root with {KAGGLE_TRAIN} nor a folder of class folders")


def _image_extensions() -> frozenset[str]:
    from PIL import Image

    Image.init()
    return frozenset(Image.EXTENSION)


def list_images(root: Path) -> list[str]:
    """Relative POSIX paths of every file whose last dot-suffix Pillow knows (I-2), unordered."""
    exts = _image_extensions()
    found: list[str] = []
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(root / rel if rel else root) as it:
            for entry in it:
                name = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_dir():
                    stack.append(name)
                elif entry.is_file() and "." + entry.name.split(".")[-1].lower() in exts:
                    found.append(name)
    if not found:
        raise FgdataError(f"{root}: no images found")
    return found


def edm_order(names: list[str]) -> list[str]:
    """Path-object order: component by component (I-2)."""
    return sorted(names, key=lambda n: PurePath(n).parts)


def edm2_order(names: list[str]) -> list[str]:
    """Plain string order of full paths (I-7); the common root prefix does not change it."""
    return sorted(names)


def folder_labels(root: Path, names: list[str]) -> dict[str, int]:
    """Z-7: the folder's ``dataset.json`` if present, else the sorted index of each top-level directory."""
    meta = root / "dataset.json"
    if meta.is_file():
        try:
            data = json.loads(meta.read_text())["labels"]
        except (ValueError, KeyError, TypeError) as exc:
            raise FgdataError(f"{meta}: unreadable labels ({exc})") from None
        if data is not None:
            return {str(name): label for name, label in data}
    tops = {name: (name.split("/")[0] if "/" in name else "") for name in names}
    index = {top: i for i, top in enumerate(sorted(set(tops.values())))}
    if len(index) < 2:
        return {}
    return {name: index[top] for name, top in tops.items()}
