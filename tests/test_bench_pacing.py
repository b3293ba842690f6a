"""Latency is measured from each message's intended send time (coordinated-omission safe)."""

import os
import time

import pytest

from bench.pacing import (
    HEADER,
    NS_PER_S,
    STAMP_RESOLUTION_NS,
    FixedRateSchedule,
    Window,
    encode,
    intended_ns_of,
    latency_us,
    payloads,
)
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
    payload = encode(123_456_789, bytes(100))
    assert len(payload) == 100
    assert intended_ns_of(payload) == 123_456_789


def test_a_payload_is_its_padding_after_the_stamp() -> None:
    padding = os.urandom(1000)
    payload = encode(42, padding)
    assert type(payload) is bytes
    assert payload[HEADER.size :] == padding[HEADER.size :]


def test_a_payload_without_header_is_refused() -> None:
    with pytest.raises(ValueError):
        intended_ns_of(b"short")


def test_stamp_groups_never_stamp_a_message_after_its_intended_time() -> None:
    schedule = FixedRateSchedule(start_ns=7, rate=33_333)  # 30 us apart: about 3 per slot
    groups = schedule.stamp_groups(first=5, count=1000)
    stamps = [stamp for stamp, count in groups for _ in range(count)]
    assert len(stamps) == 1000
    for index, stamp in enumerate(stamps, start=5):
        assert 0 <= schedule.intended_ns(index) - stamp <= STAMP_RESOLUTION_NS


def test_stamp_groups_take_one_group_per_slot_at_high_rates() -> None:
    schedule = FixedRateSchedule(start_ns=0, rate=1_000_000)  # 100 messages per 100 us slot
    groups = schedule.stamp_groups(first=0, count=5000)
    assert groups == [(slot * STAMP_RESOLUTION_NS, 100) for slot in range(50)]


def test_stamp_groups_keep_slow_messages_apart() -> None:
    schedule = FixedRateSchedule(start_ns=0, rate=100)  # 10 ms apart: every slot holds one
    groups = schedule.stamp_groups(first=3, count=3)
    assert groups == [(30 * MS, 1), (40 * MS, 1), (50 * MS, 1)]


def test_a_batch_repeats_one_payload_per_stamp_group() -> None:
    batch = payloads([(1 * MS, 3), (2 * MS, 2)], bytes(64))
    assert [intended_ns_of(p) for p in batch] == [MS, MS, MS, 2 * MS, 2 * MS]
    assert {len(p) for p in batch} == {64}
    assert batch[0] is batch[2]  # a reference per message, not a copy


def test_acks_count_toward_the_rate_only_inside_the_window() -> None:
    tally = Tally(Window(start_ns=100 * MS, end_ns=200 * MS))
    tally.on_acked([(50 * MS, 3)], ack_ns=90 * MS)
    tally.on_acked([(150 * MS, 2)], ack_ns=160 * MS)
    assert tally.acked == 5
    assert tally.acked_in_window == 2
    assert tally.publish_latency.total == 2


def test_an_acked_batch_weighs_each_stamp_by_its_message_count() -> None:
    tally = Tally(Window(start_ns=0, end_ns=NS_PER_S))
    tally.on_acked([(10 * MS, 900), (20 * MS, 100)], ack_ns=30 * MS)
    assert tally.acked == 1000
    assert tally.publish_latency.total == 1000
    # 100 messages waited 10 ms, 900 waited 20 ms.
    assert tally.publish_latency.percentile(10) < 10_100  # within the bucket error
    assert tally.publish_latency.percentile(11) == 20_000


def test_late_ack_of_a_message_intended_in_the_window_keeps_its_full_latency() -> None:
    tally = Tally(Window(start_ns=0, end_ns=100 * MS))
    tally.on_acked([(90 * MS, 1)], ack_ns=400 * MS)
    assert tally.acked_in_window == 0
    assert tally.publish_latency.max == 310_000


def test_end_to_end_latency_is_from_the_stamped_intended_time() -> None:
    tally = Tally(Window(start_ns=0, end_ns=2**62))
    intended = 1_000 * MS
    tally.on_delivery([encode(intended, bytes(32)) for _ in range(4)])
    assert tally.received == 4
    assert tally.e2e_latency.total == 4
    assert tally.e2e_latency.min > 0


def test_a_delivery_records_each_distinct_stamp_with_its_count() -> None:
    tally = Tally(Window(start_ns=0, end_ns=2**62))
    now = time.monotonic_ns()
    older, newer = now - 500 * MS, now - 100 * MS
    # Separate bytes objects, as a consumer decodes them, interleaved.
    delivery = [encode(t, bytes(32)) for t in (older, newer, older, older, newer)]
    tally.on_delivery(delivery)
    assert tally.e2e_latency.total == 5
    assert 100_000 <= tally.e2e_latency.percentile(40) < 200_000
    assert tally.e2e_latency.percentile(41) >= 500_000


def test_a_delivery_outside_the_window_counts_no_latency() -> None:
    tally = Tally(Window(start_ns=10 * MS, end_ns=20 * MS))
    tally.on_delivery([encode(5 * MS, bytes(16))] * 3 + [encode(0, bytes(16))])
    assert tally.received == 4
    assert tally.e2e_latency.total == 0


def test_a_delivered_payload_without_header_is_refused() -> None:
    tally = Tally(Window(0, 2**62))
    with pytest.raises(ValueError):
        tally.on_delivery([encode(1, bytes(16)), b"short"])


def test_errors_keep_the_first_message() -> None:
    tally = Tally(Window(0, 1))
    tally.on_error(TimeoutError("first"))
    tally.on_error(RuntimeError("second"))
    assert tally.errors == 2
    assert tally.first_error == "TimeoutError: first"
