"""The two feature detectors of the FID references, loaded without running code from the weights file.

- Inception-v3 (``fid``, 2048-d): :class:`fgdata.fid.inception.InceptionV3` with weights from a plain state
  dict (``torch.load(weights_only=True)``) or a safetensors file, given as a local path, an http(s) URL
  (downloaded once into the torch hub cache) or a hub id ``owner/repo[/file]``. The official pickled
  detector (``inception-2015-12-05.pkl``) loads only with ``trust_pickle=True``: unpickling runs whatever
  code the file names.
- DINOv2 ViT-L/14 (``fd_dinov2``, 1024-d): transformers ``Dinov2Model.from_pretrained``; the feature is the
  class token after the final layer norm, the output of the torch.hub model EDM2 uses.

Each detector maps uint8 RGB ``[N, 3, H, W]`` on its device to float features ``[N, D]``, and records where its
weights came from and their SHA-256 for the provenance file.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fgdata.errors import FgdataError

#: The ported FID Inception weights as a plain state dict (the file pytorch-fid downloads).
INCEPTION_DEFAULT = "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/pt_inception-2015-12-05-6726825d.pth"
#: The official pickled detector EDM and EDM2 load; needs ``--trust-pickle``.
INCEPTION_PICKLE_URL = "https://api.ngc.nvidia.com/v2/models/nvidia/research/stylegan3/versions/1/files/metrics/inception-2015-12-05.pkl"
DINOV2_DEFAULT = "facebook/dinov2-large"
DINOV2_SIZE = 224
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DOWNLOAD_TIMEOUT_S = 30.0

_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?$")
_NAME_HASH = re.compile(r"-([0-9a-f]{8,64})\.[a-z]+$")


@dataclass
class Detector:
    """A feature network ready to run: ``metric`` names its statistics in the EDM2 pickle."""

    metric: str
    dim: int
    run: Callable[[Any], Any]
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> dict[str, Any]:
        """What changes the features: the network, its weights' checksums and its input transform."""
        return {k: self.provenance[k] for k in ("network", "files", "input") if k in self.provenance}


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _download(url: str, flag: str) -> Path:
    """The URL's file in the torch hub cache, downloaded once (atomically); offline: one line naming ``flag``."""
    import torch

    from fgdata.storage import atomic_path

    dest = Path(torch.hub.get_dir()) / "checkpoints" / url.rstrip("/").rpartition("/")[2]
    if dest.is_file():
        return dest
    if _offline():
        raise FgdataError(f"{url}: not in the cache ({dest}) and HF_HUB_OFFLINE is set; pass {flag} PATH to a local copy")
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, atomic_path(str(dest)) as tmp, \
                open(tmp, "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
    except OSError as exc:
        reason = getattr(exc, "reason", None) or exc
        raise FgdataError(f"{url}: cannot download it ({reason}); pass {flag} PATH to a local copy") from None
    return dest


def check_name_hash(path: Path) -> None:
    """Files named ``<stem>-<hex>.<ext>`` (the torch hub convention) must have a SHA-256 starting with ``<hex>``."""
    match = _NAME_HASH.search(path.name)
    if match and not sha256_file(path).startswith(match.group(1)):
        raise FgdataError(f"{path}: its SHA-256 does not start with {match.group(1)}, as its name says (damaged "
                          "or replaced; delete it and rerun)")


def _hub_file(source: str, default_file: str, flag: str) -> Path:
    """``owner/repo[/file]`` fetched through the Hugging Face cache; offline without a copy: one line."""
    from huggingface_hub import hf_hub_download

    owner, repo, *rest = source.split("/")
    filename = "/".join(rest) or default_file
    try:
        return Path(hf_hub_download(f"{owner}/{repo}", filename))
    except Exception as exc:  # noqa: BLE001 - hub errors come in many classes; the message is what matters
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        why = "HF_HUB_OFFLINE is set and it is not cached" if _offline() else first
        raise FgdataError(f"{source}: {why}; pass {flag} PATH to a local weights file") from None


def resolve_weights(source: str, flag: str, default_file: str = "model.safetensors") -> tuple[Path, str]:
    """(local file, how it was found) for a path, an http(s) URL or a hub id."""
    local = Path(source).expanduser()
    if local.is_file():
        return local.resolve(), "path"
    if local.exists():
        raise FgdataError(f"{source}: not a file; pass {flag} a weights file (.pth, .safetensors)")
    if source.startswith(("http://", "https://")):
        return _download(source, flag), "url"
    if _HUB_ID.match(source) and not source.startswith((".", "/", "~")):
        return _hub_file(source, default_file, flag), "hub"
    raise FgdataError(f"{source}: no such file; pass {flag} a local weights file, an http(s) URL or a hub id")


def load_state_dict(path: Path) -> dict[str, Any]:
    """A plain state dict from safetensors or a ``.pth``, never executing code from the file."""
    import torch

    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - unpickling errors have no common base class
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise FgdataError(f"{path}: not a plain state dict or safetensors file ({first})") from None
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise FgdataError(f"{path}: holds no plain state dict (a mapping of names to tensors)")
    return state


def _eval_on(module: Any, device: str) -> Any:
    module = module.to(device).eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def load_inception(source: str = INCEPTION_DEFAULT, device: str = "cpu", trust_pickle: bool = False,
                   build: Callable[[], Any] | None = None) -> Detector:
    """The ``fid`` detector. ``build`` makes the module the state dict loads into (default InceptionV3)."""
    import torch

    is_pickle = source.split("?")[0].endswith(".pkl")
    if is_pickle and not trust_pickle:
        raise FgdataError(f"{source}: a pickle runs code when loaded; pass --trust-pickle if you trust its origin, "
                          "or --inception with a plain state dict or safetensors file")
    path, found = resolve_weights(source, "--inception")
    if found == "url":
        check_name_hash(path)
    files = {path.name: sha256_file(path)}
    if is_pickle:
        import pickle

        with open(path, "rb") as fh:
            try:
                net = pickle.load(fh)  # noqa: S301 - only with --trust-pickle, the user's explicit choice
            except Exception as exc:  # noqa: BLE001 - whatever the pickle raised, in one line
                raise FgdataError(f"{path}: cannot unpickle the detector ({type(exc).__name__}: {exc})") from None
        net = _eval_on(net, device)

        def run(images: torch.Tensor) -> torch.Tensor:
            return net(images, return_features=True)

        loader, network = "pickle (trusted)", "inception-v3 (official pickled detector)"
        dim = 2048
    else:
        from fgdata.fid.inception import InceptionV3

        state = load_state_dict(path)
        module = (build or InceptionV3)()
        try:
            result = module.load_state_dict(state, strict=False)
        except RuntimeError as exc:
            raise FgdataError(f"{path}: weights do not fit the Inception-v3 layout ({str(exc).splitlines()[-1].strip()})") from None
        missing = [k for k in result.missing_keys if not k.startswith("fc.") and not k.endswith(".num_batches_tracked")]
        if missing or result.unexpected_keys:
            what = f"missing {missing[:3]}" if missing else f"unexpected {result.unexpected_keys[:3]}"
            raise FgdataError(f"{path}: weights do not fit the Inception-v3 layout ({what})")
        net = _eval_on(module, device)
        run = net
        loader = "safetensors" if path.suffix == ".safetensors" else "state dict (weights_only)"
        network = f"inception-v3 FID ({type(module).__name__})"
        dim = int(getattr(module, "feature_dim", 2048))
    return Detector("fid", dim, run, {
        "network": network, "source": source, "found_by": found, "loader": loader, "files": files,
        "input": "uint8 RGB NCHW; float32, TF-style bilinear resize to 299x299, (x - 128) / 128; 2048-d pool features",
    })


def _dinov2_files(source: str, local: bool) -> tuple[dict[str, str], str | None]:
    """SHA-256 of the config and weights from_pretrained read, and the hub revision when known."""
    if local:
        folder = Path(source).expanduser()
        names = sorted(p.name for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".json"))
        return {n: sha256_file(folder / n) for n in names}, None
    from huggingface_hub import try_to_load_from_cache

    files, revision = {}, None
    for name in ("config.json", "model.safetensors", "pytorch_model.bin"):
        hit = try_to_load_from_cache(source, name)
        if isinstance(hit, str):
            files[name] = sha256_file(hit)
            revision = Path(hit).parent.name
    return files, revision


