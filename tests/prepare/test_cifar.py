"""CIFAR-10: tarball reading, MD5 policy, safe unpickling, download with resume, and the zip against the reference."""

from __future__ import annotations

import hashlib
import http.server
import io
import pickle
import shutil
import tarfile
import threading
import zipfile
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

import edm_reference as ref
from fgdata.errors import FgdataError
from fgdata.cli.prepare import Phases
from fgdata.prepare import Cifar10Options, RunSettings, prepare_cifar10
from fgdata.sources.cifar import CIFAR10_TARBALL, download_cifar10, load_batch, read_cifar10


def phased(run: RunSettings, update) -> RunSettings:
    """``run`` drawing ``update(phase, done, total)`` per pass, as the CLI's bars do."""
    phases = Phases(["convert"], update)
    return replace(run, progress=phases.progress, on_start=phases.on_start)


def test_zip_matches_reference_member_by_member(cifar_tarball, tmp_path):
    tarball, images, labels = cifar_tarball
    [summary] = prepare_cifar10(Cifar10Options(tmp_path, tarball, skip_md5=True), RunSettings(workers=2))
    out = tmp_path / "cifar10" / "cifar10-32x32.zip"
    assert summary.written == 200 and summary.failed == 0
    ref_images, ref_labels = ref.read_cifar(str(tarball))  # the EDM tool's own way of reading the tarball
    assert (ref_images == images).all() and ref_labels == list(labels)
    ref.convert_cifar(ref_images, ref_labels, str(tmp_path / "ref.zip"))
    with zipfile.ZipFile(out) as ours, zipfile.ZipFile(tmp_path / "ref.zip") as theirs:
        assert ours.namelist() == theirs.namelist()
        assert ours.namelist()[-1] == "dataset.json" and ours.namelist()[0] == "00000/img00000000.png"
        assert ours.read("dataset.json") == theirs.read("dataset.json")
        assert ours.read("dataset.json").startswith(b'{"labels": [["00000/img00000000.png", 6], ')
        for info in ours.infolist():
            assert info.compress_type == zipfile.ZIP_STORED and info.date_time == (1980, 1, 1, 0, 0, 0)
        for i, name in enumerate(ours.namelist()[:-1]):
            png = Image.open(io.BytesIO(ours.read(name)))
            assert png.mode == "RGB" and not png.info
            np.testing.assert_array_equal(np.asarray(png), np.asarray(Image.open(io.BytesIO(theirs.read(name)))))
            np.testing.assert_array_equal(np.asarray(png), images[i])
    assert (tmp_path / "cifar10" / "cifar10-32x32.zip.provenance.json").is_file()


def test_rerun_is_skipped_no_resume_rebuilds_identically(cifar_tarball, tmp_path):
    tarball = cifar_tarball[0]
    prepare_cifar10(Cifar10Options(tmp_path, tarball, skip_md5=True), RunSettings(workers=1))
    out = tmp_path / "cifar10" / "cifar10-32x32.zip"
    first = out.read_bytes()
    assert prepare_cifar10(Cifar10Options(tmp_path, tarball, skip_md5=True))[0].kept is True
    prepare_cifar10(Cifar10Options(tmp_path, tarball, skip_md5=True), RunSettings(workers=2, resume=False))
    assert out.read_bytes() == first


def _full_then_stopped(tarball, tmp_path, workers: int) -> bytes:
    """The zip of an uninterrupted run in ``a``; a run in ``b`` stopped after its first block (and unit)."""
    prepare_cifar10(Cifar10Options(tmp_path / "a", tarball, skip_md5=True), RunSettings(workers=workers))

    def interrupt(phase, done, total):
        if done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare_cifar10(Cifar10Options(tmp_path / "b", tarball, skip_md5=True),
                        phased(RunSettings(workers=workers), interrupt))
    return (tmp_path / "a" / "cifar10" / "cifar10-32x32.zip").read_bytes()


def test_interrupted_run_resumes_to_identical_bytes(cifar_tarball, tmp_path):
    tarball = cifar_tarball[0]
    full = _full_then_stopped(tarball, tmp_path, workers=2)
    dest = tmp_path / "b" / "cifar10" / "cifar10-32x32.zip"
    partial = dest.with_name(dest.name + ".partial")
    assert not dest.exists() and partial.exists()
    # Tear the file inside member 120, as a kill during a write would.
    data = partial.read_bytes()
    partial.write_bytes(data[: data.index(b"00000/img00000120.png") + 40])
    [summary] = prepare_cifar10(Cifar10Options(tmp_path / "b", tarball, skip_md5=True), RunSettings(workers=2))
    assert summary.written == 200 and dest.read_bytes() == full and not partial.exists()


