"""One local replica of a shard of an internal topic whose partitions are Raft groups applying
JSON commands to a pure state machine (consumer groups: `__groups`; queues: `__queues`).

Owns applying committed commands to the shard's state (any object with `apply(command) ->
result`, `snapshot()`, a `checkpoint` command and an `applied_commands` count), handing each
proposer its command's result, checkpoints and the log trim that follows them, and the role.

The shard log always starts with a checkpoint (or at offset 0): a checkpoint command carries the
whole state as the leader saw it after applying offset `after`; it is applied (and the log is
then trimmed to end just before it, on every replica) only if it lands at `after + 1`, so no
command can be lost between the snapshot and its place in the log (a decision every replica
takes alike, from log positions alone). A follower that lags
behind a trim point gets that point as a Raft snapshot and applies the checkpoint that follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from raftline.node.controller import decode_command, encode_command
from raftline.node.errors import BrokerError, OutcomeUnknown
from raftline.node.metadata import MetadataError
from raftline.node.runtime import Runtime
from raftline.raftlog.types import Entry, EntryKind

log = logging.getLogger(__name__)

CHECKPOINT_EVERY = 1_000  # commands between checkpoints (the log then holds about this many)


def not_leader(shard: str) -> BrokerError:
    """Nothing was done: the caller may try the shard's leader (see Router.on_leader_of)."""
    return BrokerError("not_leader", f"this node does not lead {shard}")


