"""Model tests of the exactly-once cores, parameterised by the class under test so that
test_eos_planted_bugs.py can run the same models against cores with bugs planted.

Each machine holds a few lines of reference code and checks the core against it after every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from raftline.node.eos.markers import SEQUENCE_MODULUS, BatchMeta, marker_meta
from raftline.node.eos.producer_state import Outcome, ProducerStateMachine, Verdict
from raftline.node.eos.txn_coordinator import (
    PREPARE,
    MarkerRequest,
    TxnCoordinator,
    TxnResult,
    TxnState,
)

PIDS = (1, 2)
MAX_UNACKED = 5  # a producer keeps at most this many batches unacknowledged (max.in.flight)


# ---------------------------------------------------------------------------- dedup


@dataclass
class Sent:
    meta: BatchMeta
    # unsent (never accepted, or lost in a term change), in_flight, applied, abandoned (unsent
    # and given up by an epoch bump)
    status: str = "unsent"
    offsets: tuple[int, int] | None = None


class DedupModel(RuleBasedStateMachine):
    """Producers send batches, retry any of their recent ones at any moment and bump their
    epoch; a leader checks each before proposing, proposals commit in order or are lost in a term
    change (some of them committing first). Reference: a batch is in the log once; a batch of an
    epoch older than the producer's latest accepted one is fenced; a retry of an applied batch
    gets its offsets, of an in-flight one in_flight; any other batch is new exactly when it
    continues the producer's chain of accepted batches (at 0 for a new epoch)."""

    under_test: type[ProducerStateMachine] = ProducerStateMachine

    def __init__(self) -> None:
        super().__init__()
        self.state = self.under_test()
        self.sent: dict[int, list[Sent]] = {pid: [] for pid in PIDS}
        self.chain: dict[int, list[Sent]] = {pid: [] for pid in PIDS}  # applied + in flight
        self.next_seq: dict[int, int] = {}
        self.epoch: dict[int, int] = dict.fromkeys(PIDS, 0)
        self.proposals: list[Sent] = []
        self.next_offset = 0
        self.log: list[tuple[int, int, int]] = []

    @initialize(starts=st.lists(st.sampled_from([0, 7, SEQUENCE_MODULUS - 4]), min_size=2))
    def start(self, starts: list[int]) -> None:
        for pid, seq in zip(PIDS, starts, strict=False):
            self.next_seq[pid] = seq

    def _expected(self, pid: int, sent: Sent) -> Verdict:
        chain = self.chain[pid]
        meta, tail = sent.meta, (chain[-1].meta if chain else None)
        if tail is not None and meta.producer_epoch < tail.producer_epoch:
            return Verdict(Outcome.FENCED)
        if sent.status == "applied":
            assert sent.offsets is not None
            return Verdict(Outcome.DUPLICATE, *sent.offsets)
        if sent.status == "in_flight":
            return Verdict(Outcome.IN_FLIGHT, key=meta.key)
        if tail is None:
            continues = True  # an unknown producer starts anywhere
        elif meta.producer_epoch > tail.producer_epoch:
            continues = meta.base_sequence == 0
        else:
            continues = meta.base_sequence == (tail.last_sequence + 1) % SEQUENCE_MODULUS
        return Verdict(Outcome.NEW if continues else Outcome.OUT_OF_ORDER)

    def _check_against_reference(self, pid: int, sent: Sent) -> None:
        expected = self._expected(pid, sent)
        assert self.state.check(sent.meta) == expected, (sent, expected)
        if expected.outcome is Outcome.NEW:
            sent.status = "in_flight"
            self.chain[pid].append(sent)
            self.proposals.append(sent)

    @precondition(lambda self: self.next_seq)
    @rule(pid=st.sampled_from(PIDS), count=st.integers(1, 3))
    def send(self, pid: int, count: int) -> None:
        unacked = [s for s in self.sent[pid] if s.status in ("unsent", "in_flight")]
        if len(unacked) >= MAX_UNACKED:
            return
        seq = self.next_seq[pid]
        sent = Sent(BatchMeta(pid, self.epoch[pid], seq, count - 1))
        self.next_seq[pid] = (seq + count) % SEQUENCE_MODULUS
        self.sent[pid].append(sent)
        self._check_against_reference(pid, sent)

    @precondition(lambda self: self.next_seq)
    @rule(pid=st.sampled_from(PIDS))
    def bump_epoch(self, pid: int) -> None:
        """The producer moves to a new epoch (KIP-360), sequences restart at 0; it gives up
        resending its batches not yet accepted (it may still repeat them)."""
        self.epoch[pid] += 1
        self.next_seq[pid] = 0
        for sent in self.sent[pid]:
            if sent.status == "unsent":
                sent.status = "abandoned"

    @rule(pid=st.sampled_from(PIDS), back=st.integers(1, MAX_UNACKED))
    def retry(self, pid: int, back: int) -> None:
        """Repeat one of the producer's last MAX_UNACKED batches (acked ones included: the ack
        may have been lost)."""
        recent = self.sent[pid][-MAX_UNACKED:]
        if len(recent) >= back:
            self._check_against_reference(pid, recent[-back])

    @rule(survivors=st.integers(0, 3))
    def term_change(self, survivors: int) -> None:
        """A new leader: the first `survivors` proposals were replicated and commit, the rest
        are lost; the new leader has applied all of it before it checks anything."""
        for _ in range(min(survivors, len(self.proposals))):
            self.commit()
        for sent in self.proposals:
            sent.status = (
                "unsent"
                if sent.meta.producer_epoch == self.epoch[sent.meta.producer_id]
                else "abandoned"
            )
            self.chain[sent.meta.producer_id].remove(sent)
        self.proposals.clear()
        self.state.clear_in_flight()

    @precondition(lambda self: self.proposals)
    @rule()
    def commit(self) -> None:
        sent = self.proposals.pop(0)
        base = self.next_offset
        self.next_offset += sent.meta.last_offset_delta + 1
        assert self.state.apply_batch(base, sent.meta) == Verdict(Outcome.NEW)
        sent.status, sent.offsets = "applied", (base, self.next_offset - 1)
        self.log.append(sent.meta.key)

    @invariant()
    def every_batch_is_in_the_log_once(self) -> None:
        assert len(self.log) == len(set(self.log))


