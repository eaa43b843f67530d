"""The README's loader snippets run as written (on a real dataset in place of the example path), without a warning."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from fgdata.shards import ShardWriter

README = Path(__file__).resolve().parents[2] / "README.md"
EXAMPLE_TAG = "/data/photos-wds"


def loader_snippets() -> list[str]:
    """The ```python blocks of the README's "### Loaders" section, in order."""
    text = README.read_text()
    section = text[text.index("### Loaders"):]
    section = section[: section.index("\n### ", 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.mark.slow  # end to end, several seconds
def test_readme_loader_snippets_run_without_warnings(tmp_path, sample_images):
    shards = str(tmp_path / "photos-wds")
    with ShardWriter(shards, maxcount=4) as w:
        for n, path in enumerate(sample_images):
            w.write(f"photo_{n:06d}", {path.suffix[1:]: path.read_bytes(), "txt": path.stem.encode()})
    snippets = loader_snippets()
    assert len(snippets) >= 2 and EXAMPLE_TAG in snippets[0]
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for code in snippets:
            exec(compile(code.replace(EXAMPLE_TAG, shards), str(README), "exec"), namespace)  # noqa: S102 - the README's own code
        # the later snippets edit the first one's config: build and read from it as the first does
        batch = next(iter(namespace["instantiate"](namespace["cfg"])))
    assert batch["real_raw"].shape[1:] == (3, 256, 256)
    assert namespace["batch"]["real_raw"].shape[1:] == (3, 256, 256)
