"""Feature moments in float64 and the two reference file formats (EDM ``.npz``, EDM2 ``.pkl``).

The accumulation is the reference's: per image once, ``n``, ``Σ f`` and ``Σ fᵀf`` in float64, then
``mu = Σ f / n`` and ``sigma = (Σ fᵀf − n·mu muᵀ) / (n − 1)``. Moments of disjoint parts add, which is how
chunks, ranks and resumed runs combine.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from dataclasses import dataclass

import numpy as np

from fgdata.errors import FgdataError

#: Protocol of the EDM2 pickle: 4 reads on every Python 3 the reference runs on.
PICKLE_PROTOCOL = 4
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass
class Moments:
    """``n``, ``Σ f`` (float64 [d]) and ``Σ fᵀf`` (float64 [d, d]) of a set of feature vectors."""

    n: int
    s1: np.ndarray
    s2: np.ndarray

    @classmethod
    def zeros(cls, dim: int) -> Moments:
        return cls(0, np.zeros(dim, np.float64), np.zeros((dim, dim), np.float64))

    def add(self, other: Moments) -> None:
        """Fold in the moments of a disjoint set of images."""
        self.n += other.n
        self.s1 += other.s1
        self.s2 += other.s2

    def mu_sigma(self) -> tuple[np.ndarray, np.ndarray]:
        """The reference's formulas, in its operation order."""
        if self.n < 2:
            raise FgdataError(f"FID statistics need at least 2 images, got {self.n}")
        mu = self.s1 / self.n
        sigma = (self.s2 - np.outer(mu, mu) * self.n) / (self.n - 1)
        return mu, sigma


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """What ``np.savez`` writes, minus the wall-clock timestamps: same arrays -> same bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, array in arrays.items():
            with zf.open(zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH), "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asarray(array, order="C"), allow_pickle=False)
    return buf.getvalue()


def edm_npz_bytes(mu: np.ndarray, sigma: np.ndarray) -> bytes:
    """EDM's reference file: ``np.load(path)["mu"]``, ``["sigma"]``."""
    return npz_bytes({"mu": mu.astype(np.float64), "sigma": sigma.astype(np.float64)})


def edm2_pkl_bytes(stats: dict[str, tuple[np.ndarray, np.ndarray]]) -> bytes:
    """EDM2's reference file: a pickled ``{metric: {"mu": ndarray, "sigma": ndarray}}``."""
    doc = {metric: {"mu": mu.astype(np.float64), "sigma": sigma.astype(np.float64)} for metric, (mu, sigma) in stats.items()}
    return pickle.dumps(doc, protocol=PICKLE_PROTOCOL)


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """``|mu1 − mu2|² + tr(sigma1 + sigma2 − 2 (sigma1 sigma2)^½)``, the trace root via symmetric eigensolves.

    ``tr((sigma1 sigma2)^½)`` equals the sum of square roots of the eigenvalues of ``s1^½ sigma2 s1^½`` with
    ``s1^½`` the PSD root of sigma1, which needs no general matrix square root (scipy is not a dependency).
    """
    w, v = np.linalg.eigh(sigma1)
    root1 = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    inner = np.linalg.eigvalsh(root1 @ sigma2 @ root1)
    trace_root = float(np.sqrt(np.clip(inner, 0, None)).sum())
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * trace_root)
