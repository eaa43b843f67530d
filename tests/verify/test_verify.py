"""fgdata verify: every structural check, every decode reason, the side files it writes, the CLI contract."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest

from faultkit import assert_clean_failure, jpg_bytes, make_tar, png_bytes, truncate_at, write_dataset
from inprocess import fgdata  # verify's output and exit status are what its CLI tests check
from fgdata.errors import FgdataError
from fgdata.shards import load_ignore_index, read_shard_counts
from fgdata.verify import verify_dataset, write_counts, write_ignore


def reasons(report) -> dict[str, int]:
    return dict(report.by_reason)


def bad(report) -> dict[str, set[str]]:
    return {k: set(v) for k, v in report.ignore_mapping().items()}


def test_clean_dataset_is_ok_and_counts_agree(tmp_path):
    counts = write_dataset(tmp_path / "ds", n=10, kinds=("png", "txt", "json", "npy", "latent.pth"))
    report = verify_dataset(str(tmp_path / "ds"), decode=True, require=["png", "txt"], workers=1)
    assert report.ok, report.to_json()
    assert report.samples == report.readable == 10
    assert report.readable_counts() == counts
    assert report.count_file and report.count_file.endswith("shard_count.json")
    write_ignore(report, str(tmp_path / "ignore.json"))
    assert load_ignore_index(str(tmp_path / "ignore.json")) == {}  # "{}": a valid, non-empty ignore file


def test_structural_problems_per_key(tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir()
    png = png_bytes(1)
    make_tar(ds / "00000.tar", [
        ("a.png", png), ("a.txt", b"x"),
        ("b.png", png), ("c.png", png), ("b.txt", b"x"),          # b: members not adjacent
        ("d.png", png), ("d.png", png),                            # d: repeated extension
        ("e.png", png), ("e.txt", b"1"), ("f.png", png), ("e.png", png), ("e.txt", b"2"),  # e: key twice
        ("noext", b"x"),                                           # no extension
        ("../up.png", png),                                        # key rule: '..'
        ("/abs.png", png),                                         # key rule: absolute
        ("g.png", png),                                            # missing required txt
        ("h.png", png), ("h.txt", tarfile.SYMTYPE, "/etc/passwd"), # link member
    ])
    report = verify_dataset(str(ds), require=["png", "txt"], workers=1)
    by_key: dict[str, set[str]] = {}
    for p in report.shards[0].problems:
        by_key.setdefault(p.key, set()).add(p.reason)
    assert "not-adjacent" in by_key["b"]
    assert "repeated-ext" in by_key["d"]
    assert "duplicate-key" in by_key["e"]
    assert "bad-key" in by_key["noext"]
    assert "bad-key" in by_key["../up"]
    assert "bad-key" in by_key["/abs"]
    assert by_key["g"] == {"missing-member"}
    assert "link-member" in by_key["h"]
    assert "a" not in by_key
    assert set(report.ignore_mapping()["00000.tar"]) == set(by_key) - {None}
    # every ignored key is among the counted samples: loaders subtract one from the other
    counted = report.readable_counts()["00000.tar"]
    assert counted == report.shards[0].samples


def test_truncated_shard_counts_only_readable_samples(tmp_path):
    ds = tmp_path / "ds"
    write_dataset(ds, n=8, maxcount=4)
    shard = ds / "00001.tar"
    from faultkit import layout

    cut = layout(shard).payloads[3][0] + 5  # inside the second sample's second member
    truncate_at(shard, cut)
    report = verify_dataset(str(ds), workers=1)
    r = report.shards[1]
    assert r.readable == 1 and r.samples == 2
    assert {"truncated", "index-stale", "counts-mismatch"} <= set(reasons(report))
    assert "sample_000005" in r.problems[0].detail  # the cut sample is named
    assert report.readable_counts() == {"00000.tar": 4, "00001.tar": 1}
    assert bad(report) == {}  # the cut sample is not counted, so it must not be ignored either


def test_cut_at_member_boundary_without_end_marker(tmp_path):
    ds = tmp_path / "ds"
    write_dataset(ds, n=4, maxcount=4)
    from faultkit import layout

    lay = layout(ds / "00000.tar")
    truncate_at(ds / "00000.tar", lay.headers[-1][0])  # drop the last member (sample_000003.txt) exactly
    report = verify_dataset(str(ds), require=["png", "txt"], workers=1)
    assert report.shards[0].readable == 4
    assert bad(report) == {"00000.tar": {"sample_000003"}}
    assert reasons(report)["truncated"] == 2  # the shard (no end marker) and its possibly incomplete last sample


@pytest.mark.parametrize("content,reason", [(b"", "empty-shard"), (b"this is not a tar file\n" * 40, "not-a-tar"),
                                            (b"\0" * 10240, "empty-shard")])
def test_empty_and_not_a_tar(tmp_path, content, reason):
    ds = tmp_path / "ds"
    write_dataset(ds, n=2, maxcount=2)
    (ds / "00001.tar").write_bytes(content)
    (ds / "shard_count.json").unlink()
    report = verify_dataset(str(ds), workers=2)
    assert [p.reason for p in report.shards[1].problems] == [reason]
    assert report.readable_counts() == {"00000.tar": 2, "00001.tar": 0}


def test_duplicate_keys_across_shards(tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir()
    make_tar(ds / "00000.tar", [("k1.txt", b"a"), ("k2.txt", b"b")])
    make_tar(ds / "00001.tar", [("k3.txt", b"c"), ("k1.txt", b"d")])
    make_tar(ds / "00002.tar", [("k1.txt", b"e")])
    report = verify_dataset(str(ds), workers=1)
    assert bad(report) == {"00001.tar": {"k1"}, "00002.tar": {"k1"}}  # the first occurrence is kept
    assert reasons(report) == {"duplicate-key": 2}


def test_side_file_disagreements(tmp_path):
    ds = tmp_path / "ds"
    write_dataset(ds, n=6, maxcount=2)
    (ds / "shard_count.json").write_text(json.dumps({"00000.tar": 2, "00001.tar": 3, "00099.tar": 1}))
    idx = ds / "00002.tar.idx.json"
    doc = json.loads(idx.read_text())
    doc["samples"][0][1] += 512
    idx.write_text(json.dumps(doc))
    (ds / "00000.tar.idx.json").write_text("not json")
    report = verify_dataset(str(ds), workers=1)
    assert [p.reason for p in report.shards[0].problems] == ["index-invalid"]
    assert [p.reason for p in report.shards[1].problems] == ["counts-mismatch"]
    assert sorted(p.reason for p in report.shards[2].problems) == ["counts-missing", "index-mismatch"]
    assert [p.reason for p in report.problems] == ["counts-extra"]
    assert bad(report) == {}
    path = write_counts(report)
    assert read_shard_counts(path) == {"00000.tar": 2, "00001.tar": 2, "00002.tar": 2}
    assert not any(p.reason.startswith("counts") for p in verify_dataset(str(ds), workers=1).shards[1].problems)


def _npy_object() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return buf.getvalue()


def test_decode_reasons(tmp_path, sample_video):
    video = sample_video.read_bytes()
    ds = tmp_path / "ds"
    write_dataset(ds, n=12, maxcount=6, kinds=("jpg", "txt", "json", "npy", "latent.pth"), override={
        1: {"jpg": jpg_bytes(1)[:60]},
        2: {"txt": b"\xff\xfe caption"},
        3: {"json": b"{not json"},
        4: {"npy": _npy_object()},
        5: {"latent.pth": b"PK\x03\x04 not a torch file"},
        6: {"mp4": video[: len(video) // 3]},
        7: {"mp4": b"\0" * 2000},
        8: {"npz": b"PK garbage"},
        9: {"mp4": video},
    })
    report = verify_dataset(str(ds), decode=True, workers=1)
    assert bad(report) == {"00000.tar": {f"sample_{i:06d}" for i in range(1, 6)},
                           "00001.tar": {"sample_000006", "sample_000007", "sample_000008"}}
    got = reasons(report)
    for reason in ("image-decode", "utf8", "json", "npy", "pth", "npz"):
        assert got.get(reason) == 1, got
    assert got.get("video-decode", 0) + got.get("video-truncated", 0) == 2, got
    # without --decode only structure is checked
    assert verify_dataset(str(ds), workers=1).ok


def test_decode_in_processes_matches_inline(tmp_path):
    ds = tmp_path / "ds"
    write_dataset(ds, n=9, maxcount=3, override={0: {"png": b"junk"}, 4: {"txt": b"\xff"}, 8: {"png": png_bytes(8)[:40]}})
    inline = verify_dataset(str(ds), decode=True, workers=1).to_json()
    pooled = verify_dataset(str(ds), decode=True, workers=2).to_json()
    assert pooled == inline
    assert inline["bad_samples"] == 3


def test_single_shard_path_updates_its_count(tmp_path):
    ds = tmp_path / "ds"
    write_dataset(ds, n=6, maxcount=3)
    from faultkit import layout

    truncate_at(ds / "00001.tar", layout(ds / "00001.tar").payloads[2][0] + 1)
    report = verify_dataset(str(ds / "00001.tar"), workers=1)
    assert len(report.shards) == 1 and report.shards[0].readable == 1
    write_counts(report)
    assert read_shard_counts(str(ds / "shard_count.json")) == {"00000.tar": 3, "00001.tar": 1}


def test_cli_report_json_and_outputs(tmp_path):
    ds = tmp_path / "ds"
    write_dataset(ds, n=8, maxcount=4, override={2: {"png": b"junk"}, 5: {"txt": None}})
    ok = fgdata("verify", str(ds), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True
    proc = fgdata("verify", str(ds), "-w", "1", "--decode", "--require", "png,txt", "--json",
                   "--write-ignore", str(tmp_path / "ign.json"), "--counts-output", str(tmp_path / "counts.json"))
    assert_clean_failure(proc)
    doc = json.loads(proc.stdout)
    assert doc["bad_samples"] == 2 and doc["by_reason"] == {"image-decode": 1, "missing-member": 1}
    assert doc["written"] == {"ignore": str(tmp_path / "ign.json"), "counts": str(tmp_path / "counts.json")}
    assert load_ignore_index(str(tmp_path / "ign.json")) == {"00000.tar": {"sample_000002"}, "00001.tar": {"sample_000005"}}
    assert read_shard_counts(str(tmp_path / "counts.json")) == {"00000.tar": 4, "00001.tar": 4}
    table = fgdata("verify", str(ds), "-w", "1", "--decode", "--require", "png,txt")
    assert_clean_failure(table)
    assert "image-decode" in table.stdout and "sample_000002" in table.stdout and "missing .txt" in table.stdout


@pytest.mark.parametrize("args", [["/nonexistent/dir"], ["{tmp}/empty"], ["{tmp}/file.tar"]])
def test_cli_errors_are_one_line(tmp_path, args):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.tar").write_bytes(b"garbage" * 100)
    proc = fgdata("verify", *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert_clean_failure(proc)


def test_cli_start_up_stays_light():
    import subprocess
    import sys

    code = "import sys, fgdata.cli.verify; print(','.join(m for m in ('torch','av','webdataset','numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


# -- several datasets at once --------------------------------------------------

def test_each_folder_is_its_own_dataset(tmp_path):
    """Two healthy datasets both number keys from sample_000000: no key is a duplicate of the other's."""
    write_dataset(tmp_path / "a", n=6, maxcount=3)
    write_dataset(tmp_path / "b", n=4, maxcount=3, override={1: {"txt": None}})
    report = verify_dataset([str(tmp_path / "a"), str(tmp_path / "b")], require=["txt"], workers=1)
    assert reasons(report) == {"missing-member": 1}
    b0 = str(tmp_path / "b" / "00000.tar")
    assert bad(report) == {"b/00000.tar": {"sample_000001"}}  # folder and shard: both folders hold a 00000.tar
    assert [d["path"] for d in report.dataset_summaries()] == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert [(d["samples"], d["ok"]) for d in report.dataset_summaries()] == [(6, True), (4, False)]
    # duplicates are still found inside one dataset
    make_tar(tmp_path / "b" / "00002.tar", [("sample_000000.txt", b"again")])
    again = verify_dataset([str(tmp_path / "a"), str(tmp_path / "b")], workers=1)
    dup = [p for s in again.shards for p in s.problems if p.reason == "duplicate-key"]
    assert [(p.key, p.detail) for p in dup] == [("sample_000000", f"key also in {b0}")]


