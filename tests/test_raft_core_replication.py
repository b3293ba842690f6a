"""Replication and commit rules of the Raft core: log matching, conflicts, figure 8, flow control.

Each test drives a few RaftNodes by hand-routed messages (no simulator).
"""

from __future__ import annotations

import pytest
from raft_core_harness import Group

from raftline.raftlog.raft import NotLeaderError, RaftConfig
from raftline.raftlog.types import Entry, EntryKind, HardState, Message, MessageType

APPEND = MessageType.APPEND


def _append(src: int, dst: int, term: int, prev: int, prev_term: int, entries: list[Entry],
            commit: int = -1) -> Message:  # fmt: skip
    return Message(APPEND, src, dst, term, log_index=prev, log_term=prev_term, entries=entries,
                   commit=commit)  # fmt: skip


def test_follower_accepts_append_and_acknowledges_its_last_offset() -> None:
    group = Group()
    group.deliver([_append(1, 2, 1, -1, 0, [Entry(0, 1, data=b"abc", count=3)])])
    (resp,) = group.take()
    assert (resp.type, resp.reject, resp.log_index) == (MessageType.APPEND_RESP, False, 2)
    assert group.logs[2].last_index() == 2


def test_follower_rejects_append_with_mismatched_previous_term() -> None:
    group = Group()
    group.seed(2, [Entry(0, 1), Entry(1, 1)], HardState(term=1))
    group.deliver([_append(1, 2, 2, 1, 2, [Entry(2, 2)])])
    (resp,) = group.take()
    assert resp.reject and resp.log_index == 1
    assert group.logs[2].last_index() == 1


def test_follower_rejects_append_beyond_its_log_end() -> None:
    group = Group()
    group.deliver([_append(1, 2, 1, 4, 1, [Entry(5, 1)])])
    (resp,) = group.take()
    assert resp.reject and (resp.reject_hint, resp.hint_term) == (-1, 0)


def test_follower_truncates_conflicting_suffix_only_from_first_conflict() -> None:
    group = Group()
    group.seed(2, [Entry(0, 1), Entry(1, 1), Entry(2, 2), Entry(3, 2)], HardState(term=2))
    group.deliver([_append(1, 2, 3, 0, 1, [Entry(1, 1), Entry(2, 3)])])
    stored = group.logs[2].all_entries()
    assert [(e.index, e.term) for e in stored] == [(0, 1), (1, 1), (2, 3)]


def test_duplicate_append_does_not_truncate_newer_entries() -> None:
    group = Group()
    group.deliver([_append(1, 2, 1, -1, 0, [Entry(0, 1), Entry(1, 1)])])
    group.deliver([_append(1, 2, 1, -1, 0, [Entry(0, 1)])])
    assert group.logs[2].last_index() == 1


def test_follower_commit_is_bounded_by_what_this_append_covers() -> None:
    group = Group()
    group.seed(2, [Entry(0, 1), Entry(1, 1), Entry(2, 1)], HardState(term=1))
    group.deliver([_append(1, 2, 2, 0, 1, [], commit=5)])
    assert group[2].commit_index == 0  # offsets 1..2 may be a stale tail


def test_follower_refuses_to_truncate_committed_entries() -> None:
    group = Group()
    group.seed(2, [Entry(0, 1), Entry(1, 1)], HardState(term=1, commit=1))
    group.deliver([_append(1, 2, 2, 0, 1, [Entry(1, 2)], commit=0)])
    (resp,) = group.take()
    assert (resp.reject, resp.log_index) == (False, 1)  # answers with its commit index
    assert group.logs[2].term_at(1) == 1


def test_leader_does_not_commit_previous_term_entry_by_counting() -> None:
    group = Group(config=RaftConfig(max_append_bytes=1))  # one entry per APPEND
    group.seed(1, [Entry(0, 1, data=b"x"), Entry(1, 2, data=b"old")], HardState(term=2, commit=0))
    for node_id in (2, 3):
        group.seed(node_id, [Entry(0, 1, data=b"x")], HardState(term=2, commit=0))
    leader = group[1]
    leader.campaign()

    def hide_acks_of_own_term_entry(m: Message) -> bool:
        return m.type == MessageType.APPEND_RESP and not m.reject and m.log_index >= 2

    group.stabilize(drop=hide_acks_of_own_term_entry)
    assert leader.role == "leader" and leader.term == 3
    assert leader.progress(2).match == leader.progress(3).match == 1  # offset 1 is on all three
    assert leader.commit_index == 0
    group.tick(1)  # heartbeat round: the acks of the NOOP come through now
    group.stabilize()
    assert leader.commit_index == 2  # the NOOP of term 3 commits offset 1 indirectly


