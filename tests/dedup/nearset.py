"""A generated near-duplicate set from the repository's sample photos, shared by the tests and
benchmarks/bench_dedup.py.

Distinct photos: each sample photo whole and its four quadrants (35). Copies of each: resized to half size,
re-encoded at JPEG quality 60, cropped by 5 % (2.5 % off each side), brightened by 10 %, and, for every
fifth photo, an exact copy of the bytes. Each sample's json names its group and kind, the ground truth."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageEnhance

from fgdata.catalog import SAMPLE_DATA as DATA
KINDS = ("original", "resized", "jpeg60", "crop5", "bright10", "exact")


def _jpeg(im: Image.Image, quality: int = 95) -> bytes:
    buf = io.BytesIO()
    im.convert("RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def distinct_photos() -> list[Image.Image]:
    out = []
    for path in sorted(p for p in DATA.iterdir() if p.suffix.lower() in {".jpg", ".png"}):
        im = Image.open(path).convert("RGB")
        out.append(im)
        w, h = im.size
        out += [im.crop((x, y, x + w // 2, y + h // 2)) for y in (0, h // 2) for x in (0, w // 2)]
    return out


@dataclass(frozen=True)
class Item:
    group: int
    kind: str
    data: bytes


def near_duplicate_set() -> list[Item]:
    """Originals first (so ``--keep first`` keeps them), then the copies, group by group."""
    photos = distinct_photos()
    originals = [Item(g, "original", _jpeg(im)) for g, im in enumerate(photos)]
    copies = []
    for g, im in enumerate(photos):
        w, h = im.size
        dx, dy = round(w * 0.025), round(h * 0.025)
        copies += [Item(g, "resized", _jpeg(im.resize((w // 2, h // 2), Image.Resampling.LANCZOS))),
                   Item(g, "jpeg60", _jpeg(Image.open(io.BytesIO(originals[g].data)), 60)),
                   Item(g, "crop5", _jpeg(im.crop((dx, dy, w - dx, h - dy)))),
                   Item(g, "bright10", _jpeg(ImageEnhance.Brightness(im).enhance(1.1)))]
        if g % 5 == 0:
            copies.append(Item(g, "exact", originals[g].data))
    return originals + copies


def write_shards(items: list[Item], dest: Path, maxcount: int = 40) -> None:
    from fgdata.shards import ShardWriter

    writer = ShardWriter(str(dest), maxcount=maxcount)
    for n, item in enumerate(items):
        writer.write(f"{n:06d}", {"jpg": item.data, "json": json.dumps({"group": item.group, "kind": item.kind,
                                                                          "quality": n % 7}).encode()})
    writer.close()


def score(items: list[Item], dropped: dict[int, int]) -> dict[str, float]:
    """Recall per copy kind (copies dropped as a copy of their own group) and precision (drops that name their
    own group) from ``dropped``: item index -> index of the kept item it duplicates."""
    out: dict[str, float] = {}
    for kind in KINDS[1:]:
        idx = [i for i, it in enumerate(items) if it.kind == kind]
        hit = sum(1 for i in idx if i in dropped and items[dropped[i]].group == items[i].group)
        out[f"recall_{kind}"] = hit / len(idx)
    right = sum(1 for i, j in dropped.items() if items[i].group == items[j].group)
    out["precision"] = right / len(dropped) if dropped else 1.0
    out["dropped"] = len(dropped)
    out["distinct_dropped"] = sum(1 for i in dropped if items[i].kind == "original")
    return out
