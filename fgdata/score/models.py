"""Model-based signals from local weight files only: CLIP image-text similarity, the LAION aesthetic and NSFW heads,
and the LAION watermark detector (:mod:`fgdata.score.watermark`, which needs no CLIP).

Nothing is downloaded: ``--model-dir DIR`` holds the files, and a missing one is a one-line error naming the file
expected, raised before any shard is read (:func:`check_files`). Layouts read:

- **CLIP, Hugging Face layout**: ``config.json`` with ``model.safetensors`` or ``pytorch_model.bin`` and the
  tokenizer files (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``), loaded with transformers'
  ``CLIPModel.from_pretrained`` and ``CLIPTokenizer(Fast)``.
- **CLIP, open_clip hub layout** (as LAION publishes its models): ``open_clip_config.json`` with
  ``open_clip_model.safetensors`` or ``open_clip_pytorch_model.bin`` (``torch.load(weights_only=True)``), plus the
  same tokenizer files. open_clip itself needs torchvision, which has no build beside the CPU torch pinned here,
  so the checkpoint is loaded into transformers' ``CLIPModel`` through :func:`open_clip_to_hf` (the key mapping)
  and :func:`open_clip_config` (the config mapping); every key must map, and every CLIPModel weight be filled.
- **Aesthetic head** (LAION improved aesthetic predictor): ``sac+logos+ava1-l14-linearMSE.pth`` (or ``.safetensors``)
  with keys ``layers.{0,2,4,6,7}.{weight,bias}``: Linear(D, 1024), Dropout, Linear(1024, 128), Dropout,
  Linear(128, 64), Dropout, Linear(64, 16), Linear(16, 1), no activations; D is read from the file (768 for ViT-L/14).
- **NSFW head** (LAION CLIP-based NSFW detector, NeMo Curator's PyTorch port): ``clip_autokeras_binary_nsfw.pth``
  (or ``.safetensors``) with keys ``norm.mean``, ``norm.variance``, ``linear_{1,2,3,4}.{weight,bias}``:
  ``(x - mean) / sqrt(variance)``, Linear(D, 64), ReLU, Linear(64, 512), ReLU, Linear(512, 256), ReLU,
  Linear(256, 1), sigmoid.

Both heads read the L2-normalised CLIP image embedding; its width must equal the head's D.

CLIP's preprocessing, written with Pillow and numpy (torchvision's ``Resize``/``CenterCrop`` arithmetic, as
open_clip uses): the displayed image (EXIF orientation, alpha on white) in RGB, its shorter side resized to the
model's image size with Pillow's bicubic filter (longer side ``int(size * long / short)``), centre-cropped
(offset ``round((side - size) / 2)``), divided by 255 and normalised with CLIP's mean and std. Captions are
cleaned as open_clip's tokenizer cleans them (:func:`clean_caption`). Equality with open_clip itself is tested
against values open_clip computed once (``tests/fixtures/openclip/``; docs/FORMATS.md).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fgdata.errors import FgdataError, OptionError

if TYPE_CHECKING:
    import torch
    from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
OPEN_CLIP_CONFIG = "open_clip_config.json"
OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
AESTHETIC_FILES = ("sac+logos+ava1-l14-linearMSE.pth", "sac+logos+ava1-l14-linearMSE.safetensors")
NSFW_FILES = ("clip_autokeras_binary_nsfw.pth", "clip_autokeras_binary_nsfw.safetensors")
#: The signals that run the CLIP model (the watermark detector does not).
CLIP_SIGNALS = ("clip", "aesthetic", "nsfw")

#: Signal name -> the fields it writes.
MODEL_SIGNALS: dict[str, tuple[str, ...]] = {
    "clip": ("clip_score",),
    "aesthetic": ("aesthetic",),
    "nsfw": ("p_nsfw", "p_safe"),
    "watermark": ("p_watermark", "p_no_watermark"),
}
PREPROCESSING = ("displayed image in RGB; shorter side resized to {size} (Pillow bicubic), centre crop {size}x{size}, "
                 "/255, normalised with CLIP mean (0.48145466, 0.4578275, 0.40821073) and std "
                 "(0.26862954, 0.26130258, 0.27577711)")
SCALES = {
    "clip": "raw cosine of the L2-normalised image and text embeddings, -1..1 (not x100 or x2.5); caption from the "
            "caption member, truncated to the model's context length; no field without a caption",
    "aesthetic": "LAION improved aesthetic predictor on the L2-normalised CLIP image embedding; about 1..10",
    "nsfw": "LAION CLIP-based NSFW detector on the L2-normalised CLIP image embedding; p_nsfw 0..1 (1 = NSFW), "
            "p_safe = 1 - p_nsfw",
}


def _first(model_dir: str, names: tuple[str, ...]) -> str | None:
    return next((os.path.join(model_dir, n) for n in names if os.path.isfile(os.path.join(model_dir, n))), None)


def _need(model_dir: str, names: tuple[str, ...], what: str) -> str:
    found = _first(model_dir, names)
    if found is None:
        raise FgdataError(f"--model-dir {model_dir}: {what} needs {' or '.join(names)} there (nothing is downloaded)")
    return found


@dataclass(frozen=True)
class ClipFiles:
    """Where a CLIP model's files are: its layout (``hf`` or ``open_clip``), config and weights."""

    layout: str
    config: str
    weights: str