def test_several_folders_write_counts_per_folder_and_refuse_one_count_file(tmp_path):
    write_dataset(tmp_path / "a", n=5, maxcount=3)
    write_dataset(tmp_path / "b", n=2, maxcount=3)
    (tmp_path / "a" / "shard_count.json").write_text(json.dumps({"00000.tar": 3, "00001.tar": 2, "00009.tar": 1}))
    report = verify_dataset([str(tmp_path / "a"), str(tmp_path / "b")], workers=1)
    assert [p.reason for p in report.problems] == ["counts-extra"]  # each folder given whole is checked whole
    assert str(tmp_path / "a" / "shard_count.json") in report.problems[0].detail
    write_counts(report)
    assert read_shard_counts(str(tmp_path / "a" / "shard_count.json")) == {"00000.tar": 3, "00001.tar": 2}
    assert read_shard_counts(str(tmp_path / "b" / "shard_count.json")) == {"00000.tar": 2}
    with pytest.raises(FgdataError, match="one count file cannot describe"):
        verify_dataset([str(tmp_path / "a"), str(tmp_path / "b")], count_file=str(tmp_path / "a" / "shard_count.json"))
    with pytest.raises(FgdataError, match="one count file cannot hold both"):
        write_counts(report, str(tmp_path / "counts.json"))


