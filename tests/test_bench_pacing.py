"""Latency is measured from each message's intended send time (coordinated-omission safe)."""

import pytest

from bench.pacing import NS_PER_S, FixedRateSchedule, Window, encode, intended_ns_of, latency_us
from bench.tally import Tally

MS = 1_000_000


def test_schedule_spaces_messages_at_the_rate() -> None:
    schedule = FixedRateSchedule(start_ns=5 * NS_PER_S, rate=1000)
    assert schedule.intended_ns(0) == 5 * NS_PER_S
    assert schedule.intended_ns(1000) == 6 * NS_PER_S


def test_nothing_is_due_before_the_start() -> None:
    assert FixedRateSchedule(start_ns=NS_PER_S, rate=100).due(NS_PER_S - 1) == 0


def test_due_counts_every_message_whose_time_has_come() -> None:
    schedule = FixedRateSchedule(start_ns=0, rate=100)  # one message each 10 ms
    assert schedule.due(0) == 1
    assert schedule.due(10 * MS - 1) == 1
    assert schedule.due(10 * MS) == 2
    assert schedule.due(NS_PER_S) == 101


def test_a_stalled_sender_still_owes_latency_for_the_stall() -> None:
    # The sender froze for 100 ms: the 10 messages due meanwhile go out together at 100 ms.
    schedule = FixedRateSchedule(start_ns=0, rate=100)
    sent_at = 100 * MS
    due = schedule.due(sent_at)
    latencies = [latency_us(schedule.intended_ns(i), sent_at) for i in range(due)]
    assert due == 11
    assert max(latencies) == 100_000
    assert sorted(latencies) == [i * 10_000 for i in range(11)]


def test_latency_never_goes_negative() -> None:
    assert latency_us(intended_ns=2_000, observed_ns=1_000) == 0


def test_schedule_needs_a_positive_rate() -> None:
    with pytest.raises(ValueError):
        FixedRateSchedule(start_ns=0, rate=0)


def test_payload_carries_its_intended_send_time_at_full_size() -> None:
    payload = encode(123_456_789, 42, bytes(100))
    assert len(payload) == 100
    assert intended_ns_of(payload) == 123_456_789


def test_a_payload_without_header_is_refused() -> None:
    with pytest.raises(ValueError):
        intended_ns_of(b"short")


def test_acks_count_toward_the_rate_only_inside_the_window() -> None:
    tally = Tally(Window(start_ns=100 * MS, end_ns=200 * MS))
    tally.on_acked([50 * MS] * 3, ack_ns=90 * MS)
    tally.on_acked([150 * MS] * 2, ack_ns=160 * MS)
    assert tally.acked == 5
    assert tally.acked_in_window == 2
    assert tally.publish_latency.total == 2


def test_late_ack_of_a_message_intended_in_the_window_keeps_its_full_latency() -> None:
    tally = Tally(Window(start_ns=0, end_ns=100 * MS))
    tally.on_acked([90 * MS], ack_ns=400 * MS)
    assert tally.acked_in_window == 0
    assert tally.publish_latency.max == 310_000


def test_end_to_end_latency_is_from_the_stamped_intended_time() -> None:
    tally = Tally(Window(start_ns=0, end_ns=2**62))
    intended = 1_000 * MS
    tally.on_delivery([encode(intended, i, bytes(32)) for i in range(4)])
    assert tally.received == 4
    assert tally.e2e_latency.total == 4
    assert tally.e2e_latency.min > 0


def test_errors_keep_the_first_message() -> None:
    tally = Tally(Window(0, 1))
    tally.on_error(TimeoutError("first"))
    tally.on_error(RuntimeError("second"))
    assert tally.errors == 2
    assert tally.first_error == "TimeoutError: first"