def test_an_unfinished_zip_of_fgdata_0_2_is_written_again_from_its_start(cifar_tarball, tmp_path):
    """0.2 kept a side log beside the partial zip and no unit markers: nothing says which members are whole units."""
    tarball = cifar_tarball[0]
    full = _full_then_stopped(tarball, tmp_path, workers=1)
    folder = tmp_path / "b" / "cifar10"
    shutil.rmtree(folder / ".fgdata" / "zips")  # as 0.2 left it: the partial zip and its state, no markers
    (folder / "cifar10-32x32.zip.partial.log").write_text('{"i": 3, "input": "row 3", "mode": "L"}\n')
    started = []
    [summary] = prepare_cifar10(Cifar10Options(tmp_path / "b", tarball, skip_md5=True),
                                RunSettings(workers=1, progress=lambda inputs, _nbytes: started.append(inputs)))
    assert sum(started) == 200 and summary.resumed == 0 and summary.written == 200 and summary.converted == ()
    assert (folder / "cifar10-32x32.zip").read_bytes() == full
    assert sorted(p.name for p in folder.iterdir()) == [".fgdata", "cifar10-32x32.zip",
                                                        "cifar10-32x32.zip.provenance.json", "failures.json"]


def test_md5_mismatch_is_refused_with_a_clear_message(cifar_tarball, tmp_path):
    with pytest.raises(FgdataError, match="does not match the official cifar-10-python.tar.gz.*--skip-md5"):
        prepare_cifar10(Cifar10Options(tmp_path, cifar_tarball[0]))
    assert not (tmp_path / "cifar10" / "cifar10-32x32.zip").exists()


def test_restricted_unpickler_refuses_anything_but_arrays():
    class Evil:
        def __reduce__(self):
            import os
            return (os.getcwd, ())

    with pytest.raises(FgdataError, match="posix.getcwd|os.getcwd"):
        load_batch(pickle.dumps({"data": Evil(), "labels": []}, protocol=2), "evil")


def test_missing_batch_is_reported(tmp_path):
    path = tmp_path / "bad.tar.gz"
    with tarfile.open(path, "w:gz"):
        pass
    with pytest.raises(FgdataError, match="missing member cifar-10-batches-py/data_batch_1"):
        read_cifar10(path, skip_md5=True)


@pytest.mark.timeout(60)  # Python's tarfile never returns on this archive: a hang is the failure
def test_a_crafted_negative_size_is_one_line_not_a_hang(cifar_tarball, tmp_path):
    """A CIFAR-shaped tarball whose second member's size field reads -512: fgdata's scanner calls it damage."""
    import gzip
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shards"))
    from tarcraft import member, raw_header

    with tarfile.open(cifar_tarball[0]) as tar:  # the fixture's real first batch, re-packed by hand
        first = tar.extractfile("cifar-10-batches-py/data_batch_1").read()
    crafted = (member("cifar-10-batches-py/data_batch_1", first)
               + bytes(raw_header(b"cifar-10-batches-py/data_batch_2", b"-0001000")) + bytes(1024))
    path = tmp_path / "crafted.tar.gz"
    path.write_bytes(gzip.compress(crafted, mtime=0))
    with pytest.raises(FgdataError) as info:
        read_cifar10(path, skip_md5=True)
    message = str(info.value)
    assert message.startswith(f"{path}: not a readable tar.gz (bad tar header at byte ") and "\n" not in message
    assert "size field" in message


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    payload = b""
    cut = None  # serve only this many bytes to the first client, then hang up

    def do_GET(self):  # noqa: N802 - http.server's naming
        start = 0
        if "Range" in self.headers:
            start = int(self.headers["Range"].split("=")[1].split("-")[0])
        body = self.payload[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if type(self).cut is not None:
            body, type(self).cut = body[: type(self).cut], None
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_download_resumes_a_partial_file_and_reuses_a_verified_one(cifar_tarball, tmp_path):
    payload = cifar_tarball[0].read_bytes()
    _RangeHandler.payload = payload
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/{CIFAR10_TARBALL}"
    md5 = hashlib.md5(payload).hexdigest()
    try:
        (tmp_path / (CIFAR10_TARBALL + ".part")).write_bytes(payload[:1000])
        seen = []
        path = download_cifar10(tmp_path, url=url, md5=md5, progress=lambda d, t: seen.append((d, t)))
        assert path.read_bytes() == payload and seen[-1] == (len(payload), len(payload))
        assert seen[0][0] > 1000  # continued after the partial bytes
        server.shutdown()
        assert download_cifar10(tmp_path, url=url, md5=md5) == path  # verified file reused, no server needed
    finally:
        server.server_close()


def test_download_offline_fails_fast_with_one_line(tmp_path):
    with pytest.raises(FgdataError, match="download failed.*--source"):
        download_cifar10(tmp_path, url="http://127.0.0.1:9/cifar-10-python.tar.gz", timeout=5)