def clip_files(model_dir: str) -> ClipFiles:
    """The CLIP model in ``model_dir`` (open_clip layout when ``open_clip_config.json`` is there), its tokenizer
    checked too; a missing file is a one-line error naming it."""
    if not os.path.isdir(model_dir):
        raise FgdataError(f"--model-dir {model_dir}: no such folder")
    if os.path.isfile(os.path.join(model_dir, OPEN_CLIP_CONFIG)):
        files = ClipFiles("open_clip", os.path.join(model_dir, OPEN_CLIP_CONFIG),
                          _need(model_dir, OPEN_CLIP_WEIGHTS, "an open_clip CLIP model"))
    else:
        config = _need(model_dir, ("config.json", OPEN_CLIP_CONFIG), "a CLIP model")
        files = ClipFiles("hf", config, _need(model_dir, HF_WEIGHTS, "a Hugging Face CLIP model"))
    if not any(all(os.path.isfile(os.path.join(model_dir, n)) for n in group) for group in TOKENIZER_FILES):
        raise FgdataError(f"--model-dir {model_dir}: the CLIP tokenizer needs tokenizer.json or vocab.json and "
                          "merges.txt there (nothing is downloaded)")
    return files


def head_file(model_dir: str, signal: str) -> str:
    from fgdata.score import watermark

    files = {"aesthetic": AESTHETIC_FILES, "nsfw": NSFW_FILES, "watermark": watermark.FILES}[signal]
    return _need(model_dir, files, f"the {signal} signal")


def check_files(model_dir: str | None, signals: tuple[str, ...], device: str = "cpu") -> None:
    """Fail fast (before any shard is read) when a model signal's file is missing, or the files do not load
    together (a head's input width that is not the CLIP embedding's): the models are loaded once here, and a
    unit in this process reuses them."""
    wanted = [s for s in signals if s in MODEL_SIGNALS]
    if not wanted:
        return
    if model_dir is None:
        raise OptionError(f"--with {','.join(wanted)}: needs --model-dir DIR with the model files (nothing is "
                          "downloaded)")
    if any(s in CLIP_SIGNALS for s in wanted):
        clip_files(model_dir)
    if "clip" in wanted:
        clean_caption("")  # ftfy is importable: otherwise one line now, before any shard is read
    for s in wanted:
        if s != "clip":
            head_file(model_dir, s)
    scorer(model_dir, device, tuple(wanted))


@functools.lru_cache(maxsize=None)
def _sha256(path: str, size: int, mtime: float) -> str:
    from fgdata.fid.detectors import sha256_file

    return sha256_file(path)


def file_sha256(path: str) -> str:
    """A weight file's sha256, hashed once per process (keyed on its size and mtime)."""
    st = os.stat(path)
    return _sha256(path, st.st_size, st.st_mtime)


