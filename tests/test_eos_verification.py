"""Partition-side verification with the coordinator: late writes never join a later
transaction and no transaction hangs on a partition (KIP-890, Jepsen's Bufstream find)."""

from __future__ import annotations

from eos_models import TransactionsModel
from hypothesis import settings

from raftline.node.eos.verification import TxnCheck, check_transactional_write

TransactionsModel.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None
)
TestLateWritesNeverJoinALaterTransactionAndNoTransactionHangs = TransactionsModel.TestCase


def verdict(current: int | None, open_txn: bool, epoch: int, txn: bool, verified: bool) -> TxnCheck:
    return check_transactional_write(
        current_epoch=current,
        open_txn=open_txn,
        write_epoch=epoch,
        transactional=txn,
        verified=verified,
    )


def test_a_write_of_the_open_transactions_epoch_joins_it_without_asking() -> None:
    assert verdict(3, True, 3, True, verified=False) is TxnCheck.JOIN


def test_a_write_that_would_start_a_transaction_here_asks_the_coordinator_first() -> None:
    assert verdict(3, False, 3, True, verified=False) is TxnCheck.NEEDS_VERIFICATION
    assert verdict(None, False, 0, True, verified=False) is TxnCheck.NEEDS_VERIFICATION
    assert verdict(3, False, 4, True, verified=True) is TxnCheck.START


def test_an_older_epoch_is_fenced_even_when_verified() -> None:
    assert verdict(3, False, 2, True, verified=True) is TxnCheck.FENCED
    assert verdict(3, True, 2, True, verified=True) is TxnCheck.FENCED


def test_nothing_but_the_open_transactions_own_epoch_lands_inside_it() -> None:
    assert verdict(3, True, 4, True, verified=True) is TxnCheck.INVALID_TXN_STATE
    assert verdict(3, True, 3, False, verified=True) is TxnCheck.INVALID_TXN_STATE
