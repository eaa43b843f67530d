"""`fgdata prepare` on the job core's rules: shared flags, one lock per output folder, what an earlier run left."""

from __future__ import annotations

import json
import subprocess
import zipfile

from inprocess import fgdata
from job_summary import check_json_summary

from fgdata.jobs.dest import DestLock


def _cli(*args: str, root=None) -> subprocess.CompletedProcess:
    """``fgdata prepare ARGS`` in this process: its output and exit status are what these tests check."""
    return fgdata("prepare", *args, env={"DATA_ROOT_DIR": str(root)} if root else None)


def _cifar(tarball, root, *extra: str) -> subprocess.CompletedProcess:
    return _cli("cifar10", "--source", str(tarball), "--skip-md5", "--data-root", str(root), "--workers", "1",
                "--max-images", "40", *extra)


def test_json_is_one_summary_document(cifar_tarball, tmp_path):
    run = _cifar(cifar_tarball[0], tmp_path, "--json")
    assert run.returncode == 0, run.stderr
    zip_path = tmp_path / "cifar10" / "cifar10-32x32.zip"
    doc = check_json_summary(run.stdout, "prepare cifar10", zip_path.parent)
    assert (doc["seen"], doc["written"], doc["failed"]) == (40, 40, 0) and doc["source"] == str(cifar_tarball[0])
    assert doc["outputs"] == [str(zip_path)] and doc["failures_file"] == str(tmp_path / "cifar10" / "failures.json")
    assert doc["skipped"] is False
    report = json.loads((tmp_path / "cifar10" / "failures.json").read_text())
    assert (report["command"], report["seen"], report["written"], report["failed"]) == ("prepare cifar10", 40, 40, 0)
    again = check_json_summary(_cifar(cifar_tarball[0], tmp_path, "--json").stdout, "prepare cifar10", zip_path.parent)
    assert again["skipped"] is True and again["written"] == 40


def test_quiet_prints_nothing_and_no_resume_says_what_it_removes(cifar_tarball, tmp_path):
    first = _cifar(cifar_tarball[0], tmp_path, "-q")
    assert first.returncode == 0 and first.stdout == "" and first.stderr == ""
    zip_path = tmp_path / "cifar10" / "cifar10-32x32.zip"
    before = zip_path.read_bytes()
    kept = _cifar(cifar_tarball[0], tmp_path)
    assert "kept" in kept.stdout and "cifar10-32x32.zip" in kept.stdout and "--no-resume rebuilds" in kept.stdout
    again = _cifar(cifar_tarball[0], tmp_path, "--no-resume")
    assert again.returncode == 0, again.stderr
    said = " ".join(again.stderr.split())
    assert "--no-resume: removing 2 file(s)" in said and "cifar10-32x32.zip" in said
    assert "wrote" in again.stdout and zip_path.read_bytes() == before


def test_overwrite_replaces_a_zip_made_with_other_options(cifar_tarball, tmp_path):
    assert _cifar(cifar_tarball[0], tmp_path).returncode == 0
    refused = _cli("cifar10", "--source", str(cifar_tarball[0]), "--skip-md5", "--data-root", str(tmp_path),
                   "--workers", "1", "--max-images", "30")
    assert refused.returncode == 1 and "earlier run" in refused.stderr
    again = _cli("cifar10", "--source", str(cifar_tarball[0]), "--skip-md5", "--data-root", str(tmp_path),
                 "--workers", "1", "--max-images", "30", "--overwrite", "--json")
    assert again.returncode == 0, again.stderr
    said = " ".join(again.stderr.split())
    assert "--overwrite: removing 2 file(s)" in said and "cifar10-32x32.zip" in said
    with zipfile.ZipFile(tmp_path / "cifar10" / "cifar10-32x32.zip") as zf:
        assert sum(n.endswith(".png") for n in zf.namelist()) == 30


def test_a_zip_fgdata_did_not_write_is_refused_unless_overwrite(cifar_tarball, tmp_path):
    zip_path = tmp_path / "cifar10" / "cifar10-32x32.zip"
    zip_path.parent.mkdir(parents=True)
    with zipfile.ZipFile(zip_path, "w") as zf:  # e.g. a zip another tool wrote under the canonical name
        zf.writestr("dataset.json", '{"labels": null}')
    foreign = zip_path.read_bytes()
    refused = _cifar(cifar_tarball[0], tmp_path)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    line = " ".join(refused.stderr.split())
    assert "cifar10-32x32.zip: exists and was not written by fgdata" in line and "--overwrite" in line
    assert zip_path.read_bytes() == foreign  # nothing removed
    replaced = _cifar(cifar_tarball[0], tmp_path, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert "--overwrite: removing 1 file(s)" in " ".join(replaced.stderr.split())
    with zipfile.ZipFile(zip_path) as zf:
        assert len(zf.namelist()) == 41


def test_other_options_are_refused_naming_the_option(imagenet_root, tmp_path):
    base = ("imagenet-64", "--imagenet-source", str(imagenet_root), "--data-root", str(tmp_path), "--workers", "1")
    assert _cli(*base, "--max-images", "4").returncode == 0
    refused = _cli(*base, "--max-images", "5")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    line = " ".join(refused.stderr.split())
    assert "an earlier run wrote it with other options (--max-images was 4, now 5)" in line and "--no-resume" in line
    still = _cli(*base, "--max-images", "5", "--json")
    assert still.returncode == 1 and still.stdout == ""  # refused before anything: --json prints no document
    done = _cli(*base, "--max-images", "5", "--no-resume", "--json")
    assert done.returncode == 0, done.stderr
    doc = check_json_summary(done.stdout, "prepare imagenet-64", tmp_path / "imagenet-64")
    assert (doc["seen"], doc["written"], doc["failed"]) == (5, 5, 0) and len(doc["outputs"]) == 2


def test_a_second_job_on_the_same_output_is_refused(cifar_tarball, tmp_path):
    folder = tmp_path / "cifar10"
    with DestLock(str(folder)):  # the lock a running prepare holds
        refused = _cifar(cifar_tarball[0], tmp_path)
    assert refused.returncode == 1 and "another fgdata job is writing here" in " ".join(refused.stderr.split())
    assert not (folder / "cifar10-32x32.zip").exists()
    assert _cifar(cifar_tarball[0], tmp_path).returncode == 0  # free again once the holder is gone


def test_the_data_root_is_shared_so_its_other_files_are_neither_refused_nor_removed(cifar_tarball, tmp_path):
    """A zip's folder holds the downloaded source and whatever else the user keeps there: unlike a shard
    folder, the job calls none of it foreign, and --overwrite replaces only the job's own outputs."""
    import shutil

    from fgdata.prepare import Cifar10Options, RunSettings, prepare_cifar10

    folder = tmp_path / "cifar10"
    folder.mkdir()
    shutil.copy(cifar_tarball[0], folder / "cifar-10-python.tar.gz")  # where a download leaves it
    (folder / "notes.txt").write_text("mine")
    options = Cifar10Options(tmp_path, None, skip_md5=True, max_images=40)
    [first] = prepare_cifar10(options, RunSettings(workers=1))
    said: list[str] = []
    [again] = prepare_cifar10(options, RunSettings(workers=1, overwrite=True, notify=said.append))
    assert (first.written, again.written, again.kept) == (40, 40, False)
    assert (folder / "notes.txt").read_text() == "mine"
    assert (folder / "cifar-10-python.tar.gz").read_bytes() == cifar_tarball[0].read_bytes()
    assert said and all("notes.txt" not in line and "cifar-10-python" not in line for line in said), said
