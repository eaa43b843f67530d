"""What the byte checks share: every writing command's inputs, its arguments, how it is run, and its files.

Two users: ``test_same_bytes.py`` (each command twice, a second apart, the same tree) and
``benchmarks/compare_outputs.py`` (each command once with a baseline checkout and once with this tree). The inputs
are the repository's sample data plus photos that take every path of the display rule (a Display P3 PNG and JPEG,
an Adobe RGB JPEG, EXIF orientations, 16-bit greyscale and RGB, CMYK, alpha, a palette with transparency, an
animated GIF), tiny random models saved with ``save_pretrained`` and small CIFAR/ImageNet fixtures.

The one field that holds a time on purpose is ``generated`` in ``report``'s page and JSON (docs/FORMATS.md); it is
masked here, nowhere else.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np
from PIL import Image

TESTS = Path(__file__).resolve().parents[1]
for _helpers in (TESTS, TESTS / "faults", TESTS / "fid"):  # display_photos, iccprofile, inprocess; faultkit; fidkit
    if str(_helpers) not in sys.path:
        sys.path.insert(0, str(_helpers))

from display_photos import PHOTOS, jpeg, png, rgb16_png  # noqa: E402
from faultkit import FGDATA  # noqa: E402
from iccprofile import ADOBE_RGB, DISPLAY_P3, rgb_profile  # noqa: E402

GENERATED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")  # report's documented ``generated`` field


class CommandFailed(AssertionError):
    """A command exited with a status it should not have; the message holds the end of its stderr."""


def _conftest(folder: str) -> ModuleType:
    """The helpers of another folder's conftest (tiny models, source trees), loaded under their own name:
    every conftest module is named ``conftest``, so they cannot be imported plainly."""
    spec = importlib.util.spec_from_file_location(f"{folder}_helpers", TESTS / folder / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def photos(folder: Path, sample_data: Path) -> Path:
    """The bundled photos and captions, every display case, and wide-gamut photos big enough to be resized."""
    folder.mkdir(parents=True)
    for p in sample_data.iterdir():
        if p.suffix.lower() in (".jpg", ".png", ".txt") and p.stem != "bigbuckbunny":
            shutil.copyfile(p, folder / p.name)
    for name, make in PHOTOS.items():
        (folder / name).write_bytes(make())
    chelsea = Image.open(sample_data / "chelsea.png").convert("RGB")
    p3 = rgb_profile(DISPLAY_P3, "Display P3 (test)")
    (folder / "cat_p3.png").write_bytes(png(chelsea, icc_profile=p3))
    (folder / "cat_p3.jpg").write_bytes(jpeg(chelsea, icc_profile=p3))
    (folder / "cat_adobe.jpg").write_bytes(jpeg(chelsea.resize((150, 100)), icc_profile=rgb_profile(ADOBE_RGB, "Adobe RGB (test)")))
    for orientation in (3, 8):  # upside down, and turned the other way from PHOTOS' 6
        exif = Image.Exif()
        exif[0x0112] = orientation
        (folder / f"turned{orientation}.jpg").write_bytes(jpeg(chelsea.resize((60, 40)), exif=exif.tobytes()))
    rgb = np.linspace(0, 65535, 12 * 16 * 3).reshape(12, 16, 3).astype(np.uint16)
    (folder / "rgb16.png").write_bytes(rgb16_png(rgb))
    frames = [Image.new("P", (20, 20), i) for i in range(3)]
    for f in frames:
        f.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * 759)
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    (folder / "animated.gif").write_bytes(buf.getvalue())
    return folder


def build_inputs(root: Path, sample_data: Path, sample_video: Path) -> dict[str, Path]:
    """Every command's inputs under ``root``: photos, a clip, prompts, tiny models, source trees, shards."""
    import pickle

    import torch
    from diffusers import DDIMScheduler, UNet2DConditionModel
    from transformers import ByT5Tokenizer, Dinov2Config, Dinov2Model

    encode, prepare, fid = _conftest("encode"), _conftest("prepare"), _conftest("fid")
    out = {"photos": photos(root / "photos", sample_data)}
    (root / "clips").mkdir()
    shutil.copyfile(sample_video, root / "clips" / sample_video.name)
    shutil.copyfile(sample_data / "bigbuckbunny.txt", root / "clips" / "bigbuckbunny.txt")
    out["clips"] = root / "clips"
    out["prompts.txt"] = root / "prompts.txt"
    out["prompts.txt"].write_text("\n".join(p for p in encode.PROMPTS if p) + "\n")
    out["prompt_shards"] = encode.write_shards(
        root / "prompt_shards", [(f"p_{i:03d}", {"txt": p.encode()}) for i, p in enumerate(encode.PROMPTS)], 3)
    images = sorted(p for p in sample_data.iterdir() if p.suffix in (".jpg", ".png"))
    out["image_shards"] = encode.write_shards(
        root / "image_shards", [(f"s_{i:03d}", {p.suffix[1:]: p.read_bytes(), "txt": b"a photo"})
                                for i, p in enumerate(images)], 4)
    torch.manual_seed(0)
    encode.tiny_vae().save_pretrained(root / "vae")
    out["vae"] = root / "vae"
    out["t5"] = encode.tiny_t5(root / "t5")
    teacher = root / "teacher"
    torch.manual_seed(0)
    UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
                         down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                         up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                         attention_head_dim=4, norm_num_groups=8).save_pretrained(teacher / "unet")
    DDIMScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear", clip_sample=False,
                  set_alpha_to_one=False).save_pretrained(teacher / "scheduler")
    encode.tiny_t5(teacher / "text_encoder")
    ByT5Tokenizer().save_pretrained(teacher / "tokenizer")
    encode.tiny_vae().save_pretrained(teacher / "vae")
    (teacher / "model_index.json").write_text(json.dumps({
        "_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
        "scheduler": ["diffusers", "DDIMScheduler"], "text_encoder": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "ByT5Tokenizer"], "vae": ["diffusers", "AutoencoderKL"]}))
    out["teacher"] = teacher
    out["cifar"] = root / "cifar-10-python.tar.gz"
    prepare.build_cifar_tarball(out["cifar"], images, per_batch=20)
    out["imagenet"] = prepare.build_imagenet_tree(root / "imagenet", images)
    torch.manual_seed(0)
    out["detector"] = root / "stand-in.pkl"
    out["detector"].write_bytes(pickle.dumps(fid.TinyNet()))  # the fid tests' stand-in, as a trusted pickle
    out["edm_zip"] = fid.write_edm_zip(root / "edm" / "set-16x16.zip", fid.random_images(9))
    torch.manual_seed(0)
    out["dinov2"] = root / "dinov2"
    Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             patch_size=14, image_size=56)).save_pretrained(out["dinov2"])  # the fid tests' tiny one
    return out


