"""Load a diffusers AutoencoderKL by hub id or local directory, and encode images into posterior moments.

Shared by ``prepare imagenet-256`` and ``encode latents``. Loading goes through the real ``from_pretrained``
path for ids and directories alike; offline with no cached weights it fails in one line instead of a stack of
hub retries.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from fgdata.compute import hf_cache_dir, load_pretrained, resolve_device, torch_dtype

DEFAULT_VAE = "stabilityai/sd-vae-ft-mse"


def load_vae(
    id_or_dir: str = DEFAULT_VAE, device: str = "cpu", dtype: str = "float32", kind: str = "image", subfolder: str | None = None
) -> Any:
    """A VAE in eval mode without gradients, on ``device`` in ``dtype``.

    Image VAEs load as AutoencoderKL; video VAEs through diffusers' AutoModel, which picks the class
    (AutoencoderKLWan, AutoencoderKLCogVideoX, ...) from the config.
    """
    import diffusers

    cls = diffusers.AutoModel if kind == "video" else diffusers.AutoencoderKL
    vae = load_pretrained(cls, id_or_dir, "VAE", "--vae", subfolder, torch_dtype=torch_dtype(dtype))
    return vae.eval().requires_grad_(False).to(resolve_device(device))


def vae_info(vae: Any, id_or_dir: str) -> dict:
    """What provenance records about the model and the numerics."""
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
    """Posterior mean ‖ std of uint8 NHWC RGB images as float32 ``(B, 2·C, h, w)``.

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
    """``np.save`` bytes (NPY 1.0, ``<f4``, C order): 32,896 bytes for an (8, 32, 32) latent."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array, dtype="<f4"), allow_pickle=False)
    return buf.getvalue()