class ShardReplica:
    def __init__(
        self,
        runtime: Runtime,
        shard: str,
        state: Any,
        rules: tuple[type[Exception], ...],
        what: str,
        checkpoint_every: int = CHECKPOINT_EVERY,
    ) -> None:
        self.runtime = runtime
        self.shard = shard  # the Raft group name
        self.state = state
        self._rules = (*rules, MetadataError)  # a broken rule: its .code and .message answer
        self._what = what  # "group", "queue": what the commands are about, for messages
        self._checkpoint_every = checkpoint_every
        self.role = "follower"
        self.term = 0
        self.applied_index = -1
        self.term_committed = False  # a leader answers once an entry of its term is applied
        self.checkpoint_index: int | None = None
        self._waiters: dict[int, tuple[int, asyncio.Future[dict[str, Any]]]] = {}
        self._checkpointing = False
        self._closed = False

    # Raft callbacks

    def on_commit(self, entries: list[Entry]) -> None:
        for entry in entries:
            outcome: dict[str, Any] | BrokerError = {}
            if entry.kind == EntryKind.DATA:
                outcome = self._apply(entry)
            self.applied_index = entry.last_index
            if entry.term == self.term:
                self.term_committed = True
            waiter = self._waiters.pop(entry.index, None)
            if waiter is not None and not waiter[1].done():
                term, fut = waiter
                if entry.term != term:
                    fut.set_exception(self._lost())
                elif isinstance(outcome, BrokerError):
                    fut.set_exception(outcome)
                else:
                    fut.set_result(outcome)
        last = entries[-1].last_index
        for index in [i for i in self._waiters if i <= last]:
            _, fut = self._waiters.pop(index)
            if not fut.done():
                fut.set_exception(self._lost())

    def _apply(self, entry: Entry) -> dict[str, Any] | BrokerError:
        try:
            command = decode_command(entry.data)
            if command.get("op") == "checkpoint":
                if command.get("after") != entry.index - 1:
                    return BrokerError("conflict", "commands landed before the checkpoint")
                result = self.state.apply(command)
                self.checkpoint_index = entry.index
                if entry.index - 1 >= 0 and not self._closed:
                    self.runtime.trim(self.shard, entry.index - 1)
                return result
            return self.state.apply(command)
        except self._rules as exc:
            return BrokerError(exc.code, exc.message)  # type: ignore[attr-defined]
        except (KeyError, TypeError, ValueError) as exc:
            return BrokerError("invalid_request", f"bad {self._what} command: {exc!r}")
        except Exception as exc:  # a broken invariant: loud, and alike on every replica
            log.critical("%s: applying %d failed", self.shard, entry.index, exc_info=exc)
            return BrokerError("internal_error", f"applying a {self._what} command failed: {exc!r}")

    def on_role(self, role: str, leader: int | None, term: int) -> None:
        if term != self.term:
            self.term_committed = False
        was_leader = self.role == "leader"
        self.role, self.term = role, term
        if was_leader and role != "leader":
            # A proposal may still commit under the next leader, but nobody here will learn of
            # it in time: its caller hears at once that the outcome is unknown (retryable).
            self._fail_waiters(f"leadership moved before the {self._what} command committed")

    # proposals

    @property
    def serving(self) -> bool:
        return self.role == "leader" and self.term_committed and not self._closed

    async def propose(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        if not self.serving:
            raise not_leader(self.shard)
        loop = asyncio.get_running_loop()
        applied: asyncio.Future[dict[str, Any]] = loop.create_future()

        def accepted(index: int, term: int) -> None:
            self._waiters[index] = (term, applied)

        appended = self.runtime.propose(self.shard, encode_command(command), on_accept=accepted)
        try:
            async with asyncio.timeout(timeout):
                try:
                    await appended
                except Exception as exc:  # NotLeaderError: nothing was appended
                    raise not_leader(self.shard) from exc
                return await applied
        except TimeoutError:
            raise BrokerError(
                "timeout", f"the {self._what} command did not commit in time"
            ) from None

    async def read_barrier(self, timeout: float) -> None:
        """Confirm leadership and apply everything committed before the call."""
        if not self.serving:
            raise not_leader(self.shard)
        try:
            await self.runtime.read_barrier(self.shard, timeout)
        except TimeoutError:
            raise BrokerError("leader_unavailable", f"{self.shard}: no quorum") from None
        except Exception as exc:
            raise not_leader(self.shard) from exc
        if not self.serving:
            raise not_leader(self.shard)

    async def maybe_checkpoint(self, timeout: float) -> bool:
        """Leader: write a checkpoint once enough commands piled up since the last one. It must
        land right after the state it holds, so it carries the state at the end of the log:
        the applied state plus the commands appended or queued but not yet applied, replayed
        on a copy. Proposals are never held for it (holding them cost a commit round of latency
        to every call that came meanwhile); should anything else land first, it is refused."""
        group = self.runtime.groups.get(self.shard)
        if (
            self._checkpointing
            or not self.serving
            or group is None
            or self.state.applied_commands < self._checkpoint_every
        ):
            return False
        after, snapshot = self._state_at_log_end(group)
        if snapshot is None:
            return False
        self._checkpointing = True
        try:
            command = {"op": "checkpoint", "after": after, "snapshot": snapshot}
            await self.propose(command, timeout)
            return True
        except BrokerError as exc:
            log.debug("%s: checkpoint not written: %s", self.shard, exc.message)
            return False
        finally:
            self._checkpointing = False

    def _state_at_log_end(self, group: Any) -> tuple[int, dict[str, Any] | None]:
        """The offset a proposal made now would follow, and the state after applying everything
        up to it (None where an earlier checkpoint is still on its way: no second one yet)."""
        snapshot = self.state.snapshot()
        last = group.core.last_index
        pending = [(e.kind, e.data) for e in group.core.entries(self.applied_index + 1, last)]
        pending += [(p.kind, p.data) for p in group.proposals]
        after = last + sum(p.count for p in group.proposals)
        commands = [decode_command(data) for kind, data in pending if kind == EntryKind.DATA]
        if not commands:
            return after, snapshot
        if any(c.get("op") == "checkpoint" for c in commands):
            return after, None
        copy = type(self.state)()
        # through the log's own encoding, so that the copy shares nothing with the live state
        copy.apply(decode_command(encode_command({"op": "checkpoint", "snapshot": snapshot})))
        for command in commands:
            with contextlib.suppress(Exception):  # a refused command: as every replica refuses it
                copy.apply(command)
        return after, copy.snapshot()

    def close(self) -> None:
        self._closed = True
        self._fail_waiters(f"the {self._what} shard was closed")

    def _fail_waiters(self, reason: str) -> None:
        for _, fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(OutcomeUnknown(reason))
        self._waiters.clear()

    def _lost(self) -> BrokerError:
        return OutcomeUnknown(
            f"leadership of {self.shard} changed before the {self._what} command committed"
        )


R = TypeVar("R", bound=ShardReplica)
L = TypeVar("L")


class ShardLeadership(Generic[R, L]):
    """The local replicas of one kind of shard and, for each shard this node leads, the
    leader-only memory of the current term (made by `fresh(term)`; dropped when the term
    changes, since a new leader starts from applied state alone)."""

    def __init__(self, fresh: Callable[[int], L]) -> None:
        self.replicas: dict[str, R] = {}
        self.leading: dict[str, L] = {}
        self._fresh = fresh

    def add(self, shard: str, replica: R) -> R:
        self.replicas[shard] = replica
        return replica

    def drop(self, shard: str) -> None:
        replica = self.replicas.pop(shard, None)
        if replica is not None:
            replica.close()
        self.leading.pop(shard, None)

    def drop_all(self) -> None:
        for shard in list(self.replicas):
            self.drop(shard)

    def serving(self, shard: str) -> R:
        """The shard's replica where this node serves it as leader; else not_leader (nothing
        was done: the caller may try the leader)."""
        replica = self.replicas.get(shard)
        if replica is None or not replica.serving:
            raise not_leader(shard)
        return replica

    def lead(self, shard: str) -> tuple[R, L]:
        """The shard's replica and leader memory, where this node serves it as leader."""
        replica = self.serving(shard)
        leading = self.leading.get(shard)
        if leading is None or getattr(leading, "term", None) != replica.term:
            leading = self.leading[shard] = self._fresh(replica.term)
        return replica, leading