def clip_image_size(files: ClipFiles) -> int:
    with open(files.config, encoding="utf-8") as fh:
        doc = json.load(fh)
    if files.layout == "open_clip":
        return int(doc["model_cfg"]["vision_cfg"]["image_size"])
    return int(doc.get("vision_config", {}).get("image_size", 224))


def signal_record(name: str, model_dir: str) -> dict[str, Any]:
    """What a model signal is: its fields, model files with their sha256, preprocessing and scale."""
    if name == "watermark":
        from fgdata.score import watermark

        path = head_file(model_dir, name)
        return {"fields": list(MODEL_SIGNALS[name]), "model": {name: os.path.basename(path)},
                "model_sha256": {name: file_sha256(path)}, "preprocessing": watermark.PREPROCESSING,
                "scale": watermark.SCALE}
    files = clip_files(model_dir)
    model: dict[str, Any] = {"clip": os.path.basename(files.weights), "clip_layout": files.layout}
    sha: dict[str, Any] = {"clip": file_sha256(files.weights)}
    if name != "clip":
        head = head_file(model_dir, name)
        model[name], sha[name] = os.path.basename(head), file_sha256(head)
    return {"fields": list(MODEL_SIGNALS[name]), "model": model, "model_sha256": sha,
            "preprocessing": PREPROCESSING.format(size=clip_image_size(files)), "scale": SCALES[name]}


def preprocess(data: bytes, size: int) -> np.ndarray:
    """One image as CLIP's input, ``(3, size, size)`` float32 (see the module docstring)."""
    from fgdata.media.image import decode_display

    return preprocess_image(decode_display(data)[0], size)


def preprocess_image(im: Image.Image, size: int) -> np.ndarray:
    """A decoded, displayed image (a photo or a video frame) as CLIP's input."""
    from PIL import Image

    im = im.convert("RGB")
    w, h = im.size
    if w <= h:
        nw, nh = size, int(size * h / w)
    else:
        nw, nh = int(size * w / h), size
    im = im.resize((nw, nh), Image.Resampling.BICUBIC)
    left, top = int(round((nw - size) / 2.0)), int(round((nh - size) / 2.0))
    im = im.crop((left, top, left + size, top + size))
    unit = np.asarray(im, dtype=np.float32) / np.float32(255.0)
    norm = (unit - np.asarray(CLIP_MEAN, np.float32)) / np.asarray(CLIP_STD, np.float32)
    return np.ascontiguousarray(norm.transpose(2, 0, 1), dtype=np.float32)


