"""``--where EXPR``: a row filter in a small grammar of its own, never evaluated as Python.

Grammar (keywords in any case)::

    expr    := term ("or" term)*
    term    := factor ("and" factor)*
    factor  := "not" factor | "(" expr ")" | test
    test    := FIELD OP VALUE | VALUE OP FIELD
             | FIELD ["not"] "in" "(" VALUE ("," VALUE)* ")"
             | FIELD "is" ["not"] "null"
    OP      := "=" | "==" | "!=" | "<" | "<=" | ">" | ">="
    VALUE   := a number | 'text' | "text" | true | false
    FIELD   := name ("." name)*   (a name: letters, digits, "_"; or any text in `backquotes`)

A dotted field reaches into an object cell (a JSON object, a Parquet struct): ``meta.score``; a column whose own
name holds a dot is found first.

Semantics are pandas' boolean masks, so a filter written here keeps exactly the rows ``df[mask]`` keeps: a
comparison with a null (or NaN) cell is false, except ``!=``, which is true; ``in`` is ``isin`` (false for null);
``is null`` is ``isna`` (null or NaN); ``not`` negates the result, so ``not (a > 1)`` keeps the rows whose ``a``
is null. ``and``/``or`` combine the results.

A field the rows do not have, or a value of another type than the field's (text against a number column), is a
one-line :class:`~fgdata.errors.OptionError` naming the field and the fields present, raised by :meth:`Where.check`
before any row is used. A later row whose cell has another type than the first row's is refused alone
(:class:`CellTypeError`), never compared as Python would.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, Union

from fgdata.errors import OptionError

#: A field's kind as a row shows it (``None``: not known from the first row, e.g. a null cell).
Kind = Union[str, None]
_OPS = {"=": "==", "==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_KEYWORDS = {"and", "or", "not", "in", "is", "null", "true", "false"}
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<op><=|>=|!=|==|=|<|>|\(|\)|,)
  | (?P<name>(?:[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)(?:\.(?:[A-Za-z0-9_]+|`[^`]+`))*)
""", re.VERBOSE)


class CellTypeError(ValueError):
    """A cell whose type differs from what the expression compares it with (that row is refused)."""


