"""Routing tables against a reference matcher: for random bindings and random routing keys,
the trie of a topic exchange, the exact map of a direct one and a fanout's list give exactly
the destinations whose binding the few-line reference says the key matches (RabbitMQ's
semantics: `*` one word, `#` zero or more); plus the documented examples and pattern checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftline.node.exchanges.matcher import RoutingTable, check_pattern


def reference_matches(pattern: str, key: str) -> bool:
    """Whether a topic pattern matches a key, by plain recursion over their words."""
    p = pattern.split(".") if pattern else []
    k = key.split(".") if key else []

    def match(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(k)
        if p[i] == "#":
            return any(match(i + 1, rest) for rest in range(j, len(k) + 1))
        return j < len(k) and p[i] in ("*", k[j]) and match(i + 1, j + 1)

    return match(0, 0)


# Few distinct words, so that patterns and keys collide often; "" is a word too ("a..b").
key_words = st.lists(st.sampled_from(["a", "b", "c", ""]), max_size=6)
keys = key_words.map(".".join)
patterns = st.lists(st.sampled_from(["a", "b", "", "*", "#"]), max_size=6).map(".".join)
bindings = st.lists(st.tuples(patterns, st.integers(0, 5)), max_size=12)


@settings(max_examples=400, deadline=None)
@given(bindings, st.lists(keys, min_size=1, max_size=10))
def test_a_topic_table_routes_as_the_reference_matcher(
    table_bindings: list[tuple[str, int]], routing_keys: list[str]
) -> None:
    table = RoutingTable("topic", table_bindings)
    for key in routing_keys:
        expected = {d for pattern, d in table_bindings if reference_matches(pattern, key)}
        assert table.route(key) == expected, key


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(keys, st.integers(0, 5)), max_size=12), keys)
def test_a_direct_table_matches_keys_exactly(
    table_bindings: list[tuple[str, int]], key: str
) -> None:
    table = RoutingTable("direct", table_bindings)
    assert table.route(key) == {d for bound, d in table_bindings if bound == key}


@settings(max_examples=100, deadline=None)
@given(bindings, keys)
def test_a_fanout_table_reaches_every_destination(
    table_bindings: list[tuple[str, int]], key: str
) -> None:
    table = RoutingTable("fanout", table_bindings)
    assert table.route(key) == {d for _, d in table_bindings}


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("*.orange.*", "quick.orange.rabbit", True),
        ("*.orange.*", "quick.orange.male.rabbit", False),
        ("*.*.rabbit", "lazy.orange.rabbit", True),
        ("lazy.#", "lazy.orange.male.rabbit", True),
        ("lazy.#", "lazy", True),
        ("eu.orders.*", "eu.orders.created", True),
        ("eu.orders.*", "eu.orders", False),
        ("eu.orders.*", "eu.orders.created.late", False),
        ("#.refund", "refund", True),
        ("#.refund", "eu.orders.refund", True),
        ("#.refund", "eu.refund.done", False),
        ("#", "", True),
        ("*", "", False),
        ("*", "a", True),
        ("", "", True),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("#.#", "", True),
        ("a.*", "a.", True),  # "a." is the words "a" and ""
    ],
)
def test_documented_topic_examples(pattern: str, key: str, matches: bool) -> None:
    assert reference_matches(pattern, key) is matches
    assert (RoutingTable("topic", [(pattern, 0)]).route(key) == {0}) is matches


def test_many_hashes_against_a_long_key_take_one_pass() -> None:
    """Each (trie node, words consumed) state is visited once: without that, twenty `#` in
    a row would try exponentially many splits of a 60-word key."""
    pattern = ".".join(["#"] * 20 + ["z"])
    key = ".".join(["a"] * 60)
    table = RoutingTable("topic", [(pattern, 0)])
    assert table.route(key) == frozenset()
    assert table.route(key + ".z") == {0}


@pytest.mark.parametrize(
    ("kind", "key", "ok"),
    [
        ("topic", "a.*.#", True),
        ("topic", "a.b*", False),
        ("topic", "#x", False),
        ("topic", "x" * 256, False),
        ("direct", "a.b*", True),  # a direct key is literal
        ("fanout", "", True),
        ("headers", "", False),
    ],
)
def test_binding_keys_are_checked_for_the_exchange_kind(kind: str, key: str, ok: bool) -> None:
    assert (check_pattern(kind, key) is None) is ok
