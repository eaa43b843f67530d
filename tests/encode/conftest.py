"""Tiny random models saved with save_pretrained (ENVIRONMENT.md) and small input shards.

Everything loads back through the same ``from_pretrained`` calls fgdata uses for hub ids; nothing is mocked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

PROMPTS = ["a photo of a cat", "a red car on a road", "two dogs playing", "", "a very long prompt " * 8,
           "mountains at dawn", "a bowl of fruit"]


def tiny_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 16, 32, 32), layers_per_block=1,
        latent_channels=4, norm_num_groups=8, scaling_factor=0.18215,
    )


def tiny_t5(path: Path, d_model: int = 32) -> Path:
    import torch
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    torch.manual_seed(0)
    T5EncoderModel(T5Config(vocab_size=384, d_model=d_model, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                            relative_attention_num_buckets=8)).save_pretrained(path)
    ByT5Tokenizer().save_pretrained(path)
    return path


def tiny_clip(path: Path) -> Path:
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(0)
    CLIPTextModel(CLIPTextConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, max_position_embeddings=77, bos_token_id=298,
                                 eos_token_id=299, pad_token_id=299)).save_pretrained(path)
    # A byte-level vocabulary (no merges) with CLIP's special tokens: enough to tokenize offline.
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(symbols)}
    vocab.update({s + "</w>": 256 + i for i, s in enumerate(symbols[:40])})
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = 298, 299
    CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """Directories of a tiny image VAE, a tiny Wan video VAE, a T5 and a CLIP text encoder, and a KD teacher."""
    import torch
    from diffusers import AutoencoderKLWan, DDIMScheduler, UNet2DConditionModel

    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    tiny_vae().save_pretrained(root / "vae")
    AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
                     latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[2.0, 1.5, 1.0, 0.5]).save_pretrained(root / "wan_vae")
    tiny_t5(root / "t5")
    tiny_clip(root / "clip")

    # Teacher 1: an SD-style pipeline directory (unet + DDIM + T5 text encoder + VAE), model_index.json layout.
    sd = root / "teacher_unet"
    torch.manual_seed(0)
    UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
                         down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                         up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                         attention_head_dim=4, norm_num_groups=8).save_pretrained(sd / "unet")
    DDIMScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                  clip_sample=False, set_alpha_to_one=False).save_pretrained(sd / "scheduler")
    tiny_t5(sd / "text_encoder")
    from transformers import ByT5Tokenizer

    ByT5Tokenizer().save_pretrained(sd / "tokenizer")
    tiny_vae().save_pretrained(sd / "vae")
    (sd / "model_index.json").write_text(json.dumps({
        "_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
        "scheduler": ["diffusers", "DDIMScheduler"], "text_encoder": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "ByT5Tokenizer"], "vae": ["diffusers", "AutoencoderKL"]}))

    wan_vae = root / "wan_vae"
    return {"vae": root / "vae", "wan_vae": wan_vae, "t5": root / "t5", "clip": root / "clip",
            "teacher_unet": sd}


def write_shards(dest: Path, samples: list[tuple[str, dict[str, bytes]]], per_shard: int) -> Path:
    from fgdata.shards import ShardWriter

    with ShardWriter(str(dest), maxcount=per_shard) as w:
        for key, members in samples:
            w.write(key, members)
    return dest


@pytest.fixture(scope="session")
def image_shards(tmp_path_factory, sample_images) -> Path:
    """3 shards (3 + 3 + 1 samples) of the bundled images with captions and a json member, plus one bad image."""
    samples = []
    for i in range(6):
        img = sample_images[i % len(sample_images)]
        members = {img.suffix[1:].lower(): img.read_bytes(), "txt": PROMPTS[i].encode(),
                   "json": json.dumps({"score": i}).encode()}
        samples.append((f"sample_{i:06d}", members))
    samples.append(("sample_000006", {"jpg": b"not an image", "txt": b"broken"}))
    return write_shards(tmp_path_factory.mktemp("img") / "shards", samples, per_shard=3)


@pytest.fixture(scope="session")
def video_shards(tmp_path_factory) -> Path:
    """2 samples of a synthetic 9-frame 48x40 h264 clip (encoded with PyAV, ultrafast)."""
    import io

    import av
    import numpy as np

    def clip(seed: int) -> bytes:
        buf = io.BytesIO()
        with av.open(buf, "w", format="mp4") as c:
            s = c.add_stream("libx264", rate=8, options={"preset": "ultrafast"})
            s.width, s.height, s.pix_fmt = 48, 40, "yuv420p"
            rng = np.random.default_rng(seed)
            for i in range(10):
                frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8), format="rgb24")
                frame.pts = i
                for p in s.encode(frame):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        return buf.getvalue()

    samples = [(f"vid_{i:03d}", {"mp4": clip(i), "txt": PROMPTS[i].encode()}) for i in range(2)]
    return write_shards(tmp_path_factory.mktemp("vid") / "shards", samples, per_shard=1)