def kind_of(value: Any) -> Kind:
    """``number``, ``text``, ``bool``, ``object``, ``list``; None for a null or NaN cell."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "text"
    return "object" if isinstance(value, Mapping) else "list" if isinstance(value, (list, tuple)) else "other"


def is_null(value: Any) -> bool:
    return kind_of(value) is None


@dataclass(frozen=True)
class _Field:
    parts: tuple[str, ...]

    @property
    def name(self) -> str:
        return ".".join(self.parts)

    def get(self, row: Mapping[str, Any]) -> Any:
        """The cell (None when a level is missing or null: ``a.b`` of a row whose ``a`` is null is null)."""
        if self.name in row:
            return row[self.name]
        value: Any = row
        for part in self.parts:
            if not isinstance(value, Mapping):
                return None
            value = value.get(part)
        return value


@dataclass(frozen=True)
class _Compare:
    field: _Field
    op: str
    value: Any

    def __call__(self, row: Mapping[str, Any]) -> bool:
        cell = self.field.get(row)
        if is_null(cell):
            return self.op == "!="
        _same_kind(self.field, cell, self.value)
        if self.op == "==":
            return bool(cell == self.value)
        if self.op == "!=":
            return bool(cell != self.value)
        if self.op == "<":
            return bool(cell < self.value)
        if self.op == "<=":
            return bool(cell <= self.value)
        if self.op == ">":
            return bool(cell > self.value)
        return bool(cell >= self.value)


@dataclass(frozen=True)
class _In:
    field: _Field
    values: tuple[Any, ...]

    def __call__(self, row: Mapping[str, Any]) -> bool:
        cell = self.field.get(row)
        if is_null(cell):
            return False
        for value in self.values:
            _same_kind(self.field, cell, value)
        return any(cell == v for v in self.values)


@dataclass(frozen=True)
class _IsNull:
    field: _Field

    def __call__(self, row: Mapping[str, Any]) -> bool:
        return is_null(self.field.get(row))


@dataclass(frozen=True)
class _Not:
    inner: Callable[[Mapping[str, Any]], bool]

    def __call__(self, row: Mapping[str, Any]) -> bool:
        return not self.inner(row)


@dataclass(frozen=True)
class _All:
    parts: tuple[Callable[[Mapping[str, Any]], bool], ...]
    either: bool  # "or" when True, "and" when False

    def __call__(self, row: Mapping[str, Any]) -> bool:
        return any(p(row) for p in self.parts) if self.either else all(p(row) for p in self.parts)


def _literal_kind(value: Any) -> str:
    return "bool" if isinstance(value, bool) else "number" if isinstance(value, (int, float)) else "text"


def _same_kind(field: _Field, cell: Any, value: Any) -> None:
    kind = kind_of(cell)
    if kind != _literal_kind(value):
        raise CellTypeError(f"where: field {field.name!r} holds {article(kind)} here, compared with "
                            f"{article(_literal_kind(value))}")


def article(kind: Kind) -> str:
    """A kind as a message names it."""
    return {"number": "a number", "text": "text", "bool": "a boolean", "object": "an object",
            "list": "a list"}.get(kind or "", "a value of another type")


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text[1:-1])


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        at = 0
        while at < len(text):
            m = _TOKEN.match(text, at)
            if not m:
                self.fail(f"unexpected {text[at]!r}", at)
            assert m.lastgroup is not None
            if m.lastgroup != "space":
                kind, value = m.lastgroup, m.group()
                if kind == "name" and value.lower() in _KEYWORDS:
                    kind, value = "keyword", value.lower()
                self.tokens.append((kind, value, at))
            at = m.end()
        self.at = 0

    def fail(self, why: str, where: int | None = None) -> NoReturn:
        if where is None:
            where = self.tokens[self.at][2] if self.at < len(self.tokens) else len(self.text)
        raise OptionError(f"--where: {why} at character {where + 1} of {self.text!r}")

    def peek(self, kind: str, value: str | None = None) -> bool:
        if self.at >= len(self.tokens):
            return False
        k, v, _ = self.tokens[self.at]
        return k == kind and (value is None or v == value)

    def take(self, kind: str, value: str | None = None) -> str:
        if not self.peek(kind, value):
            found = repr(self.tokens[self.at][1]) if self.at < len(self.tokens) else "the end"
            kind = {"op": "an operator", "name": "a field name"}.get(kind, kind)
            self.fail(f"expected {value or kind}, found {found}")
        self.at += 1
        return self.tokens[self.at - 1][1]

    def parse(self) -> Callable[[Mapping[str, Any]], bool]:
        if not self.tokens:
            self.fail("an empty expression", 0)
        expr = self.expr()
        if self.at < len(self.tokens):
            self.fail(f"unexpected {self.tokens[self.at][1]!r}")
        return expr

    def expr(self) -> Callable[[Mapping[str, Any]], bool]:
        parts = [self.term()]
        while self.peek("keyword", "or"):
            self.at += 1
            parts.append(self.term())
        return parts[0] if len(parts) == 1 else _All(tuple(parts), either=True)

    def term(self) -> Callable[[Mapping[str, Any]], bool]:
        parts = [self.factor()]
        while self.peek("keyword", "and"):
            self.at += 1
            parts.append(self.factor())
        return parts[0] if len(parts) == 1 else _All(tuple(parts), either=False)

    def factor(self) -> Callable[[Mapping[str, Any]], bool]:
        if self.peek("keyword", "not"):
            self.at += 1
            return _Not(self.factor())
        if self.peek("op", "("):
            self.at += 1
            inner = self.expr()
            self.take("op", ")")
            return inner
        return self.test()

    def value(self) -> Any:
        if self.peek("number"):
            text = self.take("number")
            return int(text) if re.fullmatch(r"[-+]?\d+", text) else float(text)
        if self.peek("string"):
            return _unquote(self.take("string"))
        if self.peek("keyword", "true") or self.peek("keyword", "false"):
            return self.take("keyword") == "true"
        self.fail("expected a number, a quoted text, true or false")

    def field(self) -> _Field:
        text = self.take("name")
        parts = re.findall(r"`([^`]+)`|([^.`]+)", text)
        return _Field(tuple(a or b for a, b in parts))

    def test(self) -> Callable[[Mapping[str, Any]], bool]:
        if not self.peek("name"):
            value = self.value()
            op = self.take("op")
            if op not in _OPS:
                self.fail(f"expected a comparison, found {op!r}")
            return _Compare(self.field(), _FLIP[_OPS[op]], value)
        field = self.field()
        if self.peek("keyword", "is"):
            self.at += 1
            negated = self.peek("keyword", "not")
            self.at += negated
            self.take("keyword", "null")
            return _Not(_IsNull(field)) if negated else _IsNull(field)
        negated = self.peek("keyword", "not")
        if negated or self.peek("keyword", "in"):
            self.at += negated
            self.take("keyword", "in")
            self.take("op", "(")
            values = [self.value()]
            while self.peek("op", ","):
                self.at += 1
                values.append(self.value())
            self.take("op", ")")
            test = _In(field, tuple(values))
            return _Not(test) if negated else test
        op = self.tokens[self.at][1] if self.at < len(self.tokens) else ""
        if op not in _OPS:
            self.fail(f"expected a comparison, in or is after {field.name!r}")
        self.at += 1
        if self.peek("name"):
            self.fail("a field compared with a field (compare a field with a value)")
        return _Compare(field, _OPS[op], self.value())


def _tests(node: Any) -> list[Any]:
    if isinstance(node, _Not):
        return _tests(node.inner)
    if isinstance(node, _All):
        return [t for p in node.parts for t in _tests(p)]
    return [node]


class Where:
    """A parsed ``--where`` expression: :meth:`check` it against the fields rows have, then call it on rows."""

    def __init__(self, text: str, flag: str = "--where"):
        self.text = text
        self.flag = flag
        self._test = _Parser(text).parse()

    @property
    def fields(self) -> list[str]:
        """The fields the expression reads, in order of appearance."""
        names = [t.field.name for t in _tests(self._test)]
        return list(dict.fromkeys(names))

    def check(self, kinds: Mapping[str, Kind]) -> None:
        """Refuse a field the rows do not have or a value of another type than the field (``kinds``: each field of
        the first row and its kind), in one line naming the field and the fields present."""
        present = ", ".join(sorted(kinds)) or "none"
        for test in _tests(self._test):
            kind = field_kind(test.field, kinds)
            if kind is False:
                raise OptionError(f"{self.flag}: no field {test.field.name!r} (fields: {present})")
            values: Sequence[Any] = test.values if isinstance(test, _In) else \
                [test.value] if isinstance(test, _Compare) else []
            for value in values:
                if kind is not None and kind != _literal_kind(value):
                    raise OptionError(f"{self.flag}: field {test.field.name!r} holds {article(kind)}, compared with "
                                      f"{article(_literal_kind(value))} {value!r} (fields: {present})")

    def __call__(self, row: Mapping[str, Any]) -> bool:
        """Whether ``row`` passes; :class:`CellTypeError` when a cell's type differs from its value's."""
        return self._test(row)


def field_kind(field: _Field | str, kinds: Mapping[str, Kind]) -> Kind | Literal[False]:
    """The kind of ``field`` given the first row's ``kinds``; False when the rows do not have it (a dotted field
    below an object cell is not known from the first row: None)."""
    parts = field.parts if isinstance(field, _Field) else tuple(field.split("."))
    name = ".".join(parts)
    if name in kinds:
        return kinds[name]
    if parts[0] in kinds and len(parts) > 1 and kinds[parts[0]] in ("object", None):
        return None
    return False


def field_value(name: str, row: Mapping[str, Any]) -> Any:
    """The cell a field name (dotted: inside an object cell) reaches in ``row``; None when absent."""
    return _Field(tuple(name.split("."))).get(row)


def row_kinds(row: Mapping[str, Any]) -> dict[str, Kind]:
    """Each field of a row and its kind."""
    kinds: dict[str, Kind] = {}
    for name, value in row.items():
        kinds[str(name)] = kind_of(value)
    return kinds
