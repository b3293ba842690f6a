"""The filter language against a reference evaluation: random expressions, written out as text
the way a user would, parse and compile to predicates that agree with a few lines of plain
Python over random records; bad filters are 400s naming the problem and its position."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftline.api.errors import ApiError
from raftline.api.filters import from_body, from_query
from raftline.node.filters import FilterError, compile_filter

KEYS = ["a", "b", "ab", "é", "", None]
NAMES = ["region", "trace", "x-id", "and"]
VALUES = ["eu", "us", "e", "", None]
INTS = [0, 5, 1_700_000_000_000, -1]

Record = dict[str, Any]

records = st.fixed_dictionaries(
    {
        "key": st.sampled_from(KEYS),
        "headers": st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES)), max_size=4),
        "timestamp": st.sampled_from([*INTS, 1_700_000_000_001]),
        "offset": st.integers(0, 10),
    }
)

string_fields = st.one_of(st.just(("key",)), st.sampled_from(NAMES).map(lambda n: ("header", n)))
int_fields = st.sampled_from([("timestamp",), ("offset",)])
ops = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])


def _leaf() -> st.SearchStrategy[tuple[Any, ...]]:
    string_compare = st.tuples(
        st.just("cmp"), string_fields, ops, st.sampled_from(["eu", "a", "", "é"])
    )
    equality = st.sampled_from(["==", "!="])
    null_compare = st.tuples(st.just("cmp"), string_fields, equality, st.none())
    int_compare = st.tuples(st.just("cmp"), int_fields, ops, st.sampled_from(INTS))
    within = st.tuples(
        st.just("in"),
        string_fields,
        st.lists(st.sampled_from(["eu", "us", "a", None]), min_size=1, max_size=3),
        st.booleans(),
    )
    has = st.tuples(st.just("has"), st.sampled_from(NAMES))
    starts = st.tuples(st.just("sw"), string_fields, st.sampled_from(["e", "", "a", "x"]))
    return st.one_of(string_compare, null_compare, int_compare, within, has, starts)


expressions = st.recursive(
    _leaf(),
    lambda inner: st.one_of(
        st.tuples(st.just("not"), inner),
        st.tuples(st.sampled_from(["and", "or"]), inner, inner),
    ),
    max_leaves=8,
)


def _lit(value: str | int | None) -> str:
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    return '"' + value + '"'


def _field(field: tuple[str, ...], bracket: bool) -> str:
    if field[0] != "header":
        return field[0]
    name = field[1]
    return f'headers["{name}"]' if bracket or name == "and" else f"headers.{name}"


def render(tree: tuple[Any, ...], bracket: bool) -> str:
    kind = tree[0]
    if kind == "cmp":
        return f"{_field(tree[1], bracket)} {tree[2]} {_lit(tree[3])}"
    if kind == "in":
        word = "not in" if tree[3] else "in"
        return f"{_field(tree[1], bracket)} {word} ({', '.join(_lit(v) for v in tree[2])})"
    if kind == "has":
        return f"has({_field(('header', tree[1]), bracket)})"
    if kind == "sw":
        return f"starts_with({_field(tree[1], bracket)}, {_lit(tree[2])})"
    if kind == "not":
        return f"not ({render(tree[1], bracket)})"
    return f"({render(tree[1], bracket)}) {kind} ({render(tree[2], bracket)})"


def value_of(field: tuple[str, ...], record: Record) -> Any:
    if field[0] != "header":
        return record[field[0]]
    values = [v for n, v in record["headers"] if n == field[1]]
    return values[-1] if values else None


def reference(tree: tuple[Any, ...], record: Record) -> bool:
    kind = tree[0]
    if kind == "cmp":
        got, op, want = value_of(tree[1], record), tree[2], tree[3]
        if op == "==":
            return got == want
        if op == "!=":
            return got != want
        if got is None:
            return False
        return {"<": got < want, "<=": got <= want, ">": got > want, ">=": got >= want}[op]
    if kind == "in":
        inside = value_of(tree[1], record) in tree[2]
        return not inside if tree[3] else inside
    if kind == "has":
        return any(n == tree[1] for n, _ in record["headers"])
    if kind == "sw":
        got = value_of(tree[1], record)
        return got is not None and got.startswith(tree[2])
    if kind == "not":
        return not reference(tree[1], record)
    if kind == "and":
        return reference(tree[1], record) and reference(tree[2], record)
    return reference(tree[1], record) or reference(tree[2], record)


def run(text: str, record: Record) -> bool:
    headers = [(n, None if v is None else v.encode()) for n, v in record["headers"]]
    key = None if record["key"] is None else record["key"].encode()
    return compile_filter(text).matches(key, headers, record["timestamp"], record["offset"])


@settings(max_examples=300, deadline=None)
@given(expressions, st.lists(records, min_size=1, max_size=8), st.booleans())
def test_compiled_filters_agree_with_the_reference(
    tree: tuple[Any, ...], sample: list[Record], bracket: bool
) -> None:
    text = render(tree, bracket)
    for record in sample:
        assert run(text, record) == reference(tree, record), (text, record)


@settings(max_examples=200, deadline=None)
@given(expressions, st.lists(records, min_size=1, max_size=8))
def test_the_canonical_source_means_what_the_filter_means(
    tree: tuple[Any, ...], sample: list[Record]
) -> None:
    text = render(tree, False)
    source = compile_filter(text).source
    assert compile_filter(source).source == source
    for record in sample:
        assert run(source, record) == run(text, record)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="keyhadrsimtpno.()[]\",=!<> 0123456789\\'_-", max_size=40))
def test_any_text_either_compiles_or_is_a_filter_error(text: str) -> None:
    try:
        compile_filter(text)
    except FilterError as error:
        assert 0 <= error.position <= len(text)


@pytest.mark.parametrize(
    ("text", "record", "expected"),
    [
        ('key == "a" or key == "b" and timestamp > 5', {"key": "a", "timestamp": 0}, True),
        ('not key == "a" and timestamp > 5', {"key": "b", "timestamp": 0}, False),
        ('headers.region != "eu"', {"key": None, "timestamp": 0}, True),  # absent: not "eu"
        ('headers.region < "zz"', {"key": None, "timestamp": 0}, False),  # absent: unordered
        ("key == null", {"key": None, "timestamp": 0}, True),
        ("key in ('a', null)", {"key": None, "timestamp": 0}, True),
    ],
)
def test_precedence_and_null_rules(text: str, record: dict[str, Any], expected: bool) -> None:
    assert run(text, {"headers": [], "offset": 0, **record}) is expected


def test_a_header_named_twice_counts_with_its_last_value() -> None:
    record = {"key": None, "headers": [("h", "1"), ("h", "2")], "timestamp": 0, "offset": 0}
    assert run('headers.h == "2"', record) and not run('headers.h == "1"', record)


@pytest.mark.parametrize(
    ("text", "problem", "position"),
    [
        ("key = 'a'", "'=' is not an operator", 4),
        ("key == 1", "key is a string", 7),
        ("timestamp >= 'x'", "timestamp is an integer", 13),
        ("key == 'a' and", "expected a field", 14),
        ("(key == 'a'", "expected ')'", 11),
        ("region == 'eu'", "expected a field", 0),
        ("key == 'a", "unterminated string", 7),
        ("headers.x > null", "null can only be compared", 12),
        ("has(key)", "has() takes a header", 4),
        ("key == 'a' key", "expected 'and', 'or'", 11),
        ("", "empty filter", 0),
    ],
)
def test_bad_filters_name_the_problem_and_its_position(
    text: str, problem: str, position: int
) -> None:
    with pytest.raises(FilterError) as caught:
        compile_filter(text)
    assert problem in caught.value.problem and caught.value.position == position
    assert str(caught.value).endswith(f"at position {position}")


def test_deep_nesting_and_long_text_are_refused() -> None:
    with pytest.raises(FilterError, match="nested deeper"):
        compile_filter("not " * 40 + "key == 'a'")
    with pytest.raises(FilterError, match="longer than"):
        compile_filter("key == '" + "a" * 5000 + "'")


def test_a_bad_filter_in_a_request_is_a_400_with_its_position() -> None:
    with pytest.raises(ApiError) as caught:
        from_query({"filter": "key == 1"})
    assert caught.value.status == 400 and caught.value.extra["filter_position"] == 7
    with pytest.raises(ApiError, match="at position 0"):
        from_body({"expr": "foo"})


def test_simple_forms_compile_to_the_same_filter_as_the_expression() -> None:
    query = {"key": "k", "header.region": "eu", "has_header": "trace"}
    body = {"key": "k", "headers": {"region": "eu"}, "has_headers": ["trace"]}
    expression = 'key == "k" and headers.region == "eu" and has(headers.trace)'
    simple = from_query(query)
    assert simple is not None
    assert simple.source == from_body(body).source == compile_filter(expression).source  # type: ignore[union-attr]
    assert from_query({}) is None and from_body(None) is None


def test_unknown_fields_of_a_body_filter_are_named() -> None:
    with pytest.raises(Exception, match="unknown fields"):
        from_body({"keys": "a"})