def test_leader_counts_only_its_persisted_entries() -> None:
    group = Group((1,))
    leader = group.elect(1)
    index = leader.propose(b"a")
    rd = leader.ready()
    assert leader.commit_index < index  # the entry is only in the unstable tail
    group.logs[1].append(rd.entries)
    group.logs[1].fsync()
    leader.advance(rd)
    assert leader.commit_index == index


def test_entry_with_count_takes_consecutive_offsets() -> None:
    group = Group()
    group.elect(1)
    first = group.propose(1, b"batch-of-5", count=5)
    second = group.propose(1, b"next")
    assert second == first + 5
    assert group[1].commit_index == second
    stored = group.logs[2].all_entries()
    assert [(e.index, e.last_index) for e in stored][-2:] == [(first, first + 4), (second, second)]


def test_propose_on_follower_names_the_leader() -> None:
    group = Group()
    group.elect(1)
    try:
        group[2].propose(b"x")
    except NotLeaderError as exc:
        assert exc.leader == 1
    else:
        raise AssertionError("a follower accepted a proposal")


def test_reject_hint_skips_whole_conflicting_term_in_one_round_trip() -> None:
    group = Group()
    base = [Entry(0, 1)]
    group.seed(1, base + [Entry(i, 3) for i in range(1, 13)], HardState(term=3, commit=0))
    group.seed(2, base + [Entry(i, 2) for i in range(1, 11)], HardState(term=3, commit=0))
    group.seed(3, base, HardState(term=3, commit=0))
    rejections: list[Message] = []

    def record(m: Message) -> bool:
        if m.type == MessageType.APPEND_RESP and m.reject and m.src == 2:
            rejections.append(m)
        return False

    group[1].campaign()
    group.stabilize(drop=record)
    assert len(rejections) == 1
    assert [e.term for e in group.logs[2].all_entries()] == [1] + [3] * 12 + [4]


def test_heartbeat_carries_commit_bounded_by_match_and_no_entries() -> None:
    group = Group()
    leader = group.elect(1)
    group.isolated = {3}
    group.propose(1, b"a")
    group.tick(1)
    beats = {m.dst: m for m in group.take(MessageType.HEARTBEAT)}
    assert beats[2].commit == leader.commit_index
    assert beats[3].commit == leader.progress(3).match < leader.commit_index
    assert all(not m.entries for m in beats.values())


def test_proposals_are_batched_into_one_append_per_follower() -> None:
    group = Group()
    group.elect(1)
    for i in range(10):
        group[1].propose(b"r%d" % i)
    group.process(1)
    appends = group.take(APPEND)
    assert sorted(m.dst for m in appends) == [2, 3]
    assert all(len(m.entries) == 10 for m in appends)


def test_append_size_is_bounded_by_max_append_bytes() -> None:
    group = Group(config=RaftConfig(max_append_bytes=10))
    group.elect(1)
    for _ in range(6):
        group[1].propose(b"12345")
    group.process(1)
    sizes = [sum(len(e.data) for e in m.entries) for m in group.take(APPEND) if m.dst == 2]
    assert sizes == [10, 10, 10]


def test_pipeline_pauses_at_max_inflight() -> None:
    group = Group(config=RaftConfig(max_append_bytes=1, max_inflight=2))
    group.elect(1)
    for _ in range(5):
        group[1].propose(b"x")
    group.process(1)
    assert len([m for m in group.take(APPEND) if m.dst == 2]) == 2


def test_pipeline_pauses_at_max_inflight_bytes_until_acknowledged() -> None:
    group = Group(config=RaftConfig(max_append_bytes=1, max_inflight_bytes=25))
    group.elect(1)
    for _ in range(5):
        group[1].propose(b"x" * 10)
    group.process(1)
    first = [m for m in group.take(APPEND) if m.dst == 2]
    assert len(first) == 3  # 30 bytes in flight: the third passed the 25-byte window
    group.take()  # node 3's, never answered
    group.deliver(first)  # node 2 acknowledges: the window opens
    group.deliver(group.take(MessageType.APPEND_RESP))
    assert len([m for m in group.take(APPEND) if m.dst == 2]) == 2  # the rest


def test_probing_follower_gets_one_append_at_a_time() -> None:
    group = Group()
    leader = group.elect(1)
    group.isolated = {3}
    group.propose(1, b"a")
    group.take()
    leader.progress(3).become_probe()
    leader.progress(3).next = 1
    for _ in range(3):
        leader.propose(b"b")
        group.process(1)
    assert len([m for m in group.take(APPEND) if m.dst == 3]) == 1


def test_lagging_follower_catches_up_after_rejoining() -> None:
    group = Group()
    group.elect(1)
    group.isolated = {3}
    for i in range(5):
        group.propose(1, b"v%d" % i)
    group.isolated = set()
    group.tick(1)
    group.stabilize()
    assert group.data(3) == group.data(1) == [b"v%d" % i for i in range(5)]


