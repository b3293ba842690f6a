"""The state machine of one transaction coordinator shard, as its shard replica applies it.

Owns the adaptation of node/eos/txn_coordinator.py's TxnCoordinator to the command shape of
node/shard.py's ShardReplica (JSON commands with an "op"; "checkpoint" carries a whole
snapshot) and the answers as plain dicts. Invariants: as TxnCoordinator's; a checkpoint
replaces the state with exactly the snapshot it carries, so replaying from any checkpoint
reaches the same state.
"""

from __future__ import annotations

from typing import Any

from raftline.node.eos.txn_coordinator import COMMANDS, MarkerRequest, TxnCoordinator


class TxnShardState:
    def __init__(self) -> None:
        self.coordinator = TxnCoordinator()
        self.applied_commands = 0  # since the last checkpoint: the leader's cadence, not state

    def apply(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command.get("op")
        if op == "checkpoint":
            self.coordinator = TxnCoordinator.restore(command["snapshot"])
            self.applied_commands = 0
            return {}
        if op not in COMMANDS:
            raise ValueError(f"unknown transaction command {op!r}")
        self.applied_commands += 1
        result = self.coordinator.apply({**command, "type": op})
        answer: dict[str, Any] = {
            "error": result.error,
            "producer_id": result.producer_id,
            "producer_epoch": result.producer_epoch,
        }
        if result.markers is not None:
            answer["markers"] = marker_dict(result.markers)
        return answer

    def snapshot(self) -> dict[str, Any]:
        return self.coordinator.snapshot()


def marker_dict(markers: MarkerRequest) -> dict[str, Any]:
    return {
        "transactional_id": markers.transactional_id,
        "producer_id": markers.producer_id,
        "producer_epoch": markers.producer_epoch,
        "commit": markers.commit,
        "partitions": [[t, p] for t, p in markers.partitions],
        "offsets": [[g, t, p, o] for g, (t, p), o in markers.offsets],
    }
