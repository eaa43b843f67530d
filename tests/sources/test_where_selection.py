"""``--where`` and ``--keep-top``: the rows kept are exactly those a straightforward pandas filter keeps, on random
tables with nulls, NaN and ties; bad expressions are one-line usage errors."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fgdata.errors import OptionError
from fgdata.workitem import WorkItem
from fgdata.sources.selection import Selection, Selector, kth_largest
from fgdata.sources.where import Where

_FLOATS = st.one_of(st.none(), st.just(float("nan")), st.sampled_from([-1.5, 0.0, -0.0, 0.25, 0.5, 1.0, 3.0]),
                    st.floats(-10, 10, allow_nan=False))
_INTS = st.integers(-3, 3)
_TEXTS = st.one_of(st.none(), st.sampled_from(["a", "b", "bb", "c", "ä", ""]))


@st.composite
def _tables(draw: Any) -> pd.DataFrame:
    n = draw(st.integers(0, 40))
    return pd.DataFrame({"x": pd.Series(draw(st.lists(_FLOATS, min_size=n, max_size=n)), dtype="float64"),
                         "k": pd.Series(draw(st.lists(_INTS, min_size=n, max_size=n)), dtype="int64"),
                         "s": pd.Series(draw(st.lists(_TEXTS, min_size=n, max_size=n)), dtype="object")})


_OPS = {"=": "__eq__", "==": "__eq__", "!=": "__ne__", "<": "__lt__", "<=": "__le__", ">": "__gt__",
        ">=": "__ge__"}


@st.composite
def _expressions(draw: Any, depth: int = 0) -> tuple[str, Any]:
    """An expression as text, and the function that gives pandas' mask for it."""
    shape = draw(st.sampled_from(["cmp", "in", "null", "not", "and", "or"] if depth < 3 else ["cmp", "in", "null"]))
    if shape in ("and", "or"):
        (ta, fa), (tb, fb) = draw(_expressions(depth + 1)), draw(_expressions(depth + 1))
        combine = (lambda a, b: a & b) if shape == "and" else (lambda a, b: a | b)
        return f"({ta}) {shape.upper() if draw(st.booleans()) else shape} ({tb})", \
            lambda df: combine(fa(df), fb(df))
    if shape == "not":
        text, f = draw(_expressions(depth + 1))
        return f"not ({text})", lambda df: ~f(df)
    column = draw(st.sampled_from(["x", "k", "s"]))
    literal = _TEXTS.filter(lambda v: v is not None) if column == "s" else \
        st.sampled_from([-1.5, 0, 0.25, 0.5, 1, 3]) if column == "x" else _INTS

    def show(v: Any) -> str:
        return repr(v) if isinstance(v, str) else str(v)

    if shape == "null":
        negated = draw(st.booleans())
        return f"{column} is {'not ' if negated else ''}null", \
            (lambda df: df[column].notna()) if negated else (lambda df: df[column].isna())
    if shape == "in":
        values = draw(st.lists(literal, min_size=1, max_size=3))
        negated = draw(st.booleans())
        text = f"{column} {'not ' if negated else ''}in ({', '.join(show(v) for v in values)})"
        return text, (lambda df: ~df[column].isin(values)) if negated else (lambda df: df[column].isin(values))
    op = draw(st.sampled_from(sorted(_OPS)))
    value = draw(literal)
    if draw(st.booleans()):  # the value first: "1 < x" is "x > 1"
        flipped = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}.get(op, op)
        return f"{show(value)} {op} {column}", lambda df: getattr(df[column], _OPS[flipped])(value)
    return f"{column} {op} {show(value)}", lambda df: getattr(df[column], _OPS[op])(value)


def _items(df: pd.DataFrame) -> list[WorkItem]:
    """The table's rows as a manifest gives them (a NaN cell is null, as a Parquet manifest reads it)."""
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in df.astype(object).to_dict("records")]
    return [WorkItem(index=i, name=f"img{i}.jpg", path=f"img{i}.jpg", metadata=row) for i, row in enumerate(rows)]


