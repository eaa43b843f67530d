"""URL-aware path rules and the s5cmd error wording, without a server."""

from __future__ import annotations

import pytest

from fgdata.errors import StorageError
from fgdata.storage import basename, is_s3, join, parent, s5cmd_binary
from fgdata.storage.s5cmd import classify, error_line, scrub


def test_is_s3():
    assert is_s3("s3://b/k")
    assert not is_s3("/data/s3://x")
    assert not is_s3("relative/path")


@pytest.mark.parametrize(
    ("base", "parts", "expected"),
    [
        ("s3://bucket/p", ("x",), "s3://bucket/p/x"),
        ("s3://bucket/p/", ("/x/", "y.tar"), "s3://bucket/p/x/y.tar"),
        ("s3://bucket", ("neg.npy",), "s3://bucket/neg.npy"),
        ("/d/shards", ("neg.npy",), "/d/shards/neg.npy"),
        ("/d", ("a", "b"), "/d/a/b"),
    ],
)
def test_join(base, parts, expected):
    assert join(base, *parts) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("s3://bucket/a/b/shards", "s3://bucket/a/b"),
        ("s3://bucket/a/b/shards/", "s3://bucket/a/b"),
        ("s3://bucket/shards", "s3://bucket"),
        ("/d/shards", "/d"),
        ("/d/shards/", "/d"),
        ("shards", "."),
        ("/", "/"),
    ],
)
def test_parent(path, expected):
    assert parent(path) == expected


@pytest.mark.parametrize("url", ["s3://bucket", "s3://bucket/", "s3://"])
def test_parent_never_leaves_the_bucket(url):
    """`WDS:s3://bucket` + files_map must fail, not build `s3:/neg.npy`."""
    with pytest.raises(StorageError, match="s3://"):
        parent(url)


def test_files_map_rule_on_s3_tags():
    """The side file sits next to the shard prefix, for any depth of tag."""
    assert join(parent("s3://bucket/d/shards"), "neg.npy") == "s3://bucket/d/neg.npy"
    assert join(parent("s3://bucket/shards"), "neg.npy") == "s3://bucket/neg.npy"


def test_basename():
    assert basename("s3://bucket/a/x.tar") == "x.tar"
    assert basename("s3://bucket/a/") == "a"
    assert basename("s3://bucket") == "bucket"
    assert basename("/d/x.tar") == "x.tar"
    assert basename("/d/dir/") == "dir"


def test_s5cmd_binary_is_the_go_binary():
    path = s5cmd_binary()
    with open(path, "rb") as f:
        assert f.read(4) == b"\x7fELF"


def test_error_line_and_classification():
    line = error_line(b'ERROR "cat s3://fgtest/nope.tar": given object s3://fgtest/nope.tar not found\n')
    assert line == "given object s3://fgtest/nope.tar not found"
    assert classify(line).reason == "object not found"
    assert not classify(line).transient
    json_err = b'{"operation":"ls","command":"ls s3://x/","error":"NoSuchBucket: gone status code: 404"}\n'
    assert classify(error_line(json_err)).reason == "bucket not found"
    assert classify("SlowDown: please reduce your request rate status code: 503").transient
    assert not classify("NoCredentialProviders: no valid providers in chain").transient
    assert not classify("AccessDenied: Access Denied status code: 403").transient


def test_scrub_removes_credentials(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2-very-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "tok-123456")
    line = error_line(b"ERROR \"ls\": bad signature for hunter2-very-secret with tok-123456\n")
    assert "hunter2" not in line and "tok-123456" not in line
    assert scrub("x hunter2-very-secret y") == "x *** y"
