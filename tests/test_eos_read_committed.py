"""read_committed: the aborts producer state reports, as the log's transaction index collects
them, and the filter drop exactly the aborted transactions' data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from eos_models import LoggedBatch, transactional_logs
from hypothesis import given, settings
from hypothesis import strategies as st

from raftline.node.eos.isolation import read_committed
from raftline.node.eos.markers import BatchMeta, marker_meta
from raftline.node.eos.producer_state import AbortedTxn, ProducerStateMachine
from raftline.raftlog import txnindex

Collect = Callable[[list[txnindex.TxnIndex], int, int], list[txnindex.AbortedTxn]]


def indexed_aborts(state: ProducerStateMachine, log: list[LoggedBatch]) -> txnindex.TxnIndex:
    """Apply `log`; the aborts it reports, as the node records them (with the LSO after each)
    in a transaction index (in memory: its entries are what collect reads)."""
    index = txnindex.TxnIndex(Path("unwritten.txnindex"))
    for b in log:
        verdict = state.apply_batch(b.base_offset, b.meta)
        assert verdict.accepted
        if verdict.aborted is not None:
            lso = state.last_stable_offset(state.next_offset)
            index.entries.append(txnindex.AbortedTxn(*verdict.aborted, lso))
    return index


def committed_view(log: list[LoggedBatch], start: int, collect: Collect) -> tuple[list[int], int]:
    """Base offsets a read_committed fetch from `start` returns, and the LSO it stopped at."""
    state = ProducerStateMachine()
    index = indexed_aborts(state, log)
    lso = state.last_stable_offset(state.next_offset)
    fetched = [
        (b.base_offset, b.meta, b.base_offset)
        for b in log
        if b.base_offset + b.meta.last_offset_delta >= start and b.base_offset < lso
    ]
    return list(read_committed(fetched, collect([index], start, lso))), lso


def check_read_committed(collect: Collect, log: list[LoggedBatch], start: int) -> None:
    got, lso = committed_view(log, start, collect)
    expected = [
        b.base_offset
        for b in log
        if b.fate in ("plain", "committed")
        and b.base_offset + b.meta.last_offset_delta >= start
        and b.base_offset < lso
    ]
    assert got == expected


@settings(max_examples=300, deadline=None)
@given(log=transactional_logs(), data=st.data())
def test_read_committed_drops_exactly_the_aborted_transactions_data(
    log: list[LoggedBatch], data: st.DataObject
) -> None:
    end = log[-1].base_offset + 1 if log else 0
    check_read_committed(txnindex.collect, log, data.draw(st.integers(0, end)))


def test_a_fetch_never_reaches_past_the_first_offset_of_an_open_transaction() -> None:
    state = ProducerStateMachine()
    state.apply_batch(0, BatchMeta(-1, -1, -1, 1))
    state.apply_batch(2, BatchMeta(5, 0, 0, 0, is_transactional=True))
    state.apply_batch(3, BatchMeta(-1, -1, -1, 0))
    assert state.last_stable_offset(4) == 2
    marker = marker_meta(False, producer_id=5, producer_epoch=1, coordinator_epoch=0, timestamp=0)
    assert state.apply_batch(4, marker).aborted == AbortedTxn(5, 2, 4)
    assert state.last_stable_offset(5) == 5
