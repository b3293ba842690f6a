"""Group consumers (blocking and asyncio) against a real single-node `raftline serve` process:
members split a topic's partitions, one leaves (or goes silent) and the other takes over from
the committed offsets with nothing lost; the admin calls show members, offsets and lag."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from cluster_harness import Cluster

from raftline.clients.client import AsyncClient, Client, GroupConsumer, Message, RaftlineError

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]

PARTITIONS = 4
_groups = (f"group-{i}" for i in itertools.count())


def _produce(client: Client, topic: str, count: int, tag: str) -> set[tuple[int, str]]:
    """`count` messages on every partition; the (partition, value) pairs sent."""
    sent = set()
    for p in range(PARTITIONS):
        values = [f"{tag}-{p}-{i}" for i in range(count)]
        client.produce_batch(topic, p, values)
        sent |= {(p, v) for v in values}
    return sent


def _caught_up(client: Client, topic: str, *consumers: GroupConsumer) -> Callable[[], bool]:
    """True once the consumers together have consumed every partition to its end (as now)."""
    ends = {(topic, p["partition"]): p["high_watermark"] for p in
            client.describe_topic(topic)["partitions"]}  # fmt: skip

    def done() -> bool:
        consumed = {tp: o for c in consumers for tp, o in c.consumed.items()}
        return all(consumed.get(tp, -1) >= end for tp, end in ends.items())

    return done


def _got(messages: Iterable[Message]) -> list[tuple[int, str]]:
    return [(m.partition, m.text or "") for m in messages]


def _poll_until(
    consumers: list[GroupConsumer], done: Callable[[], bool], seconds: float = 30.0
) -> dict[int, list[Message]]:
    """Polls every consumer from a thread of its own (as applications do: a join that waits
    for the others to commit before a rebalance must not hold their polls) until `done()`;
    what each one got."""
    got: dict[int, list[Message]] = {i: [] for i in range(len(consumers))}
    deadline = time.monotonic() + seconds
    stop = threading.Event()

    def run(i: int) -> None:
        while not stop.is_set():
            got[i] += consumers[i].poll()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(consumers))]
    for thread in threads:
        thread.start()
    try:
        while not done():
            assert time.monotonic() < deadline, [c.assignment for c in consumers]
            time.sleep(0.01)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    return got


def _options(**more: Any) -> dict[str, Any]:
    return {"auto_offset_reset": "earliest", "wait_ms": 200, "session_timeout_ms": 3000, **more}


def test_two_members_split_then_one_leaves_and_the_other_continues_from_its_commits(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic, group = new_topic(PARTITIONS), next(_groups)
    events: list[tuple[str, str, list[tuple[str, int]]]] = []

    def recorder(name: str, kind: str) -> Callable[[list[tuple[str, int]]], None]:
        return lambda partitions: events.append((name, kind, partitions))

    first = client.consumer(
        topic, group=group, on_assign=recorder("a", "assign"), on_revoke=recorder("a", "revoke"),
        **_options(auto_commit_interval_ms=500),
    )  # fmt: skip
    second = client.consumer(topic, group=group, on_assign=recorder("b", "assign"), **_options())
    first.poll()  # the first joins alone and holds every partition
    assert len(first.assignment) == PARTITIONS
    # The second joins before any message is there; they settle on two partitions each.
    _poll_until([first, second], lambda: len(first.assignment) == len(second.assignment) == 2)
    assert set(first.assignment) | set(second.assignment) == {(topic, p) for p in range(4)}
    assert ("a", "revoke", sorted(second.assignment)) in events

    sent = _produce(client, topic, 30, "one")
    got = _poll_until([first, second], _caught_up(client, topic, first, second))
    mine = {p for _, p in first.assignment}
    assert {p for p, _ in _got(got[0])} == mine  # each reads only what it holds
    assert {p for p, _ in _got(got[1])} == set(range(4)) - mine
    assert sorted(_got(got[0]) + _got(got[1])) == sorted(sent)  # all of it, once

    first.close()  # commits (auto-commit is on), revokes, leaves
    assert events[-1] == ("a", "revoke", sorted((topic, p) for p in mine))
    later = _produce(client, topic, 10, "two")
    taken = _poll_until([second], _caught_up(client, topic, second))
    # The second member takes the first's partitions from its committed offsets: the new
    # messages only, none of the ones the first already consumed, none lost.
    assert sorted(_got(taken[0])) == sorted(later)
    second.commit()
    offsets = client.group_offsets(group)
    assert len(offsets) == PARTITIONS
    assert all(o["offset"] == o["high_watermark"] and o["lag"] == 0 for o in offsets)
    second.close()


def test_iterating_member_commits_up_to_the_message_it_has_processed(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic, group = new_topic(PARTITIONS), next(_groups)
    sent = _produce(client, topic, 5, "m")
    processed = []
    with client.consumer(topic, group=group, **_options(auto_commit_interval_ms=None)) as first:
        for message in first:
            processed.append(message)
            if len(processed) == 7:
                first.commit()  # the seventh one included, nothing after it
                break
    # The first member left without committing more: the next one starts after the seventh.
    with client.consumer(topic, group=group, **_options()) as second:
        rest = _poll_until([second], _caught_up(client, topic, second))[0]
    assert sorted(_got(processed) + _got(rest)) == sorted(sent)


def test_a_silent_member_loses_its_partitions_after_the_session_timeout(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic, group = new_topic(PARTITIONS), next(_groups)
    silent = client.consumer(topic, group=group, **_options(session_timeout_ms=1000))
    other = client.consumer(topic, group=group, **_options(session_timeout_ms=3000))
    _poll_until([silent, other], lambda: len(silent.assignment) == len(other.assignment) == 2)
    silent._stop.set()  # as if its process had died: no more heartbeats, no leave
    silent._heart.join()
    started = time.monotonic()
    _poll_until([other], lambda: len(other.assignment) == 4, seconds=10)
    took = time.monotonic() - started
    print(f"a silent member's partitions moved {took:.3f} s after its last heartbeat (session 1 s)")
    assert took < 1.0 + 3.0
    members = client.describe_group(group)["members"]
    assert [m["member_id"] for m in members] == [other.member_id]
    other.close()


def test_admin_calls_list_describe_reset_and_remove_members(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic, group = new_topic(PARTITIONS), next(_groups)
    _produce(client, topic, 10, "x")
    member = client.consumer(topic, group=group, member_id="static-1", **_options())
    _poll_until([member], _caught_up(client, topic, member))
    member.commit()
    assert {"group": group, "state": "stable", "members": 1} in client.list_groups()
    described = client.describe_group(group)
    assert described["members"][0]["member_id"] == "static-1"
    assert len(described["members"][0]["assignment"]) == PARTITIONS
    with pytest.raises(RaftlineError) as refused:
        client.reset_group_offsets(group, topic, "earliest")
    assert refused.value.code == "group_not_empty"
    assert client.remove_group_members(group) == ["static-1"]
    reset = client.reset_group_offsets(group, topic, {"offset": 3})
    assert len(reset) == PARTITIONS
    offsets = client.group_offsets(group)
    assert all(o["offset"] == 3 and o["lag"] == o["high_watermark"] - 3 > 0 for o in offsets)
    assert client.reset_group_offsets(group, topic, "latest")
    assert {o["lag"] for o in client.group_offsets(group)} == {0}
    # The removed member learns it on its next call and joins again with the same id.
    assert member.poll() == []
    _poll_until([member], lambda: member.generation is not None and member.assignment != [])
    assert member.member_id == "static-1"
    member.close()
    client.delete_group(group)
    assert group not in [g["group"] for g in client.list_groups()]


def test_async_members_split_and_hand_over(node: Cluster, topic_name: str) -> None:
    group = next(_groups)

    async def scenario() -> tuple[list[Any], list[tuple[int, str]], set[tuple[int, str]]]:
        async with AsyncClient(node.urls) as client:
            await client.create_topic(topic_name, PARTITIONS)
            events: list[Any] = []

            async def on_assign(partitions: list[tuple[str, int]]) -> None:
                await asyncio.sleep(0)
                events.append(("assign", partitions))

            first = client.consumer(topic_name, group=group, on_assign=on_assign, **_options())
            second = client.consumer(topic_name, group=group, **_options())
            deadline = time.monotonic() + 30
            while not len(first.assignment) == len(second.assignment) == 2:
                assert time.monotonic() < deadline
                await first.poll()
                await second.poll()
            sent = set()
            for p in range(PARTITIONS):
                values = [f"v-{p}-{i}" for i in range(20)]
                await client.produce_batch(topic_name, p, values)
                sent |= {(p, v) for v in values}
            got: list[tuple[int, str]] = []
            async for message in first:  # the first member reads its half, commits, leaves
                got.append((message.partition, message.text or ""))
                if len(got) == 40:
                    break
            await first.close()
            while len(got) < 80:
                assert time.monotonic() < deadline
                got += _got(await second.poll())
            await second.commit()
            described = await client.describe_group(group)
            assert [m["member_id"] for m in described["members"]] == [second.member_id]
            assert {o["lag"] for o in await client.group_offsets(group)} == {0}
            await second.close()
            assert {"group": group, "state": "empty", "members": 0} in await client.list_groups()
            return events, got, sent

    events, got, sent = asyncio.run(scenario())
    assert events and events[0][0] == "assign"
    assert sorted(got) == sorted(sent)


def _clean_leave_seen_after(client: Client, topic: str) -> float:
    """Seconds from one member's close() to the other's on_assign of everything, while the
    other long-polls in a thread with the default wait_ms."""
    group, gained = next(_groups), []
    stay = client.consumer(topic, group=group, on_assign=lambda p: gained.append(time.monotonic()))
    leave = client.consumer(topic, group=group, wait_ms=0)
    _poll_until([stay, leave], lambda: len(stay.assignment) == len(leave.assignment) == 2)
    stop = threading.Event()

    def polling() -> None:
        while not stop.is_set():
            stay.poll()

    thread = threading.Thread(target=polling)
    thread.start()
    try:
        time.sleep(0.3)
        left_at = time.monotonic()
        leave.close()
        deadline = time.monotonic() + 10
        while len(stay.assignment) != PARTITIONS:
            assert time.monotonic() < deadline, stay.assignment
            time.sleep(0.005)
        return gained[-1] - left_at
    finally:
        stop.set()
        thread.join()
        stay.close()


def test_a_member_in_a_long_poll_sees_a_clean_leave_within_about_a_second(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(PARTITIONS)
    seen = [_clean_leave_seen_after(client, topic) for _ in range(3)]
    print(f"clean leave seen after {', '.join(f'{s:.3f}' for s in seen)} s")
    assert max(seen) < 1.5
