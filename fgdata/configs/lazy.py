"""Lazy-call configs: a target plus keyword arguments, edited freely and built on demand.

This mirrors the omegaconf-based ``LazyCall`` that FastGen's configs use, without
depending on omegaconf: presets are shared module-level objects, so ``.copy()`` is a
deep copy (editing a copy's ``key_map`` never alters the preset), attributes are set
by assignment, and :func:`instantiate` passes every key as a keyword argument.
"""

from __future__ import annotations

import copy
import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

TARGET_KEY = "_target_"


class LazyConfig:
    """A callable target and the keyword arguments it will be called with."""

    __slots__ = ("_kwargs", "_target")

    def __init__(self, target: Callable[..., Any] | str, kwargs: dict[str, Any] | None = None):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_kwargs", dict(kwargs or {}))

    # Attribute-style access, as on an omegaconf DictConfig.
    def __getattr__(self, name: str) -> Any:
        if name == TARGET_KEY:
            return self._target
        try:
            return self._kwargs[name]
        except KeyError:
            raise AttributeError(f"{self.target_name} config has no key {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == TARGET_KEY:
            object.__setattr__(self, "_target", value)
        else:
            self._kwargs[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self._kwargs[name]
        except KeyError:
            raise AttributeError(name) from None

    # Mapping-style access.
    def __getitem__(self, name: str) -> Any:
        return self._target if name == TARGET_KEY else self._kwargs[name]

    def __setitem__(self, name: str, value: Any) -> None:
        setattr(self, name, value)

    def __contains__(self, name: object) -> bool:
        return name == TARGET_KEY or name in self._kwargs

    def __iter__(self) -> Iterator[str]:
        return iter(self._kwargs)

    def keys(self) -> list[str]:
        return list(self._kwargs)

    def items(self) -> list[tuple[str, Any]]:
        return list(self._kwargs.items())

    def get(self, name: str, default: Any = None) -> Any:
        return self._kwargs.get(name, default)

    def copy(self) -> LazyConfig:
        """An independent deep copy (omegaconf >= 2.1 semantics)."""
        return LazyConfig(self._target, copy.deepcopy(self._kwargs))

    def __deepcopy__(self, memo: dict) -> LazyConfig:
        return LazyConfig(self._target, copy.deepcopy(self._kwargs, memo))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazyConfig) and self._target == other._target and self._kwargs == other._kwargs

    __hash__ = None  # type: ignore[assignment]  # mutable

    @property
    def target_name(self) -> str:
        t = self._target
        return t if isinstance(t, str) else f"{getattr(t, '__module__', '?')}.{getattr(t, '__qualname__', t)}"

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._kwargs.items())
        return f"LazyCall({self.target_name})({args})"


class LazyCall:
    """``LazyCall(Target)(**kwargs)`` records a call instead of making it."""

    def __init__(self, target: Callable[..., Any] | str):
        if not (callable(target) or isinstance(target, str)):
            raise TypeError(f"LazyCall needs a callable or a dotted name, got {target!r}")
        self._target = target

    def __call__(self, **kwargs: Any) -> LazyConfig:
        return LazyConfig(self._target, kwargs)


def _resolve_target(target: Callable[..., Any] | str) -> Callable[..., Any]:
    if callable(target):
        return target
    module, _, name = target.rpartition(".")
    if not module:
        raise TypeError(f"_target_ {target!r} is not a dotted name")
    return getattr(importlib.import_module(module), name)


def _check_keywords(target: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """Name the unknown key and the class, instead of Python's bare message."""
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    allowed = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        name = getattr(target, "__qualname__", repr(target))
        raise TypeError(
            f"{name} got unexpected config key(s) {', '.join(map(repr, unknown))}; "
            f"remove them or use a loader that accepts them"
        )


def _build(value: Any) -> Any:
    if isinstance(value, LazyConfig):
        return instantiate(value)
    if isinstance(value, dict):
        if TARGET_KEY in value:
            return instantiate(LazyConfig(value[TARGET_KEY], {k: v for k, v in value.items() if k != TARGET_KEY}))
        return {k: _build(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_build(v) for v in value)
    return value


def instantiate(cfg: LazyConfig | dict[str, Any], **overrides: Any) -> Any:
    """Call the config's target with every key as a keyword (nested configs are built first).

    ``overrides`` replace keys for this call only; the config itself is not modified.
    """
    if isinstance(cfg, dict):
        if TARGET_KEY not in cfg:
            raise TypeError("instantiate needs a LazyConfig or a dict with a '_target_' key")
        cfg = LazyConfig(cfg[TARGET_KEY], {k: v for k, v in cfg.items() if k != TARGET_KEY})
    if not isinstance(cfg, LazyConfig):
        raise TypeError(f"instantiate needs a LazyConfig, got {type(cfg).__name__}")
    target = _resolve_target(cfg._target)
    kwargs = {k: _build(copy.deepcopy(v)) for k, v in {**cfg._kwargs, **overrides}.items()}
    _check_keywords(target, kwargs)
    return target(**kwargs)
