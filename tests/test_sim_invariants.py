"""The simulator's safety checker flags each broken Raft rule it is fed (and accepts legal
histories), independently of any core."""

import pytest

from raftline.raftlog.invariants import Checker, InvariantViolation
from raftline.raftlog.memlog import MemLog
from raftline.raftlog.types import Entry, EntryKind, HardState, SnapshotMeta


def stored(checker: Checker, node: int, log: MemLog, *spec: tuple[int, int, bytes]) -> None:
    batch = [Entry(i, t, data=d) for i, t, d in spec]
    checker.on_removed(node, log.append(batch), "truncation")
    checker.on_append(node, log, batch)


def applied(checker: Checker, node: int, *spec: tuple[int, int, bytes], term: int = 1) -> None:
    for i, t, d in spec:
        checker.on_applied(node, i - 1, Entry(i, t, data=d), term)


def test_the_same_position_with_different_payloads_breaks_log_matching() -> None:
    checker = Checker()
    stored(checker, 1, MemLog(), (0, 1, b"a"))
    with pytest.raises(InvariantViolation, match="log matching"):
        stored(checker, 2, MemLog(), (0, 1, b"b"))


def test_the_same_position_after_different_predecessors_breaks_log_matching() -> None:
    checker = Checker()
    stored(checker, 1, MemLog(), (0, 1, b"a"), (1, 2, b"x"))
    other = MemLog()
    stored(checker, 2, other, (0, 2, b"z"))
    with pytest.raises(InvariantViolation, match="log matching"):
        stored(checker, 2, other, (1, 2, b"x"))


def test_logs_that_agree_pass_the_log_matching_check() -> None:
    checker = Checker()
    stored(checker, 1, MemLog(), (0, 1, b"a"), (1, 2, b"x"))
    other = MemLog()
    stored(checker, 2, other, (0, 1, b"a"))
    stored(checker, 2, other, (1, 2, b"x"))


def test_a_second_leader_in_a_term_is_flagged() -> None:
    checker = Checker()
    checker.on_role(1, "leader", 3)
    checker.on_role(2, "leader", 4)
    with pytest.raises(InvariantViolation, match="two leaders"):
        checker.on_role(2, "leader", 3)


def test_a_vote_sent_before_it_is_durable_is_flagged() -> None:
    with pytest.raises(InvariantViolation, match="before it was durable"):
        Checker().on_vote_granted(2, 5, 1, HardState(term=4, vote=3))


def test_two_durable_votes_in_one_term_are_flagged() -> None:
    checker = Checker()
    checker.on_vote_granted(2, 5, 1, HardState(term=5, vote=1))
    with pytest.raises(InvariantViolation, match="two votes"):
        checker.on_vote_granted(2, 5, 3, HardState(term=5, vote=3))


def test_a_campaign_before_the_self_vote_is_durable_is_flagged() -> None:
    with pytest.raises(InvariantViolation, match="self-vote"):
        Checker().on_campaign(1, 2, HardState(term=1, vote=1))


def test_hard_state_must_not_lower_term_or_commit_or_switch_vote() -> None:
    checker = Checker()
    with pytest.raises(InvariantViolation, match="term regressed"):
        checker.on_hard_state(1, HardState(term=3), HardState(term=2))
    with pytest.raises(InvariantViolation, match="vote changed"):
        checker.on_hard_state(1, HardState(term=3, vote=1), HardState(term=3, vote=2))
    with pytest.raises(InvariantViolation, match="commit index regressed"):
        checker.on_hard_state(1, HardState(term=3, commit=7), HardState(term=3, commit=6))
    checker.on_hard_state(1, HardState(term=3, vote=1, commit=6), HardState(term=4, commit=6))


def test_a_committed_entry_applied_differently_elsewhere_is_flagged() -> None:
    checker = Checker()
    applied(checker, 1, (0, 1, b"a"), (1, 1, b"b"))
    applied(checker, 2, (0, 1, b"a"))
    with pytest.raises(InvariantViolation, match="committed entry changed"):
        checker.on_applied(2, 0, Entry(1, 2, data=b"c"), 2)


def test_applying_out_of_order_is_flagged() -> None:
    with pytest.raises(InvariantViolation, match="out of order"):
        Checker().on_applied(1, -1, Entry(1, 1, data=b"a"), 1)


def test_a_payload_committed_at_two_offsets_is_flagged() -> None:
    checker = Checker()
    with pytest.raises(InvariantViolation, match="committed twice"):
        applied(checker, 1, (0, 1, b"a"), (1, 1, b"a"))


def test_noop_entries_may_share_their_empty_payload() -> None:
    checker = Checker()
    checker.on_applied(1, -1, Entry(0, 1, EntryKind.NOOP), 1)
    checker.on_applied(1, 0, Entry(1, 2, EntryKind.NOOP), 2)
    assert checker.committed_offset() == 1


def test_truncating_a_committed_entry_is_flagged() -> None:
    checker = Checker()
    log = MemLog()
    stored(checker, 1, log, (0, 1, b"a"), (1, 1, b"b"))
    applied(checker, 2, (0, 1, b"a"), (1, 1, b"b"))
    with pytest.raises(InvariantViolation, match="committed entry lost"):
        stored(checker, 1, log, (1, 2, b"c"))


def test_truncating_an_uncommitted_suffix_is_legal() -> None:
    checker = Checker()
    log = MemLog()
    stored(checker, 1, log, (0, 1, b"a"), (1, 1, b"b"))
    applied(checker, 2, (0, 1, b"a"))
    stored(checker, 1, log, (1, 2, b"c"))


def test_a_leader_lacking_an_entry_committed_in_an_earlier_term_is_flagged() -> None:
    checker = Checker()
    applied(checker, 1, (0, 1, b"a"), (1, 1, b"b"), term=1)
    log = MemLog()
    stored(checker, 3, log, (0, 1, b"a"))
    with pytest.raises(InvariantViolation, match="leader completeness"):
        checker.check_leader_complete(3, 2, log)


def test_a_stale_leader_need_not_hold_entries_committed_in_later_terms() -> None:
    checker = Checker()
    applied(checker, 1, (0, 1, b"a"), term=1)
    applied(checker, 1, (1, 1, b"b"), term=3)
    log = MemLog()
    stored(checker, 3, log, (0, 1, b"a"))
    checker.check_leader_complete(3, 2, log)


def test_a_snapshot_beyond_the_committed_prefix_is_flagged() -> None:
    checker = Checker()
    applied(checker, 1, (0, 1, b"a"))
    checker.on_snapshot(2, -1, SnapshotMeta(0, 1, (1,), ()))
    with pytest.raises(InvariantViolation, match="snapshot not committed"):
        checker.on_snapshot(2, -1, SnapshotMeta(1, 1, (1,), ()))


def test_a_read_index_below_an_acknowledged_commit_is_flagged() -> None:
    checker = Checker()
    applied(checker, 1, (0, 1, b"a"), (1, 1, b"b"))
    checker.on_read_request(1, b"r1")
    checker.on_read_request(2, b"r1")  # each node names its own reads
    checker.on_read_state(1, 1, b"r1")
    with pytest.raises(InvariantViolation, match="stale read"):
        checker.on_read_state(2, 0, b"r1")


def test_a_leader_moving_its_commit_to_a_previous_term_entry_is_flagged() -> None:
    checker = Checker()
    checker.on_leader_commit(1, 4, 7, 4)
    with pytest.raises(InvariantViolation, match="previous-term entry committed"):
        checker.on_leader_commit(1, 4, 6, 2)
