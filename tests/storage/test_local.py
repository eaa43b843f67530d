"""Local paths: listing, atomic writes, copies, the cache pass-through, the credentials file."""

from __future__ import annotations

import json
import os

import pytest

from fgdata.errors import StorageError
from fgdata.storage import (
    atomic_path,
    download,
    exists,
    fetch_to_cache,
    list_dir,
    list_recursive,
    load_s3_credentials_file,
    make_dirs,
    open_read,
    read_bytes,
    read_text,
    remove,
    size,
    upload,
    write_bytes,
)


def test_list_dir_sorted_direct_children_with_suffix(tmp_path):
    for name in ["b.tar", "A.TAR", "c.txt", "10.tar"]:
        (tmp_path / name).write_bytes(b"x" * len(name))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.tar").write_bytes(b"d")
    names = [i.name for i in list_dir(str(tmp_path))]
    assert names == ["10.tar", "A.TAR", "b.tar", "c.txt"]
    tars = list_dir(str(tmp_path), suffix=".tar")
    assert [i.name for i in tars] == ["10.tar", "A.TAR", "b.tar"]
    assert tars[1].path == str(tmp_path / "A.TAR") and tars[1].size == 5
    rec = list_recursive(str(tmp_path))
    assert [i.path for i in rec] == sorted(i.path for i in rec)
    assert str(tmp_path / "sub" / "deep.tar") in [i.path for i in rec]


def test_list_missing_directory(tmp_path):
    with pytest.raises(StorageError, match="nope: directory not found"):
        list_dir(str(tmp_path / "nope"))
    with pytest.raises(StorageError, match="nope: directory not found"):
        list_recursive(str(tmp_path / "nope"))


def test_a_file_gone_while_its_folder_is_listed_is_left_out(tmp_path):
    """Another process renames its temporary into place, or removes a file, between the reading of the names and
    the look at each file: the listing is the folder as it is afterwards, not an error about the folder."""
    for name in ["00000.tar", ".00001.tar.fgtmp-0123456789abcdef", "shard_job.json"]:
        (tmp_path / name).write_bytes(b"x")

    def meanwhile() -> None:
        (tmp_path / ".00001.tar.fgtmp-0123456789abcdef").rename(tmp_path / "00001.tar")
        (tmp_path / "shard_job.json").unlink()

    assert [i.name for i in list_dir(str(tmp_path), listed=meanwhile)] == ["00000.tar"]
    assert [i.name for i in list_dir(str(tmp_path))] == ["00000.tar", "00001.tar"]


def test_write_read_round_trip_creates_parents(tmp_path):
    path = str(tmp_path / "a" / "b" / "f.bin")
    write_bytes(path, b"\x00hello")
    assert read_bytes(path) == b"\x00hello"
    assert size(path) == 6 and exists(path)
    write_bytes(path, "é".encode())
    assert read_text(path) == "é"
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["f.bin"]
    remove(path)
    remove(path)  # idempotent
    assert not exists(path)


def test_missing_file_errors_name_the_path(tmp_path):
    missing = str(tmp_path / "missing.bin")
    with pytest.raises(StorageError, match="missing.bin: file not found"):
        read_bytes(missing)
    with pytest.raises(StorageError, match="missing.bin: file not found"):
        size(missing)


def test_atomic_path_leaves_nothing_on_exception(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(str(target)) as tmp:
            assert os.path.dirname(tmp) == str(tmp_path)
            assert os.path.basename(tmp).startswith(".out.bin.tmp-")
            with open(tmp, "wb") as f:
                f.write(b"half")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == ["out.bin"]
    assert target.read_bytes() == b"old"
    with atomic_path(str(target)) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"new")
        assert target.read_bytes() == b"old"  # readers still see the old file
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_atomic_path_refuses_s3():
    with pytest.raises(StorageError, match="local paths only"):
        with atomic_path("s3://bucket/x"):
            pass


def test_local_upload_download_and_cache_pass_through(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    upload(str(src), str(tmp_path / "up" / "copy.bin"))
    download(str(tmp_path / "up" / "copy.bin"), str(tmp_path / "down.bin"))
    assert (tmp_path / "down.bin").read_bytes() == b"payload"
    assert fetch_to_cache(str(src)) == str(src)
    make_dirs(str(tmp_path / "x" / "y"))
    make_dirs("s3://bucket/ignored")
    assert (tmp_path / "x" / "y").is_dir()


def test_open_read_local(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    with open_read(str(tmp_path / "f")) as f:
        assert f.read() == b"abc"


def test_credentials_file_fills_only_unset_variables(tmp_path, monkeypatch):
    for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION",
                "S3_ENDPOINT_URL", "AWS_ENDPOINT_URL"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    creds = tmp_path / "s3.json"
    creds.write_text(json.dumps({
        "aws_access_key_id": "from-file", "aws_secret_access_key": "file-secret-xyz",
        "region_name": "eu-west-1", "endpoint_url": "http://127.0.0.1:9",
    }))
    load_s3_credentials_file(str(creds))
    assert os.environ["AWS_ACCESS_KEY_ID"] == "from-env"
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == "file-secret-xyz"
    assert os.environ["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert os.environ["S3_ENDPOINT_URL"] == "http://127.0.0.1:9"
    load_s3_credentials_file(str(tmp_path / "absent.json"))  # optional file


def test_bad_credentials_file_does_not_echo_contents(tmp_path):
    bad = tmp_path / "s3.json"
    bad.write_text('{"aws_secret_access_key": "leak-me-not"')
    with pytest.raises(StorageError) as err:
        load_s3_credentials_file(str(bad))
    assert "leak-me-not" not in str(err.value) and str(bad) in str(err.value)
