"""CLI surface, data-root resolution, Kaggle credential checks, unzip safety, zip64, and the quickstart demo."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from fgdata.errors import FgdataError
from fgdata.prepare.paths import data_root_dir, dataset_zip_paths, s3_data_root_dir
from fgdata.prepare.zipwriter import EdmZipWriter, ZipState, dataset_json_bytes, member_name
from fgdata.sources.imagenet import download_imagenet, kaggle_credentials, unzip


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``fgdata ARGS`` in this process: its output and exit status are what these tests check."""
    from inprocess import fgdata

    return fgdata(*args, env=env)


def test_prepare_list_and_usage_errors():
    listed = _cli("prepare", "--list")
    assert listed.returncode == 0 and "imagenet-64x64-edmv2.zip" in listed.stdout and "--imagenet-source" in listed.stdout
    bare = _cli("prepare")
    assert bare.returncode == 2 and "cifar10, imagenet-64, imagenet-256" in bare.stderr


def test_cli_prepare_cifar10_end_to_end(cifar_tarball, tmp_path):
    run = _cli("prepare", "cifar10", "--source", str(cifar_tarball[0]), "--skip-md5", "--workers", "2",
               env={"DATA_ROOT_DIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    assert "prepare cifar10" in run.stdout and "wrote" in run.stdout and "cifar10-32x32.zip" in run.stdout
    assert [line.split()[-2] for line in run.stdout.splitlines() if "inputs seen" in line or "written" in line] == ["200", "200"]
    with zipfile.ZipFile(tmp_path / "cifar10" / "cifar10-32x32.zip") as zf:
        assert len(zf.namelist()) == 201
    again = _cli("prepare", "cifar10", "--source", str(cifar_tarball[0]), "--skip-md5", "--data-root", str(tmp_path))
    assert again.returncode == 0 and "kept" in again.stdout


def test_roots(monkeypatch, tmp_path):
    monkeypatch.delenv("DATA_ROOT_DIR", raising=False)
    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", "rel-out")
    monkeypatch.chdir(tmp_path)
    assert data_root_dir() == tmp_path / "rel-out" / "DATA"
    monkeypatch.setenv("DATA_ROOT_DIR", str(tmp_path / "d"))
    assert dataset_zip_paths("imagenet-256")[1] == tmp_path / "d" / "imagenet-256" / "imagenet_256_sd.zip"
    monkeypatch.delenv("S3_DATA_ROOT_DIR", raising=False)
    assert s3_data_root_dir() == "s3://data"
    monkeypatch.setenv("S3_DATA_ROOT_DIR", "/local/path")
    with pytest.raises(FgdataError, match="must be an s3:// URL"):
        s3_data_root_dir()


def test_kaggle_credentials_say_what_is_missing(monkeypatch, tmp_path):
    for var in ("KAGGLE_API_TOKEN", "KAGGLE_USERNAME", "KAGGLE_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("KAGGLE_USERNAME", "someone")
    with pytest.raises(FgdataError, match=r"KAGGLE_KEY is missing.*access_token or kaggle.json"):
        kaggle_credentials()
    (tmp_path / "kaggle.json").write_text("{}")
    assert kaggle_credentials().endswith("kaggle.json")


def test_kaggle_failure_is_one_line_without_the_secret(monkeypatch, tmp_path, capfd):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(tmp_path / "kcfg"))
    monkeypatch.delenv("KAGGLE_API_TOKEN", raising=False)
    monkeypatch.setenv("KAGGLE_USERNAME", "someone")
    monkeypatch.setenv("KAGGLE_KEY", "s3cr3t-value-123")
    with pytest.raises(FgdataError, match="failed with exit code") as info:
        download_imagenet(tmp_path / "imagenet")
    out = capfd.readouterr()
    assert "s3cr3t-value-123" not in str(info.value) + out.out + out.err


def test_unzip_refuses_escaping_members_and_resumes(tmp_path):
    good = tmp_path / "good.zip"
    with zipfile.ZipFile(good, "w") as zf:
        zf.writestr("ILSVRC/Data/CLS-LOC/train/n1/a.JPEG", b"x" * 10)
    seen = []
    unzip(good, tmp_path / "out", lambda *a: seen.append(a))
    assert (tmp_path / "out" / "ILSVRC/Data/CLS-LOC/train/n1/a.JPEG").read_bytes() == b"x" * 10
    assert seen[-1] == ("unzip", 10, 10)
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../escape.txt", b"no")
    with pytest.raises(FgdataError, match="escape"):
        unzip(evil, tmp_path / "out2")
    assert not (tmp_path / "escape.txt").exists()


def test_zip64_when_members_exceed_65535(tmp_path):
    writer = EdmZipWriter(tmp_path / "big.zip", ZipState({"t": 1}))
    for i in range(65536):
        writer.add(member_name(i), b"")
    writer.finish(dataset_json_bytes(None))
    data = (tmp_path / "big.zip").read_bytes()
    assert b"PK\x06\x06" in data[-200:]  # zip64 end of central directory record
    with zipfile.ZipFile(tmp_path / "big.zip") as zf:
        names = zf.namelist()
    assert len(names) == 65537 and names[-2] == "00065/img00065535.png" and names[-1] == "dataset.json"


def test_quickstart_demo(tmp_path):
    from fgdata.quickstart import quickstart_demo

    result = quickstart_demo(tmp_path)
    assert result["images"] == 7 and all(Path(p).is_file() for p in result["zips"])
    assert result["batch"] == {"real": [4, 3, 64, 64], "condition": [4, 2], "neg_condition": [4, 2], "idx": [4]}
