"""Hand-driven Raft groups for the core's unit tests: MemLog storage and a message queue.

Owns the driver loop (persist, fsync, send, apply, advance) and routing with drops/isolation.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from raftline.raftlog.memlog import MemLog
from raftline.raftlog.raft import RaftConfig, RaftNode
from raftline.raftlog.types import Entry, EntryKind, HardState, Message, MessageType, ReadState

Drop = Callable[[Message], bool]


class Group:
    """Nodes 1..n (or given ids) of one Raft group, driven synchronously by the test."""

    def __init__(
        self,
        ids: Iterable[int] = (1, 2, 3),
        learners: Iterable[int] = (),
        config: RaftConfig | None = None,
        voters: Iterable[int] | None = None,
    ) -> None:
        self.ids = list(ids)
        self.voters = (
            list(voters) if voters is not None else [i for i in self.ids if i not in learners]
        )
        self.learner_ids = list(learners)
        self.config = config or RaftConfig()
        self.logs = {i: MemLog() for i in self.ids}
        self.nodes = {i: self._make(i) for i in self.ids}
        self.inflight: list[Message] = []
        self.applied: dict[int, list[Entry]] = {i: [] for i in self.ids}
        self.reads: dict[int, list[ReadState]] = {i: [] for i in self.ids}
        self.isolated: set[int] = set()

    def _make(self, node_id: int, applied: int = -1) -> RaftNode:
        log = self.logs[node_id]
        return RaftNode(
            node_id, log, log.hard_state, self.voters, self.learner_ids, self.config,
            random.Random(node_id), applied=applied,
        )  # fmt: skip

    def seed(self, node_id: int, entries: list[Entry], hard_state: HardState) -> RaftNode:
        """Give a node a durable log and hard state, as if it had lived through earlier terms."""
        log = self.logs[node_id]
        log.append(entries)
        log.save(hard_state)
        log.fsync()
        self.nodes[node_id] = self._make(node_id, applied=hard_state.commit)
        return self.nodes[node_id]

    def __getitem__(self, node_id: int) -> RaftNode:
        return self.nodes[node_id]

    def process(self, node_id: int) -> None:
        """Run the driver loop of one node until it has nothing ready."""
        node, log = self.nodes[node_id], self.logs[node_id]
        while node.has_ready():
            rd = node.ready()
            if rd.snapshot is not None:
                log.install(rd.snapshot)
            log.append(rd.entries)
            if rd.hard_state is not None:
                log.save(rd.hard_state)
            if rd.must_sync:
                log.fsync()
            self.inflight.extend(rd.messages)
            self.applied[node_id].extend(rd.committed)
            self.reads[node_id].extend(rd.read_states)
            node.advance(rd)

    def process_all(self) -> None:
        for node_id in self.ids:
            self.process(node_id)

    def take(self, mtype: MessageType | None = None, src: int | None = None) -> list[Message]:
        """Remove and return queued messages (optionally of one type / sender) without delivery."""
        taken = [
            m for m in self.inflight
            if (mtype is None or m.type == mtype) and (src is None or m.src == src)
        ]  # fmt: skip
        self.inflight = [m for m in self.inflight if m not in taken]
        return taken

    def deliver(self, msgs: Iterable[Message]) -> None:
        for msg in msgs:
            if msg.src in self.isolated or msg.dst in self.isolated:
                continue
            self.nodes[msg.dst].step(msg)
            self.process(msg.dst)

    def stabilize(self, drop: Drop | None = None, rounds: int = 200) -> None:
        """Process and deliver until no message is in flight."""
        self.process_all()
        for _ in range(rounds):
            if not self.inflight:
                return
            batch, self.inflight = self.inflight, []
            self.deliver(m for m in batch if drop is None or not drop(m))
        raise AssertionError("group did not stabilize")

    def tick(self, node_id: int, times: int = 1) -> None:
        for _ in range(times):
            self.nodes[node_id].tick()
        self.process(node_id)

    def tick_all(self, times: int = 1) -> None:
        for _ in range(times):
            for node_id in self.ids:
                self.nodes[node_id].tick()
            self.stabilize()

    def elect(self, node_id: int) -> RaftNode:
        self.nodes[node_id].campaign()
        self.stabilize()
        assert self.nodes[node_id].role == "leader"
        return self.nodes[node_id]

    def propose(self, node_id: int, data: bytes, count: int = 1) -> int:
        index = self.nodes[node_id].propose(data, count)
        self.stabilize()
        return index

    def restart(self, node_id: int) -> RaftNode:
        """Crash (losing unsynced writes) and start again from durable storage."""
        self.logs[node_id].crash()
        self.inflight = [m for m in self.inflight if m.dst != node_id and m.src != node_id]
        self.applied[node_id] = []
        self.nodes[node_id] = self._make(node_id)
        return self.nodes[node_id]

    def data(self, node_id: int) -> list[bytes]:
        """Applied DATA payloads of a node, in order."""
        return [e.data for e in self.applied[node_id] if e.kind == EntryKind.DATA]


def fresh(node_id: int, voters: Iterable[int], config: RaftConfig | None = None) -> RaftNode:
    """A single node over an empty log, for tests that hand-craft every message."""
    return RaftNode(
        node_id, MemLog(), HardState(), voters, config=config, rng=random.Random(node_id)
    )
