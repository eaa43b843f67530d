"""ImageNet-style image trees: locate the train split, enumerate images in each tool's order, derive labels.

The EDM and EDM2 tools order files differently (path components vs plain strings); both orders
are produced here from one directory walk so a fused pass can use them when they agree.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePath

from fgdata.errors import FgdataError
from fgdata.sources.folder import link_refusal

KAGGLE_TRAIN = Path("ILSVRC/Data/CLS-LOC/train")
_SYNSET = re.compile(r"n\d{8}")


def _not_synset(train: Path) -> str | None:
    """The first entry of ``train`` that is not a WordNet synset folder (``n01440764``), or None if all are."""
    entries = sorted(e.name for e in os.scandir(train) if not e.name.startswith("."))
    if not entries:
        return "it is empty"
    for name in entries:
        if not (_SYNSET.fullmatch(name) and (train / name).is_dir()):
            return f"{name!r} is not a synset folder like n01440764"
    return None


def resolve_train_dir(source: str | os.PathLike[str], allow_any_tree: bool = False) -> Path:
    """The train folder: the unzipped Kaggle root's ``ILSVRC/Data/CLS-LOC/train``, or that folder itself.

    Either must hold only synset folders (``n01440764``, ...), so a folder of unrelated photos is not
    mistaken for ImageNet and written under ImageNet's canonical zip names. ``allow_any_tree`` takes
    any folder as it is (labels from its top-level folders, or its ``dataset.json``).
    """
    root = Path(source).expanduser()
    if not root.is_dir():
        raise FgdataError(f"{source}: ImageNet source is not a directory")
    train = root / KAGGLE_TRAIN if (root / KAGGLE_TRAIN).is_dir() else root
    if allow_any_tree:
        return train.resolve()
    problem = _not_synset(train)
    if problem:
        raise FgdataError(
            f"{train}: not the ImageNet train tree ({problem}); expected {root / KAGGLE_TRAIN} (or that train "
            "folder) holding synset folders; pass --allow-any-tree to use a custom class-folder tree"
        )
    return train.resolve()


def _image_extensions() -> frozenset[str]:
    from PIL import Image

    Image.init()
    return frozenset(Image.EXTENSION)


def list_images(root: Path) -> list[str]:
    """Relative POSIX paths of every file whose last dot-suffix Pillow knows, unordered."""
    exts = _image_extensions()
    found: list[str] = []
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(root / rel if rel else root) as it:
            for entry in it:
                name = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_dir():
                    stack.append(name)
                elif entry.is_file() and "." + entry.name.split(".")[-1].lower() in exts:
                    found.append(name)
    if not found:
        raise FgdataError(f"{root}: no images found")
    return found


def escaped_links(root: Path, names: list[str]) -> dict[str, str]:
    """``name -> reason`` for the images that are symbolic links, or lie below a linked folder, resolving outside
    ``root`` (:func:`fgdata.sources.folder.link_refusal`); ``--follow-symlinks`` reads them instead."""
    real_root = os.path.realpath(root)
    linked: dict[str, bool] = {"": False}

    def below_link(folder: str) -> bool:
        if folder not in linked:
            parent = folder.rpartition("/")[0]
            linked[folder] = os.path.islink(root / folder) or below_link(parent)
        return linked[folder]

    refused = {}
    for name in names:
        why = link_refusal(str(root / name), real_root, through_link=below_link(name.rpartition("/")[0]))
        if why:
            refused[name] = why
    return refused


def edm_order(names: list[str]) -> list[str]:
    """Path-object order: component by component."""
    return sorted(names, key=lambda n: PurePath(n).parts)


def edm2_order(names: list[str]) -> list[str]:
    """Plain string order of full paths; the common root prefix does not change it."""
    return sorted(names)


def folder_labels(root: Path, names: list[str]) -> dict[str, int]:
    """The folder's ``dataset.json`` if present, else the sorted index of each top-level directory."""
    meta = root / "dataset.json"
    if meta.is_file():
        try:
            data = json.loads(meta.read_text())["labels"]
        except (ValueError, KeyError, TypeError) as exc:
            raise FgdataError(f"{meta}: unreadable labels ({exc})") from None
        if data is not None:
            return {str(name): label for name, label in data}
    tops = {name: (name.split("/")[0] if "/" in name else "") for name in names}
    index = {top: i for i, top in enumerate(sorted(set(tops.values())))}
    if len(index) < 2:
        return {}
    return {name: index[top] for name, top in tops.items()}


