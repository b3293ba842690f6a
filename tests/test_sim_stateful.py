"""Hypothesis drives the simulated cluster's faults step by step; on a violation it shrinks the
schedule to a minimal one. The simulator's checker enforces safety after every step, and the
teardown heals everything and requires progress (liveness)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from raftline.raftlog.simchaos import check_final, settle
from raftline.raftlog.simcluster import TICK, NetConfig, Simulation

ELECTION = 2 * 10 * TICK
node_pick = st.integers(0, 6)  # an index into the cluster's nodes, taken modulo its size


class SimulatedCluster(RuleBasedStateMachine):
    sim: Simulation

    @initialize(seed=st.integers(0, 2**32 - 1), nodes=st.sampled_from([3, 5]))
    def boot(self, seed: int, nodes: int) -> None:
        net = NetConfig(drop=0.05, duplicate=0.05, max_delay=2 * TICK, long_delay=0.02)
        self.sim = Simulation(seed, nodes, net=net)

    def node(self, pick: int) -> int:
        members = sorted(self.sim.nodes)
        return members[pick % len(members)]

    @rule(duration=st.integers(1, ELECTION))
    def run(self, duration: int) -> None:
        self.sim.run_for(duration)

    @rule(pick=node_pick, count=st.integers(1, 3))
    def propose(self, pick: int, count: int) -> None:
        leader = self.sim.leader()
        self.sim.propose(leader if leader is not None else self.node(pick), count=count)

    @rule(pick=node_pick)
    def crash(self, pick: int) -> None:
        self.sim.crash(self.node(pick))

    @rule(pick=node_pick)
    def restart(self, pick: int) -> None:
        node = self.node(pick)
        if not self.sim.nodes[node].alive:
            self.sim.start(node)

    @rule(picks=st.lists(node_pick, min_size=1, max_size=3))
    def partition(self, picks: list[int]) -> None:
        side = {self.node(p) for p in picks}
        self.sim.partition(sorted(side), sorted(set(self.sim.nodes) - side))

    @rule()
    def heal(self) -> None:
        self.sim.heal()

    @rule(pick=node_pick)
    def compact(self, pick: int) -> None:
        self.sim.compact(self.node(pick))

    @rule(pick=node_pick)
    def read(self, pick: int) -> None:
        self.sim.read(self.node(pick))

    @rule(pick=node_pick)
    def transfer(self, pick: int) -> None:
        leader = self.sim.leader()
        target = self.node(pick)
        if leader is not None and target != leader:
            self.sim.transfer(leader, target)

    def teardown(self) -> None:
        if hasattr(self, "sim"):
            settle(self.sim, self.sim.raft.election_ticks)
            check_final(self.sim)


SimulatedCluster.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSimulatedCluster = SimulatedCluster.TestCase
