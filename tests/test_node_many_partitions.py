"""What lets a node hold tens of thousands of partitions: bounded driver rounds, quiet new
followers, link changes that wake only the groups concerned, parallel hard-state saves, leader
balancing fed by events, and one metadata entry per topic creation."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import configs, wait_for

from raftline.node.config import NodeConfig
from raftline.node.controller import LeaderWatch
from raftline.node.metadata import META_GROUP, MetadataState
from raftline.node.rounds import run_all
from raftline.node.runtime import GROUPS_PER_ROUND, Runtime
from raftline.raftlog.storage import RaftStorage

pytestmark = pytest.mark.timeout(120)


class _Replica:
    def on_commit(self, entries: Any) -> None:
        pass

    def on_role(self, role: str, leader: int | None, term: int) -> None:
        pass


def _runtime(tmp_path: Path) -> Runtime:
    config: NodeConfig = configs(tmp_path, 3)[0]
    return Runtime(config, on_rpc=None)  # type: ignore[arg-type]


async def test_a_fresh_follower_stays_quiet_until_its_expected_leaders_link_goes_down(
    tmp_path: Path,
) -> None:
    runtime = _runtime(tmp_path)
    runtime.transport.alive = lambda peer: True  # type: ignore[method-assign]
    runtime.add_group("t~1~0", RaftStorage(tmp_path / "g"), [1, 2, 3], _Replica(), -1, 2)
    assert runtime.quiet_groups() == 1  # no election timer while node 2 is expected to campaign
    runtime._on_gone(3)
    assert runtime.quiet_groups() == 1  # another follower's node: nothing to do
    runtime._on_gone(2)
    assert runtime.quiet_groups() == 0  # the expected leader is gone: elect


async def test_a_fresh_follower_whose_expected_leader_is_down_starts_its_election_timer(
    tmp_path: Path,
) -> None:
    runtime = _runtime(tmp_path)
    runtime.transport.alive = lambda peer: peer != 2  # type: ignore[method-assign]
    runtime.add_group("t~1~0", RaftStorage(tmp_path / "g"), [1, 2, 3], _Replica(), -1, 2)
    assert runtime.quiet_groups() == 0


async def test_a_round_feeds_a_bounded_number_of_groups_metadata_first(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    names = [f"t~1~{i}" for i in range(GROUPS_PER_ROUND + 10)]
    for name in [*names, META_GROUP]:
        runtime.add_group(name, RaftStorage(tmp_path / name), [1], _Replica(), -1)
    runtime.first_groups.add(META_GROUP)
    first = runtime._take_dirty()
    assert first[0] == META_GROUP and len(first) == GROUPS_PER_ROUND
    assert first[1:] == names[: GROUPS_PER_ROUND - 1]  # the longest touched come first
    assert runtime._take_dirty() == names[GROUPS_PER_ROUND - 1 :]


def test_hard_state_saves_of_a_round_run_side_by_side() -> None:
    # Three saves that each wait for the other two: run one after the other, they would
    # never meet at the barrier.
    barrier = threading.Barrier(3, timeout=10)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        run_all(pool, [barrier.wait, barrier.wait, barrier.wait])  # type: ignore[list-item]


def _state_with_topic(replicas: list[list[int]]) -> MetadataState:
    state = MetadataState()
    for node in (1, 2, 3):
        state.apply({"op": "register_node", "node": {"id": node, "raft": "r", "http": "h"}})
    state.apply({"op": "create_topic", "name": "t", "config": {}, "replicas": replicas})
    return state


def test_leader_balancing_looks_only_at_groups_whose_leader_moved() -> None:
    state = _state_with_topic([[1, 2, 3], [2, 3, 1]])
    moved, stays = state.topics["t"].group(0), state.topics["t"].group(1)
    leaders = {moved: 2, stays: 2}
    watch = LeaderWatch()
    watch.saw(moved, 2, now=0.0)
    watch.saw(stays, 2, now=0.0)
    assert watch.moves(state, leaders.get, lambda n: True, now=100.0, settle_s=10) == [
        (moved, 2, 1)
    ]
    assert watch.candidates == {moved}  # `stays` is on its preferred replica: dropped
    leaders[moved] = 1
    watch.saw(moved, 1, now=101.0)
    assert watch.moves(state, leaders.get, lambda n: True, now=200.0, settle_s=10) == []
    assert watch.candidates == set()


def test_leader_balancing_forgets_groups_of_deleted_topics() -> None:
    state = _state_with_topic([[1, 2, 3]])
    group = state.topics["t"].group(0)
    watch = LeaderWatch()
    watch.saw(group, 2, now=0.0)
    state.apply({"op": "delete_topic", "name": "t"})
    assert watch.moves(state, lambda g: 2, lambda n: True, now=100.0, settle_s=10) == []
    assert watch.candidates == set() and watch.last_change == {}


async def test_a_topic_of_many_partitions_is_one_metadata_entry(
    cluster: list[Any],
) -> None:
    meta = [b.runtime.groups[META_GROUP].core for b in cluster]
    before = max(core.last_index for core in meta)
    await cluster[0].create_topic("wide", 300, 3, {})
    assert max(core.last_index for core in meta) == before + 1


async def test_an_idle_cluster_of_many_partitions_sends_no_raft_messages(
    cluster: list[Any],
) -> None:
    await cluster[0].create_topic("wide", 200, 3, {})
    total = sum(len(b.runtime.groups) for b in cluster)
    await wait_for(lambda: sum(b.runtime.quiet_groups() for b in cluster) == total, 60)
    sent = [b.runtime.stats["messages_sent"] for b in cluster]
    await asyncio.sleep(0.5)  # ten ticks
    assert [b.runtime.stats["messages_sent"] for b in cluster] == sent


def _linked_group(tmp_path: Path, preferred: int | None = None) -> tuple[Any, Any]:
    """A runtime whose links all count as up, keeping the notices it would send, with one
    group "t~1~0" of nodes 1-3 (`preferred`: the replica it waits for)."""
    runtime = _runtime(tmp_path)
    runtime.transport.alive = lambda peer: True  # type: ignore[method-assign]
    runtime._flush_notices = lambda: None  # type: ignore[method-assign]  # keep them to look at
    storage = RaftStorage(tmp_path / "g")
    extra = () if preferred is None else (preferred,)
    return runtime, runtime.add_group("t~1~0", storage, [1, 2, 3], _Replica(), -1, *extra)


async def test_a_follower_woken_by_its_leaders_link_loss_wakes_the_leader_when_it_returns(
    tmp_path: Path,
) -> None:
    runtime, group = _linked_group(tmp_path, preferred=2)
    group.leader = 2  # a follower of node 2 in a quiet group
    runtime._on_gone(2)
    assert not group.quiet
    runtime._on_link(2, up=True)
    assert ["w", "t~1~0"] in runtime._notices[2]


async def test_followers_woken_by_a_silent_leader_go_quiet_again_when_it_is_heard_again(
    tmp_path: Path,
) -> None:
    runtime, group = _linked_group(tmp_path, preferred=2)
    group.leader = group.core.leader_id = 2  # a follower of node 2 in a quiet group
    runtime._on_gone(2)
    assert runtime.quiet_groups() == 0
    runtime._on_link(2, up=True, revived=True)  # the same connection: node 2 was only silent
    assert runtime.quiet_groups() == 1
    assert runtime._notices[2] == []  # neither its leader nor anything led here is woken


async def test_a_follower_that_moved_on_while_its_leader_was_silent_wakes_the_leader(
    tmp_path: Path,
) -> None:
    runtime, group = _linked_group(tmp_path, preferred=2)
    group.leader = group.core.leader_id = 2
    runtime._on_gone(2)
    group.proposals.append(object())  # type: ignore[arg-type]  # something to feed
    runtime._on_link(2, up=True, revived=True)
    assert runtime.quiet_groups() == 0
    assert ["w", "t~1~0"] in runtime._notices[2]


async def test_a_reconnected_peer_learns_the_leaders_here_and_wakes_their_groups(
    tmp_path: Path,
) -> None:
    runtime, group = _linked_group(tmp_path)
    group.role, group.term, group.quiet = "leader", 4, True  # a quiet group led here
    runtime._active.discard(group.name)
    runtime._on_link(2, up=True, revived=True)
    assert runtime.quiet_groups() == 1 and runtime._notices[2] == []
    runtime._on_link(2, up=True)  # a new connection: node 2 may have restarted
    assert runtime.quiet_groups() == 0
    assert runtime._notices[2] == [["l", "t~1~0", 1, 4]]


def _silent_peer_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Any, list[int], list[int], list[float]]:
    """A transport of node 1 whose tick clock is `clock`, with node 2 last heard at 99.5; the
    lists collect the link-down and the gone events."""
    from unittest import mock

    from raftline.node import transport as transport_module

    downs: list[int] = []
    gone: list[int] = []
    transport = transport_module.Transport(
        1,
        "127.0.0.1:0",
        {2: "x"},
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        lambda p, up, revived: downs.append(p),
        gone.append,
        1.0,
        0.05,
    )
    clock = [100.0]
    monkeypatch.setattr(transport_module.time, "monotonic", lambda: clock[0])
    transport._last_tick = 100.0
    transport._links[2] = transport_module._Link(mock.Mock(), last_heard=99.5)
    return transport, downs, gone, clock


def _ticks(transport: Any, clock: list[float], count: int) -> None:
    for _ in range(count):  # every 50 ms
        clock[0] += 0.05
        transport.tick()


def test_a_node_that_runs_on_time_counts_a_silent_peer_gone_after_the_base_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    transport, downs, gone, clock = _silent_peer_transport(monkeypatch)
    _ticks(transport, clock, 10)  # 1.0 s of silence
    assert downs == gone == []
    _ticks(transport, clock, 2)
    assert downs == gone == [2] and not transport.alive(2)


def test_a_node_that_did_not_run_for_a_while_does_not_declare_its_peers_dead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    transport, downs, gone, clock = _silent_peer_transport(monkeypatch)
    clock[0] = 103.0  # this node's own loop stalled 3 s: the peer's frames wait unread
    transport.tick()
    assert downs == gone == [] and transport.alive(2)


def test_a_node_that_stalled_wakes_a_silent_peers_groups_only_after_the_widened_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    transport, downs, gone, clock = _silent_peer_transport(monkeypatch)
    clock[0] = 103.0  # a 3 s stall: the peer counts as heard until 102.5
    transport.tick()
    _ticks(transport, clock, 22)  # 1.1 s: requests no longer go to the peer
    assert downs == [2] and not transport.alive(2)
    # ... but the groups it leads wake only past the widest window (1 s + 2 s)
    _ticks(transport, clock, 26)
    assert gone == []
    _ticks(transport, clock, 4)
    assert gone == [2]


async def test_started_replicas_are_kept_out_of_the_collectors_scans(cluster: list[Any]) -> None:
    import gc

    frozen = gc.get_freeze_count()
    await cluster[0].create_topic("frozen", 20, 3, {})
    await wait_for(lambda: gc.get_freeze_count() > frozen)


def test_a_long_full_collection_freezes_its_survivors() -> None:
    import gc

    from raftline.node.collector import Collector

    collector = Collector(freeze_after_s=0.0)
    gc.unfreeze()
    collector.install()
    try:
        survivors = [[i] for i in range(1000)]
        gc.collect()
        assert collector.freezes == 1 and collector.collections[2] == 1
        assert gc.get_freeze_count() >= len(survivors)
    finally:
        collector.uninstall()
        gc.unfreeze()


def test_a_short_full_collection_freezes_nothing() -> None:
    import gc

    from raftline.node.collector import Collector

    collector = Collector(freeze_after_s=3600.0)
    gc.unfreeze()
    collector.install()
    try:
        gc.collect()
        assert collector.collections[2] == 1 and collector.freezes == 0
        assert gc.get_freeze_count() == 0
    finally:
        collector.uninstall()


def test_role_changes_past_the_budget_are_counted_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from raftline.node.role_log import RoleLog

    now = [0.0]
    role_log = RoleLog(logging.getLogger("roles"), lines_per_s=3, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="roles"):
        for i in range(10):
            role_log.changed(f"t~1~{i}", "leader" if i % 2 else "follower", 2, 1, 0, 0)
        role_log.flush()  # within the second: nothing more yet
        assert len(caplog.records) == 3
        now[0] = 1.5
        role_log.flush()
    assert len(caplog.records) == 4
    assert caplog.records[-1].getMessage().startswith("7 more Raft role changes")
    assert "(4 to leader here)" in caplog.records[-1].getMessage()


def test_the_groups_of_a_placed_topic_are_named_once_per_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raftline.node.metadata import TopicInfo

    state = _state_with_topic([[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    named = []
    original = TopicInfo.group
    monkeypatch.setattr(TopicInfo, "group", lambda self, p: named.append(p) or original(self, p))
    first = state.groups_of(1)
    assert sorted(p for _, p in first.values()) == [0, 1, 2] and len(named) == 3
    assert state.groups_of(1) == first and len(named) == 3  # the next metadata change
    state.apply({"op": "create_topic", "name": "u", "config": {}, "replicas": [[2, 3, 1]]})
    assert len(state.groups_of(1)) == 4 and len(named) == 4  # only the new topic's


async def test_a_pass_over_all_partitions_lets_the_loop_run_between_slices() -> None:
    from raftline.node.upkeep import in_slices

    others: list[str] = []
    asyncio.get_running_loop().call_soon(others.append, "a timer or a socket read")
    first_after_others = None
    seen = []
    async for item in in_slices(list(range(1000)), size=100):
        seen.append(item)
        if others and first_after_others is None:
            first_after_others = item
    assert seen == list(range(1000))
    assert first_after_others == 100


async def test_a_new_partitions_preferred_replica_stands_without_a_pre_vote_round(
    cluster: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from raftline.raftlog.raft import RaftNode

    stood: list[bool] = []
    original = RaftNode.campaign

    def campaign(self: RaftNode, pre_vote: bool = True) -> None:
        stood.append(pre_vote)
        original(self, pre_vote)

    monkeypatch.setattr(RaftNode, "campaign", campaign)
    await cluster[0].create_topic("fresh", 6, 3, {})
    assert stood == [False] * 6  # one campaign per partition, on its preferred replica


async def test_the_count_of_groups_led_follows_role_changes(cluster: list[Any]) -> None:
    await cluster[0].create_topic("led", 6, 3, {})
    await wait_for(lambda: sum(b.runtime.leading_groups() for b in cluster) == 7)  # and __meta
    for broker in cluster:
        led = [g for g in broker.runtime.groups.values() if g.role == "leader"]
        assert broker.runtime.leading_groups() == len(led)
    moved = next(g for g in cluster[0].runtime.groups.values() if g.role == "leader")
    other = next(p for p in sorted(moved.peers(cluster[0].node_id)))
    cluster[0].runtime.transfer_leadership(moved.name, other)
    await wait_for(lambda: moved.role != "leader")
    assert cluster[0].runtime.leading_groups() == sum(
        g.role == "leader" for g in cluster[0].runtime.groups.values()
    )


async def test_the_http_topic_cache_is_filled_without_asking_partition_leaders() -> None:
    from raftline.api.app import ApiState

    class SettingsOnly:
        async def topic_partition_count(self, name: str) -> int:
            return 2000

        async def topic_settings(self, name: str) -> tuple[int, dict[str, str]]:
            return 2000, {"max.message.bytes": "4096", "compression.type": "zstd"}

        async def describe_topic(self, name: str) -> Any:
            raise AssertionError("describing every partition's offsets, per cache refresh")

    state = ApiState(SettingsOnly(), None)  # type: ignore[arg-type]
    meta = await state.topic_meta("wide")
    assert (meta.partitions, meta.max_message_bytes, meta.compression) == (2000, 4096, "zstd")