def test_cli_names_the_dataset_in_every_row_and_the_loader_takes_its_ignore_index(tmp_path, monkeypatch):
    """`verify A B --write-ignore` writes an index the loaders accept with relative datatags A and B."""
    from fgdata.loaders import WDSLoader

    write_dataset(tmp_path / "a", n=4, maxcount=2, kinds=("txt", "npy"))
    write_dataset(tmp_path / "b", n=4, maxcount=2, kinds=("txt", "npy"), override={3: {"npy": b"junk"}})
    monkeypatch.chdir(tmp_path)
    proc = fgdata("verify", "a", "b", "-w", "1", "--decode", "--write-ignore", "ign.json", cwd=tmp_path)
    assert_clean_failure(proc)
    rows = [line for line in proc.stdout.splitlines() if ".tar" in line and "│" in line]
    assert len(rows) == 4 and all("a/0000" in r or "b/0000" in r for r in rows), proc.stdout
    assert "b/00001.tar sample_000003" in proc.stdout and "a: 2 shard(s), 4 samples, ok" in proc.stdout
    assert json.loads((tmp_path / "ign.json").read_text()) == {"b/00001.tar": ["sample_000003"]}
    loader = WDSLoader(["WDS:a", "WDS:b"], batch_size=7, key_map={"x": "npy"}, deterministic=True, train=False,
                       num_workers=0, ignore_index_paths="ign.json")
    got = [(shard, key) for b in loader for shard, key in zip(b["shard"], b["fname"])]
    assert len(got) == 7 and ("b/00001.tar", "sample_000003") not in got and ("a/00001.tar", "sample_000003") in got
    table = fgdata("count-shards", "a", "b", "--no-write", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if ".tar" in line]
    assert len(rows) == 4 and all("a/0000" in r or "b/0000" in r for r in rows), table.stdout
    doc = json.loads(fgdata("count-shards", "a", "b", "--no-write", "--json", cwd=tmp_path).stdout)
    assert [(d["path"], d["samples"]) for d in doc["datasets"]] == [("a", 4), ("b", 4)]


