"""Election rules of the Raft core: pre-vote, votes, terms, check-quorum and leader leases.

Each test drives a few RaftNodes by hand-routed messages (no simulator).
"""

from __future__ import annotations

from raft_core_harness import Group, fresh

from raftline.raftlog.raft import RaftConfig
from raftline.raftlog.types import Entry, HardState, Message, MessageType

NO_PREVOTE = RaftConfig(pre_vote=False)


def test_single_node_becomes_leader_and_commits() -> None:
    group = Group((1,))
    leader = group.elect(1)
    index = group.propose(1, b"a")
    assert leader.term == 1
    assert leader.commit_index == index
    assert group.data(1) == [b"a"]


def test_three_nodes_elect_one_leader_and_agree_on_term() -> None:
    group = Group()
    group.elect(1)
    assert [group[i].role for i in (1, 2, 3)] == ["leader", "follower", "follower"]
    assert {group[i].term for i in (1, 2, 3)} == {1}
    assert {group[i].leader_id for i in (1, 2, 3)} == {1}


def test_pre_vote_does_not_change_term_or_vote() -> None:
    group = Group()
    group[1].campaign()
    group.process(1)
    assert group[1].role == "pre_candidate"
    pre_votes = group.take(MessageType.PRE_VOTE)
    assert {m.term for m in pre_votes} == {1}  # asks about the next term...
    group.deliver(pre_votes)
    for node_id in (1, 2, 3):
        assert group[node_id].term == 0  # ...without anyone moving to it
        assert group.logs[node_id].hard_state == HardState()


def test_campaign_votes_leave_only_with_persisted_term_and_vote() -> None:
    node = fresh(1, [1, 2, 3], NO_PREVOTE)
    node.campaign()
    rd = node.ready()
    assert [m.type for m in rd.messages] == [MessageType.VOTE, MessageType.VOTE]
    assert rd.hard_state is not None and (rd.hard_state.term, rd.hard_state.vote) == (1, 1)
    assert rd.must_sync


def test_vote_grant_leaves_only_with_persisted_vote() -> None:
    voter = fresh(2, [1, 2, 3])
    voter.step(Message(MessageType.VOTE, 1, 2, term=1, log_index=-1, log_term=0))
    rd = voter.ready()
    assert [(m.type, m.reject) for m in rd.messages] == [(MessageType.VOTE_RESP, False)]
    assert rd.hard_state is not None and (rd.hard_state.term, rd.hard_state.vote) == (1, 1)
    assert rd.must_sync


def test_node_votes_once_per_term() -> None:
    voter = fresh(3, [1, 2, 3])
    voter.step(Message(MessageType.VOTE, 1, 3, term=1, log_index=-1, log_term=0))
    voter.step(Message(MessageType.VOTE, 2, 3, term=1, log_index=-1, log_term=0))
    replies = voter.ready().messages
    assert [(m.dst, m.reject) for m in replies] == [(1, False), (2, True)]


def test_vote_survives_restart() -> None:
    group = Group(config=NO_PREVOTE)
    group.deliver([Message(MessageType.VOTE, 1, 3, term=1, log_index=-1, log_term=0)])
    group.take()
    node = group.restart(3)
    assert (node.term, node.vote) == (1, 1)
    node.step(Message(MessageType.VOTE, 2, 3, term=1, log_index=-1, log_term=0))
    assert node.ready().messages[0].reject


def test_voter_refuses_candidate_with_shorter_log() -> None:
    group = Group(config=NO_PREVOTE)
    group.seed(3, [Entry(0, 1), Entry(1, 1)], HardState(term=1))
    group.deliver([Message(MessageType.VOTE, 1, 3, term=2, log_index=0, log_term=1)])
    assert group.take()[0].reject


def test_voter_refuses_candidate_whose_last_term_is_older() -> None:
    group = Group(config=NO_PREVOTE)
    group.seed(3, [Entry(0, 2)], HardState(term=2))
    group.deliver([Message(MessageType.VOTE, 1, 3, term=3, log_index=5, log_term=1)])
    assert group.take()[0].reject


def test_candidate_does_not_count_vote_from_stale_term() -> None:
    group = Group(config=NO_PREVOTE)
    group[1].campaign()  # term 1
    group.process(1)
    group.take()
    group[1].campaign()  # term 2
    group.process(1)
    group.take()
    group.deliver([Message(MessageType.VOTE_RESP, 2, 1, term=1)])
    assert group[1].role == "candidate"
    group.deliver([Message(MessageType.VOTE_RESP, 2, 1, term=2)])
    assert group[1].role == "leader"


def test_candidate_steps_down_when_a_majority_refuses() -> None:
    group = Group(config=NO_PREVOTE)
    group[1].campaign()
    group.process(1)
    group.take()
    group.deliver([Message(MessageType.VOTE_RESP, 2, 1, term=1, reject=True)])
    assert group[1].role == "candidate"
    group.deliver([Message(MessageType.VOTE_RESP, 3, 1, term=1, reject=True)])
    assert group[1].role == "follower"


def test_candidate_follows_same_term_leader() -> None:
    group = Group(config=NO_PREVOTE)
    group[2].campaign()  # term 1, never delivered
    group.process(2)
    group.take()
    group.deliver([Message(MessageType.HEARTBEAT, 1, 2, term=1, commit=-1)])
    assert (group[2].role, group[2].leader_id, group[2].term) == ("follower", 1, 1)


