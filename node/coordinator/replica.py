"""One local replica of a coordinator shard (a partition of the internal `__groups` topic).

Owns binding the generic shard replica (node/shard.py: applying committed commands, results to
proposers, checkpoints and log trims, role) to the consumer-group state machine.
"""

from __future__ import annotations

from raftline.node.coordinator.state import CoordinatorState, GroupError
from raftline.node.runtime import Runtime
from raftline.node.shard import ShardReplica, not_leader

__all__ = ["CHECKPOINT_EVERY", "CoordinatorReplica", "not_leader"]

CHECKPOINT_EVERY = 1_000  # commands between checkpoints (the log then holds about this many)


class CoordinatorReplica(ShardReplica):
    state: CoordinatorState

    def __init__(self, runtime: Runtime, shard: str) -> None:
        super().__init__(
            runtime, shard, CoordinatorState(), (GroupError,), "group", CHECKPOINT_EVERY
        )