def test_the_ignore_index_of_several_datasets_still_holds_after_they_move(tmp_path, monkeypatch):
    """Over several folders, verify names shards by folder and shard (as dedup does), not by absolute path: the
    datasets moved together elsewhere lose exactly the same sample."""
    import shutil

    from fgdata.loaders import WDSLoader

    write_dataset(tmp_path / "old" / "a", n=4, maxcount=2, kinds=("txt", "npy"))
    write_dataset(tmp_path / "old" / "b", n=4, maxcount=2, kinds=("txt", "npy"), override={1: {"npy": b"junk"}})
    proc = fgdata("verify", str(tmp_path / "old" / "a"), str(tmp_path / "old" / "b"), "-w", "1", "--decode",
                  "--write-ignore", str(tmp_path / "ign.json"))
    assert_clean_failure(proc)
    assert json.loads((tmp_path / "ign.json").read_text()) == {"b/00000.tar": ["sample_000001"]}
    shutil.move(tmp_path / "old", tmp_path / "new")
    monkeypatch.chdir(tmp_path)
    loader = WDSLoader(["WDS:new/a", "WDS:new/b"], batch_size=7, key_map={"x": "npy"}, deterministic=True,
                       train=False, num_workers=0, ignore_index_paths="ign.json")
    got = {(shard, key) for b in loader for shard, key in zip(b["shard"], b["fname"])}
    assert len(got) == 7 and ("new/b/00000.tar", "sample_000001") not in got
    assert ("new/a/00000.tar", "sample_000001") in got


