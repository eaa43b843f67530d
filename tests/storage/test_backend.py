"""The backend interface: choice by URL scheme, local ranged reads and stat, path rules for any scheme."""

from __future__ import annotations

import pytest

from fgdata import storage
from fgdata.storage import paths
from fgdata.errors import StorageError
from fgdata.storage.local import LocalBackend
from fgdata.storage.s3 import S3Backend


def test_backend_by_scheme():
    assert isinstance(storage.backend_for("/data/x.tar"), LocalBackend)
    assert isinstance(storage.backend_for("relative/x.tar"), LocalBackend)
    assert isinstance(storage.backend_for("s3://bucket/x.tar"), S3Backend)
    assert storage.random_access("/data/x.tar") and not storage.random_access("s3://bucket/x.tar")


def test_an_unknown_scheme_is_one_line():
    with pytest.raises(StorageError, match=r"^gs://bucket/x\.tar: unsupported URL scheme \(supported: local paths, http://, https://, s3://\)$"):
        storage.read_bytes("gs://bucket/x.tar")


@pytest.mark.parametrize(("path", "scheme", "absolute"), [
    ("s3://b/k", "s3", True), ("gs://b/k", "gs", True), ("/d/x", "", True), ("d/x", "", False), ("/d/s3://x", "", True),
])
def test_scheme_and_absolute(path, scheme, absolute):
    assert paths.scheme(path) == scheme
    assert storage.is_url(path) == bool(scheme)
    assert storage.is_absolute(path) == absolute


def test_url_rules_hold_for_any_scheme():
    assert storage.join("gs://b/p/", "x.tar") == "gs://b/p/x.tar"
    assert storage.parent("gs://b/p/x.tar") == "gs://b/p"
    assert storage.basename("gs://b/p/x.tar/") == "x.tar"
    assert storage.relative("gs://b/p/", "gs://b/p/a/x.jpg") == "a/x.jpg"
    assert storage.relative("/d/p", "/d/p/a/x.jpg") == "a/x.jpg"


def test_local_read_range_and_stat(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(bytes(range(256)) * 4)
    assert storage.read_range(str(f), 250, 10) == bytes(range(250, 256)) + bytes(range(4))
    assert storage.read_range(str(f), 1020, 100) == bytes(range(252, 256))  # short only at the end
    info = storage.stat(str(f))
    assert info is not None and (info.name, info.size) == ("x.bin", 1024)
    assert storage.stat(str(tmp_path)) is None and storage.stat(str(tmp_path / "nope")) is None
    with pytest.raises(StorageError, match="nope: file not found"):
        storage.read_range(str(tmp_path / "nope"), 0, 1)


def test_s3_has_no_ranged_reads():
    with pytest.raises(StorageError, match="no ranged reads"):
        storage.read_range("s3://bucket/x.tar", 0, 10)


def test_local_move_publish_remove_tree(tmp_path):
    stage = storage.staging_dir(str(tmp_path / "out"))
    assert stage == str(tmp_path / "out")
    storage.make_dirs(stage)
    (tmp_path / "out" / "a.tmp").write_bytes(b"a")
    storage.publish(str(tmp_path / "out" / "a.tmp"), str(tmp_path / "out" / "a.tar"))
    assert (tmp_path / "out" / "a.tar").read_bytes() == b"a" and not (tmp_path / "out" / "a.tmp").exists()
    storage.move(str(tmp_path / "out" / "a.tar"), str(tmp_path / "out" / "b.tar"))
    assert [i.name for i in storage.list_dir(str(tmp_path / "out"))] == ["b.tar"]
    with pytest.raises(StorageError, match="a.tar: file not found"):
        storage.move(str(tmp_path / "out" / "a.tar"), str(tmp_path / "out" / "c.tar"))
    storage.remove_tree(str(tmp_path / "out"))
    storage.remove_tree(str(tmp_path / "out"))  # a missing tree is fine
    assert not (tmp_path / "out").exists()


def test_local_copy_is_the_file_itself(tmp_path):
    f = tmp_path / "v.mp4"
    f.write_bytes(b"v")
    assert storage.local_copy(str(f), str(tmp_path / "elsewhere")) == str(f)


def test_s3_staging_is_private_and_stable(tmp_path, monkeypatch):
    monkeypatch.setenv("FGDATA_CACHE", str(tmp_path))
    a = storage.staging_dir("s3://bucket/out")
    assert a == storage.staging_dir("s3://bucket/out/") and a.startswith(str(tmp_path / "staging"))
    assert a != storage.staging_dir("s3://bucket/other")