def test_pre_candidate_forgets_its_leader() -> None:
    group = Group()
    group.elect(1)
    group.isolated = {1}
    group.tick(2, 2 * group.config.election_ticks)
    assert group[2].role == "pre_candidate"
    assert group[2].leader_id is None


def test_followers_in_lease_ignore_pre_votes_of_rejoining_node() -> None:
    group = Group()
    group.elect(1)
    group.isolated = {3}
    group.tick(3, 4 * group.config.election_ticks)  # its pre-votes go nowhere
    assert group[3].term == 1
    group.isolated = set()
    pre_votes = group.take(MessageType.PRE_VOTE, src=3)
    assert pre_votes and {m.term for m in pre_votes} == {2}
    group.deliver(pre_votes)
    assert group.take(MessageType.PRE_VOTE_RESP) == []  # ignored, not even refused
    assert (group[1].role, group[1].term, group[2].term) == ("leader", 1, 1)


def test_rejoining_node_follows_the_leader_again() -> None:
    group = Group()
    group.elect(1)
    group.isolated = {3}
    group.tick(3, 4 * group.config.election_ticks)
    group.isolated = set()
    group.inflight.clear()
    group.tick(1)  # heartbeat
    group.stabilize()
    assert (group[3].role, group[3].leader_id, group[1].role) == ("follower", 1, "leader")


def test_followers_grant_pre_votes_after_leader_silence() -> None:
    group = Group()
    group.elect(1)
    group.isolated = {1}
    group.tick(3, group.config.election_ticks)  # lease over on node 3
    group.tick(2, 2 * group.config.election_ticks)  # node 2 campaigns
    group.stabilize()
    assert group[2].role == "leader" or group[3].role == "leader"
    assert max(group[2].term, group[3].term) == 2


def test_leader_steps_down_without_quorum_contact() -> None:
    group = Group()
    leader = group.elect(1)
    group.isolated = {2, 3}
    group.tick(1, group.config.election_ticks)  # contact from the election still counts
    assert leader.role == "leader"
    group.tick(1, group.config.election_ticks)
    assert leader.role == "follower"
    assert leader.leader_id is None
    assert leader.term == 1


def test_leader_keeps_leading_with_quorum_contact() -> None:
    group = Group()
    leader = group.elect(1)
    group.isolated = {3}
    for _ in range(3 * group.config.election_ticks):
        group.tick(1)
        group.stabilize()
    assert leader.role == "leader"


def test_stale_leader_learns_new_term_from_append_response() -> None:
    group = Group()
    old = group.elect(1)
    group.isolated = {1}
    group.tick(3, group.config.election_ticks)  # lease over on node 3
    group.tick(2, 2 * group.config.election_ticks)
    group.stabilize()
    assert group[2].role == "leader" and group[2].term == 2
    group.isolated = set()
    group.inflight.clear()
    group.tick(1)  # old leader's heartbeat
    group.stabilize()
    assert (old.role, old.term, old.leader_id) == ("follower", 2, None)


def test_learner_never_campaigns() -> None:
    group = Group((1, 2, 3, 4), learners=(4,))
    group.tick(4, 5 * group.config.election_ticks)
    assert group[4].role == "learner"
    assert group.inflight == []


def test_pre_vote_grant_for_another_term_is_not_counted() -> None:
    group = Group()
    group[1].campaign()
    group.process(1)
    ask = group.take(MessageType.PRE_VOTE)[0]
    group.deliver([Message(MessageType.PRE_VOTE_RESP, 2, 1, term=5, context=ask.context)])
    assert (group[1].role, group[1].term) == ("pre_candidate", 0)
    group.deliver([Message(MessageType.PRE_VOTE_RESP, 2, 1, term=1, context=ask.context)])
    assert (group[1].role, group[1].term) == ("candidate", 1)


def test_delayed_grant_from_an_earlier_pre_election_is_not_counted() -> None:
    group = Group()
    group[1].campaign()
    group.process(1)
    group.deliver(group.take(MessageType.PRE_VOTE, src=1)[:1])
    delayed = group.take(MessageType.PRE_VOTE_RESP)
    assert delayed and not delayed[0].reject
    group[1].campaign()  # a second pre-election for the same term
    group.process(1)
    group.take()
    group.deliver(delayed)
    assert group[1].role == "pre_candidate"


def test_leader_ignores_higher_term_vote_while_its_lease_holds() -> None:
    group = Group(config=NO_PREVOTE)
    leader = group.elect(1)
    group.deliver([Message(MessageType.VOTE, 3, 1, term=7, log_index=9, log_term=1)])
    assert (leader.role, leader.term) == ("leader", 1)


def test_learner_contact_does_not_keep_a_leader_in_office() -> None:
    group = Group((1, 2, 3, 4), learners=(4,))
    leader = group.elect(1)
    group.isolated = {2, 3}
    for _ in range(2 * group.config.election_ticks):
        group.tick(1)
        group.stabilize()  # the learner keeps answering heartbeats
    assert leader.role == "follower"


def test_a_campaign_without_pre_vote_asks_for_votes_at_once() -> None:
    node = fresh(1, [1, 2, 3])  # pre-vote configured
    node.campaign(pre_vote=False)
    assert node.role == "candidate" and node.term == 1
    assert [m.type for m in node.ready().messages] == [MessageType.VOTE, MessageType.VOTE]
