"""`fgdata prepare` options: one dataclass per job, the resume fingerprint derived from its byte options."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fgdata.errors import FgdataError
from fgdata.jobs.options import byte_options
from fgdata.prepare import Cifar10Options, ImagenetOptions, LatentZipOptions, RunSettings, prepare_imagenet64
from fgdata.prepare.options import Fingerprint

ONE = RunSettings(workers=1)


def test_the_fingerprint_holds_the_byte_options_and_the_facts(tmp_path):
    options = ImagenetOptions(tmp_path, tmp_path / "out", allow_any_tree=True, max_images=7, follow_symlinks=True)
    record = Fingerprint.of(options, dataset="imagenet-64", inputs=7).record(transform="t")
    assert record == {"dataset": "imagenet-64", "inputs": 7, "transform": "t", "max_images": 7, "strict": False,
                      "follow_symlinks": True, "max_pixels": None}  # where to read and write, and --allow-any-tree, change no byte


def test_prepare_options_follow_the_job_cores_rule(tmp_path):
    """Every field changes bytes unless declared RUNTIME: the VAE's device and batch size leave the resume
    fingerprint as it is, its dtype does not, and where to read and write is no option of the record."""
    assert set(byte_options(Cifar10Options(tmp_path, tmp_path / "c.tar.gz", skip_md5=True))) == {"max_images"}
    assert set(byte_options(ImagenetOptions(tmp_path, tmp_path, allow_any_tree=True))) == {
        "max_images", "strict", "follow_symlinks", "max_pixels"}
    latent = Fingerprint.of(LatentZipOptions(), inputs=3).record()
    assert Fingerprint.of(LatentZipOptions(device="cpu", batch_size=5), inputs=3).record() == latent
    assert Fingerprint.of(LatentZipOptions(dtype="bfloat16"), inputs=3).record() == {**latent, "dtype": "bfloat16"}


def test_changed_max_images_is_refused_naming_the_flag(imagenet_root, tmp_path):
    prepare_imagenet64(ImagenetOptions(imagenet_root, tmp_path, max_images=4), ONE)
    with pytest.raises(FgdataError) as info:
        prepare_imagenet64(ImagenetOptions(imagenet_root, tmp_path, max_images=5), ONE)
    message = str(info.value)
    assert "an earlier run wrote it with other options (--max-images was 4, now 5)" in message
    assert "inputs" not in message and "--no-resume" in message


def test_changed_follow_symlinks_is_refused_naming_the_flag(imagenet_root, tmp_path):
    prepare_imagenet64(ImagenetOptions(imagenet_root, tmp_path, max_images=2), ONE)
    with pytest.raises(FgdataError, match=r"\(--follow-symlinks was False, now True\)"):
        prepare_imagenet64(ImagenetOptions(imagenet_root, tmp_path, max_images=2, follow_symlinks=True), ONE)


def test_a_source_that_changed_is_refused_as_other_inputs(imagenet_root, tmp_path):
    root = shutil.copytree(imagenet_root, tmp_path / "imagenet")
    options = ImagenetOptions(root, tmp_path / "out")
    prepare_imagenet64(options, ONE)
    wnid = root / "ILSVRC" / "Data" / "CLS-LOC" / "train" / "n01440764"
    shutil.copy(wnid / "a.JPEG", wnid / "z.JPEG")
    with pytest.raises(FgdataError, match=r"an earlier run wrote it from other inputs \(inputs was 10, now 11\)"):
        prepare_imagenet64(options, ONE)


def test_zips_of_earlier_versions_stay_complete(imagenet_root, tmp_path):
    """Earlier versions recorded neither --max-images nor an unset --follow-symlinks: such a zip is kept."""
    options = ImagenetOptions(imagenet_root, tmp_path, max_images=None)
    first = prepare_imagenet64(options, ONE)
    for summary in first:
        prov = Path(summary.path + ".provenance.json")
        info = json.loads(prov.read_text())
        del info["max_images"], info["follow_symlinks"]
        prov.write_text(json.dumps(info))
    assert all(s.kept for s in prepare_imagenet64(options, ONE))


def test_latent_options_are_checked_in_one_line():
    with pytest.raises(FgdataError, match=r"^--dtype must be float32 or bfloat16, not 'float16'$"):
        LatentZipOptions(dtype="float16")
