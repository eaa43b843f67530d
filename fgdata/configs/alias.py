"""Opt-in aliases for the reference's module paths, so FastGen-style imports run unchanged.

Nothing is installed on disk: :func:`install_fastgen_alias` registers ``fastgen.*``
module objects in ``sys.modules`` for the current process only, and refuses when a
real FastGen is importable, so it can never shadow one.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

from fgdata.errors import FgdataError


def _module(name: str, package: bool = False, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name, f"fgdata alias for {name}")
    if package:
        mod.__path__ = []
    mod.__dict__.update(attrs)
    return mod


def _class_cond_getattr(name: str) -> Any:
    """``ImageLoader`` imports torch, so the alias resolves it on first access."""
    from fgdata.loaders import image_loader

    return getattr(image_loader, name)


def install_fastgen_alias() -> None:
    """Map ``fastgen.configs.data``, ``fastgen.datasets.wds_dataloaders``, ``fastgen.datasets.class_cond_dataloader``,
    ``fastgen.configs.instantiate`` and ``fastgen.utils.instantiate`` onto fgdata for this process."""
    existing = sys.modules.get("fastgen")
    if existing is not None and getattr(existing, "__fgdata_alias__", False):
        return
    if existing is not None or importlib.util.find_spec("fastgen") is not None:
        raise FgdataError("a real 'fastgen' package is importable; the fgdata alias would shadow it, so it is not installed")
    from fgdata import configs
    from fgdata.configs import data
    from fgdata.loaders import wds

    instantiate_mod: dict[str, Any] = {"LazyCall": configs.LazyCall, "instantiate": configs.instantiate}
    modules = {
        "fastgen": _module("fastgen", True, __fgdata_alias__=True),
        "fastgen.configs": _module("fastgen.configs", True),
        "fastgen.configs.data": data,
        "fastgen.configs.instantiate": _module("fastgen.configs.instantiate", **instantiate_mod),
        "fastgen.datasets": _module("fastgen.datasets", True),
        "fastgen.datasets.wds_dataloaders": wds,
        "fastgen.datasets.class_cond_dataloader": _module("fastgen.datasets.class_cond_dataloader", __getattr__=_class_cond_getattr),
        "fastgen.utils": _module("fastgen.utils", True),
        "fastgen.utils.instantiate": _module("fastgen.utils.instantiate", **instantiate_mod),
    }
    for name, mod in modules.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, mod)
        sys.modules[name] = mod
