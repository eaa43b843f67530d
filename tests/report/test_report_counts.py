"""Every figure of `fgdata report` counts what it says: fields present in n of N samples, extension sets as listed,
"and N more" after a few examples; text in any script is drawn without missing-glyph warnings, the contact sheet
keeps all text inside its cells, and memory stays bounded per member."""

from __future__ import annotations

import io
import json
import subprocess
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fgdata.shards import ShardWriter, require_shards
from inprocess import fgdata

def fg(*args: str) -> subprocess.CompletedProcess:
    """``fgdata ARGS`` in this process, the summary's lines unwrapped."""
    return fgdata(*args, env={"COLUMNS": "400"})


def image(ext: str, shade: int, size: tuple[int, int] = (40, 30)) -> bytes:
    buf = io.BytesIO()
    arr = np.full((size[1], size[0], 3), shade, np.uint8)
    arr[:, : size[0] // 4] = 255
    Image.fromarray(arr).save(buf, {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}[ext])
    return buf.getvalue()


def render(path: Path) -> tuple[dict, str]:
    """The report document and page, in-process."""
    from fgdata.report.build import build_report

    r = build_report(require_shards(str(path)), name="t", paths=[str(path)])
    return r.doc, r.html


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """20 samples in three extension sets (png, jpg or webp, each with json and txt); 2 carry aesthetic_score."""
    dest = tmp_path_factory.mktemp("mixed")
    with ShardWriter(str(dest), maxcount=20) as w:
        for i in range(20):
            ext = ("png", "jpg", "webp")[i % 3]
            meta = {"aesthetic_score": (4.2, 6.1)[i]} if i < 2 else {"tag": "x"}
            w.write(f"{i:06d}", {ext: image(ext, 10 * i), "json": json.dumps(meta).encode(),
                                 "txt": f"photo number {i}".encode()})
    return dest


def test_a_field_in_few_samples_says_so_and_counts_the_filter_honestly(mixed, tmp_path):
    doc, _ = render(mixed)
    f = doc["numeric_fields"]["aesthetic_score"]
    assert (f["present"], f["samples"], f["count"]) == (2, 20, 2)
    sf = f["score_filter"]
    assert sf["presets_filter"]["score"]["threshold"] == 5.0
    assert (sf["kept_with_field"], sf["passed_without_field"], sf["kept"]) == (1, 18, 19)
    res = fg("report", str(mixed), "-o", str(tmp_path / "r.html"))
    assert res.returncode == 1, res.stderr  # the one problem: png, jpg and webp in one dataset
    assert "mixed image formats" in res.stdout
    line = next(line for line in res.stdout.splitlines() if line.lstrip().startswith("aesthetic_score"))
    assert "in 2 of 20 samples" in line and "keeps 1 of those 2" in line and "18 without it pass" in line
    assert "19 of 20 kept (95.0%)" in line
    page = (tmp_path / "r.html").read_text()
    assert "2 of 20" in page and "1 of 2 with it" in page


def test_several_extension_sets_are_never_called_the_same_members(mixed):
    doc, page = render(mixed)
    assert len(doc["extension_sets"]) == 3
    assert [p["kind"] for p in doc["problems"]] == ["mixed image formats"]
    assert "every sample has the same members" not in page
    assert '<div class="v">3</div><div class="l">extension sets</div>' in page


def test_problem_examples_say_how_many_more(tmp_path):
    with ShardWriter(str(tmp_path), maxcount=20) as w:
        for i in range(8):
            w.write(f"{i:06d}", {"png": image("png", 20 * i), "txt": b"" if i < 6 else b"a caption"})
    doc, page = render(tmp_path)
    [empty] = [p for p in doc["problems"] if p["kind"] == "empty member"]
    assert empty["count"] == 6 and len(empty["examples"]) == 5
    assert "and 1 more" in page


def test_scripts_the_fonts_lack_draw_without_warnings(tmp_path):
    """Chinese, Japanese (its hiragana in a fallback font, the rest in none), Arabic and emoji captions, as captions
    and as first words: drawn with an installed font that has them, else as U+FFFD; no warning of any kind, and
    the page carries each caption as text."""
    captions = ["一只猫坐在窗台上 看着外面的雨", "猫の写真です 窓の外", "صورة قطة على النافذة", "🐱🌧️ a cat in the rain"]
    with ShardWriter(str(tmp_path / "cjk"), maxcount=20) as w:
        for i, caption in enumerate(captions):
            w.write(f"{i:06d}", {"png": image("png", 60 * i), "txt": caption.encode()})
    sheet = tmp_path / "sheet.png"
    res = fg("report", str(tmp_path / "cjk"), "-o", str(tmp_path / "r.html"), "--contact-sheet", str(sheet))
    assert res.returncode == 0, res.stderr
    assert "Warning" not in res.stderr and "Glyph" not in res.stderr, res.stderr
    page = (tmp_path / "r.html").read_text()
    assert all(caption in page for caption in captions)
    assert sheet.read_bytes()[:4] == b"\x89PNG"


def test_the_page_shows_control_characters_and_bidi_overrides_escaped(tmp_path):
    """Escape sequences, C1 controls and bidi overrides in a caption reach the page written out, as in the
    terminal, never raw."""
    caption = "\u202eevil\x1b[2J\x9b31m \u2066x\u2069 end"
    with ShardWriter(str(tmp_path), maxcount=20) as w:
        w.write("000000", {"png": image("png", 20), "txt": caption.encode()})
    _, page = render(tmp_path)
    raw = {c for c in page if (ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) < 0xA0
           or 0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069}
    assert not raw, sorted(map(hex, map(ord, raw)))
    assert "\\u202eevil\\x1b[2J\\x9b31m \\u2066x\\u2069 end" in page


def test_a_character_the_default_font_lacks_uses_an_installed_font_that_has_it():
    """Matplotlib's own math fonts have the mathematical bold letters DejaVu Sans lacks: they become a fallback."""
    from fgdata.report import plots

    text = "\U0001d400\U0001d401 bold"
    assert plots.drawable(text) == text
    assert len(plots._FAMILY) > 1
    assert plots.drawable("\U0010fffd\U0010fffc x") == "\ufffd x"  # private use: no font draws these


def test_contact_sheet_keeps_every_text_inside_its_cell():
    """Long keys, long captions without spaces and wide letters: the margins of every cell stay white, so no
    text reaches past its picture's width or out of the sheet."""
    from fgdata.media.preview import Tile
    from fgdata.report.plots import SHEET_PAD, contact_sheet, sheet_cell

    def png(shade: int) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (120, 80), (shade, 40, 200 - shade)).save(buf, "PNG")
        return buf.getvalue()

    tiles = [Tile("k" * 90, "s", png(10), "W" * 400), Tile("sample_000001", "s", png(60), "MW " * 80),
             Tile("WWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWW", "s", png(110), "a short one"),
             Tile("x", "s", png(160), "Mm" * 50 + " " + "W" * 30)]
    with Image.open(io.BytesIO(contact_sheet(tiles, columns=2))) as im:
        px = np.asarray(im.convert("L"))
    cell_w, cell_h = sheet_cell()
    assert px.shape == (2 * cell_h, 2 * cell_w)
    margin = SHEET_PAD - 2
    for col in range(2):
        left, right = col * cell_w, (col + 1) * cell_w
        assert px[:, left : left + margin].min() == 255
        assert px[:, right - margin : right].min() == 255
    assert px[:3].min() == 255 and px[-3:].min() == 255
    for row in range(2):  # the title band and the caption band hold text: something was drawn in each
        top = row * cell_h
        assert px[top + SHEET_PAD : top + SHEET_PAD + 14].min() < 200
        assert px[top + cell_h - SHEET_PAD - 28 : top + cell_h - SHEET_PAD].min() < 200


