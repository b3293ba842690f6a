"""The group consumer's core without a server: feed answers in, read requests and callbacks out.

Each test drives GroupConsumerCore's Ops by hand: every Call is checked and answered, every
Hook (on_assign, on_revoke) is run in order with the calls, so the transcripts show what the
member asks and in which order it commits, revokes and assigns.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from raftline.clients.core import Call, ClientCore, Hook, Op, Step
from raftline.clients.grouping import GroupConsumerCore
from raftline.clients.wire import Answer, RaftlineError, json_request

GROUP = "billing"
MEMBER = "m-1"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _json(body: Any) -> Answer:
    return Answer({"content-type": "application/json"}, json.dumps(body).encode())


def _parts(*partitions: int, topic: str = "orders") -> list[dict[str, Any]]:
    return [{"topic": topic, "partition": p} for p in partitions]


def _joined(generation: int, *partitions: int) -> Answer:
    return _json({"member_id": MEMBER, "generation": generation, "assignment": _parts(*partitions)})


def _fetched(generation: int, positions: dict[int, int], messages: list[tuple[int, int]]) -> Answer:
    """A group fetch answer: `positions` partition -> next offset, `messages` (partition,
    offset) pairs."""
    return _json(
        {
            "generation": generation,
            "messages": [
                {
                    "topic": "orders",
                    "partition": p,
                    "offset": o,
                    "timestamp": 0,
                    "value": f"{p}:{o}",
                }
                for p, o in messages
            ],
            "positions": [
                {"topic": "orders", "partition": p, "offset": o} for p, o in positions.items()
            ],
        }
    )


def _error(code: str, status: int) -> RaftlineError:
    return RaftlineError(code, code, retryable=False, status=status)


class Transcript:
    """Drives Ops: answers each Call from a script, runs each Hook, keeps what happened."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def run(self, op: Op[Any], answers: list[Answer | BaseException]) -> Any:
        step = Step(op)
        while (call := step.call) is not None:
            if isinstance(call, Hook):
                self.events.append((call.function.__name__, call.args[0]))
                try:  # as the shells do: a callback's error is thrown into the Op
                    result = call.run()
                except Exception as error:
                    step.throw(error)
                else:
                    step.send(result)
                continue
            assert isinstance(call, Call)
            body = json.loads(call.request.payload) if call.request.payload else None
            self.events.append((call.method, call.path, body))
            answer = answers.pop(0)
            if isinstance(answer, BaseException):
                step.throw(answer)
            else:
                step.send(answer)
        assert not answers, "the op ended before taking every answer"
        return step.result

    def calls(self) -> list[tuple[str, str]]:
        return [(e[0], e[1]) for e in self.events if len(e) == 3]


def _member(
    transcript: Transcript, auto_commit_interval_ms: int | None = None, **options: Any
) -> tuple[GroupConsumerCore, Clock]:
    clock = Clock()

    def on_assign(partitions: list[tuple[str, int]]) -> None:
        pass

    def on_revoke(partitions: list[tuple[str, int]]) -> None:
        pass

    options.setdefault("wait_ms", 0)  # no long-polls: see the idle test for those
    core = GroupConsumerCore(
        ClientCore("http://a:1"),
        "orders",
        group=GROUP,
        member_id=MEMBER,
        auto_commit_interval_ms=auto_commit_interval_ms,
        on_assign=on_assign,
        on_revoke=on_revoke,
        clock=clock,
        **options,
    )
    return core, clock


MESSAGES = f"/v1/groups/{GROUP}/members/{MEMBER}/messages"
OFFSETS = f"/v1/groups/{GROUP}/offsets"


def test_the_first_poll_joins_then_fetches_and_hands_out_in_order() -> None:
    t = Transcript()
    core, _ = _member(t, auto_offset_reset="earliest", session_timeout_ms=6000)
    got = t.run(
        core.polled(),
        [_joined(1, 0, 1), _fetched(1, {0: 2, 1: 5}, [(0, 0), (0, 1), (1, 4)])],
    )
    join = t.events[0]
    assert join[:2] == ("POST", f"/v1/groups/{GROUP}/members")
    assert join[2] == {
        "topics": ["orders"],
        "member_id": MEMBER,
        "session_timeout_ms": 6000,
        "auto_offset_reset": "earliest",
    }
    assert t.events[1] == ("on_assign", [("orders", 0), ("orders", 1)])
    assert t.events[2][:2] == ("GET", MESSAGES)
    assert [(m.topic, m.partition, m.offset, m.text) for m in got] == [
        ("orders", 0, 0, "0:0"),
        ("orders", 0, 1, "0:1"),
        ("orders", 1, 4, "1:4"),
    ]
    assert core.generation == 1 and core.consumed == {("orders", 0): 2, ("orders", 1): 5}


