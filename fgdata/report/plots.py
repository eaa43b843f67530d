"""The report's figures, drawn with matplotlib (Agg, no display) and returned as PNG bytes.

One look for all of them: a light grid, no top or right frame, one accent colour per section.
Text from the data (captions, keys, first words, field names) goes through :func:`drawable`: a character the
default font lacks is drawn with an installed font that has it (a Noto CJK font, say), found once through
matplotlib's font list; one no installed font has is drawn as U+FFFD, so matplotlib never warns about missing
glyphs and the HTML page shows the text itself.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Sequence
from typing import Any

from fgdata.errors import FgdataError
from fgdata.media.preview import Tile
from fgdata.formatting import human_bytes, terminal_safe

ACCENT = "#3b6fd4"
SECOND = "#e8833a"
KEPT = "#2e9e6a"
DROPPED = "#c9ced6"
_DPI = 110
_FONT = "DejaVu Sans"  # matplotlib's own font, always there
_FAMILY = [_FONT]  # the default font, then the fallbacks found for the text drawn so far
_COVERED: set[int] = set()  # code points the fonts of _FAMILY have
#: Fonts that have a glyph for everything, drawing boxes (what a missing glyph looks like anyway): never fallbacks.
_NOT_FALLBACKS = ("Last Resort",)


@functools.cache
def _charmap(path: str) -> frozenset[int]:
    """The code points a font file has glyphs for (empty when it does not load)."""
    from matplotlib.ft2font import FT2Font

    try:
        return frozenset(FT2Font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):
        return frozenset()


@functools.cache
def _installed_fonts() -> tuple[tuple[str, str], ...]:
    """(family, file) of every installed font matplotlib knows, one upright regular face per family, by name."""
    from matplotlib import font_manager

    faces: dict[str, str] = {}
    for f in sorted(font_manager.fontManager.ttflist, key=lambda f: (f.name, f.style != "normal", abs(f.weight - 400)
                                                                       if isinstance(f.weight, int) else 0, f.fname)):
        if not f.name.startswith(_NOT_FALLBACKS):
            faces.setdefault(f.name, f.fname)
    return tuple(sorted(faces.items()))


def _covered() -> set[int]:
    if not _COVERED:
        from matplotlib import font_manager

        _COVERED.update(_charmap(font_manager.findfont(font_manager.FontProperties(family=_FONT))))
    return _COVERED


def drawable(text: str) -> str:
    """``text`` as the plots can draw it: fallback fonts join the font family for characters the fonts so far lack;
    a run of characters no installed font has becomes one U+FFFD. Control characters are drawn escaped
    (matplotlib has no glyph for them and would warn with them raw)."""
    text = terminal_safe(text)
    wanted = {ord(c) for c in text if not c.isspace()}
    missing = wanted - _covered()
    if missing:
        for name, path in _installed_fonts():
            found = missing & _charmap(path)
            if found and name not in _FAMILY:
                _FAMILY.append(name)
                _COVERED.update(_charmap(path))
                missing -= found
                if not missing:
                    break
        _plt()  # the new family list applies to what is drawn next
    if not missing:
        return text
    out: list[str] = []
    for c in text:
        if ord(c) in missing:
            if not out or out[-1] != "\ufffd":
                out.append("\ufffd")
        else:
            out.append(c)
    return "".join(out)


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise FgdataError("the report's plots and contact sheets are drawn with matplotlib: "
                          "pip install 'fgdata[report]'") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({
        "font.size": 9, "axes.titlesize": 10, "axes.titleweight": "bold", "axes.titlelocation": "left",
        "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.color": "#e6e8ec",
        "grid.linewidth": 0.8, "axes.axisbelow": True, "axes.edgecolor": "#9aa1ab", "xtick.color": "#4a5059",
        "ytick.color": "#4a5059", "axes.labelcolor": "#30353c", "figure.facecolor": "white",
        "svg.hashsalt": "fgdata", "path.simplify": True, "font.family": list(_FAMILY),
    })
    return plt


def _png(fig: Any) -> bytes:
    """The figure as PNG bytes. Every text of it is drawn with the font family as it stands now: the axes and their
    labels were made before :func:`drawable` found the fallbacks for the data's text, and keep the family they were
    made with (matplotlib would then warn about the glyphs it does not find in it)."""
    from matplotlib.text import Text

    plt = _plt()
    for text in fig.findobj(Text):
        text.set_fontfamily(list(_FAMILY))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _counts_axis(ax: Any, axis: str = "y") -> None:
    """Whole-number ticks on an axis that counts things."""
    from matplotlib.ticker import MaxNLocator

    (ax.yaxis if axis == "y" else ax.xaxis).set_major_locator(MaxNLocator(integer=True))


def _thin_bars(ax: Any, n: int, slots: int = 8) -> None:
    """Keep a few horizontal bars as thin as many would be, at the top of the axes."""
    if n < slots:
        ax.set_ylim(-0.5 - (slots - n), n - 0.5)


def _bins(values: Sequence[float], integer: bool = False) -> Any:
    lo, hi = min(values), max(values)
    if integer and hi - lo <= 20:
        return [x - 0.5 for x in range(int(lo), int(hi) + 2)]
    if hi == lo:  # one value: a narrow bar, not one spanning the axes
        pad = abs(lo) * 0.05 or 0.5
        return [lo - pad, lo + pad]
    return min(40, max(5, int(math.sqrt(len(values))) + 1))


def _category_bars(ax: Any, counts: list[tuple[str, int]], colour: str = ACCENT, slots: int = 8) -> None:
    """Horizontal bars for a few named categories, largest on top, with their counts. Names come from the data:
    control characters are drawn escaped (matplotlib has no glyph for them and would warn with them raw)."""
    items = counts[::-1]
    bars = ax.barh([drawable(k) for k, _ in items], [v for _, v in items], color=colour, height=0.6)
    ax.bar_label(bars, labels=[f"{v:,}" for _, v in items], padding=3, fontsize=8, color="#30353c")
    ax.grid(axis="y", visible=False)
    ax.set_xlim(0, max(v for _, v in items) * 1.2)
    _counts_axis(ax, "x")
    _thin_bars(ax, len(items), slots)


def per_shard(shards: list[dict[str, Any]]) -> bytes:
    """Samples and bytes per shard, side by side; damaged shards in the second colour."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 2.8), layout="constrained")
    x = range(len(shards))
    colours = [SECOND if s.get("damage") else ACCENT for s in shards]
    width = 0.8 if len(shards) > 1 else 0.4
    a.bar(x, [s["samples"] for s in shards], color=colours, width=width)
    _counts_axis(a)
    b.bar(x, [s["bytes"] for s in shards], color=colours, width=width)
    a.set_title("samples per shard")
    b.set_title("bytes per shard")
    b.yaxis.set_major_formatter(lambda v, _pos: human_bytes(v))
    for ax in (a, b):
        ax.set_xlabel("shard index")
        ax.grid(axis="x", visible=False)
        if len(shards) <= 12:
            ax.set_xticks(list(x))
    return _png(fig)


