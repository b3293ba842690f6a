"""Read barriers, leadership transfer and snapshot catch-up in the Raft core.

Each test drives a few RaftNodes by hand-routed messages (no simulator).
"""

from __future__ import annotations

import pytest
from raft_core_harness import Group

from raftline.raftlog.raft import NotLeaderError
from raftline.raftlog.types import Message, MessageType


def test_read_index_waits_for_a_commit_of_the_leaders_term() -> None:
    group = Group()
    group[1].campaign()
    group.stabilize(drop=lambda m: m.type == MessageType.APPEND)
    leader = group[1]
    leader.read_index(b"r1")
    group.stabilize(drop=lambda m: m.type == MessageType.APPEND)
    assert group.reads[1] == []
    group.tick(1)  # heartbeat responses let the NOOP through; it commits
    group.stabilize()
    assert [(r.index, r.context) for r in group.reads[1]] == [(leader.commit_index, b"r1")]


def test_read_index_needs_a_quorum_heartbeat_round() -> None:
    group = Group()
    leader = group.elect(1)
    group.isolated = {2, 3}
    leader.read_index(b"r1")
    group.stabilize()
    assert group.reads[1] == []
    group.isolated = {3}
    group.tick(1)
    group.stabilize()
    assert [r.context for r in group.reads[1]] == [b"r1"]


def test_read_index_records_commit_at_request_time() -> None:
    group = Group()
    leader = group.elect(1)
    group.propose(1, b"a")
    at_request = leader.commit_index
    leader.read_index(b"r1")
    leader.propose(b"b")
    group.stabilize()
    assert [r.index for r in group.reads[1]] == [at_request]


def test_confirming_a_later_read_releases_earlier_ones() -> None:
    group = Group()
    leader = group.elect(1)
    leader.read_index(b"r1")
    group.take()
    leader.read_index(b"r2")
    group.stabilize()
    assert [r.context for r in group.reads[1]] == [b"r1", b"r2"]


def test_single_voter_serves_read_index_at_once() -> None:
    group = Group((1,))
    group.elect(1)
    group[1].read_index(b"r1")
    group.process(1)
    assert [r.context for r in group.reads[1]] == [b"r1"]


def test_follower_read_index_is_confirmed_by_the_leader() -> None:
    group = Group()
    leader = group.elect(1)
    group[2].read_index(b"f1")
    group.stabilize()
    assert [(r.index, r.context) for r in group.reads[2]] == [(leader.commit_index, b"f1")]


def test_reads_with_the_same_context_from_different_nodes_are_each_answered() -> None:
    group = Group()
    leader = group.elect(1)
    group[2].read_index(b"r1")
    group[3].read_index(b"r1")
    group.process_all()  # both READ_INDEXes reach the leader and wait there together
    leader.read_index(b"r1")  # the leader's own read, named like theirs
    group.stabilize()
    for node in (1, 2, 3):
        assert [(r.index, r.context) for r in group.reads[node]] == [(leader.commit_index, b"r1")]


def test_read_index_without_known_leader_raises() -> None:
    group = Group()
    with pytest.raises(NotLeaderError):
        group[2].read_index(b"r")


def test_transfer_sends_timeout_now_only_after_target_catches_up() -> None:
    group = Group()
    leader = group.elect(1)
    group.isolated = {3}
    group.propose(1, b"a")
    group.isolated = set()
    leader.transfer_leadership(3)
    group.process(1)
    assert group.take(MessageType.TIMEOUT_NOW) == []
    group.tick(1)
    group.stabilize()
    assert (group[3].role, group[3].term, leader.role) == ("leader", 2, "follower")
    assert group.data(3) == [b"a"]


def test_transfer_target_wins_despite_follower_leases() -> None:
    group = Group()
    leader = group.elect(1)
    leader.transfer_leadership(2)
    group.stabilize()
    assert group[2].role == "leader"
    assert group[3].leader_id == 2


def test_proposals_are_refused_during_transfer() -> None:
    group = Group()
    leader = group.elect(1)
    group.isolated = {2}
    leader.transfer_leadership(2)
    with pytest.raises(NotLeaderError):
        leader.propose(b"x")


def test_stalled_transfer_is_abandoned_after_an_election_timeout() -> None:
    group = Group()
    leader = group.elect(1)
    group.isolated = {2}
    leader.transfer_leadership(2)
    group.tick(1, group.config.election_ticks)
    group.stabilize()
    assert leader.role == "leader"
    leader.propose(b"x")


def _trim(group: Group, node_id: int) -> int:
    """Trim a node's log through what it applied, as the runtime does after a snapshot."""
    node = group[node_id]
    meta = node.snapshot_meta_at(node.applied)
    group.logs[node_id].trim(meta.index, meta.voters, meta.learners)
    node.compact(meta.index)
    return meta.index


def test_follower_behind_trim_point_catches_up_by_snapshot_then_suffix() -> None:
    group = Group()
    leader = group.elect(1)
    group.isolated = {3}
    for i in range(5):
        group.propose(1, b"v%d" % i)
    trimmed = _trim(group, 1)
    group.propose(1, b"after")
    group.isolated = set()
    snapshots: list[int] = []

    def record_snapshots(m: Message) -> bool:
        if m.snapshot is not None:
            snapshots.append(m.snapshot.index)
        return False

    group.tick(1)
    group.stabilize(drop=record_snapshots)
    assert snapshots == [trimmed]
    assert group.logs[3].snapshot_meta().index == trimmed
    assert group.logs[3].snapshot_meta().index == trimmed
    assert group[3].last_index == leader.last_index
    assert group.data(3) == [b"after"]  # everything before came with the snapshot
    assert group[3].voters == frozenset({1, 2, 3})


def test_lost_snapshot_is_sent_again() -> None:
    group = Group()
    leader = group.elect(1)
    group.isolated = {3}
    group.propose(1, b"a")
    _trim(group, 1)
    group.isolated = set()
    group.tick(1)
    group.stabilize(drop=lambda m: m.type == MessageType.SNAPSHOT)
    for _ in range(3 * group.config.election_ticks):
        group.tick(1)
        group.stabilize()
    assert group[3].last_index == leader.last_index


def test_compacting_beyond_applied_is_refused() -> None:
    group = Group()
    leader = group.elect(1)
    with pytest.raises(ValueError):
        leader.compact(leader.applied + 1)
