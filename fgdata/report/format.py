"""How numbers, sizes and shapes read, in the terminal and in the HTML report alike."""

from __future__ import annotations


def number(v: float) -> str:
    """4 significant digits for floats (``-4.603``, ``1.013e-06``), integers as they are."""
    if isinstance(v, bool) or not isinstance(v, float):
        return str(v)
    return f"{v:.4g}"


def dtype_shape(dtype: str, shape: list[int] | tuple[int, ...]) -> str:
    """``float32[3,17,29]``: one token that never wraps."""
    return f"{dtype}[{','.join(str(d) for d in shape)}]"


def human_bytes(n: float) -> str:
    """``1.3 MB``: decimal units, one decimal."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"
