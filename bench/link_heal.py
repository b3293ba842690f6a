"""Time from a network partition's heal to each cut node-pair link carrying frames again.

Runs in the compose cluster (image $RAFTLINE_IMAGE, hold /tmp/raftline-compose.lock): each round
cuts the nodes into two halves with the chaos harness's nftables drops, heals after `cut_s`, and
reads the nodes' link log lines (node/transport.py) for when each node heard each peer across the
cut again, and whether on the kept connection or a new one. Usage:
.venv/bin/python -m bench.link_heal [--rounds N] [--cut-s S] [--project P] [--keep]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime

from bench.positionals import positive_float, positive_int
from raftline.chaos.cluster import ComposeCluster, Node

# The node's log format (node/server.py): "2026-11-27 05:01:11,123 INFO raftline.node.transport:"
LINK_UP = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO raftline\.node\.transport: link to node (\d+) "
    r"(up on a new connection|alive again on the same connection)"
)
SETTLE_S = 15.0  # after a heal: the longest wait measured for a link is below this


@dataclass(frozen=True)
class LinkBack:
    """Node `node` heard `peer` again `after_s` after its heal began."""

    node: int
    peer: int
    after_s: float
    how: str  # "new" connection or "same" connection


def heard_again(
    cluster: ComposeCluster, node: Node, since: float, healed: dict[tuple[int, int], float]
) -> list[LinkBack]:
    """The first link-up line per peer in `node`'s log after that pair's heal."""
    argv = ["docker", "logs", "--since", f"{since:.3f}", node.container]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    logs = done.stdout + done.stderr  # the node logs to stderr
    found: dict[int, LinkBack] = {}
    for line in sorted(logs.splitlines()):
        match = LINK_UP.match(line)
        if match is None:
            continue
        peer = int(match.group(2))
        heal = healed.get((node.node_id, peer))
        at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if heal is None or at < heal or peer in found:
            continue
        how = "new" if match.group(3).startswith("up") else "same"
        found[peer] = LinkBack(node.node_id, peer, at - heal, how)
    return list(found.values())


def one_round(cluster: ComposeCluster, rng: random.Random, cut_s: float) -> list[LinkBack]:
    ids = [n.node_id for n in cluster.nodes]
    side = set(rng.sample(ids, len(ids) // 2))
    started = time.time()
    for node in cluster.nodes:
        mine = side if node.node_id in side else set(ids) - side
        cluster.drop_from(node, [cluster.node(j) for j in ids if j not in mine])
    time.sleep(cut_s)
    # A node drops what arrives from across the cut, so it hears a peer again once its own
    # rule is gone: timed from the start of that node's heal (which includes the nft call).
    healing: dict[int, float] = {}
    for node in cluster.nodes:
        healing[node.node_id] = time.time()
        cluster.heal(node)
    healed = {(a, b): healing[a] for a in ids for b in ids if (a in side) != (b in side)}
    time.sleep(SETTLE_S)
    backs = [b for node in cluster.nodes for b in heard_again(cluster, node, started, healed)]
    missing = len(healed) - len(backs)
    print(
        f"cut {sorted(side)} | {sorted(set(ids) - side)} for {cut_s:.0f} s: "
        + " ".join(f"{b.node}<-{b.peer} {b.after_s:.2f}s/{b.how}" for b in backs)
        + (f" ({missing} not back within {SETTLE_S:.0f} s)" if missing else ""),
        flush=True,
    )
    return backs


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.link_heal", description=__doc__)
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--cut-s", type=positive_float, default=20.0)
    parser.add_argument("--project", default="raftline-link-heal")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    cluster = ComposeCluster(size=5, project=args.project)
    rng = random.Random(args.seed)
    cluster.up()
    try:
        if not cluster.wait_ready():
            raise SystemExit("the cluster did not become ready")
        backs: list[LinkBack] = []
        for _ in range(args.rounds):
            backs += one_round(cluster, rng, args.cut_s)
            time.sleep(5.0)
        waits = sorted(b.after_s for b in backs)
        if waits:
            print(
                f"heal -> heard again, {len(waits)} node-peer links: "
                f"median {statistics.median(waits):.2f} s, max {waits[-1]:.2f} s; "
                f"new connection {sum(b.how == 'new' for b in backs)}, "
                f"same connection {sum(b.how == 'same' for b in backs)}"
            )
    finally:
        cluster.heal_all()
        if not args.keep:
            cluster.down()


if __name__ == "__main__":
    main()
