#!/usr/bin/env bash
# GPU check for the encode commands (about 3-5 minutes on one recent GPU; needs the package installed:
# pip install -e '.[latents]' with a CUDA torch). No network: random-weight models built from configs.
#   1. SD-VAE-shaped AutoencoderKL (full sd-vae-ft-mse config, 83.65 M parameters) at 256^2:
#      VAE-only images/s at batch 1 fp32 vs batch 32 fp32 and bf16+channels_last, and the whole
#      `encode latents` pipeline (decode threads + shards) vs the batch-1 fp32 reference loop.
#   2. T5-base-shaped text encoder: captions/s at batch 1 vs 32.
# Target: batched bf16 >= 10x the batch-1 fp32 reference on the same GPU. Prints a markdown table and
# writes it to $OUT/results_encode_gpu.md when $OUT is set, else to gpu_results.md (copy the figures into RESULTS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$PY" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''); sys.exit(0 if torch.cuda.is_available() else 3)"
OUTFILE=${OUT:+$OUT/results_encode_gpu.md}
OUTFILE=${OUTFILE:-gpu_results.md}
timeout 420 "$PY" benchmarks/bench_encode.py --device cuda --vae-config sd --text-config t5-base \
  --images 384 --size 256 --batch-size 32 --text-n 1024 --out "$OUTFILE"
