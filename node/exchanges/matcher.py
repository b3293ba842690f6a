"""Routing tables: which destinations an exchange's bindings give a routing key.

Owns the pure compilation of (binding key, destination) pairs into a table per exchange kind
and the lookup, with RabbitMQ's semantics. Keys and topic patterns are words separated by ".";
the empty key has no words, and "a." has two ("a" and ""). In a `topic` pattern a whole word
"*" stands for exactly one word and "#" for zero or more; `*` and `#` inside a word are refused
by `check_pattern`, never read literally. `direct` matches the key exactly; `fanout` ignores it.

Invariant: `table.route(key)` equals the set of destinations whose binding `matches(kind, ...)`
the key (the property tests hold the trie to the one-line reference of that).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

KINDS = ("fanout", "direct", "topic")
MAX_KEY_CHARS = 255  # AMQP's short string: routing keys and binding keys alike

D = TypeVar("D", bound=Hashable)


def words(key: str) -> list[str]:
    return key.split(".") if key else []


def check_pattern(kind: str, key: str) -> str | None:
    """Why `key` cannot be a binding key of a `kind` exchange, or None when it can."""
    if kind not in KINDS:
        return f"kind must be one of {', '.join(KINDS)}"
    if len(key) > MAX_KEY_CHARS:
        return f"a binding key has at most {MAX_KEY_CHARS} characters"
    if kind == "topic":
        for word in words(key):
            if word not in ("*", "#") and ("*" in word or "#" in word):
                return (
                    f"bad pattern {key!r}: '*' and '#' stand alone between dots "
                    f"(the word {word!r} mixes them with text)"
                )
    return None


@dataclass(slots=True)
class _Node(Generic[D]):
    children: dict[str, _Node[D]] = field(default_factory=dict)
    star: _Node[D] | None = None  # the pattern word "*"
    hash: _Node[D] | None = None  # the pattern word "#"
    destinations: set[D] = field(default_factory=set)  # of patterns that end here


class RoutingTable(Generic[D]):
    """The destinations of one exchange's bindings, compiled for lookups by routing key."""

    def __init__(self, kind: str, bindings: Iterable[tuple[str, D]]) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown exchange kind {kind!r}")
        self.kind = kind
        self._all: frozenset[D] = frozenset()
        self._exact: dict[str, set[D]] = {}
        self._root: _Node[D] = _Node()
        everything: set[D] = set()
        for key, destination in bindings:
            everything.add(destination)
            if kind == "direct":
                self._exact.setdefault(key, set()).add(destination)
            elif kind == "topic":
                self._insert(key, destination)
        self._all = frozenset(everything)

    def _insert(self, pattern: str, destination: D) -> None:
        node = self._root
        for word in words(pattern):
            if word == "*":
                node.star = node.star or _Node()
                node = node.star
            elif word == "#":
                node.hash = node.hash or _Node()
                node = node.hash
            else:
                node = node.children.setdefault(word, _Node())
        node.destinations.add(destination)

    def route(self, key: str) -> frozenset[D]:
        if self.kind == "fanout":
            return self._all
        if self.kind == "direct":
            return frozenset(self._exact.get(key, ()))
        return self._route_topic(words(key))

    def _route_topic(self, key: list[str]) -> frozenset[D]:
        """Walk the trie over (node, words consumed) states, each visited once: a "#" node
        may consume any number of words, so without the visited set several "#" in a row
        would try exponentially many splits of the key."""
        found: set[D] = set()
        seen: set[tuple[int, int]] = set()
        stack: list[tuple[_Node[D], int]] = [(self._root, 0)]
        end = len(key)
        while stack:
            node, at = stack.pop()
            if (id(node), at) in seen:
                continue
            seen.add((id(node), at))
            if node.hash is not None:
                stack.extend((node.hash, rest) for rest in range(at, end + 1))
            if at == end:
                found |= node.destinations
                continue
            child = node.children.get(key[at])
            if child is not None:
                stack.append((child, at + 1))
            if node.star is not None:
                stack.append((node.star, at + 1))
        return frozenset(found)