def test_report_memory_is_bounded_per_member(tmp_path):
    """A caption of 8 MB: the report holds about the member and its text, never a word list (many times bigger)."""
    from fgdata.report.collect import collect

    caption = ("lorem ipsum dolor sit amet " * 300_000).encode()  # 8.1 MB, 1.5 million words
    with ShardWriter(str(tmp_path), maxcount=20) as w:
        w.write("000000", {"png": image("png", 50), "txt": caption})
    tracemalloc.start()
    try:
        stats = collect(require_shards(str(tmp_path)), tiles=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stats.caption_words[0] == 1_500_000
    assert peak < 3 * len(caption), f"peak {peak / 1e6:.0f} MB for an {len(caption) / 1e6:.0f} MB caption"


def test_members_over_the_inspect_limit_are_not_loaded(tmp_path):
    """The report reads members with inspect's per-member limit: a caption over it is counted as not loaded."""
    from fgdata.report.collect import collect
    from fgdata.report.summary import summarise
    from fgdata.verify.inspect import MEMBER_LIMIT

    with ShardWriter(str(tmp_path), maxcount=20) as w:
        w.write("000000", {"png": image("png", 50), "txt": b"w" * (MEMBER_LIMIT + 1), "json": b'{"score": 3}'})
    tracemalloc.start()
    try:
        stats = collect(require_shards(str(tmp_path)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    doc = summarise(stats, name="t", paths=[str(tmp_path)])
    assert doc["not_loaded"] == {"limit_bytes": MEMBER_LIMIT, "members": {"txt": 1}}
    assert stats.captions == 0 and list(stats.numeric["score"]) == [3.0]
    assert peak < MEMBER_LIMIT // 4
