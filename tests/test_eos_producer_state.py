"""Producer state of one partition: each sequence, epoch and transaction rule, one per test."""

from __future__ import annotations

from raftline.node.eos.markers import SEQUENCE_MODULUS, BatchMeta, marker_meta
from raftline.node.eos.producer_state import Outcome, ProducerStateMachine, Verdict


def data(
    pid: int, epoch: int, seq: int, count: int = 1, txn: bool = False, ts: int = 0
) -> BatchMeta:
    return BatchMeta(pid, epoch, seq, count - 1, is_transactional=txn, max_timestamp=ts)


def marker(pid: int, epoch: int, commit: bool, coordinator_epoch: int = 0) -> BatchMeta:
    return marker_meta(
        commit,
        producer_id=pid,
        producer_epoch=epoch,
        coordinator_epoch=coordinator_epoch,
        timestamp=0,
    )


def applied(*batches: BatchMeta) -> ProducerStateMachine:
    state = ProducerStateMachine()
    for meta in batches:
        assert state.apply_batch(state.next_offset, meta).accepted
    return state


def test_an_unknown_producer_may_start_at_any_sequence() -> None:
    assert ProducerStateMachine().check(data(7, 3, 1234)).accepted


def test_a_retry_of_any_of_the_last_five_batches_gets_its_original_offsets() -> None:
    state = applied(*(data(7, 0, 2 * i, 2) for i in range(6)))
    assert state.check(data(7, 0, 2, 2)) == Verdict(Outcome.DUPLICATE, 2, 3)
    assert state.check(data(7, 0, 10, 2)) == Verdict(Outcome.DUPLICATE, 10, 11)
    assert state.check(data(7, 0, 0, 2)).outcome is Outcome.OUT_OF_ORDER  # left the window


def test_a_gap_in_sequence_is_out_of_order() -> None:
    state = applied(data(7, 0, 0, 3))
    assert state.check(data(7, 0, 4)).outcome is Outcome.OUT_OF_ORDER
    assert state.check(data(7, 0, 3)).accepted


def test_sequences_wrap_after_the_largest_int32() -> None:
    state = applied(data(7, 0, SEQUENCE_MODULUS - 2, 3))  # sequences 2**31-2, 2**31-1, 0
    assert state.check(data(7, 0, 1)).accepted


def test_an_older_epoch_is_fenced() -> None:
    state = applied(data(7, 2, 0))
    assert state.check(data(7, 1, 1)).outcome is Outcome.FENCED


def test_a_new_epoch_must_start_at_sequence_zero() -> None:
    state = applied(data(7, 0, 0))
    assert state.check(data(7, 1, 1)).outcome is Outcome.OUT_OF_ORDER
    assert state.check(data(7, 1, 0)).accepted


def test_a_retry_of_a_batch_in_flight_waits_for_the_original() -> None:
    state = ProducerStateMachine()
    assert state.check(data(7, 0, 0, 2)).accepted
    assert state.check(data(7, 0, 0, 2)) == Verdict(Outcome.IN_FLIGHT, key=(7, 0, 0))
    assert state.check(data(7, 0, 2)).accepted  # the next one pipelines behind it
    state.apply_batch(0, data(7, 0, 0, 2))
    assert state.check(data(7, 0, 0, 2)) == Verdict(Outcome.DUPLICATE, 0, 1)
    assert state.in_flight(7) == [(7, 0, 2)]


def test_a_term_change_forgets_batches_in_flight_so_their_retries_are_new_again() -> None:
    state = ProducerStateMachine()
    assert state.check(data(7, 0, 0)).accepted
    state.clear_in_flight()
    assert state.check(data(7, 0, 0)).accepted


def test_the_in_flight_view_never_answers_a_read_or_the_lso() -> None:
    state = applied(data(-1, -1, -1, 3))
    assert state.check(data(7, 0, 0, txn=True), verified=True).accepted
    assert state.last_stable_offset(3) == 3
    assert state.producers == {}


def test_a_committed_duplicate_changes_nothing_and_says_so() -> None:
    state = applied(data(7, 0, 0))
    before = state.snapshot()
    assert state.apply_batch(1, data(7, 0, 0)) == Verdict(Outcome.DUPLICATE, 0, 0)
    assert state.snapshot()["producers"] == before["producers"]