def _selected(df: pd.DataFrame, selection: Selection) -> tuple[list[int], Selector]:
    selector = Selector(selection, ("path", "caption"), text_cells=False)
    items = _items(df)
    selector.plan(items)
    return [i.index for i in selector(items)], selector


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(df=_tables(), expression=_expressions())
def test_where_keeps_what_a_pandas_mask_keeps(df: pd.DataFrame, expression: tuple[str, Any]) -> None:
    text, mask = expression
    expected = list(np.flatnonzero(mask(df).to_numpy(dtype=bool))) if len(df) else []
    kept, selector = _selected(df, Selection(where=text))
    assert kept == expected, text
    assert selector.filtered["where"] == len(df) - len(expected)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(df=_tables(), expression=st.one_of(st.none(), _expressions()),
       fraction=st.sampled_from([0.0, 0.1, 0.29, 0.3, 0.5, 0.7, 0.99, 1.0]), by=st.sampled_from(["x", "k"]))
def test_keep_top_keeps_what_pandas_nlargest_keeps(df: pd.DataFrame, expression: tuple[str, Any] | None,
                                                    fraction: float, by: str) -> None:
    passed = df[expression[1](df)] if expression and len(df) else df
    k = math.floor(Fraction(str(fraction)) * len(passed))
    # nlargest fills up with NaN rows when fewer than k have a value: those never qualify here
    expected = sorted(passed[by].dropna().nlargest(k, keep="first").index) if k else []
    kept, selector = _selected(df, Selection(where=expression[0] if expression else None, keep_top=fraction, by=by))
    assert kept == expected
    assert selector.cut is not None and selector.cut.rows == len(passed)
    assert sum(selector.filtered.values()) == len(df) - len(expected)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(allow_nan=False), min_size=1, max_size=60), data=st.data())
def test_kth_largest_is_exact_over_several_chunks(tmp_path_factory: Any, values: list[float], data: Any,
                                                   monkeypatch_chunk: None) -> None:
    from fgdata.sources.selection import _float_of, _key

    k = data.draw(st.integers(1, len(values)))
    path = tmp_path_factory.mktemp("keys") / "keys.u8"
    path.write_bytes(np.array([_key(v) for v in values], dtype="<u8").tobytes())
    key, ties = kth_largest(str(path), k)
    ordered = sorted((v + 0.0 for v in values), reverse=True)
    assert _float_of(key) == ordered[k - 1]
    assert ties == ordered[:k].count(ordered[k - 1])


@pytest.fixture(scope="module")
def monkeypatch_chunk() -> Any:
    """Read the key file a few values at a time, so the radix rounds cross chunk ends."""
    import fgdata.sources.selection as selection

    chunk, selection.CHUNK = selection.CHUNK, 7
    yield
    selection.CHUNK = chunk


@pytest.mark.parametrize("text", ["", "a >", "a > b", "a === 1", "(a > 1", "a in ()", "a > 1 and", "a ~ 1",
                                  "__import__('os').system('x')", "a > 1; b < 2", "'unclosed = 1"])
def test_bad_expressions_are_one_line_usage_errors(text: str) -> None:
    with pytest.raises(OptionError) as e:
        Where(text)
    message = str(e.value)
    assert message.startswith("--where: ") and "\n" not in message


def test_unknown_fields_and_type_mismatches_name_the_field_and_list_the_fields() -> None:
    kinds = {"path": "text", "score": "number", "tag": "text", "meta": "object"}
    with pytest.raises(OptionError, match=r"no field 'scroe' \(fields: meta, path, score, tag\)"):
        Where("scroe > 1").check(kinds)
    with pytest.raises(OptionError, match=r"field 'tag' holds text, compared with a number 1 \(fields: "):
        Where("score > 1 or tag in ('a', 1)").check(kinds)
    Where("meta.width >= 64 and `score` > 0.5").check(kinds)  # inside an object: known only per row


def test_a_later_cell_of_another_type_refuses_that_row_alone(tmp_path: Path) -> None:
    items = [WorkItem(index=i, name=f"{i}.jpg", path=f"{i}.jpg", metadata={"score": v})
             for i, v in enumerate([1, "high", None, 3])]
    selector = Selector(Selection(where="score >= 2"), ("path", "caption"), text_cells=False)
    out = list(selector(items))
    assert [(i.index, i.refused) for i in out] == [
        (1, "where: field 'score' holds text here, compared with a number"), (3, None)]
    assert selector.filtered == {"where": 2}


def test_keep_top_and_by_go_together_and_the_fraction_is_checked() -> None:
    for selection in (Selection(keep_top=0.3), Selection(by="score"), Selection(keep_top=1.5, by="score")):
        with pytest.raises(OptionError):
            selection.check()
