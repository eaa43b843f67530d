"""How numbers, sizes, shapes and untrusted text read, in the terminal and in the HTML report alike.

Below every package that prints: the loaders quote keys from the data in their messages, the job core sizes what
it refuses to overwrite, and ``report`` and the CLI render the rest, none of them importing another."""

from __future__ import annotations

# C0 controls but tab and newline, DEL, and the C1 controls (``\x9b`` starts an escape sequence on some terminals).
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A)}
# The bidi embeddings, overrides and isolates: raw, they reorder what follows them on the line (a key or caption would
# read as something else, in the terminal, the HTML page and the plots alike). Right-to-left text needs none of them.
_CONTROL.update({c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))})


def terminal_safe(text: str) -> str:
    """``text`` with control characters written as ``\\xNN``, bidi overrides as ``\\u202e`` and lone surrogates as
    ``\\udcNN``: keys, member and file names and captions come from the data, and printed raw an escape sequence would
    retitle, clear or rewrite the user's terminal. Every terminal output and the HTML report pass through it; JSON
    output has its own escaping."""
    text = text.translate(_CONTROL)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


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