def commands(i: dict[str, Path]) -> dict[str, list[str]]:
    """Each writing command with its arguments; ``{out}`` is its output folder."""
    shard = ["shard", "images", str(i["photos"]), "{out}", "--maxcount", "8", "--workers", "2"]
    zip_args = ["--dataset-zip", str(i["edm_zip"]), "-o", "{out}/refs.npz", "--inception", str(i["detector"]),
                "--trust-pickle", "--device", "cpu", "--chunk-size", "4", "--batch-size", "2", "--workers", "1"]
    kd = ["{out}", "--prompts", str(i["prompt_shards"]), "--teacher", str(i["teacher"]), "--latent-shape", "4,8,8",
          "--steps", "3", "--max-length", "8", "--batch-size", "3"]
    return {
        "shard images": shard,
        "shard images png max-side": [*shard, "--format", "png", "--max-side", "64"],
        "shard images webp": [*shard, "--format", "webp"],
        "shard images keep": [*shard, "--format", "keep"],
        "shard videos": ["shard", "videos", str(i["clips"]), "{out}", "--clip-seconds", "2", "--max-side", "64"],
        "shard videos clips": ["shard", "videos", str(i["clips"]), "{out}", "--clip-seconds", "1"],
        "shard prompts": ["shard", "prompts", str(i["prompts.txt"]), "{out}", "--maxcount", "3"],
        "encode latents": ["encode", "latents", str(i["image_shards"]), "{out}", "--vae", str(i["vae"]),
                           "--size", "32", "--batch-size", "3"],
        "encode text": ["encode", "text", str(i["prompt_shards"]), "{out}", "--encoder", str(i["t5"]),
                        "--max-length", "8"],
        "encode neg-prompt": ["encode", "neg-prompt", "--encoder", str(i["t5"]), "--text", "blurry",
                              "--max-length", "8", "-o", "{out}/neg.npy"],
        "kd pairs": ["kd", "pairs", *kd],
        "kd paths": ["kd", "paths", *kd, "--path-steps", "3"],
        "prepare cifar10": ["prepare", "cifar10", "--source", str(i["cifar"]), "--skip-md5", "--data-root", "{out}",
                            "--workers", "2"],
        "prepare imagenet-64": ["prepare", "imagenet-64", "--imagenet-source", str(i["imagenet"]), "--data-root",
                                "{out}", "--workers", "2"],
        "prepare imagenet-256": ["prepare", "imagenet-256", "--imagenet-source", str(i["imagenet"]), "--data-root",
                                 "{out}", "--workers", "2", "--max-images", "4", "--vae", str(i["vae"]),
                                 "--device", "cpu", "--batch-size", "2"],
        "fid-refs": ["fid-refs", *zip_args],
        "fid-refs edm2 pkl": ["fid-refs", *zip_args[:3], "{out}/refs.pkl", *zip_args[4:], "--dinov2", str(i["dinov2"])],
    }


# Commands that write into a copy of a dataset (``shard images``' output), run from the folder holding the copy and
# naming it "ds" (the report names its dataset as given), with the exit statuses they may end with: report exits 1,
# it lists the sample data's problems.
READING_WRITERS: dict[str, tuple[list[str], tuple[int, ...]]] = {
    "count-shards": (["count-shards", "ds"], (0,)),
    "verify --write-ignore": (["verify", "ds", "--decode", "--write-ignore", "ds/ignore.json",
                               "--counts-output", "ds/counts.json"], (0,)),
    "report": (["report", "ds", "-o", "ds/report.html"], (0, 1)),
    "score": (["score", "ds", "--with", "basic"], (0,)),
    "dedup": (["dedup", "ds", "-o", "ds/dups.json", "--by", "phash"], (0,)),
}


