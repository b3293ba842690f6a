"""The exchanges of the metadata state machine against a reference model: random sequences of
create, delete, bind, unbind and topic create/delete commands leave the same exchanges, answer
the same error codes, change nothing when they fail, never leave a binding or alternate to a
missing topic, and never give two definitions one (name, version)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from raftline.node.metadata import MetadataError, MetadataState

NAMES = ["x", "y"]
TOPICS = ["t1", "t2", "t3"]
KEYS = ["", "a", "a.*", "#", "a.b*", "*.b"]


def destinations() -> st.SearchStrategy[dict[str, str]]:
    topic = st.sampled_from(TOPICS)
    return st.one_of(
        topic.map(lambda t: {"topic": t}), topic.map(lambda t: {"queue": "q", "topic": t})
    )


commands = st.one_of(
    st.builds(
        lambda n, k, a: {"op": "create_exchange", "exchange": n, "kind": k, "alternate": a},
        st.sampled_from(NAMES),
        st.sampled_from(["topic", "direct", "fanout", "headers"]),
        st.one_of(st.none(), destinations()),
    ),
    st.builds(lambda n: {"op": "delete_exchange", "exchange": n}, st.sampled_from(NAMES)),
    st.builds(
        lambda op, n, k, d: {"op": op, "exchange": n, "key": k, "destination": d},
        st.sampled_from(["bind", "bind", "unbind"]),
        st.sampled_from(NAMES),
        st.sampled_from(KEYS),
        destinations(),
    ),
    st.builds(lambda t: {"op": "create_topic", "name": t}, st.sampled_from(TOPICS)),
    st.builds(lambda t: {"op": "delete_topic", "name": t}, st.sampled_from(TOPICS)),
)


class Reference:
    """Exchanges as plain dicts, changed by the rules as the README states them."""

    def __init__(self) -> None:
        self.topics: set[str] = set()
        self.exchanges: dict[str, dict[str, Any]] = {}

    def apply(self, c: dict[str, Any]) -> str | None:
        """The error code of `c`, or None when it applied."""
        op = c["op"]
        if op == "create_topic":
            if c["name"] in self.topics:
                return "topic_exists"
            self.topics.add(c["name"])
        elif op == "delete_topic":
            if c["name"] not in self.topics:
                return "unknown_topic"
            self.topics.discard(c["name"])
            for x in self.exchanges.values():
                x["bindings"] = [b for b in x["bindings"] if b["topic"] != c["name"]]
                if x["alternate"] is not None and x["alternate"]["topic"] == c["name"]:
                    x["alternate"] = None
        elif op == "create_exchange":
            if c["exchange"] in self.exchanges:
                return "exchange_exists"
            if c["kind"] not in ("topic", "direct", "fanout"):
                return "invalid_request"
            if c["alternate"] is not None and c["alternate"]["topic"] not in self.topics:
                return "unknown_destination"
            self.exchanges[c["exchange"]] = {
                "name": c["exchange"],
                "kind": c["kind"],
                "alternate": c["alternate"],
                "bindings": [],
            }
        elif c["exchange"] not in self.exchanges:
            return "unknown_exchange"
        elif op == "delete_exchange":
            del self.exchanges[c["exchange"]]
        else:
            x = self.exchanges[c["exchange"]]
            key = "" if x["kind"] == "fanout" else c["key"]
            if x["kind"] == "topic" and "b*" in key:
                return "invalid_request"
            binding = {"key": key, **c["destination"]}
            if op == "unbind":
                if binding not in x["bindings"]:
                    return "unknown_binding"
                x["bindings"].remove(binding)
            elif c["destination"]["topic"] not in self.topics:
                return "unknown_destination"
            elif binding not in x["bindings"]:
                x["bindings"].append(binding)
        return None


def described(state: MetadataState) -> dict[str, Any]:
    return {n: x.describe() for n, x in state.exchanges.by_name.items()}


@settings(max_examples=300, deadline=None)
@given(st.lists(commands, max_size=40))
def test_exchanges_follow_the_reference_model(sequence: list[dict[str, Any]]) -> None:
    state = MetadataState()
    state.apply({"op": "register_node", "node": {"id": 1, "raft": "r", "http": "h"}})
    reference = Reference()
    versions: dict[tuple[str, int], dict[str, Any]] = {}
    for command in sequence:
        if command["op"] == "create_topic":
            command = {**command, "config": {}, "replicas": [[1]]}
        before = copy.deepcopy(described(state))
        try:
            state.apply(command)
            code = None
        except MetadataError as exc:
            code = exc.code
            assert described(state) == before, "a refused command changed nothing"
        assert code == reference.apply(command), command
        assert described(state) == reference.exchanges
        for exchange in state.exchanges.by_name.values():
            assert all(b.destination.topic in state.topics for b in exchange.bindings)
            assert exchange.alternate is None or exchange.alternate.topic in state.topics
            seen = versions.setdefault((exchange.name, exchange.version), exchange.describe())
            assert seen == exchange.describe(), "one (name, version), two definitions"


def test_temporary_topics_expire_only_forward_and_leave_with_the_topic() -> None:
    state = MetadataState()
    state.apply({"op": "register_node", "node": {"id": 1, "raft": "r", "http": "h"}})
    create = {"op": "create_topic", "config": {}, "replicas": [[1]]}
    state.apply({**create, "name": "_reply.c", "expires_ms": 1_000})
    state.apply({"op": "touch_topic", "name": "_reply.c", "expires_ms": 5_000})
    state.apply({"op": "touch_topic", "name": "_reply.c", "expires_ms": 2_000})
    assert state.expiring == {"_reply.c": 5_000}
    state.apply({**create, "name": "kept"})
    try:
        state.apply({"op": "touch_topic", "name": "kept", "expires_ms": 1})
        raise AssertionError("a topic of its own cannot be made temporary")
    except MetadataError as exc:
        assert exc.code == "unknown_topic"
    state.apply({"op": "delete_topic", "name": "_reply.c"})
    assert state.expiring == {}
