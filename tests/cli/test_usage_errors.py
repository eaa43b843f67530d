"""A bad flag value is a usage error everywhere: exit 2 with the flag named, as Typer's own checks, and before any
model loads or anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fgdata.cli.main import app
from fgdata.shards import ShardWriter

#: (command line with {src} {dst} {prompts} {dir} placeholders, the flag the error names)
CASES = [
    ("shard images {dir} {dst} --format gif", "--format"),
    ("shard images {dir} {dst} --engine spark", "--engine"),
    ("shard images {dir} {dst} --maxsize 10XB", "10XB"),
    ("shard videos {dir} {dst} --clip-seconds 0", "--clip-seconds"),
    ("shard videos {dir} {dst} --fps -1", "--fps"),
    ("encode latents {src} {dst} --vae x --kind foo", "--kind"),
    ("encode latents {src} {dst} --vae x --kind video", "--frames"),
    ("encode latents {src} {dst} --vae x --posterior foo", "--posterior"),
    ("encode latents {src} {dst} --vae x --size abc", "--size"),
    ("encode latents {src} {dst} --vae x --batch-size 0", "--batch-size"),
    ("encode latents {src} {dst} --vae x --engine spark", "--engine"),
    ("encode latents {src} {dst} --vae x --dtype float8", "--dtype"),
    ("encode latents {src} {dst} --vae x --save-dtype float8", "--save-dtype"),
    ("encode latents {src} {dst} --vae x --device tpu", "--device"),
    ("encode text {src} {dst} --encoder x --batch-size 0", "--batch-size"),
    ("encode text {src} {dst} --encoder x --padding foo", "--padding"),
    ("encode text {src} {dst} --encoder x --dtype float8", "--dtype"),
    ("encode neg-prompt --encoder x -o {dst}.npy --preset nope", "--preset"),
    ("encode neg-prompt --encoder x -o {dst}.npy", "--preset"),
    ("encode neg-prompt --encoder x -o {dst}.npy --text a --padding foo", "--padding"),
    ("encode neg-prompt --encoder x -o {dst}.npy --text a --dtype foo", "--dtype"),
    ("encode neg-prompt --encoder x -o {dst}.npy --text a --device tpu", "--device"),
    ("kd pairs {dst} --prompts {prompts} --teacher x --steps 0", "--steps"),
    ("kd pairs {dst} --prompts {prompts} --teacher x --steps 4 --latent-shape 1,2", "--latent-shape"),
    ("kd pairs {dst} --prompts {prompts} --teacher x --steps 4 --dtype float8", "--dtype"),
    ("kd paths {dst} --prompts {prompts} --teacher x --steps 4 --record-steps x", "--record-steps"),
    ("kd paths {dst} --prompts {prompts} --teacher x --steps 4 --path-steps 9", "--path-steps"),
    ("fid-refs --dataset-zip {src} -o {dst}.npz --batch-size 0", "--batch-size"),
    ("fid-refs --dataset-zip {src} -o {dst}.npz --chunk-size 0", "--chunk-size"),
    ("fid-refs --dataset-zip {src} -o {dst}.npz --device tpu", "--device"),
    ("fid-refs --dataset-zip {src} -o {dst}.gif", ".npz"),
    ("prepare imagenet-256 --imagenet-source {dir} --data-root {dst} --dtype float16", "--dtype"),
    ("prepare imagenet-256 --imagenet-source {dir} --data-root {dst} --device tpu", "--device"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("usage")
    with ShardWriter(str(root / "shards"), maxcount=4) as w:
        w.write("000000", {"txt": b"a prompt"})
    (root / "prompts.txt").write_text("a prompt\n")
    (root / "media").mkdir()
    return {"src": str(root / "shards"), "prompts": str(root / "prompts.txt"), "dir": str(root / "media")}


@pytest.mark.parametrize(("line", "flag"), CASES, ids=[c[0].split(" --", 1)[0].split(" {")[0] + " " + c[1]
                                                        for c in CASES])
def test_a_bad_flag_value_exits_2_naming_it(line: str, flag: str, places: dict[str, str], tmp_path: Path):
    dst = tmp_path / "out"
    args = line.format(dst=dst, **places).split()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert flag in result.output
    assert not dst.exists()  # refused before anything was written
