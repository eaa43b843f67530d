"""Near-duplicate search without an all-pairs pass, and the rule that says which copy is kept.

Multi-index hashing (Norouzi, Punjani and Fleet): split each ``b``-bit hash into ``m`` blocks; two hashes within
Hamming distance ``k`` have at least one block within ``k // m`` of each other (else the distance would be at
least ``m * (k // m + 1) > k``). With ``m = k + 1`` that is the classic "share one block exactly"; fewer, longer
blocks probed within a small radius are usually cheaper, so :func:`plan_blocks` picks ``m`` from an estimate of
the work. Each block is a direct-address table (a counting sort, at most 2**24 buckets), each probe one gather,
and every candidate pair is verified with a popcount of the XOR. Identical hashes are collapsed first, so a
million copies of one image cost one bucket, not a million squared pairs.

Hashes are ``(n, words)`` uint64 arrays (64 bits per word): a million 64-bit hashes are 8 MB.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

MAX_BLOCK_BITS = 24  # a direct-address table of 2**24 int32 starts and counts: 128 MB
_CHUNK = 1 << 22  # candidate pairs verified at a time (bounds the memory of a dense bucket)


@dataclass(frozen=True)
class Pairs:
    """Pairs ``(i, j)`` with ``i < j`` and their Hamming distances, one row per pair, sorted by ``(i, j)``."""

    i: np.ndarray
    j: np.ndarray
    distance: np.ndarray


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise Hamming distance of two ``(n, words)`` uint64 arrays."""
    return np.bitwise_count(a ^ b).sum(axis=-1, dtype=np.int64)


def plan_blocks(bits: int, k: int, n: int) -> tuple[int, int]:
    """``(blocks, radius)`` with the least estimated work: probes (``blocks * V(len, radius)`` gathers per hash)
    plus candidates (each probe finds about ``n / 2**len`` hashes, for hashes spread evenly)."""
    best: tuple[float, int, int] | None = None
    fewest = math.ceil(bits / MAX_BLOCK_BITS)
    for m in range(fewest, max(fewest, min(k + 1, bits)) + 1):
        length, radius = bits // m, k // m
        probes = sum(math.comb(length, r) for r in range(radius + 1))
        cost = m * probes * (3 + n / 2**length)
        if best is None or cost < best[0]:
            best = (cost, m, radius)
    assert best is not None
    return best[1], best[2]


def _block_values(hashes: np.ndarray, start: int, length: int) -> np.ndarray:
    """Bits ``[start, start + length)`` of each hash (bit 0: the most significant bit of word 0) as uint32."""
    out = np.zeros(len(hashes), dtype=np.uint64)
    pos = start
    while pos < start + length:
        word, offset = divmod(pos, 64)
        take = min(64 - offset, start + length - pos)
        part = (hashes[:, word] >> np.uint64(64 - offset - take)) & np.uint64((1 << take) - 1)
        out = (out << np.uint64(take)) | part
        pos += take
    return out.astype(np.uint32)


def _masks(length: int, radius: int) -> Iterator[int]:
    for r in range(radius + 1):
        for bits in itertools.combinations(range(length), r):
            yield sum(1 << b for b in bits)


def _block_pairs(hashes: np.ndarray, values: np.ndarray, length: int, radius: int, k: int) -> Iterator[np.ndarray]:
    """Verified pairs (rows ``i, j, d``) whose values in one block are within ``radius``.

    A pair whose block values differ by a mask is probed from the side where the mask's highest bit is clear, so
    each is found once per mask; pairs in one bucket (mask 0) keep ``i < j``."""
    order = np.argsort(values, kind="stable").astype(np.int64)
    counts = np.bincount(values, minlength=1 << length).astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    flat = hashes[:, 0] if hashes.shape[1] == 1 else None
    for mask in _masks(length, radius):
        if mask:
            high = np.uint32(1 << (mask.bit_length() - 1))
            sources = np.flatnonzero((values & high) == 0)
            probe = values[sources] ^ np.uint32(mask)
        else:
            sources, probe = None, values
        found = counts[probe]
        hit = np.flatnonzero(found)
        if not len(hit):
            continue
        queries = hit if sources is None else sources[hit]
        found, first_at = found[hit], starts[probe[hit]]
        ends = np.cumsum(found)
        first = 0
        while first < len(queries):  # chunks of at most _CHUNK candidates (one query may exceed it alone)
            last = max(first + 1, int(np.searchsorted(ends, (ends[first - 1] if first else 0) + _CHUNK, "right")))
            c = found[first:last]
            i = np.repeat(queries[first:last], c)
            offsets = np.arange(len(i)) - np.repeat(np.cumsum(c) - c, c)
            j = order[np.repeat(first_at[first:last], c) + offsets]
            if not mask:
                keep = i < j
                i, j = i[keep], j[keep]
            else:
                i, j = np.minimum(i, j), np.maximum(i, j)
            if flat is not None:
                d = np.bitwise_count(flat[i] ^ flat[j]).astype(np.int64)
            else:
                d = hamming(hashes[i], hashes[j])
            near = d <= k
            yield np.stack([i[near], j[near], d[near]])
            first = last