def extension_sets(ext_sets: dict[str, int], top: int = 12) -> bytes:
    """How many samples have each exact set of extensions (most common first)."""
    plt = _plt()
    items = list(ext_sets.items())[:top]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(items) + 0.9), layout="constrained")
    labels = [drawable(k) or "(no extension)" for k, _ in items][::-1]
    values = [v for _, v in items][::-1]
    bars = ax.barh(labels, values, color=ACCENT, height=0.6)
    ax.bar_label(bars, labels=[f"{v:,}" for v in values], padding=3, fontsize=8, color="#30353c")
    ax.set_title("samples per extension set" + (f" (top {top} of {len(ext_sets)})" if len(ext_sets) > top else ""))
    ax.grid(axis="y", visible=False)
    ax.set_xlim(0, max(values) * 1.15)
    _counts_axis(ax, "x")
    return _png(fig)


def images(widths: Sequence[int], heights: Sequence[int]) -> bytes:
    """Width/height scatter (hexbin when dense) and the aspect-ratio histogram with common ratios marked."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained")
    if len(widths) > 3000:
        hb = a.hexbin(widths, heights, gridsize=40, cmap="Blues", mincnt=1, bins="log")
        fig.colorbar(hb, ax=a, label="images")
    else:
        a.scatter(widths, heights, s=10 if len(widths) > 200 else 28, alpha=0.5 if len(widths) > 200 else 0.85,
                  color=ACCENT, edgecolors="none")
    top = max(max(widths), max(heights)) * 1.05
    a.plot([0, top], [0, top], color="#9aa1ab", lw=0.8, ls="--")
    a.set_xlim(0, top)
    a.set_ylim(0, top)
    a.set_aspect("equal", adjustable="box")
    a.set_xlabel("width (px)")
    a.set_ylabel("height (px)")
    a.set_title("image sizes")
    ratios = [w / h for w, h in zip(widths, heights) if h]
    b.hist(ratios, bins=_bins(ratios), color=ACCENT, edgecolor="white", linewidth=0.5)
    for r, label in ((9 / 16, "9:16"), (3 / 4, "3:4"), (1.0, "1:1"), (4 / 3, "4:3"), (16 / 9, "16:9")):
        if min(ratios) - 0.1 <= r <= max(ratios) + 0.1:
            b.axvline(r, color=SECOND, lw=0.9, ls=":")
            b.annotate(label, (r, 1), xycoords=("data", "axes fraction"), ha="center", va="bottom", fontsize=7,
                       color=SECOND)
    b.set_xlabel("aspect ratio (width / height)")
    b.set_ylabel("images")
    _counts_axis(b)
    b.set_title("aspect ratios", pad=14)
    return _png(fig)


def videos(duration: Sequence[float], fps: Sequence[float], frames: Sequence[int], resolutions: dict[str, int]) -> bytes:
    """Duration and frame count histograms; frame rates and resolutions as counts per value, in a 2×2 grid."""
    from collections import Counter

    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(9, 5.2), layout="constrained")
    for ax, values, title, xlabel, integer in ((axes[0][0], duration, "duration", "seconds", False),
                                               (axes[1][0], frames, "frame count", "frames", True)):
        ax.hist(values, bins=_bins(values, integer), color=ACCENT, edgecolor="white", linewidth=0.5)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("videos")
        _counts_axis(ax)
    rates = Counter(f"{r:.4g} fps" for r in fps).most_common(8)
    _category_bars(axes[0][1], rates, slots=5)
    axes[0][1].set_title("frame rate")
    _category_bars(axes[1][1], list(resolutions.items())[:8], slots=5)
    axes[1][1].set_title("resolution (width×height)")
    return _png(fig)


def clips(seconds: Sequence[float], motion: Sequence[float]) -> bytes:
    """A scene split's clip lengths and, when the clips carry it, their ``motion_mean``, side by side."""
    plt = _plt()
    panels = [(seconds, "clip length", "seconds")] + ([(motion, "motion", "motion_mean")] if motion else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(9, 3.0), layout="constrained", squeeze=False)
    for ax, (values, title, xlabel) in zip(axes[0], panels):
        ax.hist(values, bins=_bins(values), color=ACCENT, edgecolor="white", linewidth=0.5)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("clips")
        _counts_axis(ax)
    return _png(fig)


