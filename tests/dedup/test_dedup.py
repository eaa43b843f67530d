"""``fgdata dedup`` end to end on real shards: the near-duplicate set's recall and precision, what the loaders
skip, exact and pixel hashes, embeddings, several datasets, resume after SIGKILL, and bad input."""

from __future__ import annotations

import io
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from fgdata.dedup.index import brute_pairs, keep_greedy, near_pairs
from fgdata.shards import ShardWriter
from tests.dedup.nearset import near_duplicate_set, score, write_shards
from tests.faults.faultkit import run_ranks, stop_and_signal

FGDATA = [sys.executable, "-m", "fgdata"]


def dedup(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``fgdata dedup ARGS`` in this process (its index, output and exit status are what is checked); the kill and
    torchrun tests start real processes."""
    from inprocess import fgdata

    r = fgdata("dedup", *args)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def drops(path: Path) -> dict[tuple[str, str], dict]:
    return {(shard, key): rec for shard, keys in json.loads(path.read_text()).items() for key, rec in keys.items()}


@pytest.fixture(scope="module")
def nearset(tmp_path_factory):
    items = near_duplicate_set()
    root = tmp_path_factory.mktemp("near")
    write_shards(items, root / "ds")
    return items, root / "ds"


def test_phash_finds_resized_and_reencoded_copies_and_keeps_distinct_photos(nearset, tmp_path):
    items, ds = nearset
    out = tmp_path / "dups.json"
    r = json.loads(dedup(str(ds), "-o", str(out), "--json").stdout)
    assert r["seen"] == r["hashed"] == len(items) and r["failed"] == 0
    found = drops(out)
    assert {rec["method"] for rec in found.values()} == {"phash64"}
    assert all(0 <= rec["distance"] <= 10 and rec["dup_of"]["shard"] == f"ds/{Path(rec['dup_of']['shard']).name}"
               for rec in found.values())  # qualified by the dataset's folder name, not by where it lies
    kept_named = {(rec["dup_of"]["shard"], rec["dup_of"]["key"]) for rec in found.values()}
    assert not kept_named & set(found)  # every drop names a kept sample
    m = score(items, {int(k): int(rec["dup_of"]["key"]) for (_, k), rec in found.items()})
    assert m["recall_resized"] >= 0.95 and m["recall_jpeg60"] >= 0.95 and m["recall_exact"] == 1.0
    assert m["precision"] >= 0.99 and m["distinct_dropped"] == 0
    failures = json.loads((tmp_path / "dups.json.failures.json").read_text())
    assert failures["seen"] == failures["written"] + failures["failed"] == len(items)


def test_loaders_skip_exactly_the_dropped_samples(nearset, tmp_path):
    from fgdata.loaders import ImageWDSLoader, WDSLoader

    items, ds = nearset
    out = tmp_path / "dups.json"
    dedup(str(ds), "-o", str(out), "--keep", "highest:quality")
    dropped = {k for _, k in drops(out)}
    assert dropped
    expected = sorted(f"{n:06d}" for n in range(len(items)) if f"{n:06d}" not in dropped)
    for cls, kw in ((WDSLoader, {"key_map": {"meta": "json"}}), (ImageWDSLoader, {"input_res": 16, "key_map": {"real": "jpg"}})):
        loader = cls(["WDS:" + str(ds)], batch_size=1, num_workers=0, deterministic=True, train=False, partial=True,
                     ignore_index_paths=[str(out)], **kw)
        assert sorted(k for batch in loader for k in batch["fname"]) == expected


def test_keep_highest_field_keeps_the_best_copy(nearset, tmp_path):
    items, ds = nearset
    out = tmp_path / "dups.json"
    dedup(str(ds), "-o", str(out), "--keep", "highest:quality")
    quality = {f"{n:06d}": n % 7 for n in range(len(items))}
    for (_, key), rec in drops(out).items():
        assert quality[rec["dup_of"]["key"]] >= quality[key]


def _png(im: Image.Image, level: int) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG", compress_level=level)
    return buf.getvalue()


def test_sha256_bytes_and_pixels(sample_images, tmp_path):
    im = Image.open(sample_images[0]).convert("RGB")
    w = ShardWriter(str(tmp_path / "ds"))
    w.write("a", {"png": _png(im, 1)})
    w.write("b", {"png": _png(im, 9)})  # other bytes, same pixels
    w.write("c", {"png": _png(im, 1)})  # same bytes
    w.write("d", {"txt": b"no image"})
    w.close()
    r = json.loads(dedup(str(tmp_path / "ds"), "-o", str(tmp_path / "b.json"), "--by", "sha256", "--json").stdout)
    assert (r["seen"], r["hashed"], r["failed"], r["dropped"]) == (4, 3, 1, 1)
    assert [(k, rec["dup_of"]["key"], rec["method"]) for (_, k), rec in drops(tmp_path / "b.json").items()] == [
        ("c", "a", "sha256")]
    dedup(str(tmp_path / "ds"), "-o", str(tmp_path / "p.json"), "--by", "sha256", "--pixels")
    assert sorted(k for _, k in drops(tmp_path / "p.json")) == ["b", "c"]
    report = json.loads((tmp_path / "p.json.failures.json").read_text())
    assert report["failures"][0]["input"].endswith("#d") and report["failures"][0]["reason"].startswith("member:")


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_embedding_semdedup(tmp_path):
    rng = np.random.default_rng(3)
    base = rng.normal(size=(30, 16)).astype(np.float32)
    w = ShardWriter(str(tmp_path / "ds"), maxcount=20)
    for n, v in enumerate(base):
        w.write(f"o{n:02d}", {"npy": _npy(v)})
    for n in range(0, 30, 3):
        w.write(f"n{n:02d}", {"npy": _npy(base[n] * 2 + rng.normal(size=16).astype(np.float32) * 1e-3)})
    w.write("bad", {"npy": _npy(np.array(["x"], dtype=object))})
    w.close()
    out = tmp_path / "e.json"
    r = json.loads(dedup(str(tmp_path / "ds"), "-o", str(out), "--by", "embedding", "--clusters", "3",
                         "--json").stdout)
    assert (r["seen"], r["failed"]) == (41, 1)
    assert {k: rec["dup_of"]["key"] for (_, k), rec in drops(out).items()} == {
        f"n{n:02d}": f"o{n:02d}" for n in range(0, 30, 3)}
    assert all(rec["method"] == "semdedup" and rec["distance"] <= 0.01 for rec in drops(out).values())


def test_two_datasets_with_colliding_shard_names(nearset, tmp_path):
    """A copy of a dataset under another folder: every sample of the second is a copy of the first, and the
    index keys both by their folders' names, so the loaders reading both skip exactly the second."""
    from fgdata.loaders import WDSLoader

    items, ds = nearset
    other = tmp_path / "other"
    shutil.copytree(ds, other)
    out = tmp_path / "both.json"
    dedup(str(ds), str(other), "-o", str(out), "--by", "sha256")
    found = drops(out)
    assert {str(Path(s).parent) for s, _ in found} == {"ds", "other"}
    in_other = {k for s, k in found if Path(s).parent.name == "other"}
    in_first = {k for s, k in found if Path(s).parent.name == "ds"}
    assert in_other == {f"{n:06d}" for n in range(len(items))}  # same shard names, kept apart by path
    assert in_first == {f"{n:06d}" for n, it in enumerate(items) if it.kind == "exact"}
    loader = WDSLoader(["WDS:" + str(ds), "WDS:" + str(other)], batch_size=1, num_workers=0, deterministic=True,
                       train=False, partial=True, ignore_index_paths=[str(out)], key_map={"meta": "json"})
    assert sum(1 for _ in loader) == 2 * len(items) - len(found)


def test_the_index_follows_moved_datasets(nearset, tmp_path):
    """Dedup two datasets, move both to another folder (another disk, a sync): the loaders reading them there
    with the same index drop exactly the same samples, and an index written there is byte-identical. Two
    datasets whose folders share a name too are told apart by the folder above."""
    from fgdata.loaders import WDSLoader

    _, ds = nearset
    first = tmp_path / "disk1"
    shutil.copytree(ds, first / "a")
    (first / "a" / "00000.tar").unlink()  # so the two datasets differ and drops land in both
    shutil.copytree(ds, first / "b")
    out = tmp_path / "dups.json"
    dedup(str(first / "a"), str(first / "b"), "-o", str(out))
    assert {Path(s).parent.name for s in json.loads(out.read_text())} == {"a", "b"}

    def kept(root: Path) -> list[tuple[str, str]]:
        loader = WDSLoader(["WDS:" + str(root / "a"), "WDS:" + str(root / "b")], batch_size=1, num_workers=0,
                           deterministic=True, train=False, partial=True, ignore_index_paths=[str(out)],
                           key_map={"meta": "json"})
        return sorted((Path(s).parent.name + "/" + Path(s).name, k) for b in loader
                      for s, k in zip(b["shard"], b["fname"]))

    before = kept(first)
    moved = tmp_path / "elsewhere" / "disk2"
    moved.parent.mkdir()
    shutil.move(first, moved)
    assert kept(moved) == before
    dropped = {(s, k) for s, keys in json.loads(out.read_text()).items() for k in keys}
    assert {s for s, _ in dropped} & {"a/00001.tar"} and {s for s, _ in dropped} & {"b/00000.tar"}
    assert not set(before) & dropped and len(before) + len(dropped) == 2 * len(nearset[0]) - 40
    again = tmp_path / "again.json"
    dedup(str(moved / "a"), str(moved / "b"), "-o", str(again))
    assert again.read_bytes() == out.read_bytes()
    nested = tmp_path / "x" / "data"
    shutil.copytree(ds, nested)
    shutil.copytree(ds, tmp_path / "y" / "data")
    both = tmp_path / "both.json"
    dedup(str(nested), str(tmp_path / "y" / "data"), "-o", str(both), "--by", "sha256")
    assert {str(Path(s).parent) for s in json.loads(both.read_text())} == {"x/data", "y/data"}


def test_sigkill_after_a_unit_then_rerun_gives_the_same_index(nearset, tmp_path):
    _, ds = nearset
    clean = tmp_path / "clean.json"
    dedup(str(ds), "-o", str(clean))
    out = tmp_path / "dups.json"
    stopped = stop_and_signal([*FGDATA, "dedup", str(ds), "-o", str(out)], after=2, sig=signal.SIGKILL)
    assert stopped.returncode == -signal.SIGKILL and not out.exists()
    r = json.loads(dedup(str(ds), "-o", str(out), "--json").stdout)
    assert r["resumed_shards"] == 2
    assert out.read_bytes() == clean.read_bytes()
    assert not list(tmp_path.glob(".*fgdata-dedup"))


def test_torchrun_ranks_share_the_hashing_and_rank_0_writes_the_one_index(nearset, tmp_path):
    """Two ranks started at once: each hashes its share of the shards; rank 0 waits for the other's hashes and writes
    the index and failure report of one process, byte for byte."""
    _, ds = nearset
    clean = tmp_path / "clean.json"
    alone = json.loads(dedup(str(ds), "-o", str(clean), "--json").stdout)
    out = tmp_path / "dups.json"
    docs = run_ranks([*FGDATA, "dedup", str(ds), "-o", str(out)])
    assert out.read_bytes() == clean.read_bytes()
    assert Path(f"{out}.failures.json").read_bytes() == Path(f"{clean}.failures.json").read_bytes()
    assert (docs[0]["rank"], docs[1]["rank"]) == (0, 1) and docs[0]["world"] == docs[1]["world"] == 2
    assert docs[0]["seen"] == alone["seen"] and docs[0]["dropped"] == alone["dropped"]
    assert 0 < docs[1]["seen"] < alone["seen"] and docs[1]["dropped"] == 0  # its share only


def test_bad_input_is_one_line(tmp_path):
    r = dedup(str(tmp_path / "missing"), "-o", str(tmp_path / "x.json"), check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "missing" in r.stderr
    r = dedup(str(tmp_path), "-o", str(tmp_path / "x.json"), "--keep", "best", check=False)
    assert r.returncode == 2 and "--keep" in r.stderr and "Traceback" not in r.stderr


@settings(max_examples=25, deadline=None)
@given(words=st.sampled_from([1, 4]), k=st.integers(0, 24), seed=st.integers(0, 2**32 - 1))
@pytest.mark.slow  # end to end, several seconds
def test_multi_index_search_equals_all_pairs(words, k, seed):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 2**63, size=(40, words), dtype=np.uint64)
    near = base[rng.integers(0, 40, 120)].copy()
    for row in near:
        for bit in rng.integers(0, 64 * words, rng.integers(0, 12)):
            row[bit // 64] ^= np.uint64(1) << np.uint64(bit % 64)
    hashes = np.unique(np.concatenate([base, near]), axis=0)
    got, want = near_pairs(hashes, k), brute_pairs(hashes, k)
    assert np.array_equal(got.i, want.i) and np.array_equal(got.j, want.j)
    assert np.array_equal(got.distance, want.distance)


def test_keep_rule_never_drops_past_the_distance():
    """A chain a-b-c, each step 3 bits, a to c 6: at distance 3, b goes (copy of a) and c stays."""
    a = np.uint64(0)
    b = a ^ np.uint64(0b111)
    c = b ^ np.uint64(0b111000)
    got = keep_greedy(np.array([[a], [b], [c]], dtype=np.uint64), 3, np.arange(3))
    assert got.index.tolist() == [1] and got.dup_of.tolist() == [0] and got.distance.tolist() == [3]


# imagehash 4.3.2's phash(img) and phash(img, hash_size=16) of the sample photos, computed once where it
# installs (benchmarks/bench_dedup.py's virtualenv); fgdata's numpy DCT must give the same bits.
IMAGEHASH_PHASH = {
    "camera.png": ("bff1c1c0434e8cbc", "bf78f183c102c06743fc4e9c8cd8bc233327787761d3339897888f8f4b172e5c"),
    "chelsea.png": ("b15fe6465121175e", "b1ac5ffee6df46225131214897e25edba410e16552ca376ab8c93d465d07426f"),
    "coffee.png": ("bb8320376c0f3637", "bb2483cc209e37f24cf10fc336bc37cf32c29b273241330e60cf9936333c773c"),
    "grace_hopper.jpg": ("9d8a745883d71ea5", "9de7820174d948668343d7d91e22a4056ddf67e620042637e0c67911f7efce9f"),
    "horse.png": ("ad7ad2863235b534", "adbe7a4bd2c086b6364d35d0b5d63c3af50acda2c02f27b5334d3dc1345a6d08"),
    "hubble_deep_field.jpg": ("84cc4b96ba4d333e", "8486cc4e4f659ec1ba124d1d331c3eb0387374e52ba6a3da95a77967332313dc"),
    "rocket.jpg": ("c0371bec1be51267", "c0d937671396ec201bdfe521127e67a19c7e0381fc7e0381ec7a1387e4f81b0f"),
}


def test_phash_equals_imagehash(sample_images):
    from fgdata.dedup.hashes import phash

    assert {p.name for p in sample_images} == set(IMAGEHASH_PHASH)
    for path in sample_images:
        im = Image.open(path)
        got = tuple("".join(f"{int(w):016x}" for w in phash(im, bits)) for bits in (64, 256))
        assert got == IMAGEHASH_PHASH[path.name], path.name


@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_shards_and_index_on_s3(nearset, s3_bucket, tmp_path):
    """Shards read from s3://, the index and its failure report written there, the same records as locally."""
    from fgdata import storage

    items, ds = nearset
    for p in sorted(ds.iterdir()):
        storage.upload(str(p), f"{s3_bucket}/ds/{p.name}")
    local = tmp_path / "local.json"
    dedup(str(ds), "-o", str(local), "--by", "sha256")
    dedup(f"{s3_bucket}/ds", "-o", f"{s3_bucket}/dups.json", "--by", "sha256")
    remote = json.loads(storage.read_bytes(f"{s3_bucket}/dups.json"))
    assert {k: r["dup_of"]["key"] for keys in remote.values() for k, r in keys.items()} == {
        k: r["dup_of"]["key"] for (_, k), r in drops(local).items()}
    assert list(remote) == list(json.loads(local.read_text()))  # the same qualified names: ds/NNNNN.tar
    report = json.loads(storage.read_bytes(f"{s3_bucket}/dups.json.failures.json"))
    assert report["seen"] == report["written"] == len(items)
    assert not [i.path for i in storage.list_recursive(s3_bucket) if "fgdata-dedup" in i.path]  # markers gone


# pdqhash 0.2.8's compute() (Python bindings of ThreatExchange's C++ PDQ) of the sample photos: the hash in its
# hex form and the quality, computed once where it installs; fgdata's numpy PDQ must give the same.
PDQHASH = {
    "camera.png": ("dc9c9d3b746978f888f40ce6e5c3f70f7266623e8d989cb99f21f2010841e1c7", 100),
    "chelsea.png": ("5feb5321f01da156898e2bf629a5d3438412cdbd23f48942464526315db33ffd", 100),
    "coffee.png": ("8c629e779a663698b9a33866c026726c21a679f61eb6e1f8c79ba7e23c8299e0", 100),
    "grace_hopper.jpg": ("cc6c7cb9fbf7c44f31837672900233f3ffd9d012223ccdf561606309dd97c020", 100),
    "horse.png": ("690d885b2f16c1de5966d6f2fa01a2d8a857ae1eb5d645d6d93634b001a5e92f", 100),
    "hubble_deep_field.jpg": ("1c6715e46266634f72d42df2324ad397e70e86be9c665c59a42ec19c3369b919", 100),
    "rocket.jpg": ("8792786c87937064bf1bc0e43f1fc0e03f1cc2e33da4c2537cec821b2ce4f376", 100),
}


def _pdq_hex(im: Image.Image) -> tuple[str, int]:
    from fgdata.dedup.hashes import pdq

    words, quality = pdq(im)
    return "".join(f"{int(w):016x}" for w in words), quality


def test_pdq_equals_the_stored_reference(sample_images):
    assert {p.name for p in sample_images} == set(PDQHASH)
    for path in sample_images:
        assert _pdq_hex(Image.open(path)) == PDQHASH[path.name], path.name


def test_pdq_equals_pdqhash_on_other_shapes_and_qualities(sample_images):
    """Against the reference itself: the 64x64 path (no filter), blurred (quality below 100), very tall, noise,
    the smallest hashable size and one below it (zero hash, quality 0). Below quality 50 (a flat image, a pure
    gradient) the coefficients are float rounding and PDQ says not to trust the bits: only the quality is
    compared there."""
    from PIL import ImageFilter

    pdqhash = pytest.importorskip("pdqhash")
    rng = np.random.default_rng(0)
    im = Image.open(sample_images[0]).convert("RGB")
    cases = [im.resize((64, 64)), im.filter(ImageFilter.GaussianBlur(20)), im.resize((70, 900)),
             Image.fromarray(rng.integers(0, 256, (97, 133, 3), dtype=np.uint8)),
             Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)),
             Image.fromarray(rng.integers(0, 256, (4, 9, 3), dtype=np.uint8)),
             Image.new("RGB", (100, 80), (30, 60, 90)),
             Image.fromarray(np.tile(np.linspace(0, 255, 300).astype(np.uint8)[None, :, None], (200, 1, 3)))]
    qualities = []
    for case in cases + [Image.open(p).convert("RGB") for p in sample_images]:
        bits, quality = pdqhash.compute(np.ascontiguousarray(np.asarray(case)))
        got, got_quality = _pdq_hex(case)
        assert got_quality == quality
        if quality >= 50 or quality == 0 and min(case.size) < 5:
            assert got == f"{int(''.join(map(str, bits)), 2):064x}", case.size
        qualities.append(quality)
    assert 0 in qualities and any(50 <= q < 100 for q in qualities)  # a flat case and a blurred one compared


