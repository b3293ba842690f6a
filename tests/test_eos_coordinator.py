"""The transaction coordinator and producer id allocation: each rule, one per test."""

from __future__ import annotations

import pytest

from raftline.node.eos.producer_ids import IdBlocks, ProducerIdAllocator, ProducerIdsExhausted
from raftline.node.eos.txn_coordinator import (
    EPOCH_MAX,
    TxnCoordinator,
    TxnResult,
    TxnState,
    shard_for,
)


class Shard:
    """A coordinator with a block of ids and terse commands for one transactional id."""

    def __init__(self) -> None:
        self.c = TxnCoordinator()
        self.c.apply({"type": "producer_ids", "first": 100, "count": 10})
        self.now = 0

    def do(self, kind: str, **fields: object) -> TxnResult:
        return self.c.apply({"type": kind, "transactional_id": "tx", "now_ms": self.now, **fields})

    def init(self) -> tuple[int, int]:
        r = self.do("init_producer", timeout_ms=1000)
        assert r.ok, r
        return r.producer_id, r.producer_epoch  # type: ignore[return-value]

    def add(self, pid: int, epoch: int, *parts: tuple[str, int]) -> TxnResult:
        return self.do(
            "add_partitions", producer_id=pid, producer_epoch=epoch, partitions=list(parts)
        )

    def end(self, pid: int, epoch: int, commit: bool) -> TxnResult:
        return self.do("end_txn", producer_id=pid, producer_epoch=epoch, commit=commit)

    def state(self) -> TxnState:
        return self.c.txns["tx"].state


def test_a_new_transactional_id_gets_a_fresh_producer_id_at_epoch_zero() -> None:
    assert Shard().init() == (100, 0)


def test_init_producer_bumps_the_epoch_and_fences_the_earlier_one() -> None:
    s = Shard()
    pid, old = s.init()
    assert s.init() == (pid, old + 1)
    assert s.add(pid, old, ("t", 0)).error == "producer_fenced"


def test_init_producer_aborts_the_open_transaction_of_the_fenced_epoch() -> None:
    s = Shard()
    pid, epoch = s.init()
    s.add(pid, epoch, ("t", 0), ("t", 1))
    r = s.do("init_producer", timeout_ms=1000)
    assert r.markers is not None and not r.markers.commit
    assert r.markers.partitions == (("t", 0), ("t", 1))
    assert r.markers.producer_epoch == r.producer_epoch == epoch + 1
    assert s.end(pid, epoch, commit=True).error == "producer_fenced"


def test_produce_opens_the_transaction_implicitly() -> None:
    s = Shard()
    pid, epoch = s.init()
    assert s.add(pid, epoch, ("t", 0)).ok
    assert s.state() is TxnState.ONGOING


def test_the_decision_is_durable_before_markers_and_completes_when_they_are_written() -> None:
    s = Shard()
    pid, epoch = s.init()
    s.add(pid, epoch, ("t", 0))
    r = s.end(pid, epoch, commit=True)
    assert s.state() is TxnState.PREPARE_COMMIT
    assert s.c.pending_markers() == [r.markers]
    assert s.do("markers_written", producer_epoch=r.producer_epoch).ok
    assert s.state() is TxnState.COMPLETE_COMMIT and s.c.pending_markers() == []


def test_a_restarted_coordinator_still_lists_every_undelivered_decision() -> None:
    s = Shard()
    pid, epoch = s.init()
    s.add(pid, epoch, ("t", 0))
    r = s.end(pid, epoch, commit=False)
    assert TxnCoordinator.restore(s.c.snapshot()).pending_markers() == [r.markers]


def test_every_transaction_end_bumps_the_epoch_for_the_next_one() -> None:
    s = Shard()
    pid, epoch = s.init()
    s.add(pid, epoch, ("t", 0))
    r = s.end(pid, epoch, commit=True)
    assert (r.producer_id, r.producer_epoch) == (pid, epoch + 1)
    s.do("markers_written", producer_epoch=epoch + 1)
    assert s.add(pid, epoch + 1, ("t", 0)).ok
    assert s.add(pid, epoch, ("t", 0)).error == "producer_fenced"


