"""Flag groups: a command takes a few frozen dataclasses of flags instead of one parameter per flag.

A group is a frozen, keyword-only dataclass whose fields are declared with :func:`flag`, from the same
``typer.Option`` object a plain parameter would use as its default::

    @dataclass(frozen=True, kw_only=True)
    class JobFlags:
        resume: bool = flag(RESUME)
        overwrite: bool = flag(OVERWRITE)

    @app.command("copy")
    @flag_groups
    def copy(src: str = typer.Argument(...), *, job: JobFlags, out: OutputFlags) -> None: ...

:func:`flag_groups` shows Typer one keyword parameter per field (default: the field's ``typer.Option``; type:
the field's type), in the order of the groups and of their fields, and calls the function with the values
regrouped into the dataclasses. Parameters that are not groups (the positional ``SRC``/``DST``) pass through
unchanged. Field names become Typer's parameter names, so they must be unique across one command's groups.
Groups shared by several commands are defined once (``fgdata.cli.options``); a command's own flags are one
more group next to them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from typer.models import ParameterInfo

F = TypeVar("F", bound=Callable[..., Any])

_INFO = "fgdata.typer"  # the field metadata key that holds its typer.Option


def flag(info: ParameterInfo) -> Any:
    """A group field declared by a ``typer.Option`` (``resume: bool = flag(RESUME)``).

    The dataclass default is the option's default (a required option, ``typer.Option(...)``, has none), so a
    group can also be built in code and in tests without Typer."""
    default = info.default
    if default is ...:
        return dataclasses.field(metadata={_INFO: info})
    if isinstance(default, (list, dict, set)):  # a repeatable option's empty list: one fresh copy per instance
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={_INFO: info})
    return dataclasses.field(default=default, metadata={_INFO: info})


def _is_group(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


@functools.cache  # the shared groups serve many commands
def _group_fields(cls: type) -> tuple[tuple[str, Any, ParameterInfo], ...]:
    """(name, type, typer.Option) of each field of a group, in declaration order."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        info = f.metadata.get(_INFO)
        if info is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with flag(typer.Option(...))")
        out.append((f.name, hints[f.name], info))
    return tuple(out)


def flag_groups(fn: F) -> F:
    """Let a Typer command take flag groups (see the module's docstring); apply it below ``@app.command``."""
    hints = typing.get_type_hints(fn, include_extras=True)
    groups = {name: hints[name] for name in inspect.signature(fn).parameters if _is_group(hints.get(name))}
    if not groups:
        raise TypeError(f"{fn.__name__} takes no flag group: @flag_groups is not needed")
    params: list[inspect.Parameter] = []
    members: dict[str, tuple[type, list[str]]] = {}  # group parameter -> its class and its fields
    owner: dict[str, str] = {}  # Typer parameter name -> where it comes from, to refuse a name used twice
    for p in inspect.signature(fn).parameters.values():
        if p.name not in groups:
            params.append(p.replace(annotation=hints.get(p.name, p.annotation)))
            owner[p.name] = f"{fn.__name__}'s own parameters"
            continue
        cls = groups[p.name]
        fields = _group_fields(cls)
        for name, kind, info in fields:
            if name in owner:
                raise TypeError(f"{fn.__name__}: flag {name!r} of {cls.__name__} is also in {owner[name]}; "
                                "field names must be unique across a command's groups")
            owner[name] = cls.__name__
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=kind))
        members[p.name] = (cls, [name for name, _, _ in fields])
    grouped = {name for _, names in members.values() for name in names}

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        call = {name: value for name, value in kwargs.items() if name not in grouped}
        for group, (cls, names) in members.items():
            call[group] = cls(**{name: kwargs[name] for name in names})
        return fn(*args, **call)

    # What Typer reads: inspect.signature (this __signature__) and typing.get_type_hints (__annotations__).
    returns = {"return": hints["return"]} if "return" in hints else {}
    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        params, return_annotation=returns.get("return", inspect.Signature.empty))
    command.__annotations__ = {p.name: p.annotation for p in params} | returns
    return typing.cast(F, command)