def captions(words: Sequence[int], first_words: list[tuple[str, int]]) -> bytes:
    """Caption length in words, and the most common first words."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4), gridspec_kw={"width_ratios": [3, 2]}, layout="constrained")
    a.hist(words, bins=_bins(words, integer=True), color=ACCENT, edgecolor="white", linewidth=0.5)
    a.set_title("caption length")
    a.set_xlabel("words")
    a.set_ylabel("captions")
    _counts_axis(a)
    _category_bars(b, [(f"“{w}”", n) for w, n in first_words[:12]], SECOND)
    b.set_title("most common first words")
    return _png(fig)


def numeric_field(name: str, values: Sequence[float], threshold: float, kept_share: float | None) -> bytes:
    """A json field's histogram (the samples that have it), split at the score threshold: the part a ``score``
    filter keeps in green; ``kept_share`` is the share of those samples it keeps."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 2.8), layout="constrained")
    bins = _bins(values)
    lo, hi = min(values), max(values)
    edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)] if isinstance(bins, int) and hi > lo else bins
    if isinstance(edges, list) and lo < threshold < hi:
        edges = sorted(set(edges) | {threshold})
    kept = [v for v in values if v >= threshold]
    dropped = [v for v in values if v < threshold]
    ax.hist([dropped, kept], bins=edges, stacked=True, color=[DROPPED, KEPT], edgecolor="white", linewidth=0.5,
            label=["below threshold", "kept"])
    share = f", keeps {kept_share:.1%} of these" if kept_share is not None else ""
    ax.axvline(threshold, color="#30353c", lw=1, ls="--", label=f"threshold {threshold:g}{share}")
    ax.set_xlabel(drawable(name))
    ax.set_ylabel("samples")
    _counts_axis(ax)
    ax.legend(frameon=False, fontsize=8, loc="lower right", bbox_to_anchor=(1, 1), ncols=3)
    return _png(fig)


