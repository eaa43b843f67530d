"""Semantic de-duplication (SemDeDup, Abbas et al. 2023) in numpy: spherical k-means over L2-normalised
embeddings, then inside each cluster an item is dropped when its cosine similarity to an item kept before it
(in the keep order) is at least ``1 - eps``. Comparisons never leave a cluster, so the work is the sum of the
squared cluster sizes, not ``n**2``."""

from __future__ import annotations

import numpy as np

from fgdata.dedup.index import Drops

SEED = 0
ITERATIONS = 20


def normalise(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero and matches nothing)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def kmeans(x: np.ndarray, clusters: int, seed: int = SEED, iterations: int = ITERATIONS) -> np.ndarray:
    """Cluster labels of unit rows ``x``: k-means++ seeding from ``seed``, then Lloyd steps on cosine similarity
    (centroids renormalised). Same input, same labels."""
    n = len(x)
    clusters = max(1, min(clusters, n))
    rng = np.random.default_rng(seed)
    centres = [x[int(rng.integers(n))]]
    closest = 1.0 - x @ centres[0]
    for _ in range(1, clusters):
        weights = np.clip(closest, 0, None) ** 2
        total = float(weights.sum())
        pick = int(rng.choice(n, p=weights / total)) if total > 0 else int(rng.integers(n))
        centres.append(x[pick])
        closest = np.minimum(closest, 1.0 - x @ x[pick])
    c = np.stack(centres)
    labels = np.zeros(n, dtype=np.int64)
    for _ in range(iterations):
        new = np.argmax(x @ c.T, axis=1)
        if _ and np.array_equal(new, labels):
            break
        labels = new
        sums = np.zeros_like(c)
        np.add.at(sums, labels, x)
        c = np.where(np.any(sums != 0, axis=1, keepdims=True), normalise(sums), c)
    return labels


def semdedup(x: np.ndarray, eps: float, order: np.ndarray, clusters: int) -> Drops:
    """Drop each item whose cosine to an item kept before it in ``order`` (same cluster) is ``>= 1 - eps``;
    it names the most similar such item (the earlier on a tie). ``distance`` is ``1 - cosine``."""
    x = normalise(x)
    labels = kmeans(x, clusters)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    dropped, dup_of, distance = [], [], []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        members = members[np.argsort(rank[members], kind="stable")]
        sims = x[members] @ x[members].T
        kept: list[int] = []
        for pos in range(len(members)):
            if kept:
                row = sims[pos, kept]
                best = int(np.argmax(row))  # first maximum: the earliest kept item on a tie
                if row[best] >= 1.0 - eps:
                    dropped.append(int(members[pos]))
                    dup_of.append(int(members[kept[best]]))
                    distance.append(max(0.0, 1.0 - float(row[best])))
                    continue
            kept.append(pos)
    by = np.argsort(np.array(dropped, dtype=np.int64), kind="stable")
    return Drops(np.array(dropped, dtype=np.int64)[by], np.array(dup_of, dtype=np.int64)[by],
                 np.array(distance, dtype=np.float64)[by])
