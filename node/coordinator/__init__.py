"""Consumer-group coordination: the replicated group state machine, its assignors, the shard
replica that applies it, and the shard leader's duties (sessions, positions, checkpoints)."""