def test_a_new_generation_revokes_then_assigns_and_commits_nothing_stale() -> None:
    t = Transcript()
    core, _ = _member(t, auto_commit_interval_ms=60_000)
    t.run(core.polled(), [_joined(1, 0, 1), _fetched(1, {0: 3, 1: 1}, [(0, 2), (1, 0)])])
    t.events.clear()
    # The next fetch answers in generation 2: partition 1 moved away, partition 2 came.
    got = t.run(core.polled(), [_fetched(2, {0: 4, 2: 7}, [(0, 3), (2, 6)])])
    # No commit with generation 1: the group would refuse it as stale.
    assert [e[:2] for e in t.events if len(e) == 3] == [("GET", MESSAGES)]
    assert t.events[1] == ("on_revoke", [("orders", 1)])
    assert t.events[2] == ("on_assign", [("orders", 2)])
    assert [(m.partition, m.offset) for m in got] == [(0, 3), (2, 6)]
    assert core.generation == 2
    assert core.assignment == [("orders", 0), ("orders", 2)]
    assert ("orders", 1) not in core.consumed


def test_a_rebalance_announced_in_the_generation_commits_before_the_next_answer() -> None:
    t = Transcript()
    core, _ = _member(t, auto_commit_interval_ms=60_000)
    t.run(core.polled(), [_joined(1, 0, 1), _fetched(1, {0: 3, 1: 1}, [(0, 2), (1, 0)])])
    announced = json.loads(_fetched(1, {0: 3, 1: 1}, []).raw) | {"rebalancing": True}
    t.run(core.polled(), [_json(announced)])
    t.events.clear()
    beat = _json({"generation": 2, "assignment": _parts(0), "rebalancing": False})
    t.run(core.polled(), [_json({}), beat, _fetched(2, {0: 3}, [])])
    commit, heartbeat = t.events[0], t.events[1]
    assert commit[:2] == ("POST", OFFSETS) and commit[2]["generation"] == 1
    assert {"topic": "orders", "partition": 1, "offset": 1} in commit[2]["offsets"]
    assert heartbeat[:2] == ("POST", f"/v1/groups/{GROUP}/members/{MEMBER}/heartbeat")
    assert core.generation == 2


def test_buffered_messages_of_a_revoked_partition_are_not_handed_out() -> None:
    t = Transcript()
    core, _ = _member(t)
    fetched = _fetched(1, {0: 2, 1: 2}, [(0, 0), (1, 0), (1, 1)])
    t.run(core.next_message(), [_joined(1, 0, 1), fetched])
    assert core.consumed == {("orders", 0): 2}  # only partition 0's one was handed out
    core._noticed = (2, [("orders", 0)])  # a heartbeat brought news of generation 2
    t.events.clear()
    got = t.run(core.polled(), [_fetched(2, {0: 2}, [])])
    assert t.events[0] == ("on_revoke", [("orders", 1)])
    assert got == [] and not core._buffer


def test_iteration_counts_a_message_consumed_when_it_is_handed_out() -> None:
    t = Transcript()
    core, _ = _member(t)
    t.run(core.next_message(), [_joined(1, 0), _fetched(1, {0: 5}, [(0, 1), (0, 3)])])
    assert core.consumed == {("orders", 0): 2}
    t.events.clear()
    t.run(core.committing(raise_errors=True), [_json({})])
    assert t.events[0][2]["offsets"] == [{"topic": "orders", "partition": 0, "offset": 2}]
    t.run(core.next_message(), [])
    assert core.consumed == {("orders", 0): 5}  # the last one: on to the answer's position


def test_auto_commit_goes_out_when_due_and_only_with_news() -> None:
    t = Transcript()
    core, clock = _member(t, auto_commit_interval_ms=1000)
    t.run(core.polled(), [_joined(1, 0), _fetched(1, {0: 2}, [(0, 0), (0, 1)])])
    t.events.clear()
    t.run(core.polled(), [_fetched(1, {0: 2}, [])])  # not due yet
    assert t.calls() == [("GET", MESSAGES)]
    clock.now += 1.5
    t.events.clear()
    t.run(core.polled(), [_json({}), _fetched(1, {0: 2}, [])])
    assert t.calls() == [("POST", OFFSETS), ("GET", MESSAGES)]
    clock.now += 1.5
    t.events.clear()
    t.run(core.polled(), [_fetched(1, {0: 2}, [])])  # due, but nothing new to commit
    assert t.calls() == [("GET", MESSAGES)]


