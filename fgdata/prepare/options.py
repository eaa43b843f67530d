"""The options of ``fgdata prepare``: one frozen dataclass per job, built by the CLI and passed to the library.

The rule of :mod:`fgdata.jobs.options` holds: every field changes the bytes of a zip unless it is declared
``field(metadata=RUNTIME)`` (where to read and write, how to check the source, the device and batch size of the
VAE). The others form the resume fingerprint, so a rerun with another value is refused naming the real flag
(``--max-images was 4, now 5``). Facts about the inputs (the source path, how many images it yields, its MD5)
join the fingerprint beside the options: see :class:`Fingerprint`.

A zip written before an option was recorded by name counts as written with that option's default, which is
what those versions used whenever they omitted it (``follow_symlinks`` was recorded only when on): the zips of
earlier versions stay complete. One exception: a zip an earlier version wrote with ``--max-images`` does not
say so, and is refused on a rerun with ``--max-images`` until ``--no-resume`` rebuilds it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from fgdata.errors import OptionError
from fgdata.jobs.options import RUNTIME, byte_options, check_same

PathLike = str | os.PathLike[str]
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Cifar10Options:
    """``prepare cifar10``: the tarball (None: the one under the data root, downloaded when absent)."""

    data_root: PathLike | None = field(default=None, metadata=RUNTIME)
    source: PathLike | None = field(default=None, metadata=RUNTIME)  # its path and MD5 are facts of the fingerprint
    skip_md5: bool = field(default=False, metadata=RUNTIME)
    max_images: int | None = None


@dataclass(frozen=True)
class ImagenetOptions:
    """``prepare imagenet-64`` and the RGB pass of ``prepare imagenet-256``."""

    imagenet_source: PathLike = field(metadata=RUNTIME)  # the train folder is a fact of the fingerprint
    data_root: PathLike | None = field(default=None, metadata=RUNTIME)
    allow_any_tree: bool = field(default=False, metadata=RUNTIME)
    max_images: int | None = None
    strict: bool = False
    follow_symlinks: bool = False
    max_pixels: int | None = None  # the decompression-bomb limit (None: Pillow's, or FGDATA_MAX_PIXELS)


@dataclass(frozen=True)
class LatentZipOptions:
    """The latent pass of ``prepare imagenet-256``; ``device`` and ``batch_size`` leave the stored moments as they are."""

    vae: str = "stabilityai/sd-vae-ft-mse"
    dtype: str = "float32"
    device: str = field(default="auto", metadata=RUNTIME)
    batch_size: int = field(default=32, metadata=RUNTIME)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise OptionError(f"--dtype must be {' or '.join(DTYPES)}, not {self.dtype!r}")
        if self.batch_size < 1:
            raise OptionError("--batch-size must be at least 1")
        from fgdata.compute import check_device

        check_device(self.device)


@dataclass(frozen=True)
class Fingerprint:
    """What a rerun must match to keep or resume a zip: the byte options of the command's options dataclass
    and facts about its inputs. A difference in an option is reported by its flag; a difference in the facts
    alone says the inputs changed."""

    options: dict[str, Any]
    facts: dict[str, Any]
    defaults: dict[str, Any]

    @classmethod
    def of(cls, options: Any, **facts: Any) -> Fingerprint:
        record = byte_options(options)
        defaults = {f.name: f.default for f in dataclasses.fields(options)
                    if f.name in record and f.default is not dataclasses.MISSING}
        return cls(record, facts, defaults)

    def record(self, **more: Any) -> dict[str, Any]:
        """The fingerprint as stored in a zip's provenance and a partial zip's state, plus ``more`` facts."""
        return {**self.facts, **more, **self.options}

    def earlier(self, info: dict[str, Any], **more: Any) -> dict[str, Any]:
        """What an earlier run recorded for each key of :meth:`record` (an option it omitted: its default)."""
        return {k: info.get(k, self.defaults.get(k)) for k in self.record(**more)}

    def matches(self, info: dict[str, Any], **more: Any) -> bool:
        return self.earlier(info, **more) == self.record(**more)

    def check(self, where: str, info: dict[str, Any], **more: Any) -> None:
        """Refuse to continue ``where`` when the earlier run's record ``info`` differs, naming the flag."""
        new = self.record(**more)
        check_same(where, self.earlier(info, **more), new, facts=set(new) - set(self.options))