KAGGLE_COMPETITION = "imagenet-object-localization-challenge"
_SECRET_VARS = ("KAGGLE_API_TOKEN", "KAGGLE_KEY")


def kaggle_credentials() -> str:
    """Name the credential the Kaggle CLI will use, or say exactly what is missing (never the value)."""
    env = os.environ
    if env.get("KAGGLE_API_TOKEN"):
        return "KAGGLE_API_TOKEN"
    if env.get("KAGGLE_USERNAME") and env.get("KAGGLE_KEY"):
        return "KAGGLE_USERNAME/KAGGLE_KEY"
    config = Path(env.get("KAGGLE_CONFIG_DIR") or Path.home() / ".kaggle")
    for name in ("access_token", "kaggle.json"):
        if (config / name).is_file():
            return str(config / name)
    half = ""
    if env.get("KAGGLE_USERNAME") or env.get("KAGGLE_KEY"):
        half = f" ({'KAGGLE_KEY' if env.get('KAGGLE_USERNAME') else 'KAGGLE_USERNAME'} is missing)"
    raise FgdataError(
        f"no Kaggle credentials: set KAGGLE_API_TOKEN, or KAGGLE_USERNAME and KAGGLE_KEY{half}, "
        f"or put access_token or kaggle.json in {config}"
    )


def _kaggle_command() -> list[str]:
    import importlib.util
    import shutil
    import sys

    exe = Path(sys.executable).with_name("kaggle")
    found = str(exe) if exe.is_file() else shutil.which("kaggle")
    if not found:
        raise FgdataError("the kaggle CLI is not installed: pip install 'fgdata[kaggle]'")
    if exe.is_file() and importlib.util.find_spec("six") is None:
        raise FgdataError("the kaggle package needs 'six', which it does not declare: pip install six")
    return [found]


def download_imagenet(dest: str | os.PathLike[str], progress=None) -> Path:
    """Download the Kaggle ImageNet competition archive into ``dest`` and unzip it there; returns ``dest``.

    The Kaggle CLI runs as a subprocess with an argument list; its output is relayed with any secret
    environment value masked, and success is judged by its exit code.
    """
    import subprocess
    import sys

    from fgdata.children import die_with_parent

    source = kaggle_credentials()
    dest = Path(dest).expanduser().resolve()
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [*_kaggle_command(), "competitions", "download", "-c", KAGGLE_COMPETITION, "-p", str(dest)]
    secrets = [os.environ[v].encode() for v in _SECRET_VARS if os.environ.get(v)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **die_with_parent())
    assert proc.stdout is not None
    while chunk := proc.stdout.read1(4096):  # type: ignore[attr-defined]  # a BufferedReader at run time
        for secret in secrets:
            chunk = chunk.replace(secret, b"***")
        sys.stderr.buffer.write(chunk)
        sys.stderr.flush()
    if proc.wait() != 0:
        raise FgdataError(f"kaggle competitions download -c {KAGGLE_COMPETITION} failed with exit code "
                          f"{proc.returncode} (credentials from {source}); see its output above")
    archive = dest / f"{KAGGLE_COMPETITION}.zip"
    if not archive.is_file():
        raise FgdataError(f"{archive}: the Kaggle CLI finished but the archive is not there")
    unzip(archive, dest, progress)
    return dest


def unzip(archive: Path, dest: Path, progress=None) -> None:
    """Extract with byte progress; members already extracted at full size are kept, so a rerun resumes."""
    import shutil
    import zipfile

    with zipfile.ZipFile(archive) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
        total, done = sum(i.file_size for i in infos), 0
        for info in infos:
            parts = PurePath(info.filename.replace("\\", "/")).parts
            if info.filename.startswith("/") or ".." in parts or (parts and ":" in parts[0]):
                raise FgdataError(f"{archive}: member {info.filename!r} would escape {dest}")
            target = dest.joinpath(*parts)
            if not (target.is_file() and target.stat().st_size == info.file_size):
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(target.name + ".part")
                with zf.open(info) as src, open(tmp, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                os.replace(tmp, target)
            done += info.file_size
            if progress:
                progress("unzip", done, total)
