"""Asynchronous storage writes: the driver takes further Readys before advancing earlier ones.

Each entry, snapshot and hard state is handed out once; a leader commits on its followers'
acknowledgements while its own write is still under way, but never counts that write early.
"""

from __future__ import annotations

import pytest
from raft_core_harness import Group

from raftline.raftlog.raft import RaftConfig
from raftline.raftlog.types import Entry, Message, MessageType, Ready

APPEND = MessageType.APPEND


def _write(group: Group, node_id: int, rd: Ready) -> None:
    log = group.logs[node_id]
    if rd.entries:
        log.append(rd.entries)
    if rd.hard_state is not None:
        log.save(rd.hard_state)
    log.fsync()


def test_each_entry_is_handed_out_once_while_earlier_readys_are_unwritten() -> None:
    group = Group((1,))
    leader = group.elect(1)
    a = leader.propose(b"a")
    first = leader.ready()
    b = leader.propose(b"b")
    second = leader.ready()
    assert [e.index for e in first.entries] == [a]
    assert [e.index for e in second.entries] == [b]
    assert not leader.has_ready()


def test_an_unchanged_hard_state_is_not_handed_out_again_before_advance() -> None:
    group = Group((1, 2, 3), config=RaftConfig(pre_vote=False))
    node = group[2]
    node.campaign()
    first = node.ready()
    assert first.hard_state is not None and first.must_sync
    node.tick()
    second = node.ready() if node.has_ready() else Ready()
    assert second.hard_state is None and not second.must_sync


def test_readys_advanced_in_order_leave_the_log_persisted_through_the_last() -> None:
    group = Group((1,))
    leader = group.elect(1)
    leader.propose(b"a")
    first = leader.ready()
    last = leader.propose(b"b")
    second = leader.ready()
    for rd in (first, second):
        _write(group, 1, rd)
        leader.advance(rd)
    assert leader.commit_index == last
    assert not leader.ready().entries


def test_leader_commits_on_followers_acks_while_its_own_write_is_under_way() -> None:
    group = Group((1, 2, 3))
    leader = group.elect(1)
    index = leader.propose(b"a")
    unwritten = leader.ready()  # the leader's own write of `a` has not finished
    group.deliver([m for m in unwritten.messages if m.type == APPEND])  # followers write it
    for ack in group.take(MessageType.APPEND_RESP):
        leader.step(ack)
    assert leader.commit_index == index  # followers 2 and 3 hold it durably
    # Handed out to apply in the next Ready, though the leader's own write is not done.
    assert [e.data for e in leader.ready().committed if e.data] == [b"a"]


def test_leader_does_not_count_its_own_unwritten_entries_toward_commit() -> None:
    group = Group((1, 2, 3))
    leader = group.elect(1)
    index = leader.propose(b"a")
    unwritten = leader.ready()
    group.deliver([m for m in unwritten.messages if m.type == APPEND and m.dst == 2])
    group.take(MessageType.APPEND_RESP)  # follower 2's ack is lost
    assert leader.commit_index < index
    _write(group, 1, unwritten)
    leader.advance(unwritten)
    assert leader.commit_index < index  # only the leader holds it: one of three


def test_readys_must_be_advanced_in_the_order_they_were_handed_out() -> None:
    group = Group((1,))
    leader = group.elect(1)
    leader.propose(b"a")
    first = leader.ready()
    leader.propose(b"b")
    second = leader.ready()
    with pytest.raises(ValueError, match="out of order"):
        leader.advance(second)
    leader.advance(first)
    leader.advance(second)


def test_a_truncated_entry_still_being_written_is_replaced_by_the_next_hand_out() -> None:
    group = Group((1, 2, 3))
    follower = group[2]
    old = [Entry(0, 1, data=b"old"), Entry(1, 1, data=b"stale")]
    follower.step(Message(APPEND, 1, 2, 1, log_index=-1, log_term=0, entries=old))
    unwritten = follower.ready()
    assert [e.data for e in unwritten.entries] == [b"old", b"stale"]
    new = [Entry(1, 2, data=b"new")]
    follower.step(Message(APPEND, 3, 2, 2, log_index=0, log_term=1, entries=new))
    replacing = follower.ready()
    assert [(e.index, e.data) for e in replacing.entries] == [(1, b"new")]
    for rd in (unwritten, replacing):
        _write(group, 2, rd)
        follower.advance(rd)
    assert [e.data for e in group.logs[2].all_entries()] == [b"old", b"new"]
    assert follower.term_at(1) == 2
