"""Previews of samples as ``fgdata report``'s contact sheet and ``fgdata inspect --preview`` show them.

One thumbnail rule and one caption rule for both commands, so a sample looks the same in either.
"""

from __future__ import annotations

from dataclasses import dataclass

from fgdata.errors import FgdataError

#: Members read as captions, in order of preference.
CAPTION_EXTS = ("txt", "caption", "prompt", "text")


@dataclass
class Tile:
    """A contact-sheet tile: a small RGB thumbnail (PNG bytes) and its label."""

    key: str
    shard: str
    png: bytes
    caption: str


def thumbnail(data: bytes, kind: str, size: int = 192) -> bytes | None:
    """A contact-sheet thumbnail (PNG, longer side ``size``) of an image or of a video's first frame; None when
    the member does not decode."""
    import io

    import numpy as np
    from PIL import Image

    try:
        if kind == "image":
            from fgdata.media.image import decode_display

            im = decode_display(data, draft=(size, size))[0]
        else:
            from fgdata.media.video import ClipSpec, decode_clip, probe_video

            info = probe_video(data)
            w, h = (info.height, info.width) if info.rotation in (90, 270) else (info.width, info.height)
            scale = size / max(w, h)
            first_frame = ClipSpec(sequence_length=1, img_size=(max(int(w * scale), 1), max(int(h * scale), 1)),
                                   decoder_type="full")
            clip = decode_clip(data, first_frame)
            im = Image.fromarray(((clip.video[:, 0].transpose(1, 2, 0) + 1) * 127.5).clip(0, 255).astype(np.uint8))
        im.thumbnail((size, size))
    except (FgdataError, OSError, ValueError):
        return None
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def tile_caption(text: str | None) -> str:
    """A caption as a tile shows it: one line of at most 200 characters (from its first few thousand)."""
    return " ".join((text or "")[:4096].split())[:200]
