"""Load a diffusers AutoencoderKL by hub id or local directory, and encode images into posterior moments.

Shared by ``prepare imagenet-256`` and ``encode latents``. Loading goes through the real ``from_pretrained``
path for ids and directories alike; offline with no cached weights it fails in one line instead of a stack of
hub retries.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from fgdata.errors import FgdataError

DEFAULT_VAE = "stabilityai/sd-vae-ft-mse"
DTYPES = ("float32", "bfloat16", "float16")


def hf_cache_dir() -> str:
    """The Hugging Face cache in use (HF_HOME is respected by huggingface_hub); logged in provenance (D-29)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _torch_dtype(dtype: str) -> Any:
    import torch

    if dtype not in DTYPES:
        raise FgdataError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return getattr(torch, dtype)


def resolve_device(device: str = "cpu") -> str:
    """``auto`` picks CUDA when present; ``cuda`` under torchrun means this process's LOCAL_RANK device."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise FgdataError(f"device {device} requested but CUDA is not available; use --device cpu")
    return device


def load_vae(id_or_dir: str = DEFAULT_VAE, device: str = "cpu", dtype: str = "float32") -> Any:
    """An AutoencoderKL in eval mode without gradients, on ``device`` in ``dtype``."""
    from diffusers import AutoencoderKL

    torch_dtype = _torch_dtype(dtype)
    device = resolve_device(device)
    local = Path(id_or_dir).expanduser()
    source = str(local) if local.is_dir() else id_or_dir
    try:
        vae = AutoencoderKL.from_pretrained(source, torch_dtype=torch_dtype)
    except (OSError, ValueError, EnvironmentError) as exc:
        if local.is_dir():
            raise FgdataError(f"{local}: not a diffusers AutoencoderKL directory ({str(exc).splitlines()[0]})") from None
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set and no local weights are cached" if offline else "cannot download it"
        raise FgdataError(
            f"{id_or_dir}: {why} (cache: {hf_cache_dir()}); pass --vae DIR with a directory saved by save_pretrained"
        ) from None
    return vae.eval().requires_grad_(False).to(device)


def vae_info(vae: Any, id_or_dir: str) -> dict:
    """What provenance records about the model and the numerics (S-6)."""
    import torch

    return {
        "vae": id_or_dir,
        "vae_revision": getattr(vae.config, "_commit_hash", None),
        "vae_dtype": str(next(vae.parameters()).dtype).replace("torch.", ""),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "hf_cache": hf_cache_dir(),
    }


def encode_moments(vae: Any, images: np.ndarray) -> np.ndarray:
    """Posterior mean ‖ std (S-2, S-3) of uint8 NHWC RGB images as float32 ``(B, 2·C, h, w)``.

    Inputs map to [-1, 1] as ``x/127.5 − 1`` in float32 before any cast; std is ``exp(0.5·clamp(logvar, −30, 20))``.
    No sampling and no scaling factor: training draws a fresh latent from these moments at every step.
    """
    import torch

    param = next(vae.parameters())
    x = torch.from_numpy(np.ascontiguousarray(images)).to(param.device).permute(0, 3, 1, 2).float() / 127.5 - 1
    with torch.inference_mode():
        moments = vae.encode(x.to(param.dtype)).latent_dist.parameters.float()
        mean, logvar = moments.chunk(2, dim=1)
        std = torch.exp(0.5 * torch.clamp(logvar, -30.0, 20.0))
        return torch.cat([mean, std], dim=1).cpu().numpy()


def npy_bytes(array: np.ndarray) -> bytes:
    """``np.save`` bytes (NPY 1.0, ``<f4``, C order): 32,896 bytes for an (8, 32, 32) latent (S-4)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array, dtype="<f4"), allow_pickle=False)
    return buf.getvalue()
