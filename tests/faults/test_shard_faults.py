"""Damaged shards against every reader: verify, count-shards, inspect, iter_samples and the WDS loaders.

Each fault is injected with a seeded RNG into a small dataset of every member type. The
contract checked for each:

* nothing raises anything but FgdataError, CLI commands exit 0/1 with no traceback;
* non-strict loaders skip, count and log (shard and key) and finish; strict loaders raise
  naming the shard (and the key when the sample exists);
* the closed loop: after ``verify --decode`` writes its ignore index and readable counts,
  a *strict* deterministic loader delivers exactly counts - ignored samples, none dropped.
"""

from __future__ import annotations

import contextlib
import io
import logging
import random
import re
import shutil
import sys
from pathlib import Path

import pytest

from faultkit import flip_bits, layout, npy_bytes, truncate_at, write_dataset
from fgdata.errors import FgdataError
from fgdata.shards import discover_shards, iter_samples, load_ignore_index, read_shard_counts
from fgdata.verify import verify_dataset, write_counts, write_ignore

KINDS = ("png", "txt", "json", "npy", "latent.pth")
KEY_MAP = {"image": "png", "caption": "txt", "meta": "json", "arr": "npy", "latent": "latent.pth"}
N, PER_SHARD = 12, 4
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pristine") / "ds"
    write_dataset(root, n=N, maxcount=PER_SHARD, kinds=KINDS)
    return root


def _evil_pth() -> bytes:
    import pickle

    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('pickle code ran')",))

    return pickle.dumps({"x": Boom()})


def inject(ds: Path, fault: str, seed: int) -> str:
    """Damage ``ds`` in place; return the basename of the damaged shard."""
    rng = random.Random(f"{fault}-{seed}")
    shards = sorted(ds.glob("*.tar"))
    shard = shards[rng.randrange(len(shards))]
    lay = layout(shard)
    if fault == "truncate":
        truncate_at(shard, rng.randrange(1, shard.stat().st_size))
    elif fault == "flip-payload":
        spans = [rng.choice(lay.payloads) for _ in range(3)]
        flip_bits(shard, [rng.randrange(a, b) for a, b, _ in spans], rng)
    elif fault == "flip-header":
        start, end = rng.choice(lay.headers)
        flip_bits(shard, [rng.randrange(start, end)], rng)
    else:
        i = rng.randrange(N)
        override = {
            "bad-image": {i: {"png": b"\x89PNG\r\n\x1a\n" + bytes(rng.randrange(256) for _ in range(64))}},
            "bad-npy": {i: {"npy": npy_bytes(i)[:70]}},
            "bad-pth": {i: {"latent.pth": _evil_pth()}},
            "missing-member": {i: {"txt": None}},
        }.get(fault)
        if override is not None:
            shutil.rmtree(ds)
            write_dataset(ds, n=N, maxcount=PER_SHARD, kinds=KINDS, override=override)
            return f"{i // PER_SHARD:05d}.tar"
        if fault == "empty-shard":
            shard.write_bytes(b"")
        elif fault == "not-a-tar":
            shard.write_bytes(b"PK\x03\x04 a zip, not a tar " * 100)
        else:
            raise ValueError(fault)
    return shard.name


FAULTS = [(f, s) for f in ("truncate", "flip-payload", "flip-header") for s in range(3)] + [
    (f, 0) for f in ("bad-image", "bad-npy", "bad-pth", "missing-member", "empty-shard", "not-a-tar")
]


def cli(*args: str) -> tuple[int, str, str]:
    """Run the fgdata console entry in-process: (exit code, stdout, stderr)."""
    from fgdata.cli.main import run

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        old = sys.argv
        sys.argv = ["fgdata", *args]
        try:
            run()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            sys.argv = old
    return code, out.getvalue(), err.getvalue()


def no_crash(code: int, err: str) -> None:
    assert code in (0, 1), (code, err)
    assert "Traceback" not in err
    # run() prefixes non-FgdataError exceptions with their class name: that is a bug, not a report
    assert not re.search(r"error: [A-Z]\w*(Error|Exception): ", err), err


def loader(ds: Path, **kw):
    from fgdata.loaders import WDSLoader

    kw.setdefault("num_workers", 0)
    return WDSLoader(["WDS:" + str(ds)], batch_size=2, key_map=KEY_MAP, train=False, partial=True, **kw)


def drain(ld) -> tuple[list[str], int]:
    """Every key the loader yields, and the positions it dropped (its own count: drops never ride in a batch)."""
    keys = []
    for batch in ld:
        keys.extend(batch["__key__"])
    return keys, ld.state_dict()["drops"]


