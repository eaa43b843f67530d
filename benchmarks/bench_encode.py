"""Encoding throughput: fgdata's batched ``encode latents`` against the batch-1 float32 reference loop.

Same inputs, one run, side by side. The reference does what EDM2's ``encode`` and fast-DiT's extractor do:
decode one image, encode it at batch 1 in float32, save one file. fgdata decodes on threads ahead of the model,
encodes batches (optionally bf16 / channels_last on CUDA) and writes shards.

Also measured: the VAE alone on pre-decoded tensors (fp32 batch 1, fp32 batched, bf16 batched) and a text
encoder (batch 1 vs batched). Random weights: throughput does not depend on them.

    python benchmarks/bench_encode.py                        # CPU: tiny 4-block VAE, tiny T5
    python benchmarks/bench_encode.py --device cuda --vae-config sd --text-config t5-base --images 512
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VAE_CONFIGS = {
    # The tiny test VAE (0.25 M parameters, SD-shaped latents).
    "tiny": dict(block_out_channels=(8, 16, 32, 32), layers_per_block=1, norm_num_groups=8),
    # The full SD-VAE (sd-vae-ft-mse) architecture, 83.65 M parameters. AutoencoderKL() alone is NOT this.
    "sd": dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32),
}
TEXT_CONFIGS = {
    "tiny": dict(vocab_size=384, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                 relative_attention_num_buckets=8),
    "t5-base": dict(vocab_size=384, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12),
}


def build_vae(name: str, path: Path) -> Path:
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                  up_block_types=("UpDecoderBlock2D",) * 4, latent_channels=4, scaling_factor=0.18215,
                  **VAE_CONFIGS[name]).save_pretrained(path)
    return path


def build_inputs(n: int, dest: Path) -> Path:
    from fgdata.shards import ShardWriter

    images = sorted(p for p in (REPO / "fgdata" / "sample_data").iterdir() if p.suffix.lower() in (".jpg", ".png"))
    with ShardWriter(str(dest), maxcount=max(1, n // 4)) as w:
        for i in range(n):
            img = images[i % len(images)]
            w.write(f"sample_{i:06d}", {img.suffix[1:].lower(): img.read_bytes(), "txt": b"a photo"})
    return dest


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reference(src: Path, out: Path, vae_dir: Path, size: int, device: str) -> float:
    """Batch 1, float32, decode inline, one file per image (the behaviour fgdata replaces)."""
    import torch
    from diffusers import AutoencoderKL

    from fgdata.media.image import load_image_for_training
    from fgdata.shards import discover_shards, iter_samples

    vae = AutoencoderKL.from_pretrained(str(vae_dir)).eval().to(device)
    out.mkdir(parents=True, exist_ok=True)
    sync(device)
    t0 = time.perf_counter()
    n = 0
    for shard in discover_shards(str(src)):
        for s in iter_samples(shard):
            ext = next(e for e in s.members if e in ("jpg", "png"))
            x = torch.from_numpy(load_image_for_training(s.members[ext], size, simplejpeg=False))[None].to(device)
            with torch.no_grad():
                z = vae.encode(x).latent_dist.sample() * 0.18215
            torch.save(z[0].cpu().clone(), out / f"{s.key}.pth")
            n += 1
    sync(device)
    return n / (time.perf_counter() - t0)


def fgdata_encode(src: Path, out: Path, vae_dir: Path, size: int, device: str, batch: int, dtype: str) -> float:
    from fgdata.encode.latents import LatentOptions, encode_latents

    shutil.rmtree(out, ignore_errors=True)
    sync(device)
    t0 = time.perf_counter()
    s = encode_latents(str(src), str(out), LatentOptions(vae=str(vae_dir), size=size, batch_size=batch, dtype=dtype),
                       device=device, decode_workers=min(8, os.cpu_count() or 2))
    sync(device)
    return s.written / (time.perf_counter() - t0)


def model_only(vae_dir: Path, size: int, device: str, batch: int, dtype: str, n: int) -> float:
    """VAE encode alone on random pixels: images/s at ``batch`` in ``dtype``."""
    import torch

    from fgdata.encode.vae import load_vae

    vae = load_vae(str(vae_dir), device=device, dtype=dtype)
    if device.startswith("cuda") and batch > 1:
        vae = vae.to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device=device, dtype=next(vae.parameters()).dtype)
    if device.startswith("cuda") and batch > 1:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        vae.encode(x)  # warm-up (cudnn autotune, allocator)
        sync(device)
        t0 = time.perf_counter()
        done = 0
        while done < n:
            vae.encode(x).latent_dist.mean
            done += batch
        sync(device)
    return done / (time.perf_counter() - t0)


def text_throughput(name: str, device: str, batch: int, n: int, max_length: int) -> float:
    import torch
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    from fgdata.encode.text import load_text_encoder

    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        T5EncoderModel(T5Config(**TEXT_CONFIGS[name])).save_pretrained(d)
        ByT5Tokenizer().save_pretrained(d)
        enc = load_text_encoder(d, device=device, max_length=max_length)
    prompts = [f"a photo of object number {i} on a table, studio lighting" for i in range(batch)]
    enc.encode(prompts)
    sync(device)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        enc.encode(prompts)
        done += batch
    sync(device)
    return done / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vae-config", choices=sorted(VAE_CONFIGS), default="tiny")
    ap.add_argument("--text-config", choices=sorted(TEXT_CONFIGS), default="tiny")
    ap.add_argument("--images", type=int, default=48)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--text-n", type=int, default=256)
    ap.add_argument("--skip-pipeline", action="store_true", help="Only the model-only and text rows.")
    ap.add_argument("--out", help="Append the table to this markdown file.")
    args = ap.parse_args()
    import torch

    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        vae_dir = build_vae(args.vae_config, tmp_path / "vae")
        if not args.skip_pipeline:
            src = build_inputs(args.images, tmp_path / "src")
            ref = reference(src, tmp_path / "ref", vae_dir, args.size, args.device)
            rows.append(("pipeline: reference loop, batch 1, fp32 (decode inline, file per image)", ref, 1.0))
            ours = fgdata_encode(src, tmp_path / "fg32", vae_dir, args.size, args.device, args.batch_size, "float32")
            rows.append((f"pipeline: fgdata encode latents, batch {args.batch_size}, fp32", ours, ours / ref))
            if args.device.startswith("cuda"):
                ours = fgdata_encode(src, tmp_path / "fg16", vae_dir, args.size, args.device, args.batch_size,
                                     "bfloat16")
                rows.append((f"pipeline: fgdata encode latents, batch {args.batch_size}, bf16", ours, ours / ref))
        n = max(args.batch_size * 2, args.images)
        b1 = model_only(vae_dir, args.size, args.device, 1, "float32", min(n, 64))
        rows.append(("VAE only: batch 1, fp32", b1, 1.0))
        rows.append((f"VAE only: batch {args.batch_size}, fp32",
                     v := model_only(vae_dir, args.size, args.device, args.batch_size, "float32", n), v / b1))
        if args.device.startswith("cuda"):
            rows.append((f"VAE only: batch {args.batch_size}, bf16 + channels_last",
                         v := model_only(vae_dir, args.size, args.device, args.batch_size, "bfloat16", n), v / b1))
    t1 = text_throughput(args.text_config, args.device, 1, min(args.text_n, 32), 77)
    tb = text_throughput(args.text_config, args.device, 32, args.text_n, 77)
    rows += [(f"text ({args.text_config} T5 encoder, 77 tokens): batch 1", t1, 1.0),
             (f"text ({args.text_config} T5 encoder, 77 tokens): batch 32", tb, tb / t1)]
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    head = (f"\n### encode: {args.vae_config} VAE at {args.size}², {args.images} images, {device}, torch {torch.__version__}\n\n"
            "| case | items/s | vs batch-1 fp32 |\n|---|---|---|\n")
    table = head + "".join(f"| {name} | {rate:.1f} | {ratio:.2f}x |\n" for name, rate, ratio in rows)
    print(table)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(table)


if __name__ == "__main__":
    main()
