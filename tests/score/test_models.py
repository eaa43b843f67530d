"""Model signals (clip, aesthetic, nsfw) with tiny random models in the real layouts, saved to a temporary folder.

The CLIP model is a transformers ``CLIPModel`` with small sizes (saved with ``save_pretrained``), and the same
weights written in open_clip's hub layout by the test's own inverse of fgdata's key mapping. The heads are built
with the published state-dict keys and random weights; their input width is the tiny CLIP's embedding width (16)
instead of ViT-L/14's 768, which both published layouts allow (the width is the first Linear's, and the NSFW
normalisation's, input size). Expected values come from a direct torch computation in the test.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fgdata.shards import ShardWriter, iter_samples
from inprocess import fgdata as fg  # the commands' output, files and exit status are what is checked
from scorefiles import score_rows

EMBED = 16


def _tokenizer(path: Path) -> None:
    """A byte-level vocabulary (no merges) with CLIP's special tokens: enough to tokenize offline."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(symbols)}
    vocab.update({s + "</w>": 256 + i for i, s in enumerate(symbols[:40])})
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = 298, 299
    CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(path)


def _open_clip_state(model) -> dict:
    """The test's inverse of fgdata's mapping: a CLIPModel's weights under open_clip's keys."""
    import torch

    sd = model.state_dict()
    out = {"visual.conv1.weight": sd["vision_model.embeddings.patch_embedding.weight"],
           "visual.class_embedding": sd["vision_model.embeddings.class_embedding"],
           "visual.positional_embedding": sd["vision_model.embeddings.position_embedding.weight"],
           "visual.proj": sd["visual_projection.weight"].t(),
           "token_embedding.weight": sd["text_model.embeddings.token_embedding.weight"],
           "positional_embedding": sd["text_model.embeddings.position_embedding.weight"],
           "text_projection": sd["text_projection.weight"].t(), "logit_scale": sd["logit_scale"]}
    for ours, theirs in (("visual.ln_pre", "vision_model.pre_layrnorm"), ("visual.ln_post", "vision_model.post_layernorm"),
                         ("ln_final", "text_model.final_layer_norm")):
        for leaf in ("weight", "bias"):
            out[f"{ours}.{leaf}"] = sd[f"{theirs}.{leaf}"]
    for tower, prefix in (("vision_model", "visual.transformer"), ("text_model", "transformer")):
        for n in range(2):
            hf, oc = f"{tower}.encoder.layers.{n}", f"{prefix}.resblocks.{n}"
            for leaf in ("weight", "bias"):
                out[f"{oc}.attn.in_proj_{leaf}"] = torch.cat([sd[f"{hf}.self_attn.{p}_proj.{leaf}"] for p in "qkv"])
                for o, h in (("attn.out_proj", "self_attn.out_proj"), ("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"),
                             ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")):
                    out[f"{oc}.{o}.{leaf}"] = sd[f"{hf}.{h}.{leaf}"]
    return {k: v.contiguous().clone() for k, v in out.items()}


def _heads(folder: Path, width: int = EMBED) -> None:
    """The aesthetic and NSFW heads with their published keys and random weights."""
    import torch

    g = torch.Generator().manual_seed(1)

    def lin(i: int, o: int) -> tuple:
        return torch.randn(o, i, generator=g) / i ** 0.5, torch.randn(o, generator=g) * 0.1

    aes = {}
    for idx, (i, o) in zip((0, 2, 4, 6, 7), ((width, 1024), (1024, 128), (128, 64), (64, 16), (16, 1))):
        aes[f"layers.{idx}.weight"], aes[f"layers.{idx}.bias"] = lin(i, o)
    aes["layers.7.bias"] = aes["layers.7.bias"] + 5.0
    torch.save(aes, folder / "sac+logos+ava1-l14-linearMSE.pth")
    nsfw = {"norm.mean": torch.randn(width, generator=g) * 0.01, "norm.variance": torch.rand(width, generator=g) * 0.01 + 0.001}
    for n, (i, o) in enumerate(((width, 64), (64, 512), (512, 256), (256, 1)), start=1):
        nsfw[f"linear_{n}.weight"], nsfw[f"linear_{n}.bias"] = lin(i, o)
    torch.save(nsfw, folder / "clip_autokeras_binary_nsfw.pth")


def _clip(folder: Path, act: str = "quick_gelu"):
    import torch
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(0)
    config = CLIPConfig(
        projection_dim=EMBED,
        vision_config={"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
                       "image_size": 32, "patch_size": 8, "hidden_act": act, "layer_norm_eps": 1e-5},
        text_config={"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
                     "vocab_size": 300, "max_position_embeddings": 77, "hidden_act": act, "layer_norm_eps": 1e-5,
                     "bos_token_id": 298, "eos_token_id": 299, "pad_token_id": 299})
    model = CLIPModel(config).eval()
    model.save_pretrained(folder)
    _tokenizer(folder)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """hf: the HF layout (+ heads); open_clip: the same weights in open_clip's layout (+ the tokenizer files)."""
    import shutil

    import torch
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("clip")
    model = _clip(root / "hf")
    _heads(root / "hf")
    oc = root / "open_clip"
    oc.mkdir()
    cfg = {"model_cfg": {"embed_dim": EMBED, "quick_gelu": True,
                         "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 8},
                         "text_cfg": {"context_length": 77, "vocab_size": 300, "width": 32, "heads": 4, "layers": 2}},
           "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]}}
    (oc / "open_clip_config.json").write_text(json.dumps(cfg))
    save_file(_open_clip_state(model), str(oc / "open_clip_model.safetensors"))
    _tokenizer(oc)
    pt = root / "open_clip_bin"  # the pickled variant, read with torch.load(weights_only=True)
    shutil.copytree(oc, pt)
    (pt / "open_clip_model.safetensors").unlink()
    torch.save(_open_clip_state(model), pt / "open_clip_pytorch_model.bin")
    return {"hf": root / "hf", "open_clip": oc, "open_clip_bin": pt}


@pytest.fixture
def shards(tmp_path, sample_images) -> Path:
    dest = tmp_path / "wds"
    with ShardWriter(str(dest), maxcount=3) as w:
        for i, p in enumerate(sample_images):
            w.write(f"photo_{i:03d}", {p.suffix[1:].lower(): p.read_bytes(), "txt": f"photo number {i}".encode(),
                                       "json": json.dumps({"source": p.name}).encode()})
        w.write("broken", {"jpg": b"not a jpeg", "txt": b"broken image"})
        w.write("nocaption", {"jpg": sample_images[0].read_bytes()})
    return dest


def _expected(model_dir: Path, shards: Path) -> dict[str, dict]:
    """clip_score, aesthetic, p_nsfw computed directly: CLIPModel's own forward (logits / logit scale) and the heads
    as plain matrix products."""
    import torch
    from transformers import CLIPModel, CLIPTokenizer

    from fgdata.score.models import preprocess

    model = CLIPModel.from_pretrained(model_dir).eval()
    tok = CLIPTokenizer.from_pretrained(model_dir)
    aes = torch.load(model_dir / "sac+logos+ava1-l14-linearMSE.pth", weights_only=True)
    nsfw = torch.load(model_dir / "clip_autokeras_binary_nsfw.pth", weights_only=True)
    out = {}
    for t in sorted(shards.glob("*.tar")):
        for s in iter_samples(str(t)):
            image = next((d for e, d in s.members.items() if e in ("jpg", "png")), None)
            if s.key == "broken":
                continue
            assert image is not None
            pixels = torch.from_numpy(preprocess(image, 32))[None]
            with torch.no_grad():
                emb = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)
                x = emb / emb.norm(dim=-1, keepdim=True)
                a = x
                for idx in (0, 2, 4, 6, 7):
                    a = a @ aes[f"layers.{idx}.weight"].T + aes[f"layers.{idx}.bias"]
                h = (x - nsfw["norm.mean"]) / nsfw["norm.variance"].sqrt()
                for n in (1, 2, 3):
                    h = torch.relu(h @ nsfw[f"linear_{n}.weight"].T + nsfw[f"linear_{n}.bias"])
                p = torch.sigmoid(h @ nsfw["linear_4.weight"].T + nsfw["linear_4.bias"])
                row = {"aesthetic": float(a), "p_nsfw": float(p)}
                if "txt" in s.members:
                    ids = tok([s.members["txt"].decode()], padding="max_length", max_length=77, return_tensors="pt")
                    logits = model(input_ids=ids["input_ids"], pixel_values=pixels).logits_per_image
                    row["clip_score"] = float(logits / model.logit_scale.exp())
            out[s.key] = row
    return out


def test_preprocess_is_clips_resize_and_centre_crop():
    """A 2:1 image already at the target height is not resized; the crop is the middle square, normalised."""
    import io

    from PIL import Image

    from fgdata.score.models import CLIP_MEAN, CLIP_STD, preprocess

    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (32, 64, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    got = preprocess(buf.getvalue(), 32)
    want = ((arr[:, 16:48] / 255.0 - np.array(CLIP_MEAN)) / np.array(CLIP_STD)).transpose(2, 0, 1)
    assert got.shape == (3, 32, 32) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_clip_aesthetic_nsfw_match_a_direct_computation(models, shards):
    done = fg("score", str(shards), "--with", "clip,aesthetic,nsfw", "--model-dir", str(models["hf"]),
              "--batch-size", "3", "--json")
    assert done.returncode == 0, done.stderr
    rows = score_rows(shards)
    want = _expected(models["hf"], shards)
    assert set(rows) == set(want) | {"broken"}
    assert rows["broken"]["score_error"].startswith(".jpg:") and "clip_score" not in rows["broken"]
    assert "clip_score" not in rows["nocaption"] and "aesthetic" in rows["nocaption"]
    for key, row in want.items():
        for name, value in row.items():
            assert rows[key][name] == pytest.approx(value, abs=1e-5), (key, name)
        assert rows[key]["p_safe"] == pytest.approx(1.0 - rows[key]["p_nsfw"], abs=1e-12)
        assert -1.0 <= rows[key].get("clip_score", 0.0) <= 1.0
    meta = json.loads((shards / "scores.json").read_text())["signals"]
    from fgdata.fid.detectors import sha256_file

    assert meta["clip"]["model_sha256"]["clip"] == sha256_file(models["hf"] / "model.safetensors")
    assert meta["aesthetic"]["model_sha256"]["aesthetic"] == sha256_file(models["hf"] / "sac+logos+ava1-l14-linearMSE.pth")
    assert "bicubic" in meta["clip"]["preprocessing"] and "raw cosine" in meta["clip"]["scale"]
    assert meta["nsfw"]["fields"] == ["p_nsfw", "p_safe"]
    text = fg("inspect", str(shards / "00000.tar"), "-n", "0", env={"COLUMNS": "400"}).stdout
    assert "sac+logos+ava1-l14-linearMSE.pth" in text and meta["aesthetic"]["model_sha256"]["aesthetic"][:16] in text
    # a rerun with the same model files skips every shard; the batch size does not change the values
    again = fg("score", str(shards), "--with", "clip", "--model-dir", str(models["hf"]), "--json")
    assert all(s["skipped"] for s in json.loads(again.stdout)["shards"])


def test_open_clip_layout_gives_the_hf_scores(models, shards, tmp_path):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(shards, other)
    assert fg("score", str(shards), "--with", "clip", "--model-dir", str(models["hf"])).returncode == 0
    a = score_rows(shards)
    for layout in ("open_clip", "open_clip_bin"):
        for p in other.glob("*.scores.jsonl"):
            p.unlink()
        done = fg("score", str(other), "--with", "clip", "--model-dir", str(models[layout]))
        assert done.returncode == 0, done.stderr
        b = score_rows(other)
        assert a.keys() == b.keys()
        assert sum("clip_score" in r for r in a.values()) == len(a) - 2  # the broken image, the one without a caption
        for key in a:
            if "clip_score" in a[key]:
                assert b[key]["clip_score"] == pytest.approx(a[key]["clip_score"], abs=1e-6), (layout, key)
    meta = json.loads((other / "scores.json").read_text())["signals"]["clip"]
    assert meta["model"] == {"clip": "open_clip_pytorch_model.bin", "clip_layout": "open_clip"}


def test_open_clip_mapping_loads_every_key(models):
    """Every open_clip key maps, every CLIPModel weight is filled, and the config maps (quick_gelu, heads)."""
    from safetensors.torch import load_file
    from transformers import CLIPModel, CLIPTokenizer

    from fgdata.score.models import open_clip_config, open_clip_to_hf

    cfg = json.loads((models["open_clip"] / "open_clip_config.json").read_text())["model_cfg"]
    config = open_clip_config(cfg, CLIPTokenizer.from_pretrained(models["open_clip"]))
    assert config.vision_config.hidden_act == "quick_gelu" and config.vision_config.num_attention_heads == 4
    assert open_clip_config({**cfg, "quick_gelu": False}, CLIPTokenizer.from_pretrained(models["open_clip"])
                            ).text_config.hidden_act == "gelu"
    mapped = open_clip_to_hf(load_file(str(models["open_clip"] / "open_clip_model.safetensors")))
    reference = CLIPModel.from_pretrained(models["hf"]).state_dict()
    assert set(mapped) == set(reference)
    for k, v in mapped.items():
        assert v.shape == reference[k].shape and bool((v == reference[k]).all()), k


def test_presets_filter_on_p_safe_keeps_exactly(models, shards):
    from fgdata.loaders import WDSLoader

    assert fg("score", str(shards), "--with", "nsfw", "--model-dir", str(models["hf"])).returncode == 0
    rows = score_rows(shards)
    threshold = float(np.median([r["p_safe"] for r in rows.values() if "p_safe" in r]))
    want = sorted(k for k, r in rows.items() if r.get("p_safe", threshold) >= threshold)
    loader = WDSLoader(["WDS:" + str(shards)], batch_size=1, num_workers=0, train=False, partial=True,
                       presets_filter={"score": {"threshold": threshold, "score_key": "p_safe"}},
                       key_map={"caption": "txt"}, missing_text="empty")
    got = sorted(k for b in loader for k in b["__key__"])
    assert got == want and 0 < len(want) < len(rows)


def test_into_writes_model_scores_into_the_json(models, shards):
    beside = _expected(models["hf"], shards)
    done = fg("score", str(shards), "--with", "clip,nsfw", "--model-dir", str(models["hf"]), "--into", "--json")
    assert done.returncode == 0, done.stderr
    for t in sorted(shards.glob("*.tar")):
        for s in iter_samples(str(t)):
            if s.key == "broken":
                continue
            doc = json.loads(s.members["json"])
            assert doc["p_nsfw"] == pytest.approx(beside[s.key]["p_nsfw"], abs=1e-5)
            if "clip_score" in beside[s.key]:
                assert doc["clip_score"] == pytest.approx(beside[s.key]["clip_score"], abs=1e-5)


def test_missing_files_and_wrong_width_are_one_line_in_seconds(models, shards, tmp_path):
    import shutil

    empty = tmp_path / "empty"
    empty.mkdir()
    no_dir = fg("score", str(shards), "--with", "clip")
    assert no_dir.returncode == 2 and "--model-dir" in no_dir.stderr
    missing = fg("score", str(shards), "--with", "clip", "--model-dir", str(empty))
    assert missing.returncode == 1 and "config.json" in missing.stderr and "Traceback" not in missing.stderr
    no_weights = tmp_path / "no_weights"
    shutil.copytree(models["hf"], no_weights)
    (no_weights / "model.safetensors").unlink()
    weights = fg("score", str(shards), "--with", "clip", "--model-dir", str(no_weights))
    assert weights.returncode == 1 and "model.safetensors" in weights.stderr
    for done in (missing, weights):
        assert len(done.stderr.strip().splitlines()) == 1
    no_head = tmp_path / "no_head"
    shutil.copytree(models["hf"], no_head)
    (no_head / "clip_autokeras_binary_nsfw.pth").unlink()
    head = fg("score", str(shards), "--with", "nsfw", "--model-dir", str(no_head))
    assert head.returncode == 1 and "clip_autokeras_binary_nsfw.pth" in head.stderr
    assert len(head.stderr.strip().splitlines()) == 1
    assert not list(shards.glob("*.scores.jsonl"))  # refused before any shard was read
    wide = tmp_path / "wide"
    shutil.copytree(models["hf"], wide)
    _heads(wide, width=768)
    bad = fg("score", str(shards), "--with", "aesthetic", "--model-dir", str(wide))
    assert bad.returncode == 1 and "768" in bad.stderr and str(EMBED) in bad.stderr and "Traceback" not in bad.stderr


def test_a_non_finite_model_output_is_reported_not_written(models, shards, tmp_path):
    import shutil

    import torch

    nan = tmp_path / "nan"
    shutil.copytree(models["hf"], nan)
    state = torch.load(nan / "clip_autokeras_binary_nsfw.pth", weights_only=True)
    state["linear_4.bias"] = torch.full_like(state["linear_4.bias"], float("nan"))
    torch.save(state, nan / "clip_autokeras_binary_nsfw.pth")
    done = fg("score", str(shards), "--with", "nsfw", "--model-dir", str(nan), "--json")
    assert done.returncode == 0, done.stderr
    rows = score_rows(shards)
    assert json.loads(done.stdout)["failed_samples"] == len(rows)
    for row in rows.values():
        assert "p_nsfw" not in row and "p_safe" not in row and row["score_error"]
    assert "non-finite p_nsfw, p_safe" in rows["nocaption"]["score_error"]


def test_a_video_gets_the_mean_and_min_of_its_frames_scores(models, tmp_path):
    """A video sample is scored on the frames the weight-free signals use: each model field is the mean of the
    scores those frames get as photos (computed directly), ``FIELD_min`` the smallest; a video without a caption
    has no clip_score."""
    import io

    from PIL import Image
    from scorevideo import encode_frames, frames_at, varied_frames

    data = encode_frames(varied_frames(), fps=10, rotation=90)
    videos, photos = tmp_path / "videos", tmp_path / "photos"
    with ShardWriter(str(videos), maxcount=10) as w:
        w.write("clip", {"mp4": data, "txt": b"a short clip"})
        w.write("silent", {"mp4": data})
    with ShardWriter(str(photos), maxcount=10) as w:
        for i, frame in enumerate(frames_at(data, [5, 15, 25], rotation=90)):
            buf = io.BytesIO()
            Image.fromarray(frame).save(buf, format="PNG")
            w.write(f"frame_{i}", {"png": buf.getvalue(), "txt": b"a short clip"})
    done = fg("score", str(videos), "--with", "clip,aesthetic,nsfw", "--model-dir", str(models["hf"]),
              "--batch-size", "2", "--json")
    assert done.returncode == 0, done.stderr
    rows = score_rows(videos)
    per_frame = list(_expected(models["hf"], photos).values())
    for name in ("clip_score", "aesthetic", "p_nsfw"):
        values = [f[name] for f in per_frame]
        assert rows["clip"][name] == pytest.approx(float(np.mean(values)), abs=1e-5), name
        assert rows["clip"][f"{name}_min"] == pytest.approx(min(values), abs=1e-5), name
    assert rows["clip"]["p_safe_min"] == pytest.approx(1.0 - max(f["p_nsfw"] for f in per_frame), abs=1e-5)
    assert rows["clip"]["score_frames"] == 3 and "score_error" not in rows["clip"]
    assert "clip_score" not in rows["silent"] and rows["silent"]["aesthetic"] == rows["clip"]["aesthetic"]