def test_a_retried_end_gets_the_same_answer_and_a_changed_decision_is_refused() -> None:
    s = Shard()
    pid, epoch = s.init()
    s.add(pid, epoch, ("t", 0))
    first = s.end(pid, epoch, commit=True)
    again = s.end(pid, epoch, commit=True)
    assert again.ok and (again.producer_id, again.producer_epoch) == (pid, epoch + 1)
    assert again.markers is None  # the decision is not made twice
    assert s.end(pid, epoch, commit=False).error == "invalid_txn_state"
    assert first.markers is not None


def test_requests_during_a_pending_decision_wait() -> None:
    s = Shard()
    pid, epoch = s.init()
    s.add(pid, epoch, ("t", 0))
    s.end(pid, epoch, commit=True)
    assert s.add(pid, epoch + 1, ("t", 0)).error == "concurrent_transactions"
    assert s.do("init_producer", timeout_ms=5).error == "concurrent_transactions"


def test_transactional_offsets_reach_the_group_only_with_a_commit() -> None:
    s = Shard()
    pid, epoch = s.init()
    offsets = {"producer_id": pid, "group": "g", "offsets": [["in", 0, 41]]}
    s.do("add_offsets", producer_epoch=epoch, **offsets)
    committed = s.end(pid, epoch, commit=True).markers
    assert committed is not None and committed.offsets == (("g", ("in", 0), 41),)
    s.do("markers_written", producer_epoch=epoch + 1)
    s.do("add_offsets", producer_epoch=epoch + 1, **offsets)
    aborted = s.end(pid, epoch + 1, commit=False).markers
    assert aborted is not None and aborted.offsets == ()


def test_a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced() -> None:
    s = Shard()
    pid, epoch = s.init()
    s.add(pid, epoch, ("t", 0))
    s.now = 999
    assert s.c.expire(999) == []
    s.now = 1000
    assert s.c.expire(1000) == [("tx", pid, epoch)]
    r = s.do("abort_expired", producer_id=pid, producer_epoch=epoch)
    assert r.markers is not None and not r.markers.commit
    assert s.end(pid, epoch, commit=True).error == "producer_fenced"


def test_an_abort_of_an_expired_transaction_that_moved_on_is_ignored() -> None:
    s = Shard()
    pid, epoch = s.init()
    s.add(pid, epoch, ("t", 0))
    s.end(pid, epoch, commit=True)
    s.now = 5000
    assert s.do("abort_expired", producer_id=pid, producer_epoch=epoch).error == "not_expired"
    assert s.state() is TxnState.PREPARE_COMMIT


def test_an_exhausted_epoch_moves_to_a_fresh_producer_id() -> None:
    s = Shard()
    pid, _ = s.init()
    s.c.txns["tx"].epoch = EPOCH_MAX - 1
    assert s.init() == (pid + 1, 0)


def test_a_shard_without_ids_left_says_so() -> None:
    c = TxnCoordinator()
    r = c.apply({"type": "init_producer", "transactional_id": "x", "now_ms": 0})
    assert r.error == "producer_ids_exhausted"


def test_the_allocator_never_hands_out_an_id_twice_even_across_a_restart() -> None:
    allocator = ProducerIdAllocator()
    first = allocator.apply({"type": "allocate", "count": 3})
    restored = ProducerIdAllocator.restore(allocator.snapshot())
    second = restored.apply({"type": "allocate", "count": 2})
    assert (first, second) == ({"first": 0, "count": 3}, {"first": 3, "count": 2})
    with pytest.raises(ProducerIdsExhausted):
        ProducerIdAllocator(2**63 - 1).allocate(2)


def test_id_blocks_are_drawn_in_order_and_may_not_overlap() -> None:
    blocks = IdBlocks()
    blocks.add(10, 2)
    blocks.add(20, 1)
    assert [blocks.take() for _ in range(4)] == [10, 11, 20, None]
    with pytest.raises(ValueError):
        blocks.add(15, 1)


def test_a_transactional_id_maps_to_the_same_shard_in_every_process() -> None:
    assert shard_for("orders-etl", 16) == 2073544871 % 16
    assert {shard_for(f"tx-{i}", 4) for i in range(50)} == {0, 1, 2, 3}


def test_an_unknown_command_is_refused_loudly() -> None:
    with pytest.raises(ValueError, match="unknown transaction coordinator command"):
        TxnCoordinator().apply({"type": "current", "transactional_id": "x"})