def test_pdq_distances_copies_near_distinct_far(nearset, tmp_path):
    """Identical bytes 0 bits apart, re-encoded and brightened copies within the default 31, half-size copies
    mostly; distinct photos far apart. The index names method pdq and no distance above the default."""
    from tests.dedup.nearset import near_duplicate_set

    items = near_duplicate_set()
    hexes = [_pdq_hex(Image.open(io.BytesIO(it.data)))[0] for it in items]
    original = {it.group: hexes[n] for n, it in enumerate(items) if it.kind == "original"}

    def apart(a: str, b: str) -> int:
        return bin(int(a, 16) ^ int(b, 16)).count("1")

    by_kind: dict[str, list[int]] = {}
    for n, it in enumerate(items):
        if it.kind != "original":
            by_kind.setdefault(it.kind, []).append(apart(hexes[n], original[it.group]))
    assert set(by_kind["exact"]) == {0}
    assert max(by_kind["jpeg60"]) <= 16 and max(by_kind["bright10"]) <= 16
    assert sum(d <= 31 for d in by_kind["resized"]) >= 0.9 * len(by_kind["resized"])
    groups = sorted(original.values())
    assert min(apart(a, b) for n, a in enumerate(groups) for b in groups[n + 1:]) > 64
    _, ds = nearset
    out = tmp_path / "pdq.json"
    r = json.loads(dedup(str(ds), "-o", str(out), "--by", "pdq", "--json").stdout)
    assert r["method"] == "pdq" and r["hashed"] == len(items)
    found = drops(out)
    assert {rec["method"] for rec in found.values()} == {"pdq"} and max(rec["distance"] for rec in found.values()) <= 31
    m = score(items, {int(k): int(rec["dup_of"]["key"]) for (_, k), rec in found.items()})
    assert m["precision"] == 1.0 and m["distinct_dropped"] == 0
    assert m["recall_jpeg60"] == m["recall_bright10"] == m["recall_exact"] == 1.0 and m["recall_resized"] >= 0.9
    bad = dedup(str(ds), "-o", str(out), "--by", "pdq", "--bits", "64", check=False)
    assert bad.returncode == 2 and "--bits" in bad.stderr