# ---------------------------------------------------------------------------- LSO


@dataclass
class TxnProducer:
    pid: int
    epoch: int = 0
    seq: int = 0
    first_offset: int | None = None  # of its open transaction


class LsoModel(RuleBasedStateMachine):
    """Transactional and plain producers write committed batches, transactions end by markers,
    the high watermark (possibly ahead of what is applied) moves up. Reference: LSO = min(high
    watermark, applied end, first offset of every open transaction)."""

    under_test: type[ProducerStateMachine] = ProducerStateMachine

    def __init__(self) -> None:
        super().__init__()
        self.state = self.under_test()
        self.producers = {pid: TxnProducer(pid) for pid in (1, 2, 3)}
        self.plain_seq = 0
        self.hw = 0
        self.last_lso = 0

    def _apply(self, meta: BatchMeta) -> int:
        base = self.state.next_offset
        assert self.state.apply_batch(base, meta).accepted
        return base

    @rule(pid=st.sampled_from([1, 2, 3]), count=st.integers(1, 4))
    def write_in_transaction(self, pid: int, count: int) -> None:
        p = self.producers[pid]
        base = self._apply(BatchMeta(pid, p.epoch, p.seq, count - 1, is_transactional=True))
        p.seq += count
        if p.first_offset is None:
            p.first_offset = base

    @rule(count=st.integers(1, 4), idempotent=st.booleans())
    def write_outside_transactions(self, count: int, idempotent: bool) -> None:
        if idempotent:
            self._apply(BatchMeta(9, 0, self.plain_seq, count - 1))
            self.plain_seq += count
        else:
            self._apply(BatchMeta(-1, -1, -1, count - 1))

    @rule(pid=st.sampled_from([1, 2, 3]), commit=st.booleans())
    def end_transaction(self, pid: int, commit: bool) -> None:
        p = self.producers[pid]
        p.epoch += 1
        p.seq = 0
        p.first_offset = None
        self._apply(
            marker_meta(
                commit, producer_id=pid, producer_epoch=p.epoch, coordinator_epoch=0, timestamp=0
            )
        )

    @rule(ahead=st.integers(0, 5))
    def advance_high_watermark(self, ahead: int) -> None:
        self.hw = max(self.hw, self.state.next_offset + ahead - 2)

    @invariant()
    def lso_is_the_reference_and_never_goes_back(self) -> None:
        lso = self.state.last_stable_offset(self.hw)
        opens = [p.first_offset for p in self.producers.values() if p.first_offset is not None]
        assert lso == min([self.hw, self.state.next_offset, *opens])
        assert lso >= self.last_lso
        self.last_lso = lso