def near_pairs(hashes: np.ndarray, k: int) -> Pairs:
    """Every pair of rows of ``hashes`` (``(n, words)`` uint64, distinct rows) within Hamming distance ``k``."""
    n, words = hashes.shape
    bits = 64 * words
    m, radius = plan_blocks(bits, k, n)
    found: list[np.ndarray] = []
    for b in range(m):
        start, end = b * bits // m, (b + 1) * bits // m
        values = _block_values(hashes, start, end - start)
        found.extend(_block_pairs(hashes, values, end - start, radius, k))
        del values
    rows = np.concatenate(found, axis=1) if found else np.zeros((3, 0), dtype=np.int64)
    pair_id, first = np.unique(rows[0] * n + rows[1], return_index=True)
    return Pairs(pair_id // n, pair_id % n, rows[2][first])


def brute_pairs(hashes: np.ndarray, k: int) -> Pairs:
    """All pairs by comparing every row with every later one: the check :func:`near_pairs` must equal."""
    rows = [np.zeros((3, 0), dtype=np.int64)]
    for i in range(len(hashes) - 1):
        d = hamming(hashes[i + 1:], hashes[i][None, :])
        j = np.flatnonzero(d <= k) + i + 1
        rows.append(np.stack([np.full(len(j), i), j, d[j - i - 1]]))
    r = np.concatenate(rows, axis=1)
    return Pairs(r[0], r[1], r[2])


@dataclass(frozen=True)
class Drops:
    """For each dropped item: its index, the kept item it duplicates, and their distance."""

    index: np.ndarray
    dup_of: np.ndarray
    distance: np.ndarray


def priority_order(n: int, score: np.ndarray | None) -> np.ndarray:
    """The order in which items claim to be kept: input order, or the highest ``score`` first (NaN last, ties in
    input order)."""
    if score is None:
        return np.arange(n)
    key = np.where(np.isnan(score), -np.inf, score)
    return np.lexsort((np.arange(n), -key))


def keep_greedy(hashes: np.ndarray, k: int, order: np.ndarray) -> Drops:
    """Walk the items in ``order``; drop an item when some item kept before it lies within ``k`` (naming the
    nearest such item, the earlier in ``order`` on a tie), else keep it.

    Every dropped item is within ``k`` of the item it names, and that item is kept: a chain of small steps never
    drops two images that differ by more than ``k`` (a transitive cluster would)."""
    unique, inverse = np.unique(hashes, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    pairs = near_pairs(unique, k)
    # adjacency between distinct hashes, both directions, as CSR
    src = np.concatenate([pairs.i, pairs.j])
    dst = np.concatenate([pairs.j, pairs.i])
    dist = np.concatenate([pairs.distance, pairs.distance])
    by = np.argsort(src, kind="stable")
    dst, dist = dst[by].tolist(), dist[by].tolist()
    bounds = np.searchsorted(src[by], np.arange(len(unique) + 1)).tolist()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    rank_l = rank.tolist()
    kept_at = [-1] * len(unique)  # unique hash -> the first kept item holding it
    inv = inverse.tolist()
    dropped, dup_of, distance = [], [], []
    for item in order.tolist():
        u = inv[item]
        if kept_at[u] >= 0:
            dropped.append(item)
            dup_of.append(kept_at[u])
            distance.append(0)
            continue
        best = None
        for e in range(bounds[u], bounds[u + 1]):
            other = kept_at[dst[e]]
            if other >= 0 and (best is None or (dist[e], rank_l[other]) < (best[0], rank_l[best[1]])):
                best = (dist[e], other)
        if best is None:
            kept_at[u] = item
        else:
            dropped.append(item)
            dup_of.append(best[1])
            distance.append(best[0])
    return Drops(np.array(dropped, dtype=np.int64), np.array(dup_of, dtype=np.int64),
                 np.array(distance, dtype=np.int64))