def test_one_folder_spelled_several_ways_is_one_dataset_read_once(tmp_path, monkeypatch):
    """`verify a ./a` (or a symlink to a): the same shards, checked once as one dataset, and said so in one line."""
    from fgdata.shards import ShardSet, resolve_shards

    write_dataset(tmp_path / "a", n=6, maxcount=3)
    (tmp_path / "link").symlink_to(tmp_path / "a", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    selection = resolve_shards(["a", "./a", "link", str(tmp_path / "a" / "00001.tar")])
    assert selection.shards == ["a/00000.tar", "a/00001.tar"] and selection.folders == ["a"]
    assert len(selection.repeated) == 5 and "5 shard(s) named more than once" in selection.repeated_note()
    mixed = resolve_shards(["a/00000.tar", "./a"])  # one dataset however its shards are spelled, given whole
    assert mixed.shards == ["a/00000.tar", "./a/00001.tar"] and mixed.folders == ["a"]
    assert all(mixed.given_whole(s) for s in mixed.shards) and mixed.label("./a/00001.tar") == "00001.tar"
    report = verify_dataset(["a", "./a", "link"], workers=1)
    assert report.ok and report.samples == 6 and not report.several
    s3 = ShardSet(["s3://bkt/x/00000.tar", "s3://bkt//x/00001.tar", "s3://bkt/y/00000.tar"])  # prefixes normalised
    assert s3.folders == ["s3://bkt/x", "s3://bkt/y"] and s3.folder_of("s3://bkt//x/00001.tar") == "s3://bkt/x"
    proc = fgdata("verify", "a", "./a", "-w", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("named more than once") == 1 and "a: " not in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if ".tar" in line and "│" in line]
    assert len(rows) == 2 and "a/0000" not in proc.stdout


def test_the_one_format_rule_is_per_dataset(tmp_path):
    """Two datasets of one format each (all png, all jpg) are not "mixed": each is what HF datasets reads as one and
    what shard images writes; verify says only that a loader reading both together needs both extensions in its
    key_map. A dataset that is itself mixed is named, with its own counts."""
    write_dataset(tmp_path / "a", n=6, kinds=("png", "txt"))
    write_dataset(tmp_path / "b", n=4, kinds=("jpg", "txt"))
    report = verify_dataset([str(tmp_path / "a"), str(tmp_path / "b")], workers=1)
    assert report.ok and len(report.warnings) == 1, report.warnings
    (line,) = report.warnings
    assert "mixed" not in line and "misses" not in line
    assert f"{tmp_path / 'a'}: png; {tmp_path / 'b'}: jpg" in line and "{'real': 'jpg;png'}" in line
    assert verify_dataset(str(tmp_path / "a"), workers=1).warnings == []

    write_dataset(tmp_path / "c", n=5, kinds=("png", "txt"), override={0: {"png": None, "jpg": jpg_bytes(0)}})
    report = verify_dataset([str(tmp_path / "a"), str(tmp_path / "c")], workers=1)
    assert report.warnings == [f"mixed image formats in {tmp_path / 'c'}: 2 image extensions (png 4, jpg 1): "
                               "HF datasets refuses such shards and a single-key loader config such as "
                               "{'real': 'png'} misses 1 samples; shard with --format jpg (the default), png or "
                               "webp for one format"]
    proc = fgdata("verify", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["warnings"] == [line]


def test_a_decoding_worker_killed_with_its_result_ends_verify_with_one_line(tmp_path):
    """SIGKILL of a worker holding a shard's result (what the out-of-memory killer does): ``verify --decode`` ends
    with one error line and exit 1 instead of waiting for the result, writes neither side file, and leaves no
    worker behind. The kill happens at the point the worker signals (FGDATA_TEST_HOLD=worker-result)."""
    from faultkit import FGDATA, alive, kill_worker_with_result

    ds = tmp_path / "ds"
    write_dataset(ds, n=12, maxcount=4)
    before = (ds / "shard_count.json").read_bytes()
    killed = kill_worker_with_result([*FGDATA, "verify", str(ds), "--decode", "--workers", "2", "--write-counts",
                                      "--write-ignore", str(tmp_path / "ignore.json")])
    assert killed.returncode == 1, killed.stderr[-2000:]
    last = killed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: a worker process died while checking the shards") and \
        last.endswith("nothing was written"), killed.stderr[-2000:]
    assert "Traceback" not in killed.stderr
    assert not (tmp_path / "ignore.json").exists() and (ds / "shard_count.json").read_bytes() == before
    assert killed.siblings and not any(alive(pid) for pid in killed.siblings)