# ---------------------------------------------------------------------------- logs of transactions


@dataclass
class LoggedBatch:
    base_offset: int
    meta: BatchMeta
    fate: str  # plain, committed, aborted, open, marker


@st.composite
def transactional_logs(draw: st.DrawFn, max_steps: int = 40) -> list[LoggedBatch]:
    """A valid log: transactional producers 1-3 writing, committing and aborting (some left
    open), an idempotent producer 9 and plain writes between; timestamps equal offsets."""
    log: list[LoggedBatch] = []
    producers = {pid: TxnProducer(pid) for pid in (1, 2, 3)}
    members: dict[int, list[LoggedBatch]] = {pid: [] for pid in producers}
    offset = 0
    plain_seq = 0
    for _ in range(draw(st.integers(0, max_steps))):
        step = draw(st.sampled_from(["txn", "txn", "end", "plain", "idempotent"]))
        pid = draw(st.sampled_from([1, 2, 3]))
        p = producers[pid]
        count = draw(st.integers(1, 3))
        if step == "txn":
            meta = BatchMeta(pid, p.epoch, p.seq, count - 1, True, max_timestamp=offset)
            p.seq += count
            members[pid].append(LoggedBatch(offset, meta, "open"))
            log.append(members[pid][-1])
        elif step == "end":
            commit = draw(st.booleans())
            p.epoch += 1
            p.seq = 0
            for b in members[pid]:
                b.fate = "committed" if commit else "aborted"
            members[pid] = []
            meta = marker_meta(
                commit,
                producer_id=pid,
                producer_epoch=p.epoch,
                coordinator_epoch=0,
                timestamp=offset,
            )
            log.append(LoggedBatch(offset, meta, "marker"))
        elif step == "idempotent":
            log.append(
                LoggedBatch(
                    offset, BatchMeta(9, 0, plain_seq, count - 1, max_timestamp=offset), "plain"
                )
            )
            plain_seq += count
        else:
            log.append(LoggedBatch(offset, BatchMeta(-1, -1, -1, count - 1), "plain"))
        offset = log[-1].base_offset + log[-1].meta.last_offset_delta + 1
    return log


# ---------------------------------------------------------------------------- coordinator


@dataclass
class Session:
    """What one producer session holds: its transactional id and (producer id, epoch)."""

    tid: str
    pid: int
    epoch: int


@dataclass
class TxnRef:
    current: tuple[int, int] = (-1, -1)
    open: set[tuple[str, int]] | None = None
    started: int = 0
    deciding: tuple[bool, frozenset[tuple[str, int]]] | None = None
    history: list[tuple[int, int]] = field(default_factory=list)
    offsets: dict[tuple[str, tuple[str, int]], int] = field(default_factory=dict)


TIDS = ("a", "b")
PARTITIONS = st.lists(
    st.tuples(st.sampled_from(["t", "u"]), st.integers(0, 2)), min_size=1, max_size=3
)
TIMEOUT_MS = 100


