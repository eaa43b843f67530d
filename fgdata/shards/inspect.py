"""What is inside one shard: counts, extension sets, bytes per extension, decoded summaries.

Local shards are read header-only for the statistics and then only the samples
shown are read; s3:// shards are streamed once.
"""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fgdata import storage
from fgdata.errors import DamagedShardError, FgdataError
from fgdata.shards.reader import Sample, ShardFile, iter_samples
from fgdata.shards.scan import scan_shard


@dataclass
class ShardReport:
    shard: str
    samples: int
    ext_sets: dict[str, int]  # "jpg,json,txt" -> samples having exactly that set
    bytes_per_ext: dict[str, int]
    shown: list[dict[str, Any]] = field(default_factory=list)  # {"key", "members": {ext: summary}}
    damage: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "samples": self.samples,
            "extension_sets": self.ext_sets,
            "bytes_per_extension": self.bytes_per_ext,
            "samples_shown": self.shown,
            "damage": self.damage,
        }


def _summarise(sample: Sample) -> dict[str, Any]:
    from fgdata.media.decode import describe_member

    return {"key": sample.key, "members": {ext: {"bytes": len(d), **describe_member(ext, d)} for ext, d in sorted(sample.members.items())}}


def inspect_shard(path: str, *, limit: int = 5, key: str | None = None) -> tuple[ShardReport, list[Sample]]:
    """Summarise a shard; returns the report and the samples shown (for previews).

    With ``key`` only that sample is shown, in full; a key that is not in the shard
    is an error. Raises FgdataError when the file is not a tar at all.
    """
    ext_sets: Counter[str] = Counter()
    bytes_per_ext: Counter[str] = Counter()
    chosen: list[Sample] = []
    damage = None
    wanted = (lambda s, i: s == key) if key is not None else (lambda s, i: i < limit)
    if storage.is_s3(path):
        count = 0
        try:
            for sample in iter_samples(path):
                ext_sets[",".join(sorted(sample.members))] += 1
                for ext, data in sample.members.items():
                    bytes_per_ext[ext] += len(data)
                if wanted(sample.key, count):
                    chosen.append(sample)
                count += 1
        except DamagedShardError as exc:
            damage = exc.reason
    else:
        scan = scan_shard(path)
        damage = scan.damage
        count = len(scan.samples)
        for i, entry in enumerate(scan.samples):
            ext_sets[",".join(sorted(entry.members))] += 1
            for ext, (_, size) in entry.members.items():
                bytes_per_ext[ext] += size
        picks = [i for i, e in enumerate(scan.samples) if wanted(e.key, i)]
        if picks:
            with ShardFile(path, scan=scan) as sf:
                chosen = [sf.sample(i) for i in picks]
    if count == 0 and damage is not None:
        raise FgdataError(f"{path}: not a readable tar shard ({damage})")
    if key is not None and not chosen:
        raise FgdataError(f"{path}: no sample with key {key!r}")
    report = ShardReport(path, count, dict(ext_sets.most_common()), dict(sorted(bytes_per_ext.items())), [_summarise(s) for s in chosen], damage)
    return report, chosen


def write_preview(samples: list[Sample], out_png: str, tile: int = 160) -> int:
    """A contact sheet of the images and first video frames, labelled with their keys.

    Returns the number of tiles drawn.
    """
    import numpy as np
    from PIL import Image, ImageDraw

    from fgdata.media.decode import member_kind
    from fgdata.media.image import open_image, to_rgb
    from fgdata.media.video import decode_clip

    tiles: list[tuple[str, Image.Image]] = []
    for sample in samples:
        for ext, data in sorted(sample.members.items()):
            kind = member_kind(ext)
            try:
                if kind == "image":
                    im = to_rgb(open_image(data))
                    im.thumbnail((tile, tile - 14))
                elif kind == "video":
                    clip = decode_clip(data, sequence_length=1, img_size=(tile, (tile - 14) * 9 // 16), decoder_type="full")
                    frame = ((clip.video[:, 0].transpose(1, 2, 0) + 1) * 127.5).clip(0, 255).astype(np.uint8)
                    im = Image.fromarray(frame)
                else:
                    continue
            except FgdataError:
                continue
            tiles.append((f"{sample.key}.{ext}", im))
    if not tiles:
        raise FgdataError("no images or videos to preview in the samples shown")
    cols = min(4, len(tiles))
    rows = (len(tiles) + cols - 1) // cols
    sheet = Image.new("RGB", (cols * tile, rows * tile), "white")
    draw = ImageDraw.Draw(sheet)
    for n, (label, im) in enumerate(tiles):
        x, y = (n % cols) * tile, (n // cols) * tile
        sheet.paste(im, (x + (tile - im.width) // 2, y + 14 + (tile - 14 - im.height) // 2))
        draw.text((x + 2, y + 1), label[: tile // 6], fill="black")
    buf = io.BytesIO()
    sheet.save(buf, format="PNG")
    storage.write_bytes(out_png, buf.getvalue())
    return len(tiles)