def test_stale_generation_on_commit_raises_then_kept_partitions_commit_again() -> None:
    t = Transcript()
    core, clock = _member(t, auto_commit_interval_ms=1000)
    t.run(core.polled(), [_joined(1, 0, 1), _fetched(1, {0: 1, 1: 1}, [(0, 0), (1, 0)])])
    with pytest.raises(RaftlineError) as raised:
        t.run(core.committing(raise_errors=True), [_error("stale_generation", 409)])
    clock.now += 2  # the next auto-commit is due
    assert raised.value.code == "stale_generation"
    t.events.clear()
    beat = _json({"generation": 2, "assignment": _parts(1), "rebalancing": False})
    t.run(core.polled(), [beat, _json({}), _fetched(2, {1: 1}, [])])
    # The next poll asks for the generation, gives up partition 0 and commits partition 1
    # (still this member's) with generation 2; no join.
    assert t.events[0][:2] == ("POST", f"/v1/groups/{GROUP}/members/{MEMBER}/heartbeat")
    assert t.events[1] == ("on_revoke", [("orders", 0)])
    commit = t.events[2]
    assert commit[:2] == ("POST", OFFSETS) and commit[2]["generation"] == 2
    assert commit[2]["offsets"] == [{"topic": "orders", "partition": 1, "offset": 1}]
    assert core.generation == 2


def test_unknown_member_on_fetch_rejoins_with_the_same_member_id() -> None:
    t = Transcript()
    core, _ = _member(t)
    t.run(core.polled(), [_joined(1, 0), _fetched(1, {0: 1}, [(0, 0)])])
    assert t.run(core.polled(), [_error("unknown_member", 404)]) == []
    t.events.clear()
    t.run(core.polled(), [_joined(2, 0), _fetched(2, {0: 0}, [])])
    assert t.calls()[0] == ("POST", f"/v1/groups/{GROUP}/members")
    assert t.events[1][2]["member_id"] == MEMBER
    assert core.consumed == {("orders", 0): 0}  # from the committed offset again


def test_a_failed_fetch_is_not_retried_and_the_next_poll_commits_then_joins_again() -> None:
    t = Transcript()
    core, _ = _member(t, auto_commit_interval_ms=60_000)
    t.run(core.polled(), [_joined(1, 0), _fetched(1, {0: 3}, [(0, 1), (0, 2)])])
    timeout = RaftlineError("connection_failed", "reset", retryable=True)
    step = Step(core.polled())
    assert isinstance(step.call, Call)
    assert step.call.request.retry is False  # its answer may be lost: no second try
    step.throw(timeout)
    assert step.call is None and step.result == []
    t.events.clear()
    got = t.run(core.polled(), [_json({}), _joined(1, 0), _fetched(1, {0: 3}, [])])
    # Still a member: what was handed out is committed, then the join restarts the server's
    # reading at the committed offsets; no revocation, nothing delivered twice.
    assert t.calls() == [
        ("POST", OFFSETS),
        ("POST", f"/v1/groups/{GROUP}/members"),
        ("GET", MESSAGES),
    ]
    assert t.events[0][2]["offsets"] == [{"topic": "orders", "partition": 0, "offset": 3}]
    assert got == [] and core.generation == 1


def test_a_lost_membership_commits_nothing_even_from_on_revoke() -> None:
    t = Transcript()
    core, _ = _member(t, auto_commit_interval_ms=60_000)
    t.run(core.polled(), [_joined(1, 0), _fetched(1, {0: 1}, [(0, 0)])])

    def on_revoke(partitions: list[tuple[str, int]]) -> None:
        t.run(core.committing(raise_errors=True), [])  # no call goes out

    core.on_revoke = on_revoke
    core._rejoin = True
    t.events.clear()
    t.run(core.polled(), [_joined(2, 0), _fetched(2, {0: 0}, [])])
    assert [c for c in t.calls() if c == ("POST", OFFSETS)] == []


def test_heartbeat_only_when_idle_and_its_news_waits_for_the_next_poll() -> None:
    t = Transcript()
    core, clock = _member(t, session_timeout_ms=3000)
    t.run(core.polled(), [_joined(1, 0, 1), _fetched(1, {0: 0, 1: 0}, [])])
    t.events.clear()
    t.run(core.heartbeated(), [])  # just heard from the group
    assert core.heartbeat_delay() == pytest.approx(1.0)
    clock.now += 1.1
    beat = _json({"generation": 2, "assignment": _parts(0), "rebalancing": False})
    t.run(core.heartbeated(), [beat])
    assert t.calls() == [("POST", f"/v1/groups/{GROUP}/members/{MEMBER}/heartbeat")]
    assert core.generation == 1  # the application's thread moves to it
    t.events.clear()
    t.run(core.polled(), [_fetched(2, {0: 0}, [])])
    assert t.events[0] == ("on_revoke", [("orders", 1)])
    assert core.generation == 2


