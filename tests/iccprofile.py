"""A minimal ICC v2 RGB profile (matrix + gamma) from primaries, for tests: no P3 or Adobe RGB file ships here.

The colorants are the RGB -> XYZ matrix of the primaries under their white point, adapted to the
ICC's D50 connection space with the Bradford transform, as ICC matrix profiles store them.
"""

from __future__ import annotations

import struct

import numpy as np

D50 = (0.9642, 1.0, 0.8249)
_BRADFORD = np.array([[0.8951, 0.2664, -0.1614], [-0.7502, 1.7135, 0.0367], [0.0389, -0.0685, 1.0296]])
DISPLAY_P3 = {"red": (0.680, 0.320), "green": (0.265, 0.690), "blue": (0.150, 0.060), "white": (0.3127, 0.3290)}
ADOBE_RGB = {"red": (0.640, 0.330), "green": (0.210, 0.710), "blue": (0.150, 0.060), "white": (0.3127, 0.3290)}


def _xyz(xy: tuple[float, float]) -> np.ndarray:
    x, y = xy
    return np.array([x / y, 1.0, (1 - x - y) / y])


def _s15(v: float) -> bytes:
    return struct.pack(">i", round(v * 65536))


def _xyz_tag(v) -> bytes:
    return b"XYZ " + b"\0" * 4 + b"".join(_s15(c) for c in v)


def _desc(text: str) -> bytes:
    ascii_ = text.encode() + b"\0"
    return b"desc" + b"\0" * 4 + struct.pack(">I", len(ascii_)) + ascii_ + b"\0" * 8 + b"\0" * 3 + b"\0" * 67


def rgb_profile(primaries: dict, description: str, gamma: float = 2.2) -> bytes:
    """ICC bytes of an RGB display profile with these primaries (CIE xy), white point and gamma."""
    white = _xyz(primaries["white"])
    m = np.stack([_xyz(primaries[c]) for c in ("red", "green", "blue")], axis=1)
    m = m * np.linalg.solve(m, white)  # scale the columns so that RGB=1 gives the white point
    cone = _BRADFORD @ np.array(D50) / (_BRADFORD @ white)
    adapt = np.linalg.inv(_BRADFORD) @ np.diag(cone) @ _BRADFORD
    m50 = adapt @ m
    curve = b"curv" + b"\0" * 4 + struct.pack(">IH", 1, round(gamma * 256)) + b"\0\0"
    tags = [(b"desc", _desc(description)), (b"wtpt", _xyz_tag(D50)), (b"rXYZ", _xyz_tag(m50[:, 0])),
            (b"gXYZ", _xyz_tag(m50[:, 1])), (b"bXYZ", _xyz_tag(m50[:, 2])), (b"rTRC", curve), (b"gTRC", curve),
            (b"bTRC", curve), (b"cprt", b"text" + b"\0" * 4 + b"no copyright, test profile\0")]
    offset = 128 + 4 + 12 * len(tags)
    table, body = b"", b""
    for sig, data in tags:
        data += b"\0" * (-len(data) % 4)
        table += sig + struct.pack(">II", offset + len(body), len(data))
        body += data
    size = offset + len(body)
    header = (struct.pack(">I", size) + b"lcms" + struct.pack(">I", 0x02100000) + b"mntrRGB XYZ " + b"\0" * 12
              + b"acsp" + b"\0" * 24 + struct.pack(">I", 0) + b"".join(_s15(c) for c in D50) + b"\0" * 48)
    assert len(header) == 128
    return header + struct.pack(">I", len(tags)) + table + body
