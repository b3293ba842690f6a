"""Membership rules of the Raft core: learners, one voter change at a time, removal of the leader.

Configurations take effect when their CONFIG entry is appended (Raft thesis, single-server changes).
"""

from __future__ import annotations

import pytest
from raft_core_harness import Group

from raftline.raftlog.membership import Membership
from raftline.raftlog.raft import ConfigChangeError
from raftline.raftlog.types import Entry, EntryKind, HardState, Message, MessageType


def _group_with_spare() -> Group:
    """Voters 1..3 and a node 4 that runs but is not a member yet."""
    return Group((1, 2, 3, 4), voters=(1, 2, 3))


def test_added_learner_receives_the_log_but_does_not_vote() -> None:
    group = _group_with_spare()
    group.elect(1)
    group.propose(1, b"a")
    group[1].propose_membership([1, 2, 3], learners=[4])
    group.stabilize()
    group.tick_all()
    assert group[4].role == "learner"
    assert group.data(4) == [b"a"]
    assert group[1].voters == frozenset({1, 2, 3})


def test_learner_promoted_to_voter_counts_for_commit() -> None:
    group = _group_with_spare()
    leader = group.elect(1)
    leader.propose_membership([1, 2, 3], learners=[4])
    group.stabilize()
    leader.propose_membership([1, 2, 3, 4])
    group.stabilize()
    assert group[4].role == "follower"
    group.isolated = {2, 3}
    index = group.propose(1, b"needs-4")
    assert leader.commit_index < index  # 2 of 4 voters are not a quorum
    group.isolated = {3}
    group.tick(1)
    group.stabilize()
    assert leader.commit_index == index


def test_config_takes_effect_when_appended_not_when_committed() -> None:
    group = _group_with_spare()
    leader = group.elect(1)
    leader.propose_membership([1, 2, 3, 4])
    assert leader.voters == frozenset({1, 2, 3, 4})  # nothing replicated yet
    assert leader.commit_index < leader.last_index


def test_only_one_voter_changes_at_a_time() -> None:
    group = Group((1, 2, 3, 4, 5), voters=(1, 2, 3))
    leader = group.elect(1)
    with pytest.raises(ConfigChangeError):
        leader.propose_membership([1, 2, 3, 4, 5])


def test_second_change_waits_for_the_first_to_commit() -> None:
    group = _group_with_spare()
    leader = group.elect(1)
    leader.propose_membership([1, 2, 3], learners=[4])
    with pytest.raises(ConfigChangeError):
        leader.propose_membership([1, 2, 3, 4])


def test_new_leader_changes_membership_only_after_committing_its_term() -> None:
    group = _group_with_spare()
    group[1].campaign()
    group.stabilize(drop=lambda m: m.type == MessageType.APPEND)
    leader = group[1]
    assert leader.role == "leader" and leader.commit_index == -1
    with pytest.raises(ConfigChangeError):
        leader.propose_membership([1, 2, 3], learners=[4])


def test_removed_leader_steps_down_once_removal_commits() -> None:
    group = Group()
    leader = group.elect(1)
    index = leader.propose_membership([2, 3])
    group.process(1)
    assert leader.role == "leader"  # keeps replicating until the removal commits
    group.stabilize()
    assert leader.commit_index >= index
    assert leader.role == "follower" and leader.leader_id is None


def test_removed_leader_hands_over_to_an_up_to_date_voter() -> None:
    group = Group()
    leader = group.elect(1)
    leader.propose_membership([2, 3])
    group.stabilize()  # no ticks: nobody's election timer fired
    assert {group[2].role, group[3].role} == {"leader", "follower"}
    assert group[2].term == group[3].term == 2


def test_removed_node_does_not_disrupt_the_group() -> None:
    group = Group()
    leader = group.elect(1)
    leader.propose_membership([1, 2])
    group.stabilize()
    for _ in range(5 * group.config.election_ticks):
        group.tick_all()  # node 3 never hears of its removal and keeps pre-voting
    assert (leader.role, leader.term, group[2].term) == ("leader", 1, 1)


def test_truncated_config_entry_reverts_membership() -> None:
    group = Group((1, 2, 3, 4), voters=(1, 2, 3))
    config = Membership.of([1, 2, 3, 4]).encode()
    group.seed(2, [Entry(0, 1), Entry(1, 1, EntryKind.CONFIG, config)], HardState(term=1))
    assert group[2].voters == frozenset({1, 2, 3, 4})  # derived from the log at start
    truncate = Message(MessageType.APPEND, 3, 2, 2, log_index=0, log_term=1,
                       entries=[Entry(1, 2)], commit=0)  # fmt: skip
    group.deliver([truncate])
    assert group[2].voters == frozenset({1, 2, 3})


def test_malformed_config_entry_is_a_clear_error() -> None:
    group = Group()
    bad = Message(MessageType.APPEND, 1, 2, 1, log_index=-1, log_term=0,
                  entries=[Entry(0, 1, EntryKind.CONFIG, b"{not json")])  # fmt: skip
    with pytest.raises(ValueError, match="CONFIG"):
        group[2].step(bad)
