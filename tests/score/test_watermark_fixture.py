"""``fgdata score --with watermark`` equals timm's EfficientNet-B3 with LAION's head within 1e-4.

timm cannot be imported here (it needs torchvision, which does not install beside the CPU torch the project pins),
so ``tests/fixtures/watermark/make_fixture.py`` ran it once where it installs: a small detector made with timm's
B3 builder and LAION's head layout (``model/watermark_model_v1.pt``), timm's probabilities for the repository's
photos through LAION's transforms (``expected.json``), and every key and shape of the real-size network
(``b3_keys.json``). Nothing here recomputes the expected values.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from inprocess import fgdata

from fgdata.shards import ShardWriter
from scorefiles import score_rows

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "watermark"
SAMPLES = Path(__file__).resolve().parents[2] / "fgdata" / "sample_data"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
TOLERANCE = 1e-4


def _shards(dest: Path) -> None:
    with ShardWriter(str(dest), maxcount=4) as w:
        for name in EXPECTED["photos"]:
            w.write(Path(name).stem, {Path(name).suffix[1:]: (SAMPLES / name).read_bytes()})


def test_score_cli_and_library_give_timms_p_watermark(tmp_path):
    """Both the command and ``score_datasets`` write timm's softmax column 0 as ``p_watermark`` (within 1e-4, on
    the displayed photo; on Pillow's plain decode too where that is the same picture), ``p_no_watermark`` its
    complement, and record the weight file's sha256; no CLIP model is needed for this signal."""
    from fgdata.media.image import decode_display
    from fgdata.score.job import ScoreOptions, score_datasets

    cli, lib = tmp_path / "cli", tmp_path / "lib"
    _shards(cli)
    _shards(lib)
    done = fgdata("score", cli, "--with", "watermark", "--model-dir", FIXTURE / "model", "--batch-size", "3", "--json")
    assert done.returncode == 0, done.stderr
    summary = score_datasets([str(lib)], ScoreOptions(signals=("watermark",), model_dir=str(FIXTURE / "model")))
    assert not any(s.failed or s.error for s in summary.shards)
    for rows in (score_rows(cli), score_rows(lib)):
        assert sorted(rows) == sorted(Path(n).stem for n in EXPECTED["photos"])
        for name, want in EXPECTED["photos"].items():
            row = rows[Path(name).stem]
            assert row["p_watermark"] == pytest.approx(want["p_watermark_displayed"], abs=TOLERANCE), name
            assert row["p_no_watermark"] == pytest.approx(1.0 - row["p_watermark"], abs=1e-12)
            if not decode_display((SAMPLES / name).read_bytes())[1]:
                assert row["p_watermark"] == pytest.approx(want["p_watermark_plain"], abs=TOLERANCE), name
    record = json.loads((cli / "scores.json").read_text())["signals"]["watermark"]
    assert record["fields"] == ["p_watermark", "p_no_watermark"]
    assert record["model"] == {"watermark": "watermark_model_v1.pt"}
    assert record["model_sha256"] == {"watermark": EXPECTED["sha256"]}
    assert "256x256" in record["preprocessing"] and "bilinear" in record["preprocessing"]


def test_the_module_has_exactly_the_real_networks_keys_and_shapes():
    """fgdata's module, built for the real B3 with LAION's 1536-625-256-2 head, holds every key timm's has, with
    the same shape, and no other (so LAION's file loads with ``strict=True``)."""
    import torch

    from fgdata.score.watermark import build

    keys = json.loads((FIXTURE / "b3_keys.json").read_text())["keys"]
    model = build({k: torch.zeros(shape) for k, shape in keys.items()}, "b3")
    got = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert got == keys
    assert got["classifier.0.weight"] == [625, 1536] and got["conv_stem.weight"] == [40, 3, 3, 3]
    assert sum(1 for k in got if k.endswith(".conv_dw.weight")) == 26


def test_a_missing_or_foreign_file_is_one_line(tmp_path):
    _shards(tmp_path / "wds")
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = fgdata("score", tmp_path / "wds", "--with", "watermark", "--model-dir", empty)
    assert missing.returncode == 1 and "watermark_model_v1.pt" in missing.stderr
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "openclip" / "model" /
                "open_clip_model.safetensors", foreign / "watermark_model_v1.safetensors")
    wrong = fgdata("score", tmp_path / "wds", "--with", "watermark", "--model-dir", foreign)
    assert wrong.returncode == 1 and "not the LAION watermark detector" in wrong.stderr
    for done in (missing, wrong):
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not list((tmp_path / "wds").glob("*.scores.jsonl"))