#: The contact sheet's grid, in pixels: every tile's cell has room for its title above the picture and two caption
#: lines below it, and text is fitted (wrapped, then ended with "…") inside the picture's width.
SHEET_PAD = 8  # around the picture, left and right of each cell: text never reaches into it
_TITLE_H = 16
_CAPTION_H = 30
_TITLE_PT = 7.0
_CAPTION_PT = 6.5


def sheet_cell(tile: int = 192) -> tuple[int, int]:
    """(width, height) in pixels of one contact-sheet cell for ``tile``-pixel pictures."""
    return tile + 2 * SHEET_PAD, SHEET_PAD + _TITLE_H + tile + _CAPTION_H + SHEET_PAD


def _fit(text: str, width: float, lines: int, measure: Callable[[str], float]) -> list[str]:
    """``text`` in at most ``lines`` lines, each at most ``width`` wide: whole words where they fit, a word wider
    than a line cut, and "…" at the end of the last line when text is left over."""
    words = text.split()
    out: list[str] = []
    line = ""
    while words and len(out) < lines:
        candidate = f"{line} {words[0]}" if line else words[0]
        if measure(candidate) <= width:
            line = candidate
            words.pop(0)
            continue
        if not line:  # one word wider than the line: the longest prefix that fits
            lo, hi = 1, len(words[0])
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if measure(words[0][:mid]) <= width else (lo, mid - 1)
            line, words[0] = words[0][:lo], words[0][lo:]
        out.append(line)
        line = ""
    if line:
        out.append(line)
    if words and out:
        last = out[-1]
        while last and measure(last + "…") > width:
            last = last[:-1]
        out[-1] = last.rstrip() + "…"
    return out


def contact_sheet(tiles: list[Tile], columns: int = 6, tile: int = 192) -> bytes:
    """The sampled images and first video frames in a grid, each with its key above and the start of its caption
    below, every text fitted inside its cell (see :func:`sheet_cell`)."""
    from matplotlib.font_manager import FontProperties
    from PIL import Image

    plt = _plt()
    if not tiles:
        raise FgdataError("no images or videos to show")
    columns = min(columns, len(tiles))
    rows = math.ceil(len(tiles) / columns)
    cell_w, cell_h = sheet_cell(tile)
    fig_w, fig_h = columns * cell_w, rows * cell_h
    titles = [drawable(t.key) for t in tiles]
    captions = [drawable(t.caption) for t in tiles]
    fig = plt.figure(figsize=(fig_w / _DPI, fig_h / _DPI), dpi=_DPI)
    renderer = fig.canvas.get_renderer()

    def measure(size: float) -> Callable[[str], float]:
        prop = FontProperties(family=list(_FAMILY), size=size)
        return lambda text: renderer.get_text_width_height_descent(text, prop, ismath=False)[0]

    title_width, caption_width = measure(_TITLE_PT), measure(_CAPTION_PT)
    for i, t in enumerate(tiles):
        row, col = divmod(i, columns)
        x0, top = col * cell_w + SHEET_PAD, row * cell_h + SHEET_PAD  # the cell's content box, from the top left
        picture_top = top + _TITLE_H
        ax = fig.add_axes((x0 / fig_w, 1 - (picture_top + tile) / fig_h, tile / fig_w, tile / fig_h))
        ax.axis("off")
        im = Image.open(io.BytesIO(t.png)).convert("RGB")
        side = max(im.width, im.height)
        square = Image.new("RGB", (side, side), "white")  # centred, so every tile has the same footprint
        square.paste(im, ((side - im.width) // 2, (side - im.height) // 2))
        ax.imshow(square)
        centre = (x0 + tile / 2) / fig_w
        title = _fit(titles[i], tile, 1, title_width)
        fig.text(centre, 1 - (picture_top - 3) / fig_h, title[0] if title else "", ha="center", va="baseline",
                 fontsize=_TITLE_PT, color="#30353c")
        caption = _fit(captions[i], tile, 2, caption_width)
        fig.text(centre, 1 - (picture_top + tile + 3) / fig_h, "\n".join(caption), ha="center", va="top",
                 fontsize=_CAPTION_PT, color="#5a616b", linespacing=1.25)
    return _png(fig)
