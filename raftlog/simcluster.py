"""A simulated Raft cluster on virtual time: network, disks, clocks, crashes and a checker.

Owns the Simulation that drives RaftNodes exactly like a runtime (the Ready protocol) and the
network model (delay, loss, duplication, reordering, partitions, cut links).
"""

from __future__ import annotations

import heapq
import json
import random
import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from raftline.raftlog.invariants import Checker, InvariantViolation
from raftline.raftlog.memlog import MemLog
from raftline.raftlog.raft import ConfigChangeError, NotLeaderError, RaftConfig, RaftNode
from raftline.raftlog.types import EntryKind, Message, MessageType, Ready, SnapshotMeta

TICK = 10  # virtual time units in a nominal tick; node clocks run faster or slower than this

_TICK, _DELIVER, _CALL = 0, 1, 2
_ROLE = {"leader": "L", "follower": "f", "candidate": "c", "pre_candidate": "p", "learner": "l"}


@dataclass(slots=True, frozen=True)
class NetConfig:
    """Per-message behaviour of every link (partitions and cut links are separate)."""

    drop: float = 0.0
    duplicate: float = 0.0
    min_delay: int = 1
    max_delay: int = 5
    long_delay: float = 0.0  # chance a message is held back (reordered) for a long time
    long_delay_max: int = 20 * TICK


RELIABLE = NetConfig()
# The MIT lab's unreliable network scaled to our ticks: 10% loss, delays up to ~a quarter timeout.
UNRELIABLE = NetConfig(drop=0.1, max_delay=3 * TICK)
LONG_REORDER = NetConfig(drop=0.1, max_delay=3 * TICK, long_delay=0.3, long_delay_max=40 * TICK)


class SimNode:
    """One replica: its disk survives crashes; its core, applied state and clock do not."""

    __slots__ = (
        "applied",
        "bootstrap",
        "config",
        "core",
        "incarnation",
        "last_commit",
        "log",
        "node_id",
        "paused_until",
        "pending",
        "tick_interval",
        "writes",
    )

    def __init__(self, node_id: int, tick_interval: int) -> None:
        self.node_id = node_id
        self.log = MemLog()
        self.core: RaftNode | None = None
        self.incarnation = 0
        self.tick_interval = tick_interval
        self.applied = -1
        self.config: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        # Membership handed to the core when its log holds none (bootstrap, or the join config).
        self.bootstrap: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        self.last_commit = -1
        self.pending: dict[int, bytes] = {}  # proposed base offset -> payload, until applied
        self.paused_until = 0  # a stopped process (GC, SIGSTOP): no ticks, inputs wait
        self.writes: deque[Ready] = deque()  # asynchronous storage: Readys still being written

    @property
    def alive(self) -> bool:
        return self.core is not None


