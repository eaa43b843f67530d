"""An independent, single-process re-implementation of the EDM / EDM2 dataset tools' image path.

Used as the pixel reference by the tests and as the baseline loop by benchmarks/bench_prepare.py. It follows
the tools' algorithms step by step (numpy slicing, zipfile writes) and deliberately shares no code with
fgdata.prepare.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import PIL.Image


def is_image(path: str) -> bool:
    PIL.Image.init()
    return "." + str(path).split(".")[-1].lower() in PIL.Image.EXTENSION


def edm_files(source: str) -> list[str]:
    """EDM: pathlib rglob, sorted as Path objects."""
    return [str(p) for p in sorted(Path(source).rglob("*")) if is_image(p) and os.path.isfile(p)]


def edm2_files(source: str) -> list[str]:
    """EDM2: recursive scandir, sorted as strings."""
    found = []
    for root, _dirs, files in os.walk(source):
        found += [os.path.join(root, f) for f in files]
    return sorted(f for f in found if is_image(f))


def toplevel_labels(source: str, files: list[str]) -> dict[str, int]:
    rel = {f: os.path.relpath(f, source).replace("\\", "/") for f in files}
    top = {f: (r.split("/")[0] if "/" in r else "") for f, r in rel.items()}
    index = {t: i for i, t in enumerate(sorted(set(top.values())))}
    return {f: index[t] for f, t in top.items()} if len(index) > 1 else {}


def edm_crop(img: np.ndarray, size: int) -> np.ndarray:
    """EDM center-crop on the raw array: slice, replicate gray, LANCZOS."""
    crop = min(img.shape[:2])
    img = img[(img.shape[0] - crop) // 2:(img.shape[0] + crop) // 2, (img.shape[1] - crop) // 2:(img.shape[1] + crop) // 2]
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    return np.array(PIL.Image.fromarray(img, "RGB").resize((size, size), PIL.Image.Resampling.LANCZOS))


def adm_crop(arr: np.ndarray, size: int) -> np.ndarray:
    """ADM crop: halve with BOX while possible, BICUBIC to the short side, slice the centre."""
    pil = PIL.Image.fromarray(arr)
    while min(*pil.size) >= 2 * size:
        pil = pil.resize(tuple(x // 2 for x in pil.size), resample=PIL.Image.Resampling.BOX)
    scale = size / min(*pil.size)
    pil = pil.resize(tuple(round(x * scale) for x in pil.size), resample=PIL.Image.Resampling.BICUBIC)
    arr = np.array(pil)
    y, x = (arr.shape[0] - size) // 2, (arr.shape[1] - size) // 2
    return arr[y:y + size, x:x + size]


def load_edm(path: str) -> np.ndarray:
    """EDM decodes without conversion (valid for RGB and L sources only)."""
    return np.array(PIL.Image.open(path))


def load_edm2(path: str) -> np.ndarray:
    return np.array(PIL.Image.open(path).convert("RGB"))


def write_zip(dest: str, images) -> None:
    """The tools' writer loop: one uncompressed PNG per image via zipfile, dataset.json last."""
    labels = []
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as zf:
        for idx, (img, label) in enumerate(images):
            s = f"{idx:08d}"
            name = f"{s[:5]}/img{s}.png"
            channels = img.shape[2] if img.ndim == 3 else 1
            buf = io.BytesIO()
            PIL.Image.fromarray(img, {1: "L", 3: "RGB"}[channels]).save(buf, format="png", compress_level=0, optimize=False)
            zf.writestr(name, buf.getbuffer())
            labels.append([name, label] if label is not None else None)
        zf.writestr("dataset.json", json.dumps({"labels": labels if all(x is not None for x in labels) else None}))


def convert_folder(source: str, dest: str, flavour: str, size: int, max_images: int | None = None) -> None:
    """One tool run over an image folder: ``edm`` (center-crop) or ``edm2`` (center-crop-dhariwal)."""
    files = (edm_files if flavour == "edm" else edm2_files)(source)[:max_images]
    labels = toplevel_labels(source, files)
    load, crop = (load_edm, edm_crop) if flavour == "edm" else (load_edm2, adm_crop)
    write_zip(dest, ((crop(load(f), size), labels.get(f)) for f in files))


def read_cifar(tarball: str) -> tuple[np.ndarray, list[int]]:
    """The EDM tool's CIFAR reader: stream the tar.gz, unpickle each training batch, NCHW -> NHWC.

    Unpickling is fine here: this reference only ever reads tarballs the tests and benchmarks built.
    """
    import pickle
    import tarfile

    images, labels = [], []
    with tarfile.open(tarball, "r:gz") as tar:
        for batch in range(1, 6):
            with tar.extractfile(f"cifar-10-batches-py/data_batch_{batch}") as fh:
                data = pickle.load(fh, encoding="latin1")
            images.append(data["data"].reshape(-1, 3, 32, 32))
            labels.extend(data["labels"])
    return np.concatenate(images).transpose(0, 2, 3, 1), labels


def convert_cifar(images: np.ndarray, labels: list[int], dest: str) -> None:
    """The CIFAR loop over already-decoded rows (NHWC uint8)."""
    write_zip(dest, ((img, int(lab)) for img, lab in zip(images, labels)))
