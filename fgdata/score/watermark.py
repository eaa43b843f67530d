"""The LAION watermark detector in plain torch: timm's EfficientNet-B3 with LAION's published head, no timm.

timm needs torchvision, which does not install beside the CPU torch the project pins, so the network is written
here with timm's module names: ``watermark_model_v1.pt`` (a state dict, read with ``torch.load(weights_only=True)``,
or a ``.safetensors`` of the same keys) loads with ``strict=True``, every key and shape as timm's
``efficientnet_b3`` (``efficientnet_b3a`` is the same network) with ``classifier`` replaced by LAION's head. The
structure is read from the file (block counts, widths, kernels, squeeze-excite widths); what a state dict does not
hold is EfficientNet's: stage strides 1, 2, 2, 2, 1, 2, 1 (first block of each stage), symmetric padding
``k // 2``, SiLU, batch-norm eps 1e-5, a residual where a block keeps its width at stride 1.

- ``conv_stem`` 3x3 stride 2, ``bn1``, SiLU;
- ``blocks.0.N`` (depthwise-separable): ``conv_dw``, ``bn1``, SiLU, ``se``, ``conv_pw``, ``bn2``;
- ``blocks.S.N`` (inverted residual): ``conv_pw``, ``bn1``, SiLU, ``conv_dw``, ``bn2``, SiLU, ``se``, ``conv_pwl``,
  ``bn3``; ``se``: mean over the picture, ``conv_reduce``, SiLU, ``conv_expand``, sigmoid, times the input;
- ``conv_head`` 1x1, ``bn2``, SiLU, global average, then LAION's head ``classifier.0`` Linear(1536, 625), ReLU,
  Dropout, ``classifier.3`` Linear(625, 256), ReLU, ``classifier.5`` Linear(256, 2); softmax: column 0 is the
  watermark's probability (as LAION's example reads it).

Preprocessing as LAION's ``Resize((256, 256))``, ``ToTensor``, ``Normalize`` (ImageNet mean and std): the displayed
image in RGB resized to 256x256 with Pillow's bilinear filter (torchvision's resize of a PIL image), / 255,
normalised.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from fgdata.errors import FgdataError

if TYPE_CHECKING:
    import torch
    from PIL import Image

FILES = ("watermark_model_v1.pt", "watermark_model_v1.safetensors")
SIZE = 256
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
STRIDES = (1, 2, 2, 2, 1, 2, 1)
PREPROCESSING = ("displayed image in RGB resized to 256x256 (Pillow bilinear, aspect not kept), /255, normalised "
                 "with ImageNet mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225)")
SCALE = ("LAION watermark detector (EfficientNet-B3 and its published head), softmax column 0; p_watermark 0..1 "
         "(1 = watermarked), p_no_watermark = 1 - p_watermark")


def preprocess_image(im: Image.Image) -> np.ndarray:
    """A displayed image as the detector's input, ``(3, 256, 256)`` float32."""
    from PIL import Image

    im = im.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    unit = np.asarray(im, dtype=np.float32) / np.float32(255.0)
    norm = (unit - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
    return np.ascontiguousarray(norm.transpose(2, 0, 1), dtype=np.float32)


def _layout(state: dict[str, torch.Tensor], path: str) -> list[list[str]]:
    """The block prefixes of each stage (``blocks.S.N``), in order; a file without them is not this network."""
    found: dict[int, set[int]] = {}
    for key in state:
        m = re.match(r"blocks\.(\d+)\.(\d+)\.", key)
        if m:
            found.setdefault(int(m[1]), set()).add(int(m[2]))
    if sorted(found) != list(range(len(STRIDES))) or any(sorted(v) != list(range(len(v))) for v in found.values()):
        raise FgdataError(f"{path}: not an EfficientNet with seven stages of blocks (the LAION watermark detector)")
    return [[f"blocks.{s}.{n}" for n in range(len(found[s]))] for s in range(len(STRIDES))]


def build(state: dict[str, torch.Tensor], path: str) -> torch.nn.Module:
    """The detector for ``state``'s shapes, its weights loaded strictly, in eval mode."""
    from torch import nn

    def conv(key: str, stride: int = 1, groups: int = 1, bias: bool = False) -> nn.Conv2d:
        out_chs, in_per_group, k, _ = state[f"{key}.weight"].shape
        return nn.Conv2d(in_per_group * groups, out_chs, k, stride, k // 2, groups=groups, bias=bias)

    def bn(key: str) -> nn.BatchNorm2d:
        return nn.BatchNorm2d(state[f"{key}.weight"].shape[0], eps=1e-5)

    class SqueezeExcite(nn.Module):
        def __init__(self, key: str) -> None:
            super().__init__()
            self.conv_reduce, self.conv_expand = conv(f"{key}.conv_reduce", bias=True), conv(f"{key}.conv_expand",
                                                                                             bias=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = self.conv_expand(nn.functional.silu(self.conv_reduce(x.mean((2, 3), keepdim=True))))
            return x * s.sigmoid()

    class Block(nn.Module):
        def __init__(self, key: str, stride: int, separable: bool) -> None:
            super().__init__()
            self.separable = separable
            if separable:  # conv_dw, bn1, se, conv_pw, bn2
                chs = state[f"{key}.conv_dw.weight"].shape[0]
                self.conv_dw, self.bn1 = conv(f"{key}.conv_dw", stride, chs), bn(f"{key}.bn1")
                self.se, self.conv_pw, self.bn2 = SqueezeExcite(f"{key}.se"), conv(f"{key}.conv_pw"), bn(f"{key}.bn2")
                in_chs, out_chs = chs, state[f"{key}.conv_pw.weight"].shape[0]
            else:  # conv_pw, bn1, conv_dw, bn2, se, conv_pwl, bn3
                mid = state[f"{key}.conv_dw.weight"].shape[0]
                self.conv_pw, self.bn1 = conv(f"{key}.conv_pw"), bn(f"{key}.bn1")
                self.conv_dw, self.bn2 = conv(f"{key}.conv_dw", stride, mid), bn(f"{key}.bn2")
                self.se, self.conv_pwl, self.bn3 = SqueezeExcite(f"{key}.se"), conv(f"{key}.conv_pwl"), bn(f"{key}.bn3")
                in_chs, out_chs = state[f"{key}.conv_pw.weight"].shape[1], state[f"{key}.conv_pwl.weight"].shape[0]
            self.skip = stride == 1 and in_chs == out_chs

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            silu = nn.functional.silu
            if self.separable:
                y = self.bn2(self.conv_pw(self.se(silu(self.bn1(self.conv_dw(x))))))
            else:
                y = silu(self.bn2(self.conv_dw(silu(self.bn1(self.conv_pw(x))))))
                y = self.bn3(self.conv_pwl(self.se(y)))
            return x + y if self.skip else y

    class Detector(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv_stem, self.bn1 = conv("conv_stem", 2), bn("bn1")
            self.blocks = nn.Sequential(*(
                nn.Sequential(*(Block(key, STRIDES[s] if n == 0 else 1, separable=s == 0)
                                for n, key in enumerate(stage)))
                for s, stage in enumerate(_layout(state, path))))
            self.conv_head, self.bn2 = conv("conv_head"), bn("bn2")
            widths = [state[f"classifier.{i}.weight"].shape for i in (0, 3, 5)]
            self.classifier = nn.Sequential(nn.Linear(widths[0][1], widths[0][0]), nn.ReLU(), nn.Dropout(0.3),
                                            nn.Linear(widths[1][1], widths[1][0]), nn.ReLU(),
                                            nn.Linear(widths[2][1], widths[2][0]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = nn.functional.silu(self.bn1(self.conv_stem(x)))
            x = nn.functional.silu(self.bn2(self.conv_head(self.blocks(x))))
            return self.classifier(x.mean((2, 3)))

    missing = [k for k in ("conv_stem.weight", "conv_head.weight", "classifier.0.weight", "classifier.3.weight",
                           "classifier.5.weight") if k not in state]
    if missing:
        raise FgdataError(f"{path}: not the LAION watermark detector (no {missing[0]})")
    try:
        model = Detector()
        model.load_state_dict(state, strict=True)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise FgdataError(f"{path}: does not fit the published layout ({str(exc).splitlines()[-1].strip()})") \
            from None
    if state["classifier.5.weight"].shape[0] != 2:
        raise FgdataError(f"{path}: the head gives {state['classifier.5.weight'].shape[0]} classes, not 2")
    return model.eval()


def p_watermark(model: Any, pixels: torch.Tensor) -> torch.Tensor:
    """The probability of a watermark for each preprocessed image of a batch."""
    import torch

    with torch.no_grad():
        return torch.softmax(model(pixels).float(), dim=1)[:, 0]
