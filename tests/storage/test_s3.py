"""s3:// paths against a real S3 server (moto on loopback) through the real s5cmd binary."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from fgdata.errors import StorageError
from fgdata.storage import (
    download,
    exists,
    fetch_to_cache,
    list_dir,
    list_recursive,
    open_read,
    read_bytes,
    read_text,
    remove,
    size,
    upload,
    write_bytes,
)


def test_list_dir_and_recursive(s3_bucket):
    for key in ["p/b.tar", "p/A.TAR", "p/10.tar", "p/c.txt", "p/sub/deep.tar", "p2/other.tar", "top.tar"]:
        write_bytes(f"{s3_bucket}/{key}", key.encode())
    direct = list_dir(f"{s3_bucket}/p")
    assert [i.name for i in direct] == ["10.tar", "A.TAR", "b.tar", "c.txt"]
    assert direct[0].path == f"{s3_bucket}/p/10.tar" and direct[0].size == len("p/10.tar")
    assert list_dir(f"{s3_bucket}/p/") == direct
    assert [i.name for i in list_dir(f"{s3_bucket}/p", suffix=".tar")] == ["10.tar", "A.TAR", "b.tar"]
    assert [i.name for i in list_dir(s3_bucket)] == ["top.tar"]
    rec = list_recursive(f"{s3_bucket}/p")
    assert [i.path for i in rec] == [
        f"{s3_bucket}/p/10.tar", f"{s3_bucket}/p/A.TAR", f"{s3_bucket}/p/b.tar",
        f"{s3_bucket}/p/c.txt", f"{s3_bucket}/p/sub/deep.tar",
    ]
    assert rec[-1].name == "deep.tar"
    assert list_dir(f"{s3_bucket}/empty") == []


def test_listing_a_missing_bucket_is_an_error(s3_endpoint):
    with pytest.raises(StorageError, match=r"s3://fgtest-no-such-bucket/: bucket not found"):
        list_dir("s3://fgtest-no-such-bucket")


def test_write_read_exists_size_remove(s3_bucket):
    url = f"{s3_bucket}/dir/file.json"
    assert not exists(url)
    write_bytes(url, b'{"a": 1}')
    assert read_bytes(url) == b'{"a": 1}'
    assert read_text(url) == '{"a": 1}'
    assert exists(url) and exists(f"{s3_bucket}/dir") and exists(f"{s3_bucket}/dir/") and exists(s3_bucket)
    assert not exists(f"{s3_bucket}/dir/file.json/")
    assert not exists(f"{s3_bucket}/dir/file.js")  # a key prefix is not the object
    assert size(url) == 8
    remove(url)
    remove(url)  # idempotent
    assert not exists(url)


def test_cat_streams_a_multi_mb_object(s3_bucket, tmp_path):
    data = os.urandom(6 * 1024 * 1024 + 123)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    url = f"{s3_bucket}/big.bin"
    upload(str(src), url)
    digest = hashlib.sha256()
    total = 0
    with open_read(url) as f:
        while chunk := f.read(256 * 1024):
            digest.update(chunk)
            total += len(chunk)
    assert total == len(data)
    assert digest.digest() == hashlib.sha256(data).digest()
    # Stopping early is deliberate, not a failure: the process is killed quietly.
    with open_read(url) as f:
        assert f.read(1000) == data[:1000]


def test_upload_download(s3_bucket, tmp_path):
    src = tmp_path / "in.bin"
    src.write_bytes(b"\x01" * 5000)
    url = f"{s3_bucket}/x/in.bin"
    upload(str(src), url)
    dest = tmp_path / "out" / "copy.bin"
    download(url, str(dest))
    assert dest.read_bytes() == src.read_bytes()
    assert os.listdir(dest.parent) == ["copy.bin"]
    with pytest.raises(StorageError, match="nothing.bin: file not found"):
        upload(str(tmp_path / "nothing.bin"), url)


def test_missing_object_names_the_url(s3_bucket, tmp_path):
    url = f"{s3_bucket}/nope.tar"
    for call in (lambda: read_bytes(url), lambda: size(url), lambda: fetch_to_cache(url, str(tmp_path))):
        with pytest.raises(StorageError, match=f"^{url}: object not found$"):
            call()
    with pytest.raises(StorageError, match=f"^{url}: object not found$"):
        with open_read(url) as f:
            f.read()
    with pytest.raises(StorageError, match=f"^{url}: object not found$"):
        download(url, str(tmp_path / "d" / "nope.tar"))
    assert os.listdir(tmp_path / "d") == []


def test_weird_keys_are_plain_names(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pwned_before = os.path.exists("/tmp/pwned")
    keys = ["a b;$(touch /tmp/pwned).tar", "q'uo\"te `touch pwned2`.tar", "-r.tar", "c*d?.tar"]
    for i, key in enumerate(keys):
        write_bytes(f"{s3_bucket}/w/{key}", bytes([i]) * 10)
    # The first key holds slashes, so it sits two "directories" down.
    assert [i.path for i in list_recursive(f"{s3_bucket}/w")] == sorted(f"{s3_bucket}/w/{k}" for k in keys)
    assert [i.name for i in list_dir(f"{s3_bucket}/w", suffix=".tar")] == sorted(keys[1:])
    for i, key in enumerate(keys):
        url = f"{s3_bucket}/w/{key}"
        assert read_bytes(url) == bytes([i]) * 10
        assert exists(url) and size(url) == 10
        with open_read(url) as f:
            assert f.read() == bytes([i]) * 10
        download(url, str(tmp_path / "dl" / key))
        assert (tmp_path / "dl" / key).read_bytes() == bytes([i]) * 10
    assert os.path.exists("/tmp/pwned") == pwned_before
    assert not (tmp_path / "pwned2").exists()


def test_fetch_to_cache_downloads_once_and_refreshes_on_size_change(s3_bucket, tmp_path):
    url = f"{s3_bucket}/data/cifar.zip"
    write_bytes(url, b"z" * 1000)
    cache = str(tmp_path / "cache")
    first = fetch_to_cache(url, cache)
    assert first.startswith(cache) and first.endswith("cifar.zip")
    inode = os.stat(first).st_ino
    assert fetch_to_cache(url, cache) == first
    assert os.stat(first).st_ino == inode  # reused, not downloaded again
    write_bytes(url, b"y" * 2000)
    assert fetch_to_cache(url, cache) == first
    with open(first, "rb") as f:
        assert f.read() == b"y" * 2000


def test_fetch_to_cache_default_dir_from_env(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("FGDATA_CACHE", str(tmp_path / "envcache"))
    url = f"{s3_bucket}/k/v.bin"
    write_bytes(url, b"v")
    assert fetch_to_cache(url).startswith(str(tmp_path / "envcache"))


def test_fetch_to_cache_two_processes(s3_bucket, tmp_path):
    data = os.urandom(3 * 1024 * 1024)
    url = f"{s3_bucket}/shared/big.zip"
    write_bytes(url, data)
    cache = str(tmp_path / "cache")
    code = "import sys; from fgdata.storage import fetch_to_cache; print(fetch_to_cache(sys.argv[1], sys.argv[2]))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, url, cache], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1]
    with open(outs[0], "rb") as f:
        assert f.read() == data
    leftovers = [n for n in os.listdir(os.path.dirname(outs[0])) if ".tmp-" in n]
    assert leftovers == []


def test_endpoint_unreachable_is_one_line(s3_endpoint, monkeypatch, closed_port_url):
    monkeypatch.setenv("S3_ENDPOINT_URL", closed_port_url)
    with pytest.raises(StorageError) as err:
        list_dir("s3://fgtest-any/prefix")
    message = str(err.value)
    assert message == f"s3://fgtest-any/prefix/: endpoint unreachable ({closed_port_url})"
    with pytest.raises(StorageError, match="endpoint unreachable"):
        read_bytes("s3://fgtest-any/x.tar")


def test_aws_endpoint_url_is_passed_on(s3_bucket, s3_endpoint, monkeypatch):
    """s5cmd ignores AWS_ENDPOINT_URL; fgdata must pass it as --endpoint-url."""
    write_bytes(f"{s3_bucket}/e.txt", b"e")
    monkeypatch.delenv("S3_ENDPOINT_URL")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    assert read_bytes(f"{s3_bucket}/e.txt") == b"e"


def test_missing_credentials(s3_bucket, no_credentials):
    with pytest.raises(StorageError) as err:
        list_dir(f"{s3_bucket}/p")
    assert str(err.value) == (
        f"{s3_bucket}/p/: no credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
    )


def test_secrets_never_in_error_text(s3_bucket, monkeypatch, closed_port_url, tmp_path):
    secret = "Sup3r-S3cret-Value/xyz"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFGDATATESTKEY")
    messages = []
    for call in (
        lambda: read_bytes(f"{s3_bucket}/missing"),
        lambda: download(f"{s3_bucket}/missing", str(tmp_path / "m")),
        lambda: list_dir("s3://fgtest-no-such-bucket"),
    ):
        with pytest.raises(StorageError) as err:
            call()
        messages.append(str(err.value))
    monkeypatch.setenv("S3_ENDPOINT_URL", closed_port_url)
    with pytest.raises(StorageError) as err:
        read_bytes(f"{s3_bucket}/missing")
    messages.append(str(err.value))
    for message in messages:
        assert secret not in message and "AKIAFGDATATESTKEY" not in message
        assert "\n" not in message


def test_move_remove_tree_local_copy_and_publish(s3_bucket, tmp_path):
    from fgdata import storage

    write_bytes(f"{s3_bucket}/t/a.tar", b"a" * 100)
    write_bytes(f"{s3_bucket}/t/sub/b.tar", b"b")
    storage.move(f"{s3_bucket}/t/a.tar", f"{s3_bucket}/t/c.tar")
    assert [i.name for i in list_recursive(f"{s3_bucket}/t")] == ["c.tar", "b.tar"]
    with pytest.raises(StorageError, match=f"^{s3_bucket}/t/a.tar: object not found$"):
        storage.move(f"{s3_bucket}/t/a.tar", f"{s3_bucket}/t/d.tar")
    local = storage.local_copy(f"{s3_bucket}/t/c.tar", str(tmp_path))
    assert local == str(tmp_path / "c.tar") and (tmp_path / "c.tar").read_bytes() == b"a" * 100
    staged = tmp_path / "staged.tar"
    staged.write_bytes(b"s")
    storage.publish(str(staged), f"{s3_bucket}/t/s.tar")
    assert read_bytes(f"{s3_bucket}/t/s.tar") == b"s" and not staged.exists()
    assert storage.is_dir(f"{s3_bucket}/t") and not storage.is_dir(f"{s3_bucket}/t/c.tar")
    storage.remove_tree(f"{s3_bucket}/t")
    assert list_recursive(f"{s3_bucket}/t") == [] and not storage.is_dir(f"{s3_bucket}/t")