def _load_state(path: str) -> dict[str, torch.Tensor]:
    import torch

    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            return dict(load_file(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a corrupt or foreign file: name it in one line
        raise FgdataError(f"{path}: cannot be read as weights ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict):
        raise FgdataError(f"{path}: not a state dict")
    return dict(state.get("state_dict", state))


#: open_clip config keys fgdata maps or that do not change inference, per section.
_MAPPED: dict[str, set[str]] = {
    "model_cfg": {"embed_dim", "quick_gelu", "vision_cfg", "text_cfg", "init_logit_scale"},
    "vision_cfg": {"image_size", "layers", "width", "patch_size", "head_width", "mlp_ratio", "patch_dropout",
                   "output_tokens", "attn_pooler_queries", "attn_pooler_heads", "timm_model_pretrained", "timm_pool",
                   "timm_proj", "timm_proj_bias", "timm_drop", "timm_drop_path"},
    "text_cfg": {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio", "pad_id", "eos_id",
                 "output_tokens", "tokenizer_mode", "hf_model_pretrained", "hf_proj_type", "hf_pooler_type"},
    "preprocess_cfg": {"mean", "std", "fill_color"},
}
#: Keys that change the computation, accepted only at the value of a plain ViT CLIP (open_clip's defaults).
_PLAIN: dict[str, dict[str, Any]] = {
    "vision_cfg": {"ls_init_value": None, "attentional_pool": False, "no_ln_pre": False, "pos_embed_type": "learnable",
                   "final_ln_after_pool": False, "pool_type": "tok", "act_kwargs": None, "norm_kwargs": None,
                   "block_type": None, "qk_norm": False, "scaled_cosine_attn": False, "scale_heads": False,
                   "scale_attn_inner": False, "scale_attn": False, "scale_fc": False, "timm_model_name": None,
                   "image_mean": None, "image_std": None},
    "text_cfg": {"hf_tokenizer_name": None, "tokenizer_kwargs": None, "ls_init_value": None, "embed_cls": False,
                 "no_causal_mask": False, "final_ln_after_pool": False, "pool_type": "argmax", "proj_bias": False,
                 "proj_type": "linear", "act_kwargs": None, "norm_kwargs": None, "block_type": None, "qk_norm": False,
                 "scaled_cosine_attn": False, "scale_heads": False, "scale_attn_inner": False, "scale_attn": False,
                 "scale_fc": False, "hf_model_name": None},
    "preprocess_cfg": {"interpolation": "bicubic", "resize_mode": "shortest"},
}


def check_open_clip_config(doc: dict[str, Any], path: str) -> None:
    """Refuse, in one line naming the key, an ``open_clip_config.json`` that fgdata would compute differently
    from open_clip: a model that is not a plain ViT CLIP (layer scale, attentional or mean pooling, another
    tokenizer or its options, a timm or Hugging Face tower) or preprocessing other than CLIP's (mean, std,
    bicubic resize of the shorter side)."""
    model_cfg = doc.get("model_cfg")
    if not isinstance(model_cfg, dict):
        raise FgdataError(f"{path}: no model_cfg object")
    sections: dict[str, dict[str, Any]] = {"model_cfg": model_cfg, "preprocess_cfg": doc.get("preprocess_cfg") or {}}
    for name in ("vision_cfg", "text_cfg"):
        section = model_cfg.get(name)
        if not isinstance(section, dict):
            raise FgdataError(f"{path}: model_cfg has no {name} object")
        sections[name] = section
    for name, section in sections.items():
        plain = _PLAIN.get(name, {})
        for key, value in section.items():
            if key in _MAPPED[name] or (key in plain and (value == plain[key] or (plain[key] is None and value == {}))):
                continue  # an empty kwargs object is as plain as none
            what = f"{name}.{key} = {json.dumps(value)}" if key in plain else f"{name}.{key}"
            raise FgdataError(f"{path}: {what} is not supported (fgdata scores plain ViT CLIP models with CLIP's "
                              "preprocessing, as open_clip computes them)")
    pre = sections["preprocess_cfg"]
    for key, want in (("mean", CLIP_MEAN), ("std", CLIP_STD)):
        got = pre.get(key, want)
        if not isinstance(got, list | tuple) or len(got) != 3 or any(abs(float(a) - b) > 1e-6
                                                                      for a, b in zip(got, want)):
            raise FgdataError(f"{path}: preprocess_cfg.{key} = {json.dumps(got)} is not CLIP's {list(want)} "
                              "(fgdata normalises with CLIP's)")


def open_clip_config(model_cfg: dict[str, Any], tokenizer: Any) -> Any:
    """open_clip's ``model_cfg`` as a transformers ``CLIPConfig`` (heads = width / head_width for the image tower;
    ``quick_gelu`` -> activation ``quick_gelu`` as OpenAI's models use, else ``gelu``)."""
    from transformers import CLIPConfig

    v, t = model_cfg["vision_cfg"], model_cfg["text_cfg"]
    act = "quick_gelu" if model_cfg.get("quick_gelu") else "gelu"
    return CLIPConfig(
        projection_dim=model_cfg["embed_dim"],
        vision_config={"hidden_size": v["width"], "num_hidden_layers": v["layers"], "patch_size": v["patch_size"],
                       "image_size": v["image_size"], "num_attention_heads": v["width"] // v.get("head_width", 64),
                       "intermediate_size": int(v["width"] * v.get("mlp_ratio", 4.0)), "hidden_act": act,
                       "layer_norm_eps": 1e-5},
        text_config={"hidden_size": t["width"], "num_hidden_layers": t["layers"], "num_attention_heads": t["heads"],
                     "max_position_embeddings": t.get("context_length", 77), "vocab_size": t.get("vocab_size", 49408),
                     "intermediate_size": int(t["width"] * t.get("mlp_ratio", 4.0)), "hidden_act": act,
                     "layer_norm_eps": 1e-5, "bos_token_id": tokenizer.bos_token_id,
                     "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id},
    )


_BLOCK = {"attn.out_proj": "self_attn.out_proj", "ln_1": "layer_norm1", "ln_2": "layer_norm2",
          "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
_FIXED = {"visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
          "visual.class_embedding": "vision_model.embeddings.class_embedding",
          "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
          "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
          "positional_embedding": "text_model.embeddings.position_embedding.weight",
          "logit_scale": "logit_scale"}
_NORMS = {"visual.ln_pre": "vision_model.pre_layrnorm", "visual.ln_post": "vision_model.post_layernorm",
          "ln_final": "text_model.final_layer_norm"}


def open_clip_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """open_clip's state dict -> transformers ``CLIPModel`` keys. Each resblock's ``attn.in_proj_{weight,bias}`` is
    split in three (q, k, v); ``visual.proj`` and ``text_projection`` (``x @ proj``) are transposed into the
    Linear weights ``visual_projection`` / ``text_projection``. A key not in the mapping is an error."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key in _FIXED:
            out[_FIXED[key]] = value
        elif key == "visual.proj":
            out["visual_projection.weight"] = value.t().contiguous()
        elif key == "text_projection":
            out["text_projection.weight"] = value.t().contiguous()
        elif key.rsplit(".", 1)[0] in _NORMS:
            base, leaf = key.rsplit(".", 1)
            out[f"{_NORMS[base]}.{leaf}"] = value
        elif key.startswith(("visual.transformer.resblocks.", "transformer.resblocks.")):
            tower = "vision_model" if key.startswith("visual.") else "text_model"
            rest = key.split("resblocks.", 1)[1]
            n, inner = rest.split(".", 1)
            prefix = f"{tower}.encoder.layers.{n}"
            if inner in ("attn.in_proj_weight", "attn.in_proj_bias"):
                leaf = "weight" if inner.endswith("weight") else "bias"
                for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                    out[f"{prefix}.self_attn.{name}.{leaf}"] = part.contiguous()
                continue
            base, leaf = inner.rsplit(".", 1)
            if base not in _BLOCK:
                raise FgdataError(f"open_clip weights: unexpected key {key!r} (not a ViT CLIP this mapping knows)")
            out[f"{prefix}.{_BLOCK[base]}.{leaf}"] = value
        elif key == "attn_mask":
            continue  # open_clip's causal mask buffer (older checkpoints save it); CLIPModel builds its own
        else:
            raise FgdataError(f"open_clip weights: unexpected key {key!r} (not a ViT CLIP this mapping knows)")
    return out


def clean_caption(text: str) -> str:
    """A caption as open_clip's tokenizer sees it before BPE: ``ftfy.fix_text`` (mojibake, curly quotes, ligatures,
    full-width forms, NFC), HTML entities unescaped twice, runs of whitespace as one space, stripped, lower case.
    transformers' ``CLIPTokenizer`` normalises only NFC, whitespace and case, so ``&amp;`` or ``it’s`` would give
    other token ids than the ones LAION and DataComp scored with."""
    import html

    try:
        import ftfy
    except ImportError:
        raise FgdataError("the clip signal needs the ftfy package to clean captions as open_clip does "
                          "(pip install 'fgdata[latents]')") from None
    return " ".join(html.unescape(html.unescape(ftfy.fix_text(text))).split()).lower()


def _tokenizer(model_dir: str) -> Any:
    """transformers' CLIP tokenizer without its normaliser: :func:`clean_caption` has done open_clip's whole
    cleaning, and normalising again (NFC after the HTML unescape, Rust's lower case) would change some ids."""
    from tokenizers import normalizers
    from transformers import CLIPTokenizer  # tokenizers-backed: reads tokenizer.json or vocab.json + merges.txt

    tokenizer = CLIPTokenizer.from_pretrained(model_dir, local_files_only=True)
    tokenizer.backend_tokenizer.normalizer = normalizers.Sequence([])
    return tokenizer


def _load_clip(model_dir: str) -> tuple[Any, Any, int]:
    """(CLIPModel in eval mode on the CPU, tokenizer, image size)."""
    from transformers import CLIPModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # fgdata reports its own progress; a loader bar per worker is noise
    files = clip_files(model_dir)
    tokenizer = _tokenizer(model_dir)
    if files.layout == "hf":
        model = CLIPModel.from_pretrained(model_dir, local_files_only=True)
    else:
        with open(files.config, encoding="utf-8") as fh:
            cfg = json.load(fh)
        check_open_clip_config(cfg, files.config)
        model = CLIPModel(open_clip_config(cfg["model_cfg"], tokenizer))
        state = open_clip_to_hf(_load_state(files.weights))
        expected = {k for k in model.state_dict()}
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or extra:
            raise FgdataError(f"{files.weights}: does not fit {OPEN_CLIP_CONFIG} (missing {missing[:3]}, "
                              f"unexpected {extra[:3]})")
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise FgdataError(f"{files.weights}: does not fit {OPEN_CLIP_CONFIG} ({str(exc).splitlines()[-1]})") \
                from None
    model.eval()
    config: Any = model.config
    return model, tokenizer, int(config.vision_config.image_size)


def _aesthetic_head(state: dict[str, torch.Tensor], path: str) -> torch.nn.Module:
    from torch import nn

    if "layers.0.weight" not in state:
        raise FgdataError(f"{path}: not the aesthetic predictor (no layers.0.weight)")
    width = int(state["layers.0.weight"].shape[1])
    head = nn.Sequential(nn.Linear(width, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
                         nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))
    _load_head(head, {k.removeprefix("layers."): v for k, v in state.items()}, path)
    return head


def _nsfw_head(state: dict[str, torch.Tensor], path: str) -> torch.nn.Module:
    import torch
    from torch import nn

    if "linear_1.weight" not in state:
        raise FgdataError(f"{path}: not the NSFW detector (no linear_1.weight)")
    width = int(state["linear_1.weight"].shape[1])

    class Norm(nn.Module):
        mean: torch.Tensor
        variance: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mean", torch.zeros(width))
            self.register_buffer("variance", torch.ones(width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x - self.mean) / self.variance.sqrt()

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = Norm()
            self.linear_1, self.linear_2 = nn.Linear(width, 64), nn.Linear(64, 512)
            self.linear_3, self.linear_4 = nn.Linear(512, 256), nn.Linear(256, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.linear_1(self.norm(x)))
            x = torch.relu(self.linear_2(x))
            x = torch.relu(self.linear_3(x))
            return torch.sigmoid(self.linear_4(x))

    head = Head()
    _load_head(head, state, path)
    return head


def _load_head(head: torch.nn.Module, state: dict[str, torch.Tensor], path: str) -> None:
    try:
        head.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise FgdataError(f"{path}: does not fit the published layout ({str(exc).splitlines()[-1].strip()})") \
            from None
    head.eval()


@dataclass
class Scorer:
    """The loaded models of a set of model signals on one device: the CLIP model (None when only the watermark
    detector runs) with its tokenizer, image size and heads, and the watermark detector."""

    model: Any
    tokenizer: Any
    image_size: int | None
    device: str
    heads: dict[str, Any]

    def prepare(self, picture: Image.Image) -> dict[str, np.ndarray]:
        """A displayed picture as each loaded model's input: ``clip`` and/or ``watermark``."""
        out: dict[str, np.ndarray] = {}
        if self.image_size is not None:
            out["clip"] = preprocess_image(picture, self.image_size)
        if "watermark" in self.heads:
            from fgdata.score import watermark

            out["watermark"] = watermark.preprocess_image(picture)
        return out

    def image_embeddings(self, images: list[np.ndarray]) -> torch.Tensor:
        """The L2-normalised image embeddings (float32, on the device) of already preprocessed images."""
        import torch

        pixels = torch.from_numpy(np.stack(images)).to(self.device)
        with torch.no_grad():
            img = self.model.visual_projection(self.model.vision_model(pixel_values=pixels).pooler_output)
        return torch.nn.functional.normalize(img.float(), dim=-1)

    def token_ids(self, captions: list[str]) -> dict[str, torch.Tensor]:
        """``input_ids`` and ``attention_mask`` of cleaned captions (:func:`clean_caption`), truncated and padded to
        the context length (the last kept token is the end token, as open_clip truncates)."""
        return dict(self.tokenizer([clean_caption(c) for c in captions], padding="max_length", truncation=True,
                                   max_length=self.model.config.text_config.max_position_embeddings,
                                   return_tensors="pt"))

    def text_embeddings(self, captions: list[str]) -> torch.Tensor:
        """The L2-normalised text embeddings (float32, on the device) of captions."""
        import torch

        tok = self.token_ids(captions)
        with torch.no_grad():
            txt = self.model.text_projection(self.model.text_model(
                input_ids=tok["input_ids"].to(self.device),
                attention_mask=tok["attention_mask"].to(self.device)).pooler_output)
        return torch.nn.functional.normalize(txt.float(), dim=-1)

    def score(self, inputs: list[dict[str, np.ndarray]], captions: list[str | None], signals: tuple[str, ...]
              ) -> list[dict[str, float]]:
        """The model fields of one batch (each picture as :meth:`prepare` made it; None caption: no
        ``clip_score``)."""
        import torch

        out: list[dict[str, float]] = [{} for _ in inputs]
        if "watermark" in signals:
            from fgdata.score import watermark

            pixels = torch.from_numpy(np.stack([i["watermark"] for i in inputs])).to(self.device)
            for o, v in zip(out, watermark.p_watermark(self.heads["watermark"], pixels).cpu().tolist()):
                o["p_watermark"], o["p_no_watermark"] = float(v), 1.0 - float(v)
        if not any(s in CLIP_SIGNALS for s in signals):
            return out
        img = self.image_embeddings([i["clip"] for i in inputs])
        if "clip" in signals:
            which = [i for i, c in enumerate(captions) if c is not None]
            if which:
                txt = self.text_embeddings([c for c in captions if c is not None])
                cos = (img[which] * txt).sum(-1).cpu().tolist()
                for i, c in zip(which, cos):
                    out[i]["clip_score"] = float(c)
        with torch.no_grad():
            if "aesthetic" in signals:
                for o, v in zip(out, self.heads["aesthetic"](img).squeeze(-1).cpu().tolist()):
                    o["aesthetic"] = float(v)
            if "nsfw" in signals:
                for o, v in zip(out, self.heads["nsfw"](img).squeeze(-1).cpu().tolist()):
                    o["p_nsfw"], o["p_safe"] = float(v), 1.0 - float(v)
        return out


@functools.lru_cache(maxsize=4)
def scorer(model_dir: str, device: str, signals: tuple[str, ...]) -> Scorer:
    """The CLIP model and the heads ``signals`` need, loaded once per process."""
    from fgdata.compute import resolve_device

    dev = resolve_device(device)
    heads: dict[str, Any] = {}
    if "watermark" in signals:
        from fgdata.score import watermark

        path = head_file(model_dir, "watermark")
        heads["watermark"] = watermark.build(_load_state(path), path).to(dev)
    if not any(s in CLIP_SIGNALS for s in signals):
        return Scorer(None, None, None, dev, heads)
    model, tokenizer, size = _load_clip(model_dir)
    model.to(dev)
    width = int(model.config.projection_dim)
    for name in signals:
        if name in ("aesthetic", "nsfw"):
            path = head_file(model_dir, name)
            state = _load_state(path)
            head = _aesthetic_head(state, path) if name == "aesthetic" else _nsfw_head(state, path)
            takes = int(state["layers.0.weight" if name == "aesthetic" else "linear_1.weight"].shape[1])
            if takes != width:
                raise FgdataError(f"{path}: the {name} head takes {takes}-wide CLIP image embeddings, but the CLIP "
                                  f"model in {model_dir} gives {width}-wide ones (use the CLIP it was trained on)")
            heads[name] = head.to(dev)
    return Scorer(model, tokenizer, size, dev, heads)