def copy_dataset(source: Path, folder: Path) -> None:
    """``folder/ds``: a copy of the dataset ``source`` without its count file (count-shards writes it again)."""
    shutil.copytree(source, folder / "ds")
    (folder / "ds" / "shard_count.json").unlink()


def _filled(argv: list[str], out: Path | str) -> list[str]:
    """``ARGV --no-progress`` with ``{out}`` filled in."""
    return [*[a.replace("{out}", str(out)) for a in argv], "--no-progress"]


def _check(done: subprocess.CompletedProcess, expect: tuple[int, ...]) -> None:
    if done.returncode not in expect:
        raise CommandFailed(f"exit {done.returncode}: {done.stderr[-3000:]}")


def run(argv: list[str], out: Path | str, tree: Path = TESTS.parent, cwd: Path | None = None,
        expect: tuple[int, ...] = (0,)) -> None:
    """``fgdata ARGV --no-progress`` with ``{out}`` filled in, in a fresh process importing fgdata from ``tree``."""
    _check(subprocess.run([*FGDATA, *_filled(argv, out)], capture_output=True, text=True, timeout=600, cwd=cwd,
                          env=environment(tree)), expect)


def run_here(argv: list[str], out: Path | str, cwd: Path | None = None, expect: tuple[int, ...] = (0,),
             env: dict[str, str] | None = None) -> None:
    """:func:`run` in this process (tests/inprocess.py), with the fgdata this process imported: the other side of
    a comparison with a fresh process, sparing a second interpreter's imports (torch, transformers)."""
    from inprocess import fgdata

    _check(fgdata(*_filled(argv, out), cwd=cwd, env={"HF_HUB_OFFLINE": "1", **(env or {})}), expect)


def run_each_in_one_process(cases: dict[str, tuple[list[str], Path]]) -> dict[str, str | None]:
    """Each case's ``fgdata ARGV --no-progress`` (``{out}`` filled in with its folder), one after another in one
    fresh process that is not this one, through tests/inprocess.py's entry there: the fresh-process side of a
    comparison, paying a new interpreter's imports (torch, transformers) once, not once per command. Returns each
    case's failure (exit status and the end of its stderr), None where it exited 0."""
    results = Path(tempfile.mkdtemp()) / "results.json"
    try:
        done = subprocess.run([sys.executable, __file__, str(results)], capture_output=True, text=True, timeout=1800,
                              input=json.dumps({name: _filled(argv, out) for name, (argv, out) in cases.items()}),
                              env=environment())
        if done.returncode != 0:
            raise CommandFailed(f"exit {done.returncode}: {done.stderr[-3000:]}")
        return json.loads(results.read_text())
    finally:
        shutil.rmtree(results.parent)


def _run_each() -> None:
    """The child of :func:`run_each_in_one_process`: the cases on stdin, the results into the file ``argv[1]``."""
    from inprocess import fgdata

    results: dict[str, str | None] = {}
    for name, argv in json.loads(sys.stdin.read()).items():
        done = fgdata(*argv, env={"HF_HUB_OFFLINE": "1"})
        results[name] = None if done.returncode == 0 else f"exit {done.returncode}: {done.stderr[-3000:]}"
    Path(sys.argv[1]).write_text(json.dumps(results))


def environment(tree: Path = TESTS.parent) -> dict[str, str]:
    """This process's environment, offline, with fgdata imported from ``tree`` and fidkit (the pickled stand-in
    detector's module) from these tests."""
    return {**os.environ, "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(tree), str(TESTS / "fid"), os.environ.get("PYTHONPATH", "")])}


def bytes_of(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (fgdata's records included), by relative path; report's ``generated`` masked, and
    so is the SHA-256 that ``.fgdata/outputs.json`` records of a file holding it, once checked against that file."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name.startswith("report."):
                data = GENERATED.sub("<generated>", data.decode()).encode()
            elif p.name == "outputs.json" and p.parent.name == ".fgdata":
                data = _noted_digests_checked(p)
            out[p.relative_to(root).as_posix()] = data
    return out


def _noted_digests_checked(record: Path) -> bytes:
    """``DST/.fgdata/outputs.json`` with the SHA-256 of each file that holds report's ``generated`` time replaced by
    a mark, after checking that it is the digest of that file as it is on disk."""
    doc = json.loads(record.read_bytes())
    for name, entry in doc["files"].items():
        data = (record.parent.parent / name).read_bytes()
        if entry["sha256"] != hashlib.sha256(data).hexdigest():
            raise AssertionError(f"{record}: {name} is not the file it records")
        if GENERATED.search(data.decode(errors="replace")):
            entry["sha256"] = "<sha256 of a file with a time>"
    return json.dumps(doc, sort_keys=True).encode()


if __name__ == "__main__":
    _run_each()