class CoordinatorModel(RuleBasedStateMachine):
    """Producer sessions of two transactional ids (fenced ones keep sending) against the
    coordinator. Reference: only the current session's requests succeed, epochs strictly
    increase, each decision lists exactly the partitions its transaction added, and a commit
    (never an abort) carries the consumer offsets committed inside it."""

    under_test: type[TxnCoordinator] = TxnCoordinator

    def __init__(self) -> None:
        super().__init__()
        self.coordinator = self.under_test()
        self.coordinator.apply({"type": "producer_ids", "first": 1000, "count": 50})
        self.ref = {tid: TxnRef() for tid in TIDS}
        self.sessions: list[Session] = []
        self.now = 0

    def _decided(self, ref: TxnRef, result: TxnResult, commit: bool) -> None:
        assert result.markers is not None
        assert result.markers.commit == commit
        assert set(result.markers.partitions) == ref.open
        expected_offsets = sorted((g, tp, o) for (g, tp), o in ref.offsets.items())
        assert list(result.markers.offsets) == (expected_offsets if commit else [])
        ref.deciding = (commit, frozenset(ref.open or ()))
        ref.open = None
        ref.offsets = {}

    def _new_epoch(self, ref: TxnRef, result: TxnResult) -> None:
        pair = (result.producer_id, result.producer_epoch)
        assert pair > ref.current, (pair, ref.current)
        ref.current = pair
        ref.history.append(pair)

    @rule(tid=st.sampled_from(TIDS))
    def init_producer(self, tid: str) -> None:
        ref = self.ref[tid]
        cmd = {"type": "init_producer", "transactional_id": tid, "timeout_ms": TIMEOUT_MS}
        result = self.coordinator.apply({**cmd, "now_ms": self.now})
        if ref.deciding is not None:
            assert result.error == "concurrent_transactions"
            return
        assert result.ok
        had_open = ref.open is not None
        self._new_epoch(ref, result)
        if had_open:
            self._decided(ref, result, commit=False)
        else:
            assert result.markers is None
        self.sessions.append(Session(tid, result.producer_id, result.producer_epoch))

    def _is_current(self, s: Session) -> bool:
        ref = self.ref[s.tid]
        return (s.pid, s.epoch) == ref.current and ref.deciding is None

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), partitions=PARTITIONS)
    def add_partitions(self, data: st.DataObject, partitions: list[tuple[str, int]]) -> None:
        s = data.draw(st.sampled_from(self.sessions))
        cmd = {"type": "add_partitions", "transactional_id": s.tid, "producer_id": s.pid}
        result = self.coordinator.apply(
            {**cmd, "producer_epoch": s.epoch, "partitions": partitions, "now_ms": self.now}
        )
        assert result.ok == self._is_current(s), (result, s)
        if result.ok:
            ref = self.ref[s.tid]
            if ref.open is None:
                ref.open, ref.started = set(), self.now
            ref.open.update(partitions)

    @precondition(lambda self: self.sessions)
    @rule(
        data=st.data(),
        group=st.sampled_from(["g", "h"]),
        offsets=st.lists(st.tuples(st.sampled_from(["in"]), st.integers(0, 1), st.integers(0, 9))),
    )
    def add_offsets(
        self, data: st.DataObject, group: str, offsets: list[tuple[str, int, int]]
    ) -> None:
        """Consumer offsets committed inside the transaction (consume-transform-produce)."""
        s = data.draw(st.sampled_from(self.sessions))
        cmd = {"type": "add_offsets", "transactional_id": s.tid, "producer_id": s.pid}
        cmd |= {"producer_epoch": s.epoch, "group": group, "offsets": offsets}
        result = self.coordinator.apply({**cmd, "now_ms": self.now})
        assert result.ok == self._is_current(s), (result, s)
        if result.ok:
            ref = self.ref[s.tid]
            if ref.open is None:
                ref.open, ref.started = set(), self.now
            for topic, partition, offset in offsets:
                ref.offsets[(group, (topic, partition))] = offset

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), commit=st.booleans())
    def end_txn(self, data: st.DataObject, commit: bool) -> None:
        s = data.draw(st.sampled_from(self.sessions))
        ref = self.ref[s.tid]
        current = self._is_current(s)
        cmd = {"type": "end_txn", "transactional_id": s.tid, "producer_id": s.pid}
        result = self.coordinator.apply(
            {**cmd, "producer_epoch": s.epoch, "commit": commit, "now_ms": self.now}
        )
        if not current:
            assert not (result.ok and result.markers is not None), "a fenced epoch decided"
            return
        assert result.ok
        self._new_epoch(ref, result)
        if ref.open is not None:
            self._decided(ref, result, commit)
        else:
            assert result.markers is None
        s.epoch = result.producer_epoch  # the producer goes on with the bumped epoch

    @rule(tid=st.sampled_from(TIDS))
    def markers_written(self, tid: str) -> None:
        ref = self.ref[tid]
        for request in self.coordinator.pending_markers():
            if request.transactional_id == tid:
                cmd = {"type": "markers_written", "transactional_id": tid, "now_ms": self.now}
                assert self.coordinator.apply({**cmd, "producer_epoch": request.producer_epoch}).ok
                ref.deciding = None

    @rule(ms=st.integers(1, 80))
    def time_passes_and_expired_transactions_abort(self, ms: int) -> None:
        self.now += ms
        expired = self.coordinator.expire(self.now)
        for tid, ref in self.ref.items():
            due = ref.open is not None and self.now - ref.started >= TIMEOUT_MS
            assert due == any(e[0] == tid for e in expired)
        for tid, pid, epoch in expired:
            ref = self.ref[tid]
            cmd = {"type": "abort_expired", "transactional_id": tid, "producer_id": pid}
            result = self.coordinator.apply({**cmd, "producer_epoch": epoch, "now_ms": self.now})
            assert result.ok
            self._new_epoch(ref, result)
            self._decided(ref, result, commit=False)

    @invariant()
    def every_decision_has_pending_markers_for_all_its_partitions(self) -> None:
        pending = {
            m.transactional_id: (m.commit, frozenset(m.partitions))
            for m in self.coordinator.pending_markers()
        }
        assert pending == {tid: ref.deciding for tid, ref in self.ref.items() if ref.deciding}

    @invariant()
    def epochs_strictly_increase(self) -> None:
        for ref in self.ref.values():
            assert all(a < b for a, b in zip(ref.history, ref.history[1:], strict=False))