def test_lost_appends_are_resent_after_a_heartbeat() -> None:
    group = Group()
    leader = group.elect(1)
    leader.propose(b"a")
    group.stabilize(drop=lambda m: m.type == APPEND and m.dst == 3)
    assert group[3].last_index < leader.last_index
    group.tick(1)
    group.stabilize()
    assert group[3].last_index == leader.last_index


def test_committed_entries_are_applied_in_order_once() -> None:
    group = Group()
    group.elect(1)
    for i in range(3):
        group.propose(1, b"%d" % i)
    group.tick_all()
    for node_id in (1, 2, 3):
        kinds = [e.kind for e in group.applied[node_id]]
        assert kinds == [EntryKind.NOOP] + [EntryKind.DATA] * 3
        assert group.data(node_id) == [b"0", b"1", b"2"]


def test_restarted_node_relearns_commit_and_applies_each_entry_once() -> None:
    group = Group()
    group.elect(1)
    group.propose(1, b"a")
    group.propose(1, b"b")
    group.tick_all()
    node = group.restart(2)
    assert node.commit_index <= group[1].commit_index  # commit alone is not synced
    group.tick(1)
    group.stabilize()
    assert node.commit_index == group[1].commit_index
    assert group.data(2) == [b"a", b"b"]


def test_commit_index_is_not_synced_on_its_own() -> None:
    group = Group()
    group.deliver([_append(1, 2, 1, -1, 0, [Entry(0, 1)])])
    group[2].step(Message(MessageType.HEARTBEAT, 1, 2, 1, commit=0))
    rd = group[2].ready()
    assert rd.hard_state is not None and rd.hard_state.commit == 0
    assert not rd.must_sync


def test_append_with_a_gap_between_entries_is_a_clear_error() -> None:
    group = Group()
    with pytest.raises(ValueError, match="contiguous"):
        group[2].step(_append(1, 2, 1, -1, 0, [Entry(0, 1, count=2), Entry(3, 1)]))


def test_proposal_data_must_be_bytes() -> None:
    group = Group((1,))
    group.elect(1)
    with pytest.raises(TypeError):
        group[1].propose("text")  # type: ignore[arg-type]


def test_reject_hint_lands_on_an_entry_boundary_of_batched_entries() -> None:
    group = Group()
    batches = [Entry(0, 1, count=4), Entry(4, 2, count=3), Entry(7, 2, count=5)]
    group.seed(2, batches, HardState(term=2))
    group.deliver([_append(1, 2, 3, 20, 1, [Entry(21, 3)])])
    (resp,) = group.take()
    assert (resp.reject_hint, resp.hint_term) == (3, 1)  # last offset of the term-1 batch


def test_leader_probes_from_an_entry_boundary_when_hint_falls_inside_an_older_batch() -> None:
    group = Group()
    group.seed(1, [Entry(0, 1), Entry(1, 1, count=5), Entry(6, 3)], HardState(term=3, commit=0))
    group.seed(2, [Entry(0, 1), Entry(1, 2, count=2)], HardState(term=3, commit=0))
    group.seed(3, [Entry(0, 1)], HardState(term=3, commit=0))
    group.elect(1)  # node 2's hint (offset 2, term 2) lies inside node 1's batch 1..5
    group.tick(1)
    group.stabilize()
    stored = [(e.index, e.term, e.count) for e in group.logs[2].all_entries()]
    assert stored == [(0, 1, 1), (1, 1, 5), (6, 3, 1), (7, 4, 1)]


FIGURE_7_LEADER = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
FIGURE_7_FOLLOWERS = {
    "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],
    "b": [1, 1, 1, 4],
    "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
    "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e": [1, 1, 1, 4, 4, 4, 4],
    "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
}


@pytest.mark.parametrize("case", sorted(FIGURE_7_FOLLOWERS))
def test_new_leader_brings_every_figure_7_follower_log_in_line(case: str) -> None:
    group = Group()
    leader_log = [Entry(i, t) for i, t in enumerate(FIGURE_7_LEADER)]
    group.seed(1, leader_log, HardState(term=7))
    group.seed(2, [Entry(i, t) for i, t in enumerate(FIGURE_7_FOLLOWERS[case])], HardState(term=7))
    group.seed(3, leader_log, HardState(term=7))
    group.elect(1)
    group.tick(1)
    group.stabilize()
    assert [e.term for e in group.logs[2].all_entries()] == [*FIGURE_7_LEADER, 8]
    assert group[2].commit_index == group[1].commit_index == len(FIGURE_7_LEADER)


def test_committed_entries_are_handed_out_once_even_if_ready_repeats() -> None:
    group = Group((1,))
    leader = group.elect(1)
    leader.propose(b"a")
    group.process(1)
    leader.propose(b"b")
    rd = leader.ready()
    group.logs[1].append(rd.entries)
    leader.advance(rd)  # commits b
    first, second = leader.ready(), leader.ready()
    assert [e.data for e in first.committed] == [b"b"]
    assert second.committed == []
