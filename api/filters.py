"""Server-side filters as requests give them: query parameters of a fetch, group fetch or
stream, and the `filter` field of a queue receive's body.

Owns the simple forms (`key=`, `header.NAME=`, `has_header=`; in a body `key`, `headers`,
`has_headers`, `expr`), which compile with an expression into one filter (the language:
node/filters.py), and the 400 a bad filter gets (naming the problem and its position).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from raftline.api.errors import ApiError
from raftline.node.filters import (
    Compare,
    Field,
    FilterError,
    Has,
    Node,
    RecordFilter,
    all_of,
    parse,
)

__all__ = ["RecordFilter", "from_body", "from_query", "invalid_filter"]


def invalid_filter(error: FilterError) -> ApiError:
    return ApiError("invalid_request", str(error), extra={"filter_position": error.position})


def _simple(
    key: Any, headers: Iterable[tuple[str, Any]], present: Iterable[Any], what: str
) -> list[Node]:
    nodes: list[Node] = []
    if key is not None:
        if not isinstance(key, str):
            raise ApiError("invalid_request", f"{what}key must be a string")
        nodes.append(Compare(Field("key"), "==", key))
    for name, value in headers:
        if not name or not isinstance(value, str):
            raise ApiError(
                "invalid_request", f"{what}header {name!r} needs a name and a string value"
            )
        nodes.append(Compare(Field("header", name), "==", value))
    for name in present:
        if not isinstance(name, str) or not name:
            raise ApiError("invalid_request", f"{what}has_header must name a header")
        nodes.append(Has(Field("header", name)))
    return nodes


def _combined(nodes: list[Node], expression: Any) -> RecordFilter | None:
    if expression is not None:
        if not isinstance(expression, str):
            raise ApiError("invalid_request", "filter must be a string expression")
        try:
            nodes.append(parse(expression))
        except FilterError as error:
            raise invalid_filter(error) from None
    return all_of(nodes)


def from_query(query: Mapping[str, str]) -> RecordFilter | None:
    """The filter of a fetch's query string (an aiohttp MultiDict, so repeats count): `key=K`,
    `header.NAME=V` (repeatable with other names), `has_header=NAME` (repeatable) and
    `filter=EXPR`, all of them required at once. None when there is none: the unfiltered path."""
    getall = getattr(query, "getall", None)
    present = getall("has_header", []) if getall is not None else query.get("has_header") or []
    if isinstance(present, str):
        present = [present]
    headers = [(k[len("header.") :], v) for k, v in query.items() if k.startswith("header.")]
    nodes = _simple(query.get("key"), headers, present, "")
    return _combined(nodes, query.get("filter"))


BODY_FIELDS = frozenset({"key", "headers", "has_headers", "expr"})


def from_body(raw: Any) -> RecordFilter | None:
    """The `filter` of a request body: an expression string, or an object of `key`, `headers`
    (name -> value), `has_headers` (names) and `expr`, all required at once."""
    if raw is None:
        return None
    if isinstance(raw, str):
        return _combined([], raw)
    if not isinstance(raw, dict):
        raise ApiError("invalid_request", "filter must be an expression string or an object")
    unknown = sorted(str(k) for k in raw if k not in BODY_FIELDS)
    if unknown:
        raise ApiError(
            "invalid_request",
            f"filter has unknown fields {unknown}; it takes {sorted(BODY_FIELDS)}",
        )
    headers = raw.get("headers") or {}
    present = raw.get("has_headers") or []
    if not isinstance(headers, dict) or not isinstance(present, list):
        raise ApiError("invalid_request", "filter.headers is an object, filter.has_headers a list")
    nodes = _simple(raw.get("key"), headers.items(), present, "filter.")
    return _combined(nodes, raw.get("expr"))