def test_a_transactional_write_needs_the_coordinators_word_to_start_a_transaction_here() -> None:
    state = ProducerStateMachine()
    assert state.check(data(7, 0, 0, txn=True)).outcome is Outcome.NEEDS_VERIFICATION
    assert state.check(data(7, 0, 0, txn=True), verified=True).accepted
    assert state.check(data(7, 0, 1, txn=True)).accepted  # joins the open transaction


def test_a_late_write_of_an_ended_transaction_never_joins_the_next_one() -> None:
    """Jepsen's Bufstream find: T1's delayed produce must not land in T2 of the same producer."""
    state = applied(data(7, 0, 0, txn=True), marker(7, 1, commit=True), data(7, 1, 0, txn=True))
    assert state.check(data(7, 0, 1, txn=True), verified=True).outcome is Outcome.FENCED


def test_a_write_of_a_newer_epoch_cannot_join_the_transaction_still_open_here() -> None:
    state = applied(data(7, 0, 0, txn=True))
    assert state.check(data(7, 1, 0, txn=True), verified=True).outcome is Outcome.INVALID_TXN_STATE


def test_a_plain_write_cannot_land_inside_its_producers_open_transaction() -> None:
    state = applied(data(7, 0, 0, txn=True))
    assert state.check(data(7, 0, 1)).outcome is Outcome.INVALID_TXN_STATE


def test_an_abort_marker_ends_the_transaction_and_records_its_span() -> None:
    state = applied(data(-1, -1, -1), data(7, 0, 0, 2, txn=True), data(-1, -1, -1))
    verdict = state.apply_batch(state.next_offset, marker(7, 1, False))
    assert state.last_stable_offset(10) == state.next_offset == 5
    assert verdict.aborted is not None and tuple(verdict.aborted) == (7, 1, 4)


def test_a_marker_bumps_the_epoch_so_sequences_restart_at_zero() -> None:
    state = applied(data(7, 0, 0, 3, txn=True), marker(7, 1, True))
    assert state.check(data(7, 1, 3)).outcome is Outcome.OUT_OF_ORDER
    assert state.check(data(7, 1, 0)).accepted


def test_a_marker_of_an_older_epoch_or_coordinator_is_refused() -> None:
    state = applied(marker(7, 3, True, coordinator_epoch=5))
    assert state.check(marker(7, 2, False, coordinator_epoch=6)).outcome is Outcome.FENCED
    assert state.check(marker(7, 3, False, coordinator_epoch=4)).outcome is (
        Outcome.COORDINATOR_FENCED
    )


def test_a_late_resent_marker_never_ends_the_next_transaction() -> None:
    """Found by the transactions model: T1's abort marker, resent by the coordinator, arrived
    after T2 (at the epoch T1's decision bumped to) had opened on the partition."""
    state = applied(data(7, 0, 0, txn=True), marker(7, 1, False), data(7, 1, 0, txn=True))
    assert state.check(marker(7, 1, False)).outcome is Outcome.FENCED
    assert state.last_stable_offset(10) == 2
    assert state.check(marker(7, 2, True)).accepted


def test_a_repeated_marker_with_no_transaction_open_changes_nothing() -> None:
    state = applied(data(7, 0, 0, txn=True), marker(7, 1, False))
    before = state.snapshot()
    repeated = state.apply_batch(state.next_offset, marker(7, 1, False))
    assert repeated.accepted and repeated.aborted is None
    assert state.snapshot()["producers"] == before["producers"]


def test_idle_producers_without_open_transactions_expire_and_become_unknown() -> None:
    state = applied(data(7, 0, 0, ts=100), data(8, 0, 0, txn=True, ts=100), data(9, 0, 0, ts=500))
    assert state.expire(now_ms=1100, producer_expiry_ms=1000) == [7]
    assert state.check(data(7, 0, 40)).accepted  # unknown again: any sequence
    assert state.check(data(8, 0, 1, txn=True)).accepted


def test_batches_of_producers_without_idempotence_pass_untouched() -> None:
    state = ProducerStateMachine()
    assert state.check(data(-1, -1, -1, 4)).accepted
    assert state.apply_batch(0, data(-1, -1, -1, 4)).accepted
    assert state.next_offset == 4 and state.producers == {}
