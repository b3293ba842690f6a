"""The record filter language: which records a fetch, group fetch, queue receive or stream sends.

Owns the language (a tokenizer and a recursive-descent parser of its own: nothing is ever handed
to `eval`), its type checks and its compilation into one predicate per request. The API reads
filters from requests (api/filters.py); queue shard leaders compile the canonical text they are
sent.

The language, over a record's key, headers, timestamp and offset:
    key == "a" and headers.region in ("eu", "us") and timestamp >= 1700000000000
    not has(headers.trace) or starts_with(key, "eu.") or headers["x-id"] != null
Fields: `key` and `headers.NAME` / `headers["NAME"]` are strings (UTF-8 compared as bytes) or
null (no key; a header absent or with a null value); `timestamp` and `offset` are integers.
Comparisons `== != < <= > >=`, `in (...)`, `not in (...)`, `has(headers.NAME)` (present, even
with a null value), `starts_with(FIELD, "prefix")`, `and`, `or`, `not`, parentheses. A null
field equals only `null` (and is `in` a list only when the list holds `null`); an ordering or
`starts_with` test of a null field is false, and `!=` is always `not ==`. A header named twice
counts with its last value (Kafka's lastHeader).

Invariants: a filter's `source` is canonical expression text that compiles to the same
predicate (it travels to partition and queue leaders); parsing is linear in the text and
bounded in length, nesting and list size, so a request cannot make a node work without limit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_FILTER_CHARS = 4_096
MAX_DEPTH = 32
MAX_LIST = 256
STRING_FIELDS = ("key",)
INT_FIELDS = ("timestamp", "offset")
OPERATORS = ("==", "!=", "<=", ">=", "<", ">")
KEYWORDS = frozenset({"and", "or", "not", "in", "null", "has", "starts_with", "headers"})
HEADER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")

Headers = Sequence[Sequence[Any]]  # (name, value) pairs; value bytes or None
Predicate = Callable[[bytes | None, Headers, int, int], bool]  # key, headers, timestamp, offset


class FilterError(ValueError):
    """A filter that does not parse or type-check, naming the problem and its position."""

    def __init__(self, problem: str, position: int) -> None:
        super().__init__(f"filter: {problem} at position {position}")
        self.problem = problem
        self.position = position


# ---- tokens ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # "name", "string", "int", "op", "punct", "end"
    text: str
    value: Any
    position: int


_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "n": "\n", "t": "\t", "r": "\r"}


def tokenize(text: str) -> list[Token]:
    if len(text) > MAX_FILTER_CHARS:
        raise FilterError(f"longer than {MAX_FILTER_CHARS} characters", MAX_FILTER_CHARS)
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char.isspace():
            i += 1
        elif char in "\"'":
            i = _string(text, i, tokens)
        elif char.isdigit() or (char == "-" and i + 1 < n and text[i + 1].isdigit()):
            start = i
            i += 1
            while i < n and text[i].isdigit():
                i += 1
            if i - start > 20:
                raise FilterError("integer too long", start)
            tokens.append(Token("int", text[start:i], int(text[start:i]), start))
        elif char.isalpha() or char == "_":
            start = i
            while i < n and (text[i].isalnum() or text[i] in "_-"):
                i += 1
            tokens.append(Token("name", text[start:i], text[start:i], start))
        elif text.startswith(("==", "!=", "<=", ">="), i):
            tokens.append(Token("op", text[i : i + 2], None, i))
            i += 2
        elif char in "<>":
            tokens.append(Token("op", char, None, i))
            i += 1
        elif char in "().,[]":
            tokens.append(Token("punct", char, None, i))
            i += 1
        elif char == "=":
            raise FilterError("'=' is not an operator (did you mean '=='?)", i)
        else:
            raise FilterError(f"unexpected character {char!r}", i)
    tokens.append(Token("end", "", None, n))
    return tokens


def _string(text: str, start: int, tokens: list[Token]) -> int:
    quote = text[start]
    out: list[str] = []
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == quote:
            tokens.append(Token("string", text[start : i + 1], "".join(out), start))
            return i + 1
        if char == "\\":
            escaped = text[i + 1 : i + 2]
            if escaped not in _ESCAPES:
                raise FilterError(f"unknown escape \\{escaped}", i)
            out.append(_ESCAPES[escaped])
            i += 2
            continue
        out.append(char)
        i += 1
    raise FilterError("unterminated string", start)


# ---- syntax tree ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    name: str  # "key", "timestamp", "offset" or "header"
    header: str | None = None

    @property
    def is_int(self) -> bool:
        return self.name in INT_FIELDS

    def source(self) -> str:
        if self.header is None:
            return self.name
        if HEADER_NAME.fullmatch(self.header) and self.header not in KEYWORDS:
            return f"headers.{self.header}"
        return f"headers[{quote(self.header)}]"


@dataclass(frozen=True, slots=True)
class Compare:
    field: Field
    op: str  # one of OPERATORS
    value: str | int | None


@dataclass(frozen=True, slots=True)
class Within:
    field: Field
    values: tuple[str | int | None, ...]


@dataclass(frozen=True, slots=True)
class Has:
    field: Field


@dataclass(frozen=True, slots=True)
class StartsWith:
    field: Field
    prefix: str


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclass(frozen=True, slots=True)
class Both:
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Either:
    left: Node
    right: Node


Node = Compare | Within | Has | StartsWith | Not | Both | Either


def quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r") + '"'


def _literal_source(value: str | int | None) -> str:
    if value is None:
        return "null"
    return str(value) if isinstance(value, int) else quote(value)


def source_of(node: Node) -> str:
    """Canonical text of `node`: fully parenthesised where operators nest."""
    if isinstance(node, Compare):
        return f"{node.field.source()} {node.op} {_literal_source(node.value)}"
    if isinstance(node, Within):
        items = ", ".join(_literal_source(v) for v in node.values)
        return f"{node.field.source()} in ({items})"
    if isinstance(node, Has):
        return f"has({node.field.source()})"
    if isinstance(node, StartsWith):
        return f"starts_with({node.field.source()}, {quote(node.prefix)})"
    if isinstance(node, Not):
        return f"not ({source_of(node.operand)})"
    word = "and" if isinstance(node, Both) else "or"
    return f"({source_of(node.left)}) {word} ({source_of(node.right)})"


# ---- parser ---------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.at = 0
        self.depth = 0

    @property
    def token(self) -> Token:
        return self.tokens[self.at]

    def _describe(self, token: Token) -> str:
        return "the end of the filter" if token.kind == "end" else repr(token.text)

    def fail(self, expected: str) -> FilterError:
        found = self._describe(self.token)
        return FilterError(f"expected {expected}, found {found}", self.token.position)

    def take(self) -> Token:
        token = self.token
        self.at += 1
        return token

    def is_word(self, word: str) -> bool:
        return self.token.kind == "name" and self.token.text == word

    def expect_punct(self, char: str) -> None:
        if self.token.kind != "punct" or self.token.text != char:
            raise self.fail(f"'{char}'")
        self.at += 1

    def parse(self) -> Node:
        node = self.disjunction()
        if self.token.kind != "end":
            raise self.fail("'and', 'or' or the end of the filter")
        return node

    def disjunction(self) -> Node:
        node = self.conjunction()
        while self.is_word("or"):
            self.at += 1
            node = Either(node, self.conjunction())
        return node

    def conjunction(self) -> Node:
        node = self.negation()
        while self.is_word("and"):
            self.at += 1
            node = Both(node, self.negation())
        return node

    def negation(self) -> Node:
        if self.is_word("not"):
            self.at += 1
            return Not(self.nested(self.negation))
        return self.primary()

    def nested(self, parse: Callable[[], Node]) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise FilterError(f"nested deeper than {MAX_DEPTH}", self.token.position)
        try:
            return parse()
        finally:
            self.depth -= 1

    def primary(self) -> Node:
        if self.token.kind == "punct" and self.token.text == "(":
            self.at += 1
            node = self.nested(self.disjunction)
            self.expect_punct(")")
            return node
        if self.is_word("has"):
            self.at += 1
            self.expect_punct("(")
            start = self.token.position
            field = self.field()
            if field.header is None:
                raise FilterError("has() takes a header (headers.NAME)", start)
            self.expect_punct(")")
            return Has(field)
        if self.is_word("starts_with"):
            self.at += 1
            self.expect_punct("(")
            start = self.token.position
            field = self.field()
            if field.is_int:
                raise FilterError(f"starts_with() takes a string field, not {field.name}", start)
            self.expect_punct(",")
            if self.token.kind != "string":
                raise self.fail("a string prefix")
            prefix = self.take().value
            self.expect_punct(")")
            return StartsWith(field, prefix)
        return self.comparison()

    def field(self) -> Field:
        token = self.token
        if token.kind != "name" or token.text not in ("key", "headers", *INT_FIELDS):
            raise self.fail("a field (key, headers.NAME, timestamp or offset)")
        self.at += 1
        if token.text != "headers":
            return Field(token.text)
        if self.token.kind == "punct" and self.token.text == ".":
            self.at += 1
            if self.token.kind != "name":
                raise self.fail("a header name after 'headers.'")
            return Field("header", self.take().text)
        if self.token.kind == "punct" and self.token.text == "[":
            self.at += 1
            if self.token.kind != "string":
                raise self.fail('a quoted header name in headers["..."]')
            name = self.take().value
            self.expect_punct("]")
            return Field("header", name)
        raise self.fail("'.' or '[' after headers")

    def comparison(self) -> Node:
        field = self.field()
        negated = False
        if self.is_word("not"):
            self.at += 1
            negated = True
            if not self.is_word("in"):
                raise self.fail("'in' after 'not'")
        if self.is_word("in"):
            self.at += 1
            self.expect_punct("(")
            values = [self.literal(field)]
            while self.token.kind == "punct" and self.token.text == ",":
                self.at += 1
                values.append(self.literal(field))
                if len(values) > MAX_LIST:
                    raise FilterError(f"a list longer than {MAX_LIST} values", self.token.position)
            self.expect_punct(")")
            node: Node = Within(field, tuple(values))
            return Not(node) if negated else node
        if self.token.kind != "op":
            raise self.fail("a comparison (==, !=, <, <=, >, >=, in, not in)")
        op = self.take().text
        start = self.token.position
        value = self.literal(field)
        if value is None and op not in ("==", "!="):
            raise FilterError(f"null can only be compared with == or !=, not {op}", start)
        return Compare(field, op, value)

    def literal(self, field: Field) -> str | int | None:
        token = self.token
        if token.kind == "name" and token.text == "null":
            if field.is_int:
                raise FilterError(f"{field.name} is never null", token.position)
            self.at += 1
            return None
        if field.is_int:
            if token.kind != "int":
                raise self.fail(f"an integer ({field.name} is an integer)")
            return int(self.take().value)
        if token.kind != "string":
            raise self.fail(f'a quoted string ({field.source()} is a string), e.g. "text"')
        return str(self.take().value)


def parse(text: str) -> Node:
    """The syntax tree of filter `text`; FilterError names the problem and position."""
    if not isinstance(text, str) or not text.strip():
        raise FilterError("empty filter", 0)
    return _Parser(text).parse()


# ---- compilation ----------------------------------------------------------------------------


def _getter(field: Field) -> Callable[[bytes | None, Headers, int, int], Any]:
    if field.name == "key":
        return lambda key, headers, timestamp, offset: key
    if field.name == "timestamp":
        return lambda key, headers, timestamp, offset: timestamp
    if field.name == "offset":
        return lambda key, headers, timestamp, offset: offset
    wanted = field.header

    def header(key: bytes | None, headers: Headers, timestamp: int, offset: int) -> Any:
        found = None
        for name, value in headers:
            if name == wanted:
                found = value
        return found

    return header


def _present(field: Field) -> Predicate:
    wanted = field.header
    return lambda key, headers, timestamp, offset: any(name == wanted for name, _ in headers)


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _value(value: str | int | None) -> bytes | int | None:
    return value.encode("utf-8") if isinstance(value, str) else value


def _compile(node: Node) -> Predicate:
    if isinstance(node, Compare):
        get = _getter(node.field)
        value = _value(node.value)
        if node.op == "==":
            return lambda *r: get(*r) == value
        if node.op == "!=":
            return lambda *r: get(*r) != value
        order = _ORDER[node.op]
        return lambda *r: (v := get(*r)) is not None and order(v, value)
    if isinstance(node, Within):
        get = _getter(node.field)
        values = frozenset(_value(v) for v in node.values)
        return lambda *r: get(*r) in values
    if isinstance(node, Has):
        return _present(node.field)
    if isinstance(node, StartsWith):
        get = _getter(node.field)
        prefix = node.prefix.encode("utf-8")
        return lambda *r: (v := get(*r)) is not None and v.startswith(prefix)
    if isinstance(node, Not):
        inner = _compile(node.operand)
        return lambda *r: not inner(*r)
    left, right = _compile(node.left), _compile(node.right)
    if isinstance(node, Both):
        return lambda *r: left(*r) and right(*r)
    return lambda *r: left(*r) or right(*r)


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """A compiled filter: `matches(key, headers, timestamp, offset)`; `source` is its
    canonical text (what a forwarded request or a queue call carries)."""

    source: str
    matches: Predicate


def compile_filter(text: str) -> RecordFilter:
    node = parse(text)
    return RecordFilter(source_of(node), _compile(node))


def all_of(nodes: list[Node]) -> RecordFilter | None:
    """A filter passing the records every one of `nodes` passes; None for none."""
    if not nodes:
        return None
    node = nodes[0]
    for other in nodes[1:]:
        node = Both(node, other)
    return RecordFilter(source_of(node), _compile(node))
