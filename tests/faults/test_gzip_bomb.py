"""A shard whose ``.txt.gz`` and ``.json.gz`` members inflate to 512 MiB: every reader stays within 300 MB
of its own baseline and says what it refused (a problem, a counted bad sample, or a one-line error).

Each reader runs in its own process, first over a twin shard without the bombs (its baseline: imports,
caches, one pass of the same code), then over the bomb shard; the growth of its peak RSS in between is
what the bombs cost. The bombs are built by streaming zeros through zlib, so the test holds about half a MB of them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from fgdata.shards import ShardWriter

from tests.loaders.conftest import write_images

INFLATED = 512 << 20  # past the 64 MiB text limit, and past MAX_GROWTH: a reader holding one would fail
MAX_GROWTH = 300 << 20

pytestmark = pytest.mark.slow  # each reader twice, each time a fresh process


def _bomb() -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)  # a gzip stream
    block = bytes(1 << 20)
    return b"".join([*(z.compress(block) for _ in range(INFLATED >> 20)), z.flush()])


@pytest.fixture(scope="module")
def shards(tmp_path_factory, sample_images) -> tuple[Path, Path]:
    """(twin, bomb): three image samples with captions and json; in ``bomb`` sample 0's caption is ``txt.gz``
    and sample 1's json is ``json.gz``, both inflating to 512 MiB."""
    root = tmp_path_factory.mktemp("bomb")
    images = root / "images"
    write_images(str(images), sample_images)
    from fgdata.shards import ShardFile

    with ShardFile(str(images / "00000.tar")) as f:
        jpgs = [f.sample(i).members["jpg"] for i in range(3)]
    bomb = _bomb()
    plain = {"txt": b"a caption", "json": json.dumps({"score": 9}).encode()}
    for name, swap in (("twin", False), ("bomb", True)):
        with ShardWriter(str(root / name), maxcount=10) as w:
            for i, jpg in enumerate(jpgs):
                members = {"jpg": jpg, **plain}
                if swap and i == 0:
                    del members["txt"]
                    members["txt.gz"] = bomb
                if swap and i == 1:
                    del members["json"]
                    members["json.gz"] = bomb
                w.write(f"s{i:03d}", members)
    return root / "twin", root / "bomb"


# One reader as a function of the dataset folder; run over the twin (the baseline), then over the bomb.
_CLI = """
def once(ds):
    from fgdata.cli.main import run
    sys.argv = ["fgdata", *[a.replace("DS", ds) for a in ARGS]]
    try:
        run()
    except SystemExit as e:
        return f"exit {e.code}"
"""

_LOADER = """
import torch  # noqa: F401 - imported before the baseline, as a training script has it
def once(ds):
    from fgdata.loaders import ImageWDSLoader, WDSLoader
    cls = {"WDS": WDSLoader, "Image": ImageWDSLoader}[KIND]
    loader = cls(["WDS:" + ds], batch_size=1, num_workers=0, **KW)
    return f"delivered {[k for batch in loader for k in batch['fname']]}"
"""

_ORDERED = {"deterministic": True, "train": False, "partial": True}
_REFUSED = "inflates past the 67,108,864-byte limit"
# reader -> (its body, its parameters, what it must say about the bombs)
READERS = {
    "inspect": (_CLI, {"ARGS": ["inspect", "DS/00000.tar", "--json"]}, [_REFUSED + "; not loaded"] * 2),
    "verify": (_CLI, {"ARGS": ["verify", "DS", "--decode", "--json"]},
               [".txt.gz " + _REFUSED, ".json.gz " + _REFUSED, '"gzip-too-large": 2', "exit 1"]),
    "report": (_CLI, {"ARGS": ["report", "DS", "--json", "-o", "DS.html"]}, ["s001.json.gz: .json.gz " + _REFUSED, "exit 1"]),
    # Deterministic: each position of a refused sample is filled by the next usable one (the drop rule).
    "wds-deterministic": (_LOADER, {"KIND": "WDS", "KW": {**_ORDERED, "key_map": {"condition": "txt", "meta": "json"}}},
                          ["delivered ['s002', 's002', 's002']"]),
    "wds-streaming-score-filter": (_LOADER, {"KIND": "WDS", "KW": {"train": False, "key_map": {"condition": "txt"},
                                                                   "presets_filter": {"score": {"threshold": 1}}}},
                                   ["delivered ['s002']"]),
    "image-loader": (_LOADER, {"KIND": "Image", "KW": {**_ORDERED, "input_res": 32, "key_map": {"real": "jpg", "condition": "txt"}}},
                     ["delivered ['s001', 's001', 's002']"]),
}

_MEASURE = """
import logging, resource, sys, warnings
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
{params}
{body}
once({twin!r})
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    outcome = once({bomb!r})
except Exception as exc:
    outcome = f"raised {{type(exc).__name__}}: {{str(exc).splitlines()[0]}}"
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("GROWTH", (peak - base) * 1024, outcome, file=sys.stderr)
"""


@pytest.mark.parametrize("reader", sorted(READERS))
def test_gzip_bomb_stays_bounded_in_every_reader(shards, reader):
    twin, bomb = shards
    body, params, said = READERS[reader]
    script = _MEASURE.format(params="".join(f"{k} = {v!r}\n" for k, v in params.items()), body=body,
                             twin=str(twin), bomb=str(bomb))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    line = next((ln for ln in res.stderr.splitlines() if ln.startswith("GROWTH")), None)
    assert line is not None, out[-3000:]
    growth = int(line.split()[1])
    assert growth < MAX_GROWTH, f"{reader}: peak RSS grew {growth >> 20} MiB\n{out[-2000:]}"
    for words in said:
        assert out.count(words) >= said.count(words), f"{reader}: {words!r} not said\n{out[-2000:]}"