def test_a_long_poll_that_brought_nothing_makes_the_next_poll_ask_first() -> None:
    t = Transcript()
    core, _ = _member(t, wait_ms=1000)
    t.run(core.polled(), [_joined(1, 0, 1), _fetched(1, {0: 0, 1: 0}, [])])
    t.events.clear()
    beat = _json({"generation": 1, "assignment": _parts(0, 1), "rebalancing": False})
    t.run(core.polled(), [beat, _fetched(1, {0: 1, 1: 0}, [(0, 0)])])
    t.run(core.polled(), [_fetched(1, {0: 1, 1: 0}, [])])  # it brought one: no heartbeat
    assert t.calls() == [
        ("POST", f"/v1/groups/{GROUP}/members/{MEMBER}/heartbeat"),
        ("GET", MESSAGES),
        ("GET", MESSAGES),
    ]


def test_a_fetch_that_ends_on_a_rebalance_makes_the_next_poll_ask_first() -> None:
    t = Transcript()
    core, _ = _member(t)
    t.run(core.polled(), [_joined(1, 0, 1), _fetched(1, {0: 0, 1: 0}, [])])
    ended = json.loads(_fetched(1, {0: 0, 1: 0}, []).raw) | {"rebalancing": True}
    t.run(core.polled(), [_json(ended)])
    t.events.clear()
    beat = _json({"generation": 2, "assignment": _parts(0, 1, 2), "rebalancing": False})
    t.run(core.polled(), [beat, _fetched(2, {0: 0, 1: 0, 2: 0}, [])])
    assert t.calls() == [
        ("POST", f"/v1/groups/{GROUP}/members/{MEMBER}/heartbeat"),
        ("GET", MESSAGES),
    ]
    assert t.events[1] == ("on_assign", [("orders", 2)])  # before the fetch went out


def test_no_heartbeat_while_a_fetch_is_out_or_the_application_stopped_polling() -> None:
    t = Transcript()
    core, clock = _member(t, session_timeout_ms=3000, max_poll_interval_ms=5000)
    t.run(core.polled(), [_joined(1, 0), _fetched(1, {0: 0}, [])])
    t.events.clear()
    clock.now += 2
    core._fetching = 1
    t.run(core.heartbeated(), [])
    core._fetching = 0
    clock.now += 4  # 6 s since the last poll
    t.run(core.heartbeated(), [])
    assert t.calls() == []


def test_a_heartbeat_404_makes_the_next_poll_join_again() -> None:
    t = Transcript()
    core, clock = _member(t, session_timeout_ms=3000)
    t.run(core.polled(), [_joined(1, 0), _fetched(1, {0: 0}, [])])
    clock.now += 2
    t.run(core.heartbeated(), [_error("unknown_member", 404)])
    t.events.clear()
    t.run(core.polled(), [_joined(2, 0), _fetched(2, {0: 0}, [])])
    assert t.calls()[0] == ("POST", f"/v1/groups/{GROUP}/members")


def test_close_commits_revokes_then_leaves() -> None:
    t = Transcript()
    core, _ = _member(t, auto_commit_interval_ms=60_000)
    t.run(core.polled(), [_joined(1, 0), _fetched(1, {0: 4}, [(0, 3)])])
    t.events.clear()
    t.run(core.leaving(), [_json({}), _json({})])
    assert t.events[0][:2] == ("POST", OFFSETS)
    assert t.events[1] == ("on_revoke", [("orders", 0)])
    assert t.events[2][:2] == ("DELETE", f"/v1/groups/{GROUP}/members/{MEMBER}")
    with pytest.raises(RuntimeError):
        t.run(core.polled(), [])


def test_a_callback_error_is_raised_after_the_move_is_complete() -> None:
    t = Transcript()
    core, _ = _member(t)
    t.run(core.polled(), [_joined(1, 0, 1), _fetched(1, {0: 0, 1: 0}, [])])

    def on_revoke(partitions: list[tuple[str, int]]) -> None:
        raise ValueError("application failed")

    core.on_revoke = on_revoke
    with pytest.raises(ValueError):
        t.run(core.polled(), [_fetched(2, {0: 0}, [])])
    assert core.generation == 2 and core.assignment == [("orders", 0)]


def test_bad_options_are_refused() -> None:
    client = ClientCore("http://a:1")
    with pytest.raises(ValueError):
        GroupConsumerCore(client, "orders", group=GROUP, auto_offset_reset="middle")
    with pytest.raises(ValueError):
        GroupConsumerCore(client, [], group=GROUP)
    with pytest.raises(ValueError):
        GroupConsumerCore(client, "orders", group=GROUP, auto_commit_interval_ms=0)


def test_a_request_tried_once_still_moves_the_next_call_to_another_node() -> None:
    client = ClientCore("http://a:1,http://b:2")
    request = json_request(None)
    request.retry = False
    tries = client._tries(None, request)
    with pytest.raises(RaftlineError):
        tries.failed(RaftlineError("timeout", "slow", retryable=True, node="http://a:1"))
    assert client.nodes.base_url(None) == "http://b:2"
