"""How ``fgdata ... --help`` looks: two columns that give the descriptions most of the width.

Typer's own layout puts each option in a six-column table, which at 80 columns squeezes descriptions to
about 20 characters and shows type tags such as ``<bool>`` on flags. These command classes keep Typer's
parsing and completion and only replace the help text and the usage line: arguments in upper case
(``SRC DST``), value options with a short upper-case metavar, flags with none.
"""

from __future__ import annotations

import textwrap
from typing import Any

from typer.core import TyperCommand, TyperGroup

# Typer vendors click from 0.2x on, so click's classes are not imported: parameters and contexts are
# handled by duck typing (``param_type_name``, ``opts``, ``metavar``).

_INDENT = 2
_GAP = 2
_LABEL_MAX = 26  # longer option labels get a line of their own
_MAX_WIDTH = 100
_NBSP = "\u00a0"
_TYPE_NAMES = {"integer": "INTEGER", "integer range": "INTEGER", "text": "TEXT", "int": "INTEGER", "int range": "INTEGER", "float": "NUMBER", "float range": "NUMBER", "str": "TEXT",
               "Path": "PATH", "path": "PATH"}


def _is_argument(param: Any) -> bool:
    return getattr(param, "param_type_name", "") == "argument"


def _upper_arguments(params: list[Any]) -> None:
    """Arguments show and report as their upper-case names (``PATH``), in usage, help and errors; a list
    argument named in the plural reads as one item repeated (``paths`` -> ``PATH...``)."""
    for p in params:
        if _is_argument(p) and p.metavar is None and p.name:
            name = p.name[:-1] if p.nargs != 1 and p.name.endswith("s") and len(p.name) > 2 else p.name
            p.metavar = name.upper()


def _usage_pieces(cmd: Any, ctx: Any) -> list[str]:
    pieces = [cmd.options_metavar] if cmd.options_metavar else []
    for p in cmd.get_params(ctx):
        if _is_argument(p):
            name = p.metavar or (p.name or "").upper()
            name = name + "..." if p.nargs != 1 else name
            pieces.append(name if p.required else f"[{name}]")
    return pieces


