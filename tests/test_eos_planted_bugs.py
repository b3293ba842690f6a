"""The exactly-once model tests are not vacuous: cores with known bugs planted (by subclassing)
fail them, each for the rule it breaks; the unmodified cores pass the same runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from eos_models import (
    CoordinatorModel,
    DedupModel,
    LoggedBatch,
    LsoModel,
    TransactionsModel,
    transactional_logs,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test
from test_eos_read_committed import Collect, check_read_committed
from test_eos_snapshot import check_restart

from raftline.node.eos.markers import BatchMeta
from raftline.node.eos.producer_state import (
    ProducerEntry,
    ProducerStateMachine,
    Verdict,
)
from raftline.node.eos.txn_coordinator import TxnCoordinator, TxnMetadata, TxnResult, TxnState
from raftline.raftlog import txnindex

# No shrinking: finding a failure is the point, and it is faster without.
FIND = settings(
    max_examples=400,
    stateful_step_count=40,
    deadline=None,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)


class WindowOfOne(ProducerStateMachine):
    """Redpanda #3039: remembers only the last batch, so a retry of an earlier one of the last
    five is answered out_of_order_sequence instead of its offsets."""

    WINDOW = 1


class ChecksOnlyAppliedState(ProducerStateMachine):
    """A leader that ignores batches in flight: a retry arriving while the original is being
    replicated is appended a second time."""

    def _shadow(self, pid: int) -> ProducerEntry | None:
        return self.producers.get(pid)


class LsoIgnoresOpenTransactions(ProducerStateMachine):
    """The LSO is the high watermark: read_committed readers see open transactions."""

    def last_stable_offset(self, high_watermark: int) -> int:
        return min(high_watermark, self.next_offset)


class LsoFromCommitIndex(ProducerStateMachine):
    """Redpanda #5090's shape: the LSO trusts the high watermark even where entries are
    committed but not yet applied (a transaction may open there)."""

    def last_stable_offset(self, high_watermark: int) -> int:
        return min([high_watermark, *self._open.values()])


def aborts_from_fetch_start(
    indexes: list[txnindex.TxnIndex], start: int, end: int
) -> list[txnindex.AbortedTxn]:
    """The transaction index lists only transactions that begin inside the fetched range, so a
    fetch starting in the middle of an aborted transaction returns its tail."""
    return [a for a in txnindex.collect(indexes, start, end) if a.first_offset >= start]


class RestoreForgetsOpenTransactions(ProducerStateMachine):
    """A snapshot that loses which transactions are open: after a restart the LSO passes
    them."""

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> ProducerStateMachine:
        state = super().restore(snapshot)
        state._open.clear()
        return state


class SkipsVerification(ProducerStateMachine):
    """KIP-890's hanging transaction: a partition lets a transaction's first write in without
    asking the coordinator, so a late write of an ended transaction opens one that no marker
    will ever close."""

    def check(self, meta: BatchMeta, *, verified: bool = False) -> Verdict:
        return super().check(meta, verified=True)


class AcceptsOlderEpochs(TxnCoordinator):
    """Bufstream's shape: a request of an earlier epoch of the same producer joins or ends the
    current transaction."""

    def _current(self, cmd: dict[str, Any]) -> tuple[TxnMetadata | None, str | None]:
        older = {**cmd, "producer_epoch": self.txns[cmd["transactional_id"]].epoch}
        return super()._current(older if cmd["transactional_id"] in self.txns else cmd)


class FencesWithoutAborting(TxnCoordinator):
    """Redpanda #3232: init_producer bumps the epoch but leaves the fenced producer's
    transaction open, with no markers to write."""

    def _on_init_producer(self, cmd: dict[str, Any]) -> TxnResult:
        meta = self.txns.get(cmd["transactional_id"])
        if meta is not None and meta.state is TxnState.ONGOING:
            meta.epoch += 1
            return TxnResult(None, meta.producer_id, meta.epoch)
        return super()._on_init_producer(cmd)


def machine_with(model: type[RuleBasedStateMachine], core: type) -> type[RuleBasedStateMachine]:
    return type(f"{model.__name__}With{core.__name__}", (model,), {"under_test": core})


def run_model(model: type[RuleBasedStateMachine], core: type) -> None:
    run_state_machine_as_test(machine_with(model, core), settings=FIND)


def run_read_committed(collect: Collect) -> None:
    @FIND
    @given(log=transactional_logs(), data=st.data())
    def run(log: list[LoggedBatch], data: st.DataObject) -> None:
        end = log[-1].base_offset + 1 if log else 0
        check_read_committed(collect, log, data.draw(st.integers(0, end)))

    run()


def run_snapshot(core: type[ProducerStateMachine]) -> None:
    @FIND
    @given(log=transactional_logs(), data=st.data())
    def run(log: list[LoggedBatch], data: st.DataObject) -> None:
        check_restart(core, log, data.draw(st.integers(0, len(log))), 1 << 20)

    run()


# (run, core (or collect function) with the bug, the checks that may fail: functions holding
# the assertion)
CASES: list[tuple[Callable[[Any], None], Any, str]] = [
    (lambda core: run_model(DedupModel, core), WindowOfOne, "_check_against_reference"),
    (lambda core: run_model(DedupModel, core), ChecksOnlyAppliedState, "_check_against_reference"),
    (
        lambda core: run_model(LsoModel, core),
        LsoIgnoresOpenTransactions,
        "lso_is_the_reference_and_never_goes_back",
    ),
    (
        lambda core: run_model(LsoModel, core),
        LsoFromCommitIndex,
        "lso_is_the_reference_and_never_goes_back",
    ),
    (run_read_committed, aborts_from_fetch_start, "check_read_committed"),
    (
        lambda core: run_model(TransactionsModel, core),
        SkipsVerification,
        "no_transaction_hangs_on_a_partition",
    ),
    (run_snapshot, RestoreForgetsOpenTransactions, "check_restart"),
    (
        lambda core: run_model(CoordinatorModel, core),
        AcceptsOlderEpochs,
        "add_partitions|add_offsets|end_txn",
    ),
    (lambda core: run_model(CoordinatorModel, core), FencesWithoutAborting, "_decided"),
]


@pytest.mark.parametrize(
    ("check", "core", "failing"), CASES, ids=[core.__name__ for _, core, _ in CASES]
)
def test_the_model_tests_catch_a_planted_bug(
    check: Callable[[type], None], core: type, failing: str
) -> None:
    with pytest.raises(AssertionError) as caught:
        check(core)
    assert caught.traceback[-1].name in failing.split("|")


@pytest.mark.parametrize(
    ("check", "core"),
    [
        (lambda core: run_model(DedupModel, core), ProducerStateMachine),
        (lambda core: run_model(LsoModel, core), ProducerStateMachine),
        (run_read_committed, txnindex.collect),
        (run_snapshot, ProducerStateMachine),
        (lambda core: run_model(CoordinatorModel, core), TxnCoordinator),
        (lambda core: run_model(TransactionsModel, core), ProducerStateMachine),
    ],
    ids=["dedup", "lso", "read_committed", "snapshot", "coordinator", "transactions"],
)
def test_the_unmodified_cores_pass_the_same_runs(check: Callable[[type], None], core: type) -> None:
    check(core)