def load_dinov2(source: str = DINOV2_DEFAULT, device: str = "cpu") -> Detector:
    """The ``fd_dinov2`` detector: EDM2's default "torch" resize (bicubic, antialiased) to 224, ImageNet mean/std."""
    import torch
    import torch.nn.functional as F
    from transformers import Dinov2Model

    from fgdata.compute import load_pretrained, model_source

    model = _eval_on(load_pretrained(Dinov2Model, source, "DINOv2 detector", "--dinov2"), device)
    files, revision = _dinov2_files(source, model_source(source)[1])
    mean = torch.tensor(IMAGENET_MEAN, device=device).reshape(1, -1, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=device).reshape(1, -1, 1, 1)

    def run(images: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(images.to(torch.float32), size=(DINOV2_SIZE, DINOV2_SIZE), mode="bicubic", antialias=True)
        x = (x / 255 - mean) / std
        return model(pixel_values=x).pooler_output

    return Detector("fd_dinov2", int(model.config.hidden_size), run, {
        "network": f"dinov2 ({model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, "
                   f"patch {model.config.patch_size})",
        "source": source, "revision": revision, "loader": "transformers from_pretrained", "files": files,
        "input": f"uint8 RGB NCHW; float32, bicubic antialiased resize to {DINOV2_SIZE}x{DINOV2_SIZE} (torch), "
                 "/255, ImageNet mean/std; class token after the final layer norm",
    })