def _metavar(param: Any, ctx: Any) -> str:
    """``INTEGER``, ``TEXT``, ``[a|b]`` for value options; empty for flags."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    if param.metavar:
        return str(param.metavar)
    if hasattr(param, "display_type"):  # Typer >= 0.2x: "<int range>", "<str>", "<a|b>"
        label = str(param.display_type(ctx)).strip("<>")
    else:
        choices = getattr(param.type, "choices", None)
        label = "|".join(map(str, choices)) if choices else str(getattr(param.type, "name", "text"))
    if label.startswith("list[") and label.endswith("]"):  # a repeatable option: its item type
        label = label[5:-1]
    if "|" in label:
        return f"[{label}]"
    return _TYPE_NAMES.get(label, label.upper())


def _notes(param: Any) -> str:
    """``[default: 4; at least 1]``-style notes after a description."""
    notes = []
    lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    if lo is not None and hi is not None:
        notes.append(f"{lo} to {hi}")
    elif lo is not None:
        notes.append(f"at least {lo}")
    elif hi is not None:
        notes.append(f"at most {hi}")
    default = param.default
    if param.required:
        notes.insert(0, "required")
    elif param.show_default and default is not None and not callable(default):
        if isinstance(default, bool):
            if param.secondary_opts:  # --write/--no-write: name the side that is on by default
                notes.insert(0, f"default: {param.opts[-1] if default else param.secondary_opts[0]}")
        elif default != "" and not (isinstance(default, (list, tuple)) and not default):
            notes.insert(0, f"default: {default}")
    # no-break spaces keep a note on one line when the description wraps
    return f"[{'; '.join(notes)}]".replace(" ", _NBSP) if notes else ""


def _option_row(param: Any, ctx: Any) -> tuple[str, str]:
    short = [o for o in param.opts if not o.startswith("--")]
    long = [o for o in param.opts if o.startswith("--")]
    label = ", ".join(short + long)
    if param.secondary_opts:
        label += " / " + ", ".join(param.secondary_opts)
    metavar = _metavar(param, ctx)
    if metavar:
        label += f" {metavar}"
    return label, " ".join(x for x in ((param.help or "").strip(), _notes(param)) if x)


def _argument_row(param: Any) -> tuple[str, str]:
    help_text = getattr(param, "help", None) or ""
    notes = _notes(param) if not param.required else ""
    return param.metavar or (param.name or "").upper(), " ".join(x for x in (help_text.strip(), notes) if x)


def _paragraphs(text: str) -> list[tuple[bool, str]]:
    """(keep_lines, text) per paragraph: prose is re-flowed, examples and ``\\b`` blocks keep their lines."""
    out = []
    for para in textwrap.dedent(text).strip().split("\n\n"):
        keep = para.startswith(("\b", "Example"))
        para = para.removeprefix("\b").strip("\n")
        out.append((keep, para if keep else " ".join(line.strip() for line in para.splitlines())))
    return out


def _console():
    from rich.console import Console

    console = Console(highlight=False)
    console.width = min(console.width, _MAX_WIDTH)
    return console


def _styled(line: str, style: str = "") -> Any:
    from rich.text import Text

    text = Text(line.replace(_NBSP, " "), style=style)
    text.highlight_regex(r"(?<![\w-])--?[a-zA-Z][\w-]*", "bold cyan")
    text.highlight_regex(r"\[(default|required|at least|at most|\d+ to )[^\]]*\]", "dim")
    return text


def _two_columns(console: Any, rows: list[tuple[str, str]]) -> None:
    width = console.width
    col = min(max((len(label) for label, _ in rows), default=0), _LABEL_MAX)
    text_width = max(width - _INDENT - col - _GAP, 30)
    pad = " " * (_INDENT + col + _GAP)
    for label, desc in rows:
        lines = textwrap.wrap(desc, text_width, break_on_hyphens=False, break_long_words=False) or [""]
        if len(label) > col:
            console.print(_styled(" " * _INDENT + label), soft_wrap=True)
            first = pad + lines[0]
        else:
            first = " " * _INDENT + label.ljust(col) + " " * _GAP + lines[0]
        console.print(_styled(first.rstrip()), soft_wrap=True)
        for line in lines[1:]:
            console.print(_styled(pad + line), soft_wrap=True)


def _print_text(console: Any, text: str) -> None:
    width = console.width - _INDENT
    for keep, para in _paragraphs(text):
        lines = para.splitlines() if keep else [para]
        for line in lines:
            for part in textwrap.wrap(line, width, break_on_hyphens=False, break_long_words=False,
                                      subsequent_indent="    " if keep else ""):
                console.print(" " * _INDENT + part, soft_wrap=True)
        console.print()


def format_help(cmd: Any, ctx: Any) -> None:
    """Usage, description, arguments, options and (for groups) commands, at the terminal's width."""
    console = _console()
    console.print(_styled(f"Usage: {ctx.command_path} {' '.join(cmd.collect_usage_pieces(ctx))}".rstrip(), "bold"),
                  soft_wrap=True)
    console.print()
    if cmd.help:
        _print_text(console, cmd.help)
    params = [p for p in cmd.get_params(ctx) if not getattr(p, "hidden", False)]
    arguments = [_argument_row(p) for p in params if _is_argument(p) and getattr(p, "help", None)]
    options = [_option_row(p, ctx) for p in params if not _is_argument(p)]
    for title, rows in (("Arguments", arguments), ("Options", options)):
        if rows:
            console.print(f"[bold]{title}[/]")
            _two_columns(console, rows)
            console.print()
    if isinstance(cmd, TyperGroup):
        rows = []
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                first = _paragraphs(sub.help or "")[0][1] if sub.help else ""
                rows.append((name, first.splitlines()[0] if first else ""))
        if rows:
            console.print("[bold]Commands[/]")
            _two_columns(console, rows)
            console.print()
    if cmd.epilog:
        _print_text(console, cmd.epilog)


class FgdataCommand(TyperCommand):
    """A Typer command with fgdata's help layout."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _upper_arguments(self.params)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage_pieces(self, ctx)

    def invoke(self, ctx: Any) -> Any:
        """Run the command; a bad option value the library refuses (``OptionError``) is a usage error, exit 2."""
        import typer

        from fgdata.errors import OptionError

        try:
            return super().invoke(ctx)
        except OptionError as exc:
            raise typer.BadParameter(str(exc), ctx=ctx) from None

    def format_help(self, ctx: Any, formatter: Any) -> None:
        format_help(self, ctx)


class FgdataGroup(TyperGroup):
    """A Typer group with fgdata's help layout."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _upper_arguments(self.params)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        format_help(self, ctx)


def use_fgdata_help(app: Any) -> None:
    """Give every command and group of a Typer app (recursively) the classes above."""
    app.info.cls = FgdataGroup
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):  # a command that chose its own class keeps it
            info.cls = FgdataCommand
    for group in app.registered_groups:
        group.cls = FgdataGroup
        use_fgdata_help(group.typer_instance)
