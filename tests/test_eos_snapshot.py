"""Snapshots: restoring one and replaying the tail equals applying the whole log."""

from __future__ import annotations

import json

from eos_models import LoggedBatch, transactional_logs
from hypothesis import given, settings
from hypothesis import strategies as st

from raftline.node.eos.producer_state import ProducerStateMachine
from raftline.node.eos.txn_coordinator import TxnCoordinator


def replayed_from_snapshot(
    state_class: type[ProducerStateMachine], log: list[LoggedBatch], cut: int, high_watermark: int
) -> list[object]:
    """What a replica that restarted at `cut` answers, next to one that never stopped."""
    whole = state_class()
    for b in log:
        whole.apply_batch(b.base_offset, b.meta)
    head = state_class()
    for b in log[:cut]:
        head.apply_batch(b.base_offset, b.meta)
    restarted = state_class.restore(json.loads(json.dumps(head.snapshot())))
    for b in log[cut:]:
        restarted.apply_batch(b.base_offset, b.meta)
    return [
        (whole.snapshot(), restarted.snapshot()),
        (whole.last_stable_offset(high_watermark), restarted.last_stable_offset(high_watermark)),
    ]


def check_restart(
    state_class: type[ProducerStateMachine], log: list[LoggedBatch], cut: int, high_watermark: int
) -> None:
    for whole, restarted in replayed_from_snapshot(state_class, log, cut, high_watermark):
        assert whole == restarted


@settings(max_examples=200, deadline=None)
@given(log=transactional_logs(), data=st.data())
def test_restoring_a_snapshot_and_replaying_the_tail_equals_applying_everything(
    log: list[LoggedBatch], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(log)))
    check_restart(ProducerStateMachine, log, cut, data.draw(st.integers(0, 200)))


def test_a_restored_state_judges_retries_as_the_original_did() -> None:
    from raftline.node.eos.markers import BatchMeta
    from raftline.node.eos.producer_state import Outcome

    state = ProducerStateMachine()
    state.apply_batch(0, BatchMeta(4, 2, 10, 2))
    restored = ProducerStateMachine.restore(json.loads(json.dumps(state.snapshot())))
    assert restored.check(BatchMeta(4, 2, 10, 2)).outcome is Outcome.DUPLICATE
    assert restored.check(BatchMeta(4, 1, 13, 0)).outcome is Outcome.FENCED
    assert restored.check(BatchMeta(4, 2, 14, 0)).outcome is Outcome.OUT_OF_ORDER


commands = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(
                [
                    "init_producer",
                    "add_partitions",
                    "add_offsets",
                    "end_txn",
                    "markers_written",
                    "abort_expired",
                ]
            ),
            "transactional_id": st.sampled_from(["a", "b"]),
            "producer_id": st.integers(1000, 1002),
            "producer_epoch": st.integers(0, 4),
            "commit": st.booleans(),
            "partitions": st.lists(st.tuples(st.sampled_from("tu"), st.integers(0, 2)), max_size=2),
            "group": st.sampled_from(["g1", "g2"]),
            "offsets": st.lists(
                st.tuples(st.sampled_from("tu"), st.integers(0, 2), st.integers(0, 99)), max_size=2
            ),
            "timeout_ms": st.just(50),
            "now_ms": st.integers(0, 200),
        }
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(log=commands, data=st.data())
def test_a_coordinator_restored_from_a_snapshot_answers_the_tail_as_one_that_never_stopped(
    log: list[dict[str, object]], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(log)))
    whole, head = TxnCoordinator(), TxnCoordinator()
    for c in (whole, head):
        c.apply({"type": "producer_ids", "first": 1000, "count": 3})
    answers = [whole.apply(cmd) for cmd in log]
    for cmd in log[:cut]:
        head.apply(cmd)
    restarted = TxnCoordinator.restore(json.loads(json.dumps(head.snapshot())))
    assert [restarted.apply(cmd) for cmd in log[cut:]] == answers[cut:]
    assert restarted.snapshot() == whole.snapshot()
    assert restarted.pending_markers() == whole.pending_markers()
