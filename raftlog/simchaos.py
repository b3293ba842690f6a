"""Seeded random runs of the simulated cluster: a fault/workload plan per seed, then liveness.

Owns swarm-style fault parameters (Plan), the random schedule (Chaos), the healing phase that
checks progress (settle), the final acknowledged-proposal check and run_seed.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

from raftline.raftlog.invariants import InvariantViolation
from raftline.raftlog.raft import RaftConfig, RaftNode
from raftline.raftlog.simcluster import RELIABLE, TICK, NetConfig, SimNode, Simulation


@dataclass(slots=True)
class Plan:
    """Fault and workload parameters one seed draws (swarm testing: each seed its own mix)."""

    nodes: int
    steps: int
    net: NetConfig
    tick_intervals: dict[int, int]
    election_ticks: int
    heartbeat_ticks: int
    crash_keeps_prefix: bool
    action_every: int  # mean virtual time between chaos actions
    weights: dict[str, int] = field(default_factory=dict)
    max_down: int = 1
    max_append_bytes: int = 1 << 20  # tiny values send one entry per APPEND
    max_inflight: int = 64
    async_storage: bool = False  # Readys written after a delay while the core goes on
    disk_delay_max: int = 2 * TICK
    max_inflight_bytes: int = 16 << 20  # tiny values pause the pipeline after each APPEND


def make_plan(seed: int, nodes: int | None = None, steps: int | None = None) -> Plan:
    """The seed's fault mix; `nodes`/`steps` pin the cluster size or the chaos length."""
    rng = random.Random(seed ^ 0x5EED)
    size = nodes if nodes is not None else rng.choice((1, 3, 3, 3, 5, 5, 7))
    lossy = rng.random() < 0.6
    net = NetConfig(
        drop=rng.choice((0.0, 0.01, 0.05, 0.1, 0.2)) if lossy else 0.0,
        duplicate=rng.choice((0.0, 0.0, 0.02, 0.1)),
        min_delay=1,
        max_delay=rng.choice((2, 5, 10, 20)),
        long_delay=rng.choice((0.0, 0.0, 0.01, 0.05)),
        long_delay_max=rng.choice((10, 30, 60)) * TICK,
    )
    skewed = rng.random() < 0.5
    intervals = {
        n: rng.randint(TICK // 2, TICK * 3 // 2) if skewed else TICK for n in range(1, size + 3)
    }
    weights = {
        "propose": rng.randint(5, 30),
        "crash": rng.choice((0, 1, 2, 4)),
        "restart": 4,
        "partition": rng.choice((0, 1, 3)),
        "isolate": rng.choice((0, 1, 3)),
        "cut": rng.choice((0, 1, 2)),
        "heal": 3,
        "membership": rng.choice((0, 0, 1, 2)) if size > 1 else 0,
        "transfer": rng.choice((0, 1, 2)),
        "compact": rng.choice((0, 1, 3)),
        "read": rng.choice((0, 1, 3)),
        "pause": rng.choice((0, 1, 2)),
    }
    return Plan(
        nodes=size,
        steps=steps if steps is not None else rng.randint(150, 600),
        net=net,
        tick_intervals=intervals,
        election_ticks=rng.choice((5, 8, 10)),
        heartbeat_ticks=rng.choice((1, 1, 2)),
        crash_keeps_prefix=rng.random() < 0.3,
        action_every=rng.choice((2, 5, 10, 30)),
        weights=weights,
        max_down=rng.choice((size - 1, (size - 1) // 2)) if size > 1 else 1,
        max_append_bytes=rng.choice((1, 64, 1 << 20)),
        max_inflight=rng.choice((1, 4, 64)),
        # Drawn last, so that earlier draws keep the plans seeds had before these existed.
        async_storage=rng.random() < 0.5,
        disk_delay_max=rng.choice((TICK // 2, 2 * TICK, 4 * TICK)),
        max_inflight_bytes=rng.choice((1, 200, 16 << 20)),
    )


class Chaos:
    """Random workload and faults for one Simulation, drawn from the seed's Plan."""

    def __init__(self, sim: Simulation, plan: Plan) -> None:
        self.sim = sim
        self.plan = plan
        self.rng = sim.chaos_rng
        self.running = True
        names = sorted(plan.weights)
        self._names = names
        self._weights = [plan.weights[n] for n in names]
        self._actions: dict[str, Callable[[], None]] = {
            "propose": self.propose,
            "crash": self.crash,
            "restart": self.restart,
            "partition": self.partition,
            "isolate": self.isolate,
            "cut": self.cut,
            "heal": self.sim.heal,
            "membership": self.membership,
            "transfer": self.transfer,
            "compact": self.compact,
            "read": self.read,
            "pause": self.pause,
        }
        self._next()

    def _next(self) -> None:
        delay = 1 + int(self.rng.expovariate(1 / self.plan.action_every))
        self.sim.call_at(self.sim.time + delay, self._act)

    def _act(self) -> None:
        if not self.running:
            return
        (name,) = self.rng.choices(self._names, self._weights)
        self._actions[name]()
        self._next()

    def _pick(self, nodes: list[int]) -> int | None:
        return self.rng.choice(nodes) if nodes else None

    def _leader_or_any(self) -> int | None:
        leader = self.sim.leader()
        if leader is not None and self.rng.random() < 0.8:
            return leader
        return self._pick(self.sim.live())

    def propose(self) -> None:
        node = self._leader_or_any()
        if node is not None:
            self.sim.propose(node, count=self.rng.randint(1, 3))

    def crash(self) -> None:
        sim = self.sim
        down = [n for n in sim.bootstrap if not sim.nodes[n].alive]
        if len(down) < self.plan.max_down:
            node = self._pick(sim.live())
            if node is not None:
                sim.crash(node)

    def restart(self) -> None:
        node = self._pick([n for n, node in self.sim.nodes.items() if self._started(n, node)])
        if node is not None:
            self.sim.start(node)

    def _started(self, node_id: int, node: SimNode) -> bool:
        """Down, and part of the cluster (a bootstrap node or a spare that once joined)."""
        return not node.alive and bool(node.bootstrap[0])

    def partition(self) -> None:
        """Split the nodes into 2 or 3 random groups (sizes arbitrary, maybe one empty)."""
        nodes = sorted(self.sim.nodes)
        self.rng.shuffle(nodes)
        cuts = sorted(self.rng.randint(0, len(nodes)) for _ in range(self.rng.randint(1, 2)))
        bounds = [0, *cuts, len(nodes)]
        self.sim.partition(*(nodes[a:b] for a, b in pairwise(bounds)))

    def isolate(self) -> None:
        node = self._pick(sorted(self.sim.nodes))
        if node is not None:
            self.sim.disconnect(node)

    def cut(self) -> None:
        nodes = sorted(self.sim.nodes)
        if len(nodes) > 1:
            src, dst = self.rng.sample(nodes, 2)
            self.sim.cut.add((src, dst))

    def _leader_core(self) -> tuple[int, RaftNode] | None:
        leader = self.sim.leader()
        if leader is None:
            return None
        core = self.sim.nodes[leader].core
        assert core is not None
        return leader, core

    def membership(self) -> None:
        sim = self.sim
        found = self._leader_core()
        if found is None:
            return
        leader, core = found
        voters, learners = set(core.voters), set(core.learners)
        outsiders = [n for n in sorted(sim.nodes) if n not in voters | learners]
        choice = self.rng.random()
        if choice < 0.35 and outsiders:
            joining = self.rng.choice(outsiders)
            learners.add(joining)
            if not sim.nodes[joining].alive:
                if sim.nodes[joining].bootstrap[0]:
                    sim.start(joining)
                else:
                    sim.join(joining, voters, learners)
        elif choice < 0.7 and learners:
            promoted = self.rng.choice(sorted(learners))
            learners.discard(promoted)
            voters.add(promoted)
        elif len(voters) > 1:
            leaving = self.rng.choice(sorted(voters))
            voters.discard(leaving)
        else:
            return
        sim.change_membership(leader, voters, learners)

    def transfer(self) -> None:
        sim = self.sim
        found = self._leader_core()
        if found is None:
            return
        leader, core = found
        target = self._pick(sorted(core.voters - {leader}))
        if target is not None:
            sim.transfer(leader, target)

    def compact(self) -> None:
        node = self._pick(self.sim.live())
        if node is not None:
            self.sim.compact(node)

    def pause(self) -> None:
        node = self._pick(self.sim.live())
        if node is not None:
            timeout = 2 * self.plan.election_ticks * TICK
            self.sim.pause(node, self.rng.randint(1, 3 * timeout))

    def read(self) -> None:
        node = self._pick(self.sim.live())
        if node is not None:
            self.sim.read(node)


@dataclass(slots=True)
class SeedResult:
    """What one seed did, and the first broken rule with the trace leading to it."""

    seed: int
    nodes: int
    steps: int
    elections: int
    commits: int
    violation: str | None = None
    trace: list[str] = field(default_factory=list)
    recovery: float = 0.0  # election timeouts from healing to a committed proposal


def build(
    seed: int, nodes: int | None = None, steps: int | None = None, trace: int = 0
) -> tuple[Simulation, Plan]:
    """The Simulation and Plan for one seed (without running it)."""
    plan = make_plan(seed, nodes, steps)
    raft = RaftConfig(
        election_ticks=plan.election_ticks,
        heartbeat_ticks=plan.heartbeat_ticks,
        max_append_bytes=plan.max_append_bytes,
        max_inflight=plan.max_inflight,
        max_inflight_bytes=plan.max_inflight_bytes,
    )
    sim = Simulation(
        seed,
        plan.nodes,
        spares=2 if plan.weights["membership"] else 0,
        net=plan.net,
        raft=raft,
        tick_intervals=plan.tick_intervals,
        crash_keeps_prefix=plan.crash_keeps_prefix,
        async_storage=plan.async_storage,
        disk_delay_max=plan.disk_delay_max,
        trace=trace,
    )
    return sim, plan


def settle(sim: Simulation, election_ticks: int) -> float:
    """Liveness: heal everything, restart every member; a leader must commit a new proposal
    within a bounded time. Returns the time it took, in election timeouts."""
    sim.heal()
    sim.net = RELIABLE
    for node_id, node in sim.nodes.items():
        if not node.alive and node.bootstrap[0]:
            sim.start(node_id)
    members = [node for node in sim.nodes.values() if node.alive]
    slowest = max(node.tick_interval for node in members)
    timeout = election_ticks * slowest
    budget = 20 * timeout
    # Faults stop once the last paused process resumes (a pause cannot be cut short).
    healed = max(sim.time, *(node.paused_until for node in members))
    deadline = healed + budget
    while sim.time < deadline:
        if not sim.run_until(lambda: sim.leader() is not None, deadline - sim.time):
            break
        leader = sim.leader()
        assert leader is not None
        payload = b"live%d" % sim.steps
        if sim.propose(leader, payload) is None:  # e.g. a leadership transfer in progress
            sim.run_for(slowest)
            continue
        # Leadership may move (a transfer in flight); then try again on the new leader.
        sim.run_until(_committed_or_deposed(sim, payload, leader), 40 * slowest)
        if payload in sim.acked:
            return max(0, sim.time - healed) / timeout
    raise InvariantViolation(
        "no progress after healing",
        f"no leader committed a proposal within {budget} time units "
        f"(leader {sim.leader()}, terms "
        f"{ {n: node.core.term for n, node in sim.nodes.items() if node.core} })",
    )


def check_reads_answered(sim: Simulation, election_ticks: int) -> None:
    """Liveness of read barriers once healed: every voter that follows the leader in its term
    asks for one at the same moment (each numbers its own reads, so the leader holds equal
    contexts from several nodes), and every read is answered in bounded time. A leader change
    meanwhile may drop reads (their requesters retry), so the round is asked again then."""
    slowest = max(sim.nodes[n].tick_interval for n in sim.live())
    budget = 10 * election_ticks * slowest
    for _ in range(5):
        leader = sim.leader()
        if leader is None:
            sim.run_until(lambda: sim.leader() is not None, budget)
            continue
        term = sim.nodes[leader].core.term
        voters = sim.nodes[leader].config[0]
        asked = [
            (n, context)
            for n in voters
            if (core := sim.running(n)) is not None
            and (core.leader_id, core.term) == (leader, term)  # a stale term's read is dropped
            and (context := sim.read(n)) is not None
        ]
        if sim.run_until(_all_answered(sim, asked), budget):
            return
        if sim.leader() == leader and sim.nodes[leader].core.term == term:
            missing = [a for a in asked if a not in sim.answered]
            raise InvariantViolation(
                "read not answered",
                f"leader {leader} (term {term}) left reads {missing} unanswered for {budget}",
            )
    raise InvariantViolation("read not answered", "leadership kept moving after healing")


def _all_answered(sim: Simulation, asked: list[tuple[int, bytes]]) -> Callable[[], bool]:
    return lambda: all(read in sim.answered for read in asked)


def _committed_or_deposed(sim: Simulation, payload: bytes, leader: int) -> Callable[[], bool]:
    return lambda: payload in sim.acked or sim.leader() != leader


def check_final(sim: Simulation) -> None:
    """Every proposal acknowledged as committed is in the final log exactly once: in the
    committed record at its offset, and in the log of the most advanced live replica."""
    committed = sim.checker.committed_data()
    final = max(sim.live(), key=lambda n: sim.nodes[n].applied)
    log = sim.nodes[final].log
    floor = log.snapshot_meta().index
    by_offset = {e.index: e.data for e in log.all_entries()}
    for payload, offset in sim.acked.items():
        if committed.get(payload) != offset:
            raise InvariantViolation(
                "acknowledged proposal lost",
                f"{payload!r} acked at {offset}, committed at {committed.get(payload)}",
            )
        if offset > floor and by_offset.get(offset) != payload:
            raise InvariantViolation(
                "acknowledged proposal missing from the final log",
                f"{payload!r} at {offset} on node {final}",
            )


def run_seed(
    seed: int, nodes: int | None = None, steps: int | None = None, trace: int = 0
) -> SeedResult:
    """Run one seed: a chaos phase, then healing and the liveness check, then final checks."""
    sim, plan = build(seed, nodes, steps, trace)
    try:
        chaos = Chaos(sim, plan)
        sim.run_steps(plan.steps)
        chaos.running = False
        recovery = settle(sim, plan.election_ticks)
        check_reads_answered(sim, plan.election_ticks)
        check_final(sim)
    except Exception as exc:  # a violation, or a harness bug: either way report the seed
        detail = str(exc) if isinstance(exc, InvariantViolation) else traceback.format_exc()
        return SeedResult(
            seed,
            plan.nodes,
            sim.steps,
            len(sim.checker.leaders),
            len(sim.checker.committed),
            detail,
            sim.trace(),
        )
    return SeedResult(
        seed,
        plan.nodes,
        sim.steps,
        len(sim.checker.leaders),
        len(sim.checker.committed),
        recovery=recovery,
    )
