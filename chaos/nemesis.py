"""Fault injection in Jepsen's vocabulary: partitions, kills, pauses, loss, delay, clock skew, and
outages of the cluster's object storage.

Owns each fault's start/heal against a cluster, and the schedule that alternates faults and quiet.
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from raftline.chaos.cluster import Cluster, ClusterError, ComposeCluster, Node
from raftline.chaos.history import NEMESIS, Recorder

PARTITION_SHAPES = ("halves", "one", "leader", "ring")


class Fault(Protocol):
    name: str

    def start(self, rng: random.Random) -> dict[str, Any]: ...

    def stop(self) -> dict[str, Any]: ...


def majorities_ring(node_ids: Sequence[int], rng: random.Random) -> dict[int, set[int]]:
    """Each node sees a majority (itself and its ring neighbours), and no two see the same one."""
    ring = list(node_ids)
    rng.shuffle(ring)
    n, majority = len(ring), len(ring) // 2 + 1
    low = -(majority // 2)
    return {ring[i]: {ring[(i + d) % n] for d in range(low, low + majority)} for i in range(n)}


def leader_counts(cluster: ComposeCluster, topic: str) -> dict[int, int]:
    """How many partitions of `topic` each node leads, as any reachable node reports it."""
    for node in cluster.nodes:
        try:
            with urllib.request.urlopen(f"{node.http_url}/v1/topics/{topic}", timeout=2) as reply:
                body = json.load(reply)
        except (urllib.error.URLError, OSError, ValueError):
            continue
        counts: dict[int, int] = {}
        for p in body.get("partitions", []):
            if isinstance(p.get("leader"), int):
                counts[p["leader"]] = counts.get(p["leader"], 0) + 1
        return counts
    return {}


@dataclass
class Targets:
    """Chooses the nodes a process fault hits: a random one, or the busiest leader."""

    cluster: ComposeCluster
    topic: str

    def pick(self, rng: random.Random, prefer_leader: bool) -> Node:
        counts = leader_counts(self.cluster, self.topic) if prefer_leader else {}
        if counts:
            return self.cluster.node(max(counts, key=lambda n: counts[n]))
        return rng.choice(self.cluster.nodes)


@dataclass
class Partition:
    cluster: ComposeCluster
    targets: Targets
    shapes: Sequence[str] = PARTITION_SHAPES
    name: str = "partition"

    def start(self, rng: random.Random) -> dict[str, Any]:
        shape = rng.choice(list(self.shapes))
        ids = [n.node_id for n in self.cluster.nodes]
        if shape == "ring":
            sees = majorities_ring(ids, rng)
        else:
            if shape == "halves":
                shuffled = rng.sample(ids, len(ids))
                side = set(shuffled[: len(ids) // 2])
            else:
                side = {self.targets.pick(rng, prefer_leader=shape == "leader").node_id}
            sees = {i: side if i in side else set(ids) - side for i in ids}
        for node in self.cluster.nodes:
            cut = [self.cluster.node(j) for j in ids if j not in sees[node.node_id]]
            self.cluster.drop_from(node, cut)
        return {"fault": self.name, "shape": shape, "sees": {i: sorted(s) for i, s in sees.items()}}

    def stop(self) -> dict[str, Any]:
        self.cluster.heal_all()
        return {"fault": self.name}


@dataclass
class PacketLoss:
    cluster: ComposeCluster
    loss_percent: int = 20
    name: str = "loss"

    def start(self, rng: random.Random) -> dict[str, Any]:
        for node in self.cluster.nodes:
            peers = [p for p in self.cluster.nodes if p is not node]
            self.cluster.drop_from(node, peers, self.loss_percent)
        return {"fault": self.name, "percent": self.loss_percent}

    def stop(self) -> dict[str, Any]:
        self.cluster.heal_all()
        return {"fault": self.name}


@dataclass
class SlowNetwork:
    """A minority of nodes send through a narrow, queueing link: delayed messages."""

    cluster: ComposeCluster
    rate_kbit: int = 1000
    name: str = "slow"
    slowed: list[Node] = field(default_factory=list)

    def start(self, rng: random.Random) -> dict[str, Any]:
        minority = max(1, (len(self.cluster.nodes) - 1) // 2)
        self.slowed = rng.sample(self.cluster.nodes, rng.randint(1, minority))
        for node in self.slowed:
            self.cluster.slow_down(node, self.rate_kbit)
        return {
            "fault": self.name,
            "nodes": [n.node_id for n in self.slowed],
            "kbit": self.rate_kbit,
        }

    def stop(self) -> dict[str, Any]:
        for node in self.slowed:
            self.cluster.heal(node)
        healed, self.slowed = [n.node_id for n in self.slowed], []
        return {"fault": self.name, "nodes": healed}


@dataclass
class ProcessFault:
    """kill: SIGKILL then restart from the same volume; pause: freeze then thaw."""

    cluster: ComposeCluster
    targets: Targets
    name: str
    victims: list[Node] = field(default_factory=list)

    def start(self, rng: random.Random) -> dict[str, Any]:
        node = self.targets.pick(rng, prefer_leader=rng.random() < 0.5)
        (self.cluster.kill if self.name == "kill" else self.cluster.pause)(node)
        self.victims.append(node)
        return {"fault": self.name, "node": node.node_id}

    def stop(self) -> dict[str, Any]:
        healed = []
        while self.victims:
            node = self.victims.pop()
            if self.name == "kill":
                self.cluster.start(node)
                self.cluster.refresh_address(node)
            else:
                self.cluster.resume(node)
            healed.append(node.node_id)
        return {"fault": self.name, "nodes": healed}


# A node busy on a loaded machine may take seconds to answer a hook; a heal given up after 2 s
# left a clock offset in force for the rest of a run.
HOOK_TIMEOUT_S = 10.0


def post_hook(node: Node, path: str, body: dict[str, Any]) -> None:
    """POST to one of the node's test hooks (they exist only with RAFTLINE_TEST_HOOKS=1)."""
    request = urllib.request.Request(
        f"{node.http_url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        urllib.request.urlopen(request, timeout=HOOK_TIMEOUT_S).close()
    except (urllib.error.URLError, OSError) as failure:
        raise ClusterError(f"test hook {path} on node {node.node_id}: {failure}") from None


def reset_hook(nodes: Sequence[Node], path: str, body: dict[str, Any]) -> None:
    """POSTs `body` to the hook of every node, also after one of them failed (each node not
    reset keeps its fault); raises naming every node that failed."""
    failures = []
    for node in nodes:
        try:
            post_hook(node, path, body)
        except ClusterError as failure:
            failures.append(str(failure))
    if failures:
        raise ClusterError("; ".join(failures))


@dataclass
class ClockSkew:
    """Shifts nodes' wall clocks through the node's test hook:
    `POST /v1/admin/clock {"offset_ms": n}`; offset 0 restores the real clock."""

    cluster: ComposeCluster
    max_skew_ms: int = 60_000
    name: str = "clock"

    def start(self, rng: random.Random) -> dict[str, Any]:
        chosen = rng.sample(self.cluster.nodes, max(1, len(self.cluster.nodes) // 2))
        offsets = {n.node_id: rng.randint(-self.max_skew_ms, self.max_skew_ms) for n in chosen}
        for node in chosen:
            post_hook(node, "/v1/admin/clock", {"offset_ms": offsets[node.node_id]})
        return {"fault": self.name, "offsets_ms": offsets}

    def stop(self) -> dict[str, Any]:
        reset_hook(self.cluster.nodes, "/v1/admin/clock", {"offset_ms": 0})
        return {"fault": self.name}


@dataclass
class MessageDelay:
    """Delayed, reordered and duplicated node-to-node messages, through the node's transport
    hook `POST /v1/admin/network` (this kernel has no `tc netem`). Delays stay well under the
    1 s after which a silent peer counts as down, so this is slowness, not a partition."""

    cluster: ComposeCluster
    max_delay_ms: int = 250
    name: str = "delay"

    def start(self, rng: random.Random) -> dict[str, Any]:
        chosen = rng.sample(self.cluster.nodes, rng.randint(1, len(self.cluster.nodes)))
        settings = {}
        for node in chosen:
            delay = rng.randint(10, self.max_delay_ms)
            body = {
                "delay_ms": delay,
                "jitter_ms": rng.randint(0, delay),
                "reorder": round(rng.uniform(0, 0.3), 3),
                "duplicate": round(rng.uniform(0, 0.2), 3),
            }
            post_hook(node, "/v1/admin/network", body)
            settings[node.node_id] = body
        return {"fault": self.name, "nodes": settings}

    def stop(self) -> dict[str, Any]:
        reset_hook(self.cluster.nodes, "/v1/admin/network", {})
        return {"fault": self.name}


@dataclass
class Placebo:
    """Changes nothing. Its windows are measured like any fault's but never judged: their
    throughput ratios show how far the machine's own noise (other work on a shared machine)
    moves the ratio in the same run, which tells a real stall from noise."""

    name: str = "none"

    def start(self, rng: random.Random) -> dict[str, Any]:
        return {"fault": self.name}

    def stop(self) -> dict[str, Any]:
        return {"fault": self.name}


STORAGE_OUTAGES = ("kill", "pause", "cut")


@dataclass
class StorageOutage:
    """The S3 server is gone: its container killed (started again at the heal), frozen (requests
    hang until the client's timeout), or cut off from every node (packets from them dropped)."""

    cluster: ComposeCluster
    modes: Sequence[str] = STORAGE_OUTAGES
    name: str = "s3"
    mode: str = ""

    def _storage(self) -> Node:
        if self.cluster.storage is None:
            raise ClusterError("the compose cluster has no running object storage service")
        return self.cluster.storage

    def start(self, rng: random.Random) -> dict[str, Any]:
        storage = self._storage()
        self.mode = rng.choice(list(self.modes))
        if self.mode == "kill":
            self.cluster.kill(storage)
        elif self.mode == "pause":
            self.cluster.pause(storage)
        else:
            self.cluster.drop_from(storage, self.cluster.nodes)
        return {"fault": self.name, "mode": self.mode}

    def stop(self) -> dict[str, Any]:
        storage = self._storage()
        if self.mode == "kill":
            self.cluster.start(storage)
            self.cluster.refresh_address(storage)
        elif self.mode == "pause":
            self.cluster.resume(storage)
        else:
            self.cluster.heal(storage)
        healed, self.mode = self.mode, ""
        return {"fault": self.name, "mode": healed}


def make_faults(cluster: Cluster, names: Sequence[str], topic: str) -> list[Fault]:
    if not names:
        return []
    if not isinstance(cluster, ComposeCluster):
        raise ValueError("faults need the compose cluster; run without --urls or with --nemesis ''")
    targets = Targets(cluster, topic)
    makers: dict[str, Callable[[], Fault]] = {
        "partition": lambda: Partition(cluster, targets),
        "kill": lambda: ProcessFault(cluster, targets, "kill"),
        "pause": lambda: ProcessFault(cluster, targets, "pause"),
        "loss": lambda: PacketLoss(cluster),
        "slow": lambda: SlowNetwork(cluster),
        "clock": lambda: ClockSkew(cluster),
        "delay": lambda: MessageDelay(cluster),
        "s3": lambda: StorageOutage(cluster),
        "none": Placebo,
    }
    unknown = [n for n in names if n not in makers]
    if unknown:
        raise ValueError(f"unknown nemesis {unknown}; choose from {sorted(makers)}")
    return [makers[n]() for n in names]


@dataclass
class Schedule:
    """Alternates quiet and fault periods of random length until stopped, recording each change.

    A fault that fails to start is recorded as `fail` and opens no fault window. A heal that
    fails (a node too busy to answer its hook in time) is recorded as `fail` and tried again,
    up to HEAL_ATTEMPTS times: the fault is still in force meanwhile, so its window stays open
    and no other fault starts.

    A fault lasts at least its shortest length (fault_s[0]) even when the run ends first: one
    started seconds before the end was healed by the end of the run, not by the schedule, and
    left a second or two after the grace period to judge its window on.
    """

    HEAL_ATTEMPTS = 10
    HEAL_RETRY_S = 1.0

    faults: Sequence[Fault]
    recorder: Recorder
    rng: random.Random
    quiet_s: tuple[float, float] = (5.0, 10.0)
    fault_s: tuple[float, float] = (5.0, 15.0)
    stopping: threading.Event = field(default_factory=threading.Event)

    def _record(self, f: str, action: Callable[[], dict[str, Any]], fault: str) -> bool:
        invoke = self.recorder.invoke(NEMESIS, f, {"fault": fault})
        try:
            detail = action()
        except (ClusterError, OSError, subprocess.SubprocessError, ValueError) as failure:
            self.recorder.complete(invoke, "fail", {"fault": fault}, error=str(failure)[:300])
            return False
        self.recorder.complete(invoke, "ok", detail)
        return True

    def run(self) -> None:
        """Runs until `stopping` is set; always heals the fault in force before returning."""
        if not self.faults:
            return
        while not self.stopping.wait(self.rng.uniform(*self.quiet_s)):
            fault = self.rng.choice(list(self.faults))
            started = self._record("start", lambda f=fault: f.start(self.rng), fault.name)
            if started:
                shortest_end = time.monotonic() + self.fault_s[0]
                self.stopping.wait(self.rng.uniform(*self.fault_s))
                time.sleep(max(0.0, shortest_end - time.monotonic()))
            # Heal even after a failed start: a half-applied partition must not outlive it.
            for _ in range(self.HEAL_ATTEMPTS):
                if self._record("stop", fault.stop, fault.name):
                    break
                time.sleep(self.HEAL_RETRY_S)