# ---------------------------------------------------------------------------- whole transactions


TXN_PARTITIONS = (("t", 0), ("t", 1), ("u", 0))


@dataclass
class Writer:
    """A transactional producer session; writes carry its epoch and a sequence per partition."""

    pid: int
    epoch: int
    seqs: dict[tuple[str, int], int] = field(default_factory=dict)


class TransactionsModel(RuleBasedStateMachine):
    """One transactional id, its coordinator and three partitions. Sessions (fenced ones
    included) send transactional writes that are delivered late and in any order; a partition
    leader checks each, verifying a transaction's first write with the coordinator; commits,
    aborts, fences and timeouts make markers that reach partitions late and repeatedly.

    Checked on every partition's applied history: the writes of one transaction span share one
    epoch, the span's marker carries the decision of that epoch's transaction (a late write of
    T1 never lands in T2), every written partition was added to its transaction, and a
    transaction open on a partition is open at the coordinator or has its marker pending (none
    hangs)."""

    under_test: type[ProducerStateMachine] = ProducerStateMachine

    def __init__(self) -> None:
        super().__init__()
        self.coordinator = TxnCoordinator()
        self.coordinator.apply({"type": "producer_ids", "first": 500, "count": 20})
        self.partitions = {tp: self.under_test() for tp in TXN_PARTITIONS}
        self.writers: list[Writer] = []
        self.writes: list[tuple[tuple[str, int], BatchMeta]] = []  # sent, not yet delivered
        self.markers: list[tuple[tuple[str, int], MarkerRequest]] = []  # (partition, MarkerRequest)
        self.delivered: dict[tuple[int, int], set[tuple[str, int]]] = {}
        self.decided: dict[tuple[int, int], bool] = {}  # (pid, txn epoch) -> commit
        self.added: dict[tuple[int, int], set[tuple[str, int]]] = {}
        self.spans: dict[tuple[tuple[str, int], int], list[int]] = {}  # open: write epochs
        self.now = 0

    def _cmd(self, kind: str, **fields: object) -> TxnResult:
        return self.coordinator.apply(
            {"type": kind, "transactional_id": "x", "now_ms": self.now, **fields}
        )

    def _decision(self, result: TxnResult) -> None:
        request = result.markers
        if request is None:
            return
        self.decided[(request.producer_id, request.producer_epoch - 1)] = request.commit
        self.markers.extend((tp, request) for tp in request.partitions)

    @initialize()
    def first_session(self) -> None:
        self.init_producer()

    @precondition(lambda self: len(self.writers) < 3)
    @rule()
    def init_producer(self) -> None:
        result = self._cmd("init_producer", timeout_ms=TIMEOUT_MS)
        if result.ok:
            self.writers.append(Writer(result.producer_id, result.producer_epoch))
            self._decision(result)

    @precondition(lambda self: self.writers)
    @rule(data=st.data(), tp=st.sampled_from(TXN_PARTITIONS), late=st.booleans())
    def send(self, data: st.DataObject, tp: tuple[str, int], late: bool) -> None:
        """A write of any session; one sent `late` waits in the network for deliver_write."""
        w = data.draw(st.sampled_from(self.writers))
        seq = w.seqs.get(tp, 0)
        w.seqs[tp] = seq + 1
        meta = BatchMeta(w.pid, w.epoch, seq, 0, is_transactional=True)
        if late:
            self.writes.append((tp, meta))
        else:
            self._deliver(tp, meta)

    @precondition(lambda self: self.writes)
    @rule(data=st.data())
    def deliver_write(self, data: st.DataObject) -> None:
        self._deliver(*self.writes.pop(data.draw(st.integers(0, len(self.writes) - 1))))

    def _deliver(self, tp: tuple[str, int], meta: BatchMeta) -> None:
        state = self.partitions[tp]
        verdict = state.check(meta)
        if verdict.outcome is Outcome.NEEDS_VERIFICATION:
            fields = {"producer_id": meta.producer_id, "producer_epoch": meta.producer_epoch}
            if not self._cmd("add_partitions", partitions=[list(tp)], **fields).ok:
                return
            self.added.setdefault((meta.producer_id, meta.producer_epoch), set()).add(tp)
            verdict = state.check(meta, verified=True)
        if verdict.accepted:
            assert state.apply_batch(state.next_offset, meta).accepted
            self.spans.setdefault((tp, meta.producer_id), []).append(meta.producer_epoch)
        elif verdict.outcome is Outcome.OUT_OF_ORDER:
            self.writes.append((tp, meta))  # the producer retries it after the ones before

    @precondition(lambda self: self.writers)
    @rule(data=st.data(), commit=st.booleans())
    def end_txn(self, data: st.DataObject, commit: bool) -> None:
        w = data.draw(st.sampled_from(self.writers))
        result = self._cmd("end_txn", producer_id=w.pid, producer_epoch=w.epoch, commit=commit)
        if result.ok:
            w.epoch, w.seqs = result.producer_epoch, {}
            self._decision(result)

    @precondition(lambda self: self.markers)
    @rule(data=st.data())
    def deliver_marker(self, data: st.DataObject) -> None:
        tp, request = self.markers.pop(data.draw(st.integers(0, len(self.markers) - 1)))
        meta = marker_meta(
            request.commit,
            producer_id=request.producer_id,
            producer_epoch=request.producer_epoch,
            coordinator_epoch=0,
            timestamp=self.now,
        )
        state = self.partitions[tp]
        if state.check(meta).accepted:
            assert state.apply_batch(state.next_offset, meta).accepted
            span = self.spans.pop((tp, request.producer_id), [])
            txn = (request.producer_id, request.producer_epoch - 1)
            assert all(epoch == txn[1] for epoch in span), ("a write joined another txn", span)
            assert not span or tp in self.added.get(txn, set())
        done = self.delivered.setdefault((request.producer_id, request.producer_epoch), set())
        done.add(tp)
        if done >= set(request.partitions):
            self._cmd("markers_written", producer_epoch=request.producer_epoch)

    @rule()
    def coordinator_resends_pending_markers(self) -> None:
        for request in self.coordinator.pending_markers():
            self.markers.extend((tp, request) for tp in request.partitions)

    @rule(ms=st.integers(1, 15))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        for tid, pid, epoch in self.coordinator.expire(self.now):
            fields = {"producer_id": pid, "producer_epoch": epoch}
            self._decision(
                self.coordinator.apply(
                    {"type": "abort_expired", "transactional_id": tid, "now_ms": self.now, **fields}
                )
            )

    @invariant()
    def no_transaction_hangs_on_a_partition(self) -> None:
        meta = self.coordinator.txns.get("x")
        for (tp, pid), span in self.spans.items():
            if not span:
                continue
            epoch = span[0]
            assert meta is not None and meta.producer_id == pid
            assert all(e == epoch for e in span), ("one span, several epochs", span)
            live = meta.state is TxnState.ONGOING and meta.epoch == epoch
            deciding = meta.state in PREPARE and meta.epoch == epoch + 1
            assert (live or deciding) and tp in meta.partitions, ("hanging", tp, span, meta)
