"""Throughput of the Raft core alone: proposals committed per second, 3 simulated nodes, no faults.

Owns the core hot-path benchmark: batched proposals through the Ready protocol on the simulator
(in-memory logs, instant-ish network), with and without the simulator's safety checker.
"""

from __future__ import annotations

import argparse
import time

from raftline.raftlog.invariants import Checker
from raftline.raftlog.simcluster import TICK, NetConfig, Simulation
from raftline.raftlog.types import MessageType


class NoChecks(Checker):
    """The checker with every rule switched off, to time the core and driver alone."""

    def on_append(self, *args: object) -> None: ...
    def on_removed(self, *args: object) -> None: ...
    def on_hard_state(self, *args: object) -> None: ...
    def on_vote_granted(self, *args: object) -> None: ...
    def on_campaign(self, *args: object) -> None: ...
    def on_role(self, *args: object) -> None: ...
    def check_leader_complete(self, *args: object) -> None: ...
    def on_leader_commit(self, *args: object) -> None: ...
    def on_applied(self, *args: object) -> None: ...


def run(proposals: int, batch: int, payload_size: int, checks: bool) -> dict[str, float]:
    sim = Simulation(1, 3, net=NetConfig(min_delay=1, max_delay=1))
    if not checks:
        sim.checker = NoChecks()
    assert sim.run_until(lambda: sim.leader() is not None, 100 * TICK)
    leader = sim.leader()
    assert leader is not None
    filler = b"x" * max(0, payload_size - 8)
    sent_before = sim.sent[MessageType.APPEND]
    started = time.perf_counter()
    done = 0
    while done < proposals:
        payloads = [b"%08d" % (done + i) + filler for i in range(min(batch, proposals - done))]
        offsets = sim.propose_many(leader, payloads)
        assert len(offsets) == len(payloads), "leadership moved during a fault-free run"
        last = payloads[-1]
        assert sim.run_until(lambda last=last: last in sim.acked, 100 * TICK)
        done += len(payloads)
    elapsed = time.perf_counter() - started
    appends = sim.sent[MessageType.APPEND] - sent_before
    return {
        "per_second": proposals / elapsed,
        "seconds": elapsed,
        "appends": appends,
        "entries_per_append": 2 * proposals / max(appends, 1),  # two followers
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proposals", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=64, help="proposals per Ready cycle")
    parser.add_argument("--payload", type=int, default=100, help="bytes per proposal")
    parser.add_argument("--runs", type=int, default=3, help="best of N")
    args = parser.parse_args()
    if min(args.proposals, args.batch, args.runs) < 1 or args.payload < 8:
        parser.error("--proposals, --batch, --runs must be >= 1 and --payload >= 8")
    print(f"3 nodes, no faults, {args.proposals} proposals of {args.payload} B, batch {args.batch}")
    for checks in (False, True):
        best = max(
            (run(args.proposals, args.batch, args.payload, checks) for _ in range(args.runs)),
            key=lambda r: r["per_second"],
        )
        label = "core + driver + checker" if checks else "core + driver"
        print(
            f"{label:24} {best['per_second']:>10,.0f} proposals/s committed  "
            f"({best['entries_per_append']:.1f} entries per APPEND)"
        )


if __name__ == "__main__":
    main()
