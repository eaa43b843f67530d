"""The options of ``fgdata prepare``: one frozen dataclass per job, built by the CLI and passed to the library.

Fields marked with :func:`byte_option` change the bytes of a zip; they form the resume fingerprint, so a rerun
with another value is refused naming the real flag (``--max-images was 4, now 5``). The other fields say where
to read and write or how to check the source. Facts about the inputs (the source path, how many images it
yields, its MD5) join the fingerprint beside the options: see :class:`Fingerprint`.

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
from fgdata.jobs.options import check_same, byte_options

PathLike = str | os.PathLike[str]
DTYPES = ("float32", "bfloat16")


def byte_option(default: Any) -> Any:
    """A dataclass field that changes the output bytes: part of the resume fingerprint."""
    return field(default=default, metadata={"bytes": True})


def _byte_fields(options: Any) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(options) if f.metadata.get("bytes")]


@dataclass(frozen=True)
class Cifar10Options:
    """``prepare cifar10``: the tarball (None: the one under the data root, downloaded when absent)."""

    data_root: PathLike | None = None
    source: PathLike | None = None
    skip_md5: bool = False
    max_images: int | None = byte_option(None)


@dataclass(frozen=True)
class ImagenetOptions:
    """``prepare imagenet-64`` and the RGB pass of ``prepare imagenet-256``."""

    imagenet_source: PathLike
    data_root: PathLike | None = None
    allow_any_tree: bool = False
    max_images: int | None = byte_option(None)
    strict: bool = byte_option(False)
    follow_symlinks: bool = byte_option(False)
    max_pixels: int | None = byte_option(None)  # the decompression-bomb limit (None: Pillow's, or FGDATA_MAX_PIXELS)


@dataclass(frozen=True)
class LatentZipOptions:
    """The latent pass of ``prepare imagenet-256``; ``device`` and ``batch_size`` leave the stored moments as they are."""

    vae: str = byte_option("stabilityai/sd-vae-ft-mse")
    dtype: str = byte_option("float32")
    device: str = "auto"
    batch_size: int = 32

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise OptionError(f"--dtype must be {' or '.join(DTYPES)}, not {self.dtype!r}")
        if self.batch_size < 1:
            raise OptionError("--batch-size must be at least 1")
        from fgdata.encode.models import check_device

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
        byte = _byte_fields(options)
        names = {f.name for f in byte}
        record = {k: v for k, v in byte_options(options).items() if k in names}
        return cls(record, facts, {f.name: f.default for f in byte})

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