@pytest.mark.parametrize("fault,seed", FAULTS, ids=[f"{f}-{s}" for f, s in FAULTS])
def test_every_reader_survives(tmp_path, pristine, fault, seed, caplog):
    ds = tmp_path / "ds"
    shutil.copytree(pristine, ds)
    damaged = inject(ds, fault, seed)

    # verify: a report, never an exception; the CLI exits 1 on findings
    report = verify_dataset(str(ds), decode=True, require=list(KEY_MAP.values()), workers=1)
    code, out, err = cli("verify", str(ds), "--workers", "1", "--decode", "--require", ",".join(KEY_MAP.values()),
                         "--write-ignore", str(tmp_path / "ignore.json"), "--counts-output", str(tmp_path / "counts.json"))
    no_crash(code, err)
    assert code == (0 if report.ok else 1)
    if fault not in ("flip-payload",):  # a flipped payload bit can land in bytes no decoder checks
        assert not report.ok, f"{fault}-{seed} went unnoticed"
        assert any(not s.ok for s in report.shards if s.name == damaged) or report.problems

    # count-shards and inspect: report and exit 0/1
    no_crash(*cli("count-shards", str(ds), "--no-write")[::2])
    for shard in discover_shards(str(ds)):
        no_crash(*cli("inspect", shard, "--limit", "2")[::2])
        # iter_samples: only FgdataError (DamagedShardError) escapes
        try:
            for _ in iter_samples(shard):
                pass
        except FgdataError:
            pass

    # the closed loop: verified ignore index + readable counts -> a strict loader drops nothing
    ignore = load_ignore_index(str(tmp_path / "ignore.json"))
    counts = read_shard_counts(str(tmp_path / "counts.json"))
    expected = sum(counts.values()) - sum(len(v) for v in ignore.values())
    if expected:
        ld = loader(ds, deterministic=True, strict=True, shard_count_file=str(tmp_path / "counts.json"),
                    ignore_index_paths=[str(tmp_path / "ignore.json")])
        keys, drops = drain(ld)
        assert drops == 0 and len(keys) == expected, (fault, seed, len(keys), expected)
        assert not any(k in ignore.get(s, ()) for k in keys for s in ignore)

    # non-strict, no ignore index: finishes, logs shard and key of each drop
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fgdata.loaders"):
        for mode in ({"deterministic": True}, {"deterministic": False}):
            try:
                drain(loader(ds, **mode))
            except FgdataError as exc:  # only "nothing usable" style errors may end a non-strict run
                assert "no batch" in str(exc) or "consecutive" in str(exc) or "no .tar" in str(exc), exc
    if not report.ok and report.bad_samples:
        logged = "\n".join(r.getMessage() for r in caplog.records)
        shard = next(s for s in report.shards if s.name == damaged)
        assert damaged in logged and (shard.damage or any(k in logged for k in shard.bad_keys)), logged

    # strict, no ignore index: the sequential reader raises naming the shard (and the key when there is one);
    # the deterministic reader goes through the offset index, so it may read a shard whose tar headers
    # are damaged but whose payloads are intact: it either raises the same way or drops nothing.
    if report.bad_samples:
        bad_keys = [k for s in report.shards for k in s.bad_keys]
        shard = next(s for s in report.shards if s.name == damaged)
        with pytest.raises(FgdataError) as info:
            drain(loader(ds, deterministic=False, strict=True))
        assert damaged in str(info.value)
        assert shard.damage or any(k in str(info.value) for k in bad_keys), str(info.value)
        try:
            _, drops = drain(loader(ds, deterministic=True, strict=True))
            assert drops == 0
        except FgdataError as exc:
            assert damaged in str(exc) and (shard.damage or any(k in str(exc) for k in bad_keys)), str(exc)


def test_bad_video_is_skipped_by_the_video_loader(tmp_path, sample_video):
    from fgdata.loaders import VideoWDSLoader

    video = sample_video.read_bytes()
    ds = tmp_path / "ds"
    write_dataset(ds, n=3, maxcount=3, kinds=("txt",),
                  override={0: {"mp4": video}, 1: {"mp4": video[: len(video) // 4]}, 2: {"mp4": b"\0" * 4096}})
    report = verify_dataset(str(ds), decode=True, workers=1)
    assert report.ignore_mapping() == {"00000.tar": ["sample_000001", "sample_000002"]}
    write_ignore(report, str(tmp_path / "ignore.json"))
    write_counts(report, str(tmp_path / "counts.json"))
    kw = dict(batch_size=1, sequence_length=4, img_size=(64, 48), num_workers=0, train=False, deterministic=True)
    got = [b["__key__"][0] for b in VideoWDSLoader(["WDS:" + str(ds)], strict=True, ignore_index_paths=[str(tmp_path / "ignore.json")],
                                                   shard_count_file=str(tmp_path / "counts.json"), **kw)]
    assert got == ["sample_000000"]
    with pytest.raises(FgdataError, match="sample_00000[12]"):
        for _ in VideoWDSLoader(["WDS:" + str(ds)], strict=True, **kw):
            pass
    # non-strict: every position still yields a sample (the drop rule), the bad clips are never returned
    got = [b["__key__"][0] for b in VideoWDSLoader(["WDS:" + str(ds)], **kw)]
    assert set(got) == {"sample_000000"}
