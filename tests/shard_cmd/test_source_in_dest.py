"""A DST that is SRC or holds it is refused before anything is touched, with or without ``--overwrite``, however
either is spelled (a symlink, s3:// prefixes); a DST inside SRC is fine and never read as input. ``--overwrite``
says what it removes by kind and never removes a version-control folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``parent/imgs`` with nine photos and captions, and the things a user keeps beside them."""
    imgs = tmp_path / "parent" / "imgs"
    imgs.mkdir(parents=True)
    for i in range(9):
        Image.new("RGB", (8, 8), (25 * i, 100, 200)).save(imgs / f"img_{i}.png")
        (imgs / f"img_{i}.txt").write_text(f"photo {i}\n")
    (imgs / ".git").mkdir()
    (imgs / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "parent" / "notes.md").write_text("mine\n")
    return tmp_path


def _state(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every entry below ``root``: its bytes (None for a folder or link) and modification time."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (p.read_bytes() if p.is_file() and not p.is_symlink() else None,
                                         st.st_mtime_ns)
    return out


def _shard(cli, src, dest, *extra: str, expect: int = 0):
    return cli("shard", "images", src, dest, "--no-progress", *extra, expect=expect)


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
@pytest.mark.parametrize("where", ["same", "parent", "link-to-parent", "dotted"])
def test_a_dst_that_is_or_holds_src_is_refused_untouched(cli, tree, where, overwrite):
    src = tree / "parent" / "imgs"
    (tree / "link").symlink_to(tree / "parent")
    dest = {"same": src, "parent": tree / "parent", "link-to-parent": tree / "link",
            "dotted": Path(f"{src}/../imgs/.")}[where]
    before = _state(tree)
    refused = _shard(cli, src, dest, *(["--overwrite"] if overwrite else []), expect=1)
    message = str(refused.exception)
    assert "DST is SRC" in message if where in ("same", "dotted") else "DST holds SRC" in message
    assert "\n" not in message
    assert _state(tree) == before  # not a byte, not a folder (.fgdata) created


def test_the_cli_refuses_in_one_line_and_exit_1(tree):
    src = tree / "parent" / "imgs"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    before = _state(tree)
    done = subprocess.run([sys.executable, "-m", "fgdata", "shard", "images", str(src), str(tree / "parent"),
                           "--overwrite", "--no-progress"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and "DST holds SRC" in done.stderr
    assert _state(tree) == before


def test_encode_refuses_a_dst_holding_its_source_shards(tree, cli, tiny_vae_dir):
    """Every job of the core checks it: ``encode latents`` from shards inside DST (in place, DST = SRC, is
    ``encode``'s own way to add members, tested with encode)."""
    shards = tree / "parent" / "shards"
    _shard(cli, tree / "parent" / "imgs", shards)
    before = _state(tree)
    refused = cli("encode", "latents", shards, tree / "parent", "--vae", tiny_vae_dir, "--size", "32",
                  "--overwrite", "--no-progress", expect=1)
    assert "DST holds SRC" in str(refused.exception)
    assert _state(tree) == before


def test_a_dst_inside_src_is_left_out_of_the_walk(cli, tree):
    src = tree / "parent" / "imgs"
    dest = src / "out"
    first = json.loads(_shard(cli, src, dest, "--maxcount", "4", "--json").stdout)
    assert first["written"] == 9 and first["skipped"] == 0
    again = json.loads(_shard(cli, f"{src}/", f"{tree}/parent/imgs/./out", "--maxcount", "4", "--json").stdout)
    assert again["seen"] == 9 and again["resumed"] == 9 and again["skipped"] == 0
    assert again["rewritten_shards"] == [] and again["changed_inputs"] == []
    refused = _shard(cli, dest, src, expect=1)  # the other way round: DST holds SRC
    assert "DST holds SRC" in str(refused.exception)


@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_s3_dst_that_is_or_holds_src_is_refused_untouched(cli, tree, s3_bucket):
    import boto3

    client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"], region_name="us-east-1")
    bucket = s3_bucket.removeprefix("s3://")
    for p in sorted((tree / "parent" / "imgs").glob("img_*")):
        client.upload_file(str(p), bucket, f"parent/imgs/{p.name}")
    client.put_object(Bucket=bucket, Key="parent/notes.md", Body=b"mine\n")

    def objects() -> dict[str, str]:
        return {o["Key"]: o["ETag"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])}

    before = objects()
    src = f"{s3_bucket}/parent/imgs"
    for dest in (src, f"{src}/", f"{s3_bucket}/parent", f"{s3_bucket}//parent/", s3_bucket):
        for extra in ([], ["--overwrite"]):
            refused = _shard(cli, src, dest, *extra, expect=1)
            assert "DST is SRC" in str(refused.exception) or "DST holds SRC" in str(refused.exception)
            assert objects() == before
    inside = json.loads(_shard(cli, src, f"{src}/out", "--json").stdout)  # inside SRC: fine, and not an input
    again = json.loads(_shard(cli, src, f"{src}/out", "--json").stdout)
    assert inside["written"] == 9 and again["resumed"] == 9 and again["skipped"] == 0


def test_overwrite_lists_files_and_folders_and_spares_version_control(cli, tree):
    src = tree / "parent" / "imgs"
    dest = tree / "out"
    (dest / "sub").mkdir(parents=True)
    (dest / "sub" / "a.bin").write_bytes(b"x" * 1500)
    (dest / ".env").write_text("KEY=1\n")
    done = _shard(cli, src, dest, "--overwrite")
    assert "--overwrite: removing 1 file(s) and 1 folder(s) from" in done.stderr
    assert "(1.5 KB): .env (6 B), sub/ (1 file(s), 1.5 KB)" in done.stderr
    for vcs in (dest / ".git", dest / "deep" / "er" / ".hg"):
        vcs.mkdir(parents=True)
        (vcs / "store").write_text("history\n")
        before = _state(tree)
        refused = _shard(cli, src, dest, "--overwrite", expect=1)
        assert f"{vcs.relative_to(tree)}: a version-control folder" in str(refused.exception).replace(f"{tree}/", "")
        assert _state(tree) == before
        (vcs / "store").unlink()
        vcs.rmdir()
