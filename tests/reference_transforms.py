"""The reference loaders' pixel transforms, re-implemented from their description with nothing of
fgdata's code, so the tests can hold fgdata's ``resize="reference"`` mode to them bit for bit.

Images: full Pillow decode, shorter side to ``input_res`` with Pillow BICUBIC (long side
``int(res*long/short)``), centre crop at ``int(round((dim-res)/2))``, RGB conversion, then a
tensor conversion ``x/255`` and ``(x - mean)/std`` per channel, in float32. The reference
converts to RGB after resizing; fgdata converts first (on purpose), which gives the same pixels
for RGB and greyscale sources only: ``rgb_first=True`` follows fgdata's order for the others.

Video: every frame from the start as PyAV ``rgb24``, the chosen frames stacked ``[T,H,W,C]`` and
viewed as ``[T,C,H,W]``, cast to float32, resized with torch's antialiased bicubic to
``(int(s*h+0.5), int(s*w+0.5))`` with ``s = max(W/w, H/h)``, clamped to [0, 255], rounded,
cast to uint8, centre-cropped, ``x/127.5 - 1``, laid out ``[C,T,H,W]``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image


def _centre(dim: int, target: int) -> int:
    return round((dim - target) / 2.0)


def reference_image(
    data: bytes,
    input_res: int | tuple[int, int],
    mean: Sequence[float] = (0.5, 0.5, 0.5),
    std: Sequence[float] = (0.5, 0.5, 0.5),
    rgb_first: bool = False,
) -> np.ndarray:
    """float32 [3, H, W]."""
    im = Image.open(io.BytesIO(data))
    im.load()
    if rgb_first:
        im = im.convert("RGB")
    w, h = im.size
    if isinstance(input_res, tuple):
        th, tw = input_res
        im = im.resize((tw, th), Image.BICUBIC)
    else:
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = input_res, int(input_res * long / short)
        nw, nh = (new_short, new_long) if w <= h else (new_long, new_short)
        im = im.resize((nw, nh), Image.BICUBIC)
        top, left = _centre(nh, input_res), _centre(nw, input_res)
        im = im.crop((left, top, left + input_res, top + input_res))
    im = im.convert("RGB")
    x = torch.from_numpy(np.array(im, copy=True)).permute(2, 0, 1).contiguous().to(torch.float32).div(255)
    m = torch.as_tensor(mean, dtype=torch.float32)[:, None, None]
    s = torch.as_tensor(std, dtype=torch.float32)[:, None, None]
    return x.sub_(m).div_(s).numpy()


def reference_clip(data: bytes, frame_indices: Sequence[int], img_size: tuple[int, int]) -> np.ndarray:
    """float32 [3, T, H, W] from the source frames ``frame_indices``; ``img_size`` is (W, H)."""
    import av

    frames: list[np.ndarray] = []
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(video=0):
            frames.append(frame.to_ndarray(format="rgb24"))
            if len(frames) > max(frame_indices):
                break
    video = torch.from_numpy(np.stack([frames[i] for i in frame_indices])).permute(0, 3, 1, 2)
    target_w, target_h = img_size
    h, w = video.shape[-2:]
    ratio = max(target_w / w, target_h / h)
    size = (int(ratio * h + 0.5), int(ratio * w + 0.5))
    x = video.to(torch.float32)
    if tuple(size) != (h, w):
        x = F.interpolate(x, size=size, mode="bicubic", align_corners=False, antialias=True)
    x = torch.round(x.clamp(min=0, max=255)).to(torch.uint8)
    top, left = _centre(size[0], target_h), _centre(size[1], target_w)
    x = x[:, :, top : top + target_h, left : left + target_w]
    return (x.float() / 127.5 - 1).permute(1, 0, 2, 3).numpy()
