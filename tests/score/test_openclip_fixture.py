"""``fgdata score --with clip`` equals open_clip itself within 1e-4, on a checkpoint open_clip made and saved.

open_clip cannot be imported here (it needs torchvision, which does not install beside the CPU torch the project
pins), so ``tests/fixtures/openclip/make_fixture.py`` ran it once where it installs: a tiny random ViT-B/32-family
CLIP in open_clip's hub layout (``model/``) and open_clip's own token ids, embeddings and cosines for the
repository's photos and a set of captions its cleaning changes (``expected.json``). fgdata reads that folder
through its key mapping into transformers' ``CLIPModel``; nothing here recomputes the expected values.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from inprocess import fgdata

from fgdata.shards import ShardWriter
from scorefiles import score_rows

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "openclip"
SAMPLES = Path(__file__).resolve().parents[2] / "fgdata" / "sample_data"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    """The committed folder (``gelu``, as saved) and a copy whose config says ``quick_gelu: true``."""
    quick = tmp_path_factory.mktemp("openclip") / "quick_gelu"
    shutil.copytree(FIXTURE / "model", quick)
    doc = json.loads((quick / "open_clip_config.json").read_text())
    doc["model_cfg"]["quick_gelu"] = True
    (quick / "open_clip_config.json").write_text(json.dumps(doc))
    return {"gelu": FIXTURE / "model", "quick_gelu": quick}


def _shards(dest: Path) -> None:
    """One sample per (photo, caption) pair of the fixture, keyed by its index, five to a shard."""
    with ShardWriter(str(dest), maxcount=5) as w:
        for i, pair in enumerate(EXPECTED["gelu"]["pairs"]):
            image = SAMPLES / pair["image"]
            w.write(f"pair_{i:02d}", {image.suffix[1:]: image.read_bytes(), "txt": pair["caption"].encode()})


def _clip_scores(folder: Path) -> dict[str, float]:
    return {k: r["clip_score"] for k, r in score_rows(folder).items()}


def _plain_is_displayed(name: str) -> bool:
    """Whether Pillow's plain decode of the photo is already what a viewer shows (no alpha, ICC or rotation)."""
    from fgdata.media.image import decode_display

    return not decode_display((SAMPLES / name).read_bytes())[1]


def test_score_cli_and_library_give_open_clips_clip_score(tmp_path):
    """Both the command and ``score_datasets`` write open_clip's cosine for every pair, within 1e-4: on the
    displayed image always, and on the image as Pillow opens it wherever that is the same picture (fgdata scores
    the displayed one: a transparent PNG on white, an Adobe RGB JPEG in sRGB)."""
    from fgdata.fid.detectors import sha256_file
    from fgdata.score.job import ScoreOptions, score_datasets

    cli, lib = tmp_path / "cli", tmp_path / "lib"
    _shards(cli)
    _shards(lib)
    done = fgdata("score", cli, "--with", "clip", "--model-dir", FIXTURE / "model", "--batch-size", "4", "--json")
    assert done.returncode == 0, done.stderr
    summary = score_datasets([str(lib)], ScoreOptions(signals=("clip",), model_dir=str(FIXTURE / "model")))
    assert not any(s.failed or s.error for s in summary.shards)
    pairs = EXPECTED["gelu"]["pairs"]
    same_picture = {p["image"]: _plain_is_displayed(p["image"]) for p in pairs}
    assert not same_picture["rocket.jpg"] and not same_picture["horse.png"] and sum(same_picture.values()) == 5
    for got in (_clip_scores(cli), _clip_scores(lib)):
        assert sorted(got) == [f"pair_{i:02d}" for i in range(len(pairs))]
        for i, pair in enumerate(pairs):
            key = f"pair_{i:02d}"
            assert got[key] == pytest.approx(pair["clip_score_displayed"], abs=TOLERANCE), (key, pair["caption"])
            if same_picture[pair["image"]]:
                assert got[key] == pytest.approx(pair["clip_score_plain"], abs=TOLERANCE), key
    record = json.loads((cli / "scores.json").read_text())["signals"]["clip"]
    assert record["model_sha256"]["clip"] == EXPECTED["sha256"] == sha256_file(FIXTURE / "model" /
                                                                               "open_clip_model.safetensors")
    assert record["model"] == {"clip": "open_clip_model.safetensors", "clip_layout": "open_clip"}


@pytest.mark.parametrize("activation", ["gelu", "quick_gelu"])
def test_token_ids_and_embeddings_are_open_clips(model_dirs, activation):
    """The token ids (open_clip's cleaning: entities, curly quotes, mojibake, ligatures, full-width forms, Greek
    final sigma, whitespace; truncation to 77 with the end token last) equal open_clip's exactly, and the
    L2-normalised image and text embeddings within 1e-4, for the config as saved and with ``quick_gelu``."""
    import torch

    from fgdata.score.models import preprocess, scorer

    want = EXPECTED[activation]
    model = scorer(str(model_dirs[activation]), "cpu", ("clip",))
    texts = want["texts"]
    ids = model.token_ids([t["caption"] for t in texts])["input_ids"]
    for row, t in zip(ids.tolist(), texts):
        assert row[:len(t["ids"])] == t["ids"], t["caption"]
    assert max(len(t["ids"]) for t in texts) == 77  # the long caption was truncated, its end token kept
    got = model.text_embeddings([t["caption"] for t in texts])
    assert torch.allclose(got, torch.tensor([t["embedding"] for t in texts]), atol=TOLERANCE, rtol=0)
    other = EXPECTED["quick_gelu" if activation == "gelu" else "gelu"]["texts"]  # the fixture tells them apart
    assert not torch.allclose(got, torch.tensor([t["embedding"] for t in other]), atol=10 * TOLERANCE, rtol=0)
    names = sorted(want["images"])
    images = model.image_embeddings([preprocess((SAMPLES / n).read_bytes(), model.image_size) for n in names])
    assert torch.allclose(images, torch.tensor([want["images"][n]["displayed"] for n in names]), atol=TOLERANCE,
                          rtol=0)



@pytest.mark.parametrize(("section", "key", "value"), [
    ("text_cfg", "pool_type", "last"),  # a computation fgdata's CLIPModel does not make
    ("text_cfg", "hf_tokenizer_name", "bert-base-uncased"),  # another tokenizer
    ("preprocess_cfg", "mean", [0.5, 0.5, 0.5]),  # other preprocessing
])
def test_a_config_fgdata_would_compute_differently_is_one_line(tmp_path, section, key, value):
    """An open_clip config that is not a plain ViT CLIP with CLIP's preprocessing is refused before any shard is
    read, in one line naming the key, instead of scoring with other values than open_clip's."""
    model = tmp_path / "model"
    shutil.copytree(FIXTURE / "model", model)
    doc = json.loads((model / "open_clip_config.json").read_text())
    (doc if section == "preprocess_cfg" else doc["model_cfg"])[section][key] = value
    (model / "open_clip_config.json").write_text(json.dumps(doc))
    _shards(tmp_path / "wds")
    done = fgdata("score", tmp_path / "wds", "--with", "clip", "--model-dir", model)
    assert done.returncode == 1 and f"{section}.{key}" in done.stderr and "open_clip_config.json" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not list((tmp_path / "wds").glob("*.scores.jsonl"))