class Simulation:
    """A cluster of RaftNodes driven exactly like a runtime drives them, on virtual time.

    Each Ready is handled in order: install the snapshot, append entries, save the hard
    state, fsync if must_sync, send messages, apply committed entries, deliver read states,
    advance. With `async_storage`, a node hands each Ready to a simulated disk that writes
    them in order after a random delay while the core goes on taking inputs and handing out
    more, and a leader sends its APPENDs and HEARTBEATs before its own write, as the node
    runtime does. Every random choice comes from random.Random(seed), split into independent
    streams.
    The checker runs on every persisted write, sent vote and applied entry, and on each
    touched node after every step; a broken rule raises InvariantViolation at once.
    """

    def __init__(
        self,
        seed: int,
        nodes: int = 3,
        *,
        spares: int = 0,
        net: NetConfig = RELIABLE,
        raft: RaftConfig | None = None,
        tick_intervals: dict[int, int] | None = None,
        crash_keeps_prefix: bool = False,
        async_storage: bool = False,
        disk_delay_max: int = 2 * TICK,
        trace: int = 0,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        master = random.Random(seed)
        self.seed = seed
        self.net = net
        self.net_rng = random.Random(master.getrandbits(64))
        self.disk_rng = random.Random(master.getrandbits(64))
        self.chaos_rng = random.Random(master.getrandbits(64))
        self._core_rng = random.Random(master.getrandbits(64))
        self.raft = raft or RaftConfig()
        self.crash_keeps_prefix = crash_keeps_prefix
        self.async_storage = async_storage
        self.disk_delay_max = disk_delay_max  # asynchronous storage: the longest write
        self.bootstrap = tuple(range(1, nodes + 1))
        self.checker = Checker()
        self.time = 0
        self.steps = 0
        self.sent: Counter[MessageType] = Counter()
        self.rejected_appends: Counter[tuple[int, int]] = Counter()  # (leader, follower)
        self.acked: dict[bytes, int] = {}  # payload -> offset, acknowledged as committed
        self.answered: set[tuple[int, bytes]] = set()  # (node, context) of reads answered
        self.groups: dict[int, int] = {}  # node -> partition group; absent means group 0
        self.cut: set[tuple[int, int]] = set()  # directed links that lose everything
        self._queue: list[tuple[int, int, int, object]] = []
        self._seq = 0
        self._proposals = 0
        self._reads: Counter[int] = Counter()  # read requests made per node
        self._trace: deque[str] | None = deque(maxlen=trace) if trace else None
        intervals = tick_intervals or {}
        self.nodes: dict[int, SimNode] = {}
        for node_id in range(1, nodes + spares + 1):
            self.nodes[node_id] = SimNode(node_id, intervals.get(node_id, TICK))
        for node_id in self.bootstrap:
            self.nodes[node_id].bootstrap = (self.bootstrap, ())
            self.start(node_id)

    # ----------------------------------------------------------------- event loop
    def _schedule(self, at: int, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, kind, payload))

    def call_at(self, at: int, action: Callable[[], None]) -> None:
        """Run `action` at virtual time `at` (used by Chaos and scripted scenarios)."""
        self._schedule(max(at, self.time), _CALL, action)

    def step(self) -> bool:
        """Process the next event; False when nothing is left to do."""
        if not self._queue:
            return False
        at, _, kind, payload = heapq.heappop(self._queue)
        self.time = at
        self.steps += 1
        if kind == _TICK:
            node_id, incarnation = payload  # type: ignore[misc]
            node = self.nodes[node_id]
            if node.core is not None and node.incarnation == incarnation:
                if node.paused_until > at:
                    self._schedule(node.paused_until, _TICK, payload)
                    return True
                self._note("tick", node_id)
                self._schedule(at + node.tick_interval, _TICK, payload)
                self._drive(node, node.core.tick)
        elif kind == _DELIVER:
            self._deliver(payload)  # type: ignore[arg-type]
        else:
            payload()  # type: ignore[operator]
        return True

    def run_for(self, duration: int) -> None:
        end = self.time + duration
        while self._queue and self._queue[0][0] <= end:
            self.step()
        self.time = max(self.time, end)

    def run_until(self, done: Callable[[], bool], timeout: int) -> bool:
        """Step until `done()` holds (checked after each step) or `timeout` time passes."""
        end = self.time + timeout
        while not done():
            if not self._queue or self._queue[0][0] > end:
                self.time = max(self.time, end)
                return done()
            self.step()
        return True

    def run_steps(self, steps: int) -> None:
        for _ in range(steps):
            if not self.step():
                return

    # ----------------------------------------------------------------- nodes
    def join(self, node_id: int, voters: Iterable[int], learners: Iterable[int]) -> None:
        """Start a fresh spare knowing the group as `voters`/`learners` until its log says more."""
        node = self.nodes[node_id]
        node.bootstrap = (tuple(sorted(voters)), tuple(sorted(learners)))
        self.start(node_id)

    def start(self, node_id: int) -> None:
        """(Re)start a replica from its durable state."""
        node = self.nodes[node_id]
        if node.alive:
            raise ValueError(f"node {node_id} is already running")
        if not node.bootstrap[0]:
            raise ValueError(f"node {node_id} was never part of the group: join it first")
        log = node.log
        snap = log.snapshot_meta()
        hard = log.hard_state
        self._check_restart(node)
        node.incarnation += 1
        node.paused_until = 0
        node.applied = snap.index
        node.config = (snap.voters, snap.learners) if snap.voters else node.bootstrap
        node.last_commit = hard.commit
        node.core = RaftNode(
            node_id,
            log,
            replace(hard),
            *node.bootstrap,
            self.raft,
            random.Random(self._core_rng.getrandbits(64)),
            snap.index,
        )
        self._note("start", node_id)
        self._schedule(self.time + node.tick_interval, _TICK, (node_id, node.incarnation))
        self._drive(node, None)

    def _check_restart(self, node: SimNode) -> None:
        hard = node.log.hard_state
        if hard.commit > node.log.last_index():
            raise InvariantViolation(
                "durable commit beyond the durable log",
                f"node {node.node_id}: commit {hard.commit}, last offset {node.log.last_index()}",
            )

    def crash(self, node_id: int) -> None:
        """Stop a replica; its disk keeps only what was synced (plus, maybe, a buffer prefix)."""
        node = self.nodes[node_id]
        if not node.alive:
            return
        self._note("crash", node_id)
        before = node.log.all_entries()
        keep = self.disk_rng.randint(0, node.log.unsynced) if self.crash_keeps_prefix else 0
        node.log.crash(keep)
        after = {(e.index, e.term) for e in node.log.all_entries()}
        self.checker.on_removed(
            node_id, [e for e in before if (e.index, e.term) not in after], "crash"
        )
        node.core = None
        node.pending.clear()
        node.writes.clear()  # never written: their messages are never sent

    def pause(self, node_id: int, duration: int) -> None:
        """Freeze a live replica for `duration`: it neither ticks nor handles messages."""
        node = self.nodes[node_id]
        node.paused_until = max(node.paused_until, self.time + duration)
        self._note("pause", (node_id, duration))

    def restart(self, node_id: int) -> None:
        self.crash(node_id)
        self.start(node_id)

    def _drive(self, node: SimNode, feed: Callable[[], object] | None) -> None:
        """Feed one input to the core, then run the Ready protocol until it is quiet."""
        core = node.core
        assert core is not None
        try:
            if feed is not None:
                feed()
            while core.has_ready():
                if self.async_storage:
                    self._hand_to_disk(node, core, core.ready())
                else:
                    self._handle_ready(node, core, core.ready())
        except (InvariantViolation, NotLeaderError, ConfigChangeError):
            raise  # a broken rule, or the core refusing a request as its API documents
        except Exception as exc:
            raise InvariantViolation(
                "core raised", f"node {node.node_id}: {traceback.format_exc(limit=-4)}"
            ) from exc
        self._check_node(node, core)

    def _hand_to_disk(self, node: SimNode, core: RaftNode, rd: Ready) -> None:
        """Queue the Ready's writes; a leader's replication goes out now if its term is
        already durable (the runtime's rule: followers write while the leader does)."""
        if rd.role == "leader" and node.log.hard_state.term == core.term:
            later = []
            for msg in rd.messages:
                if msg.type in (MessageType.APPEND, MessageType.HEARTBEAT):
                    self._send(node, msg)
                else:
                    later.append(msg)
            rd.messages = later
        node.writes.append(rd)
        if len(node.writes) == 1:
            self._schedule_write(node)

    def _schedule_write(self, node: SimNode) -> None:
        incarnation = node.incarnation

        def written() -> None:
            if node.core is None or node.incarnation != incarnation:
                return  # crashed meanwhile: the queued Readys were lost with it
            if node.paused_until > self.time:
                self.call_at(node.paused_until, written)
                return
            core = node.core
            # Everything queued so far is written at once: one write, one fsync.
            batch = list(node.writes)
            node.writes.clear()
            self._note("written", (node.node_id, len(batch)))
            try:
                for rd in batch:
                    self._handle_ready(node, core, rd)
            except InvariantViolation:
                raise
            except Exception as exc:  # the disk refused what the core handed out
                raise InvariantViolation(
                    "storage refused a write", f"node {node.node_id}: {exc!r}"
                ) from exc
            self._drive(node, None)
            if node.writes:
                self._schedule_write(node)

        self.call_at(self.time + 1 + int(self.disk_rng.random() * self.disk_delay_max), written)

    def _handle_ready(self, node: SimNode, core: RaftNode, rd: Ready) -> None:
        log = node.log
        checker = self.checker
        node_id = node.node_id
        if rd.snapshot is not None:
            checker.on_snapshot(node_id, node.applied, rd.snapshot)
            checker.on_removed(node_id, log.install(rd.snapshot), "snapshot install")
            node.applied = rd.snapshot.index
            node.config = (rd.snapshot.voters, rd.snapshot.learners)
        if rd.entries:
            checker.on_removed(node_id, log.append(rd.entries), "truncation")
            checker.on_append(node_id, log, rd.entries)
        if rd.hard_state is not None:
            checker.on_hard_state(node_id, log.hard_state, rd.hard_state)
            log.save(rd.hard_state)
        if rd.must_sync:
            log.fsync()
        for msg in rd.messages:
            self._send(node, msg)
        term = core.term
        for entry in rd.committed:
            checker.on_applied(node_id, node.applied, entry, term)
            node.applied = entry.last_index
            if entry.kind == EntryKind.CONFIG:
                node.config = _decode_config(entry.data)
            proposed = node.pending.pop(entry.index, None)
            if proposed is not None and proposed == entry.data:
                self.acked[proposed] = entry.index
        for read in rd.read_states:
            checker.on_read_state(node_id, read.index, read.context)
            self.answered.add((node_id, read.context))
        core.advance(rd)

    def _check_node(self, node: SimNode, core: RaftNode) -> None:
        checker = self.checker
        node_id = node.node_id
        role = core.role
        checker.on_role(node_id, role, core.term)
        if role == "leader":
            checker.check_leader_complete(node_id, core.term, node.log)
        # With asynchronous storage, a leader may commit entries its own disk does not hold
        # yet (a quorum of followers does), so commits are checked against the core's log.
        log = core if self.async_storage else node.log
        commit = core.commit_index
        if role == "leader" and commit > node.last_commit:
            checker.on_leader_commit(node_id, core.term, commit, log.term_at(commit))
        if commit < node.last_commit:
            raise InvariantViolation(
                "commit index regressed", f"node {node_id}: {node.last_commit} -> {commit}"
            )
        last = core.last_index if self.async_storage else node.log.last_index()
        if commit > last:
            raise InvariantViolation("commit beyond the log", f"node {node_id}: {commit} > {last}")
        node.last_commit = commit

    # ----------------------------------------------------------------- network
    def connected(self, src: int, dst: int) -> bool:
        return self.groups.get(src, 0) == self.groups.get(dst, 0) and (src, dst) not in self.cut

    def _send(self, node: SimNode, msg: Message) -> None:
        self.sent[msg.type] += 1
        mtype = msg.type
        if mtype == MessageType.VOTE_RESP and not msg.reject:
            self.checker.on_vote_granted(msg.src, msg.term, msg.dst, node.log.durable_hard_state())
        elif mtype == MessageType.VOTE:
            self.checker.on_campaign(msg.src, msg.term, node.log.durable_hard_state())
        elif mtype == MessageType.APPEND_RESP:
            if msg.reject:
                self.rejected_appends[(msg.dst, msg.src)] += 1
            else:
                self._check_ack_durable(node, msg)
        net = self.net
        rng = self.net_rng
        if (
            msg.dst not in self.nodes
            or not self.connected(msg.src, msg.dst)
            or (net.drop and rng.random() < net.drop)
        ):
            if mtype == MessageType.SNAPSHOT:
                self._report_snapshot(msg, ok=False)
            return
        self._schedule(self.time + self._delay(), _DELIVER, msg)
        if net.duplicate and rng.random() < net.duplicate:
            self._schedule(self.time + self._delay(), _DELIVER, msg)

    def _check_ack_durable(self, node: SimNode, msg: Message) -> None:
        """A follower acknowledges (APPEND_RESP log_index) only entries already synced."""
        log = node.log
        index = msg.log_index
        if index > log.durable_snapshot_index() and log.durable_term_at(index) != log.term_at(
            index
        ):
            raise InvariantViolation(
                "append acknowledged before it was durable",
                f"node {node.node_id} acked offset {index} to {msg.dst}; synced term there "
                f"{log.durable_term_at(index)}, stored {log.term_at(index)}",
            )

    def _report_snapshot(self, msg: Message, ok: bool) -> None:
        """The leader's runtime ships snapshot state out of band and tells its core the outcome."""
        assert msg.snapshot is not None
        leader = self.nodes[msg.src]
        report = Message(
            MessageType.SNAPSHOT_RESP,
            msg.dst,
            msg.src,
            msg.term,
            log_index=msg.snapshot.index,
            reject=not ok,
        )
        incarnation = leader.incarnation

        def deliver() -> None:
            core = leader.core
            if core is not None and leader.incarnation == incarnation:
                self._note("snapshot report", report)
                self._drive(leader, lambda: core.step(report))

        self.call_at(self.time + self.net.max_delay, deliver)

    def _delay(self) -> int:
        net = self.net
        rng = self.net_rng
        if net.long_delay and rng.random() < net.long_delay:
            return rng.randint(net.max_delay, net.long_delay_max)
        # Not randint: this is the hottest random draw, and random() is several times cheaper.
        return net.min_delay + int(rng.random() * (net.max_delay - net.min_delay + 1))

    def _deliver(self, msg: Message) -> None:
        node = self.nodes[msg.dst]
        if node.paused_until > self.time and node.core is not None:
            self._schedule(node.paused_until, _DELIVER, msg)  # it waits in the socket buffer
            return
        delivered = node.core is not None and self.connected(msg.src, msg.dst)
        if delivered:
            self._note("deliver", msg)
            core = node.core
            self._drive(node, lambda: core.step(msg))
        if msg.type == MessageType.SNAPSHOT:
            self._report_snapshot(msg, delivered)

    def partition(self, *groups: Iterable[int]) -> None:
        """Split the nodes: each listed group talks only within itself; unlisted nodes join
        the first group."""
        self.groups = {n: i for i, group in enumerate(groups) for n in group}
        self._note("partition", groups)

    def disconnect(self, node_id: int) -> None:
        """Isolate one node from everyone (keeps other partitions)."""
        self.groups[node_id] = -node_id
        self._note("disconnect", node_id)

    def reconnect(self, node_id: int) -> None:
        self.groups.pop(node_id, None)
        self._note("reconnect", node_id)

    def heal(self) -> None:
        self.groups.clear()
        self.cut.clear()
        self._note("heal", None)

    # ----------------------------------------------------------------- clients
    def next_payload(self) -> bytes:
        self._proposals += 1
        return b"p%d" % self._proposals

    def propose(self, node_id: int, data: bytes | None = None, count: int = 1) -> int | None:
        """Offer a payload to `node_id`; its base offset, or None if that node is not leader."""
        payload = data if data is not None else self.next_payload()
        offsets = self.propose_many(node_id, [payload], count)
        return offsets[0] if offsets else None

    def propose_many(self, node_id: int, payloads: list[bytes], count: int = 1) -> list[int]:
        """Offer payloads in one go, as a runtime batching producers does, then run one Ready
        cycle; their base offsets (fewer if the node stops leading part way)."""
        node = self.nodes[node_id]
        core = self.running(node_id)
        offsets: list[int] = []
        if core is None:
            return offsets
        self._note("propose", (node_id, payloads[:3], len(payloads), count))

        def feed() -> None:
            # Registered before the Ready loop: a single voter commits within this very drive.
            for payload in payloads:
                offset = core.propose(payload, count)
                node.pending[offset] = payload
                offsets.append(offset)

        try:
            self._drive(node, feed)
        except NotLeaderError:
            if offsets:  # the earlier proposals were accepted: hand them to the core's Ready
                self._drive(node, None)
        return offsets

    def change_membership(
        self, node_id: int, voters: Iterable[int], learners: Iterable[int]
    ) -> bool:
        """Propose a configuration on `node_id`; False if it refuses (not leader, one pending)."""
        core = self.running(node_id)
        if core is None:
            return False
        voters, learners = sorted(voters), sorted(learners)
        self._note("membership", (node_id, voters, learners))
        try:
            self._drive(self.nodes[node_id], lambda: core.propose_membership(voters, learners))
        except (NotLeaderError, ConfigChangeError):
            return False
        return True

    def transfer(self, node_id: int, to: int) -> None:
        """Ask leader `node_id` to hand leadership to voter `to`."""
        core = self.running(node_id)
        if core is not None:
            self._note("transfer", (node_id, to))
            self._drive(self.nodes[node_id], lambda: core.transfer_leadership(to))

    def read(self, node_id: int) -> bytes | None:
        """Ask `node_id` for a read barrier (None if it is down, paused or knows no leader);
        the answer is checked when it comes back."""
        # Each node numbers its own reads, as runtimes do: contexts repeat across nodes.
        self._reads[node_id] += 1
        context = b"r%d" % self._reads[node_id]
        core = self.running(node_id)
        if core is None:
            return None
        self.checker.on_read_request(node_id, context)
        self._note("read", (node_id, context))
        try:
            self._drive(self.nodes[node_id], lambda: core.read_index(context))
        except NotLeaderError:
            return None
        return context

    def compact(self, node_id: int) -> SnapshotMeta | None:
        """Trim `node_id`'s log up to what it applied, as a runtime does after a snapshot."""
        node = self.nodes[node_id]
        core = self.running(node_id)
        if core is None or node.applied <= node.log.snapshot_meta().index:
            return None
        voters, learners = node.config
        meta = node.log.trim(node.applied, voters, learners)
        self._note("compact", (node_id, meta.index))
        self._drive(node, lambda: core.compact(meta.index))
        return meta

    # ----------------------------------------------------------------- inspection
    def running(self, node_id: int) -> RaftNode | None:
        """The core of `node_id` if it is up and not paused (able to take a request now)."""
        node = self.nodes[node_id]
        return node.core if node.paused_until <= self.time else None

    def live(self) -> list[int]:
        return [n for n, node in self.nodes.items() if node.alive]

    def leader(self) -> int | None:
        """The leader of the highest term among live nodes, if that node knows it leads."""
        best: tuple[int, int] | None = None
        for node_id, node in self.nodes.items():
            core = node.core
            if core is not None and core.role == "leader" and (best is None or core.term > best[0]):
                best = (core.term, node_id)
        return None if best is None else best[1]

    def connected_leader(self, among: Iterable[int]) -> int | None:
        """A leader inside `among` that leads a majority of its voters inside `among`."""
        members = set(among)
        for node_id in sorted(members):
            core = self.nodes[node_id].core
            if core is None or core.role != "leader":
                continue
            voters = core.voters
            if len(voters & members) * 2 > len(voters):
                return node_id
        return None

    def applied_at(self, offset: int) -> list[int]:
        """Nodes that applied the entry at `offset` (recorded as committed)."""
        return [n for n, node in self.nodes.items() if node.alive and node.applied >= offset]

    def trace(self) -> list[str]:
        return list(self._trace) if self._trace is not None else []

    def _note(self, what: str, detail: object) -> None:
        if self._trace is None:
            return
        if isinstance(detail, Message):
            m = detail
            detail = (
                f"{m.type.name} {m.src}->{m.dst} t{m.term} at ({m.log_index},{m.log_term}) "
                f"n={len(m.entries)} c={m.commit}{' reject' if m.reject else ''}"
                f"{f' hint={m.reject_hint}/{m.hint_term}' if m.reject else ''}"
            )
        roles = " ".join(
            f"{n}:{_ROLE[node.core.role]}{node.core.term}" if node.core else f"{n}:down"
            for n, node in self.nodes.items()
            if node.bootstrap[0]  # spares that never joined stay out of the picture
        )
        self._trace.append(f"[{self.steps} t={self.time}] {what} {detail}  | {roles}")


def _decode_config(data: bytes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    doc = json.loads(data)
    return tuple(doc["voters"]), tuple(doc.get("learners", ()))
