"""Routing: which node leads a Raft group as this node sees it, and how a call reaches it.

Owns leader lookups, forwarding that fails fast, the metadata read barrier and controller calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

from raftline.node.config import NodeConfig
from raftline.node.controller import MetaReplica
from raftline.node.errors import BrokerError, NotLeader, OutcomeUnknown
from raftline.node.metadata import META_GROUP
from raftline.node.runtime import Runtime
from raftline.node.transport import OUTCOME_UNKNOWN, RemoteError
from raftline.raftlog.raft import NotLeaderError

T = TypeVar("T")

BARRIER_S = 3.0  # how long a metadata read waits for the read barrier


class Router:
    """Leaders as this node sees them: forwarding that fails fast. `on_rpc` runs a node RPC
    here (the broker's dispatcher), for the groups this node leads itself."""

    def __init__(
        self,
        config: NodeConfig,
        runtime: Runtime,
        meta: MetaReplica,
        on_rpc: Callable[[int, str, Any], Awaitable[Any]],
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.runtime = runtime
        self.leader_view = runtime.leader_view
        self.meta = meta
        self._on_rpc = on_rpc

    @property
    def election_timeout_s(self) -> float:
        """The longest election timeout (the core randomizes in [n, 2n) ticks): a request waits
        at most this long for a group to elect a leader before it is answered with a 503."""
        return 2 * self.config.election_ticks * self.config.tick_ms / 1000

    def meta_voters(self) -> Collection[int]:
        group = self.runtime.groups.get(META_GROUP)
        return group.core.voters if group is not None else self.config.members()

    def electable(self, voters: Collection[int]) -> bool:
        """Whether this node reaches a majority of `voters`: if not, no leader it could reach
        will be elected until the network heals, and requests are answered at once."""
        return self.leader_view.reaches_majority(voters)

    def live_leader(self, group: str) -> int | None:
        leader = self.leader_view.leader_of(group)
        return leader if leader is not None and self.runtime.transport.alive(leader) else None

    def http_of(self, node: int | None) -> str | None:
        info = self.meta.state.nodes.get(node) if node is not None else None
        return info.http if info is not None else None

    def given_up_leader(self, group: str) -> int | None:
        """The leader of `group` known here when it is another node whose link has been down
        for an election timeout with no new leader heard of. Had it died, its group would have
        elected within that time; so the replicas that reach it still follow it (a ring
        partition, links that come back one by one after a heal) and no election is coming
        that a request here could wait for. Before that time, it may have died: wait."""
        leader = self.leader_view.leader_of(group)
        if leader is None or leader == self.node_id:
            return None
        if self.leader_view.link_down_for(leader) < self.election_timeout_s:
            return None
        return leader

    def leader_or_none(self, group: str, voters: Collection[int], since: float) -> int | None:
        """The live leader of `group`; None while an election may still produce one (call
        again shortly). Raises leader_unavailable when this node cannot reach a majority of
        `voters` and no other node is known to lead, also when this node leads the group
        itself: perhaps deposed already, unaware, and nothing it does needing a quorum (a
        read barrier, a commit) could finish before its own step-down. Also when the leader
        known here has been unreachable for an election timeout (`given_up_leader`), and when
        no leader has shown up for an election timeout since `since`."""
        leader = self.live_leader(group)
        if leader is not None and leader != self.node_id:
            return leader
        if not self.electable(voters):
            raise BrokerError(
                "leader_unavailable", f"node {self.node_id} cannot reach a majority of {group}"
            )
        given_up = self.given_up_leader(group)
        if given_up is not None:
            raise BrokerError(
                "leader_unavailable",
                f"node {given_up} leads {group} as last heard, unreachable from here for an "
                "election timeout",
            )
        if leader is not None:
            return leader
        if time.monotonic() - since >= self.election_timeout_s:
            raise BrokerError("leader_unavailable", f"{group} has no leader (election under way)")
        return None

    def not_leader(
        self, group: str, message: str, voters: Collection[int] | None = None
    ) -> NotLeader:
        """The answer of a node that cannot serve a request of `group` itself: where the
        leader is as this node sees it (a live node other than this one), and whether waiting
        for an election here makes sense (not when this node cannot reach a majority of
        `voters`, nor once the leader it knows has been unreachable for an election timeout)."""
        if voters is None:
            voters = self.runtime.groups[group].core.voters if group in self.runtime.groups else ()
        leader = self.live_leader(group)
        if leader == self.node_id:  # a stale view of our own, just-ended leadership
            leader = None
        given_up = self.given_up_leader(group)
        if given_up is not None:
            message = f"{message}; its leader, node {given_up}, is unreachable from here"
        return NotLeader(
            message,
            self.http_of(leader),
            group=group,
            leader=leader,
            electable=(not voters or self.electable(voters)) and given_up is None,
        )

    async def while_leads(self, group: str, leader: int, request: Awaitable[T]) -> T:
        """Await `request`, which needs `leader` to lead `group` (a forwarded request, or a
        read barrier); if the leader moves or its node goes silent first, cancel it and raise
        OutcomeUnknown at once rather than hold the caller until a timeout."""
        moved = self.leader_view.leader_moved(group, leader)
        task = asyncio.ensure_future(request)
        try:
            await asyncio.wait((task, moved), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            moved.cancel()
        if task.done():
            return task.result()
        task.cancel()
        raise OutcomeUnknown(
            f"node {leader} stopped leading {group} or went silent while it held the request"
        )

    async def on_leader_of(
        self, group: str, method: str, args: Any, voters: Collection[int] | None = None
    ) -> Any:
        """Run the node RPC `method` on the leader of Raft group `group` (of `voters`): here
        when this node leads it, else over the node-to-node RPC. While no live leader is known,
        or the one asked answers `not_leader` (nothing was done), look again for at most one
        election timeout, then answer leader_unavailable (503, retryable); at once when this
        node cannot reach a majority of the voters or has given up on the leader it knows
        (`given_up_leader`), also when it leads the group itself (calls
        that answer from the leader's memory would not notice it was replaced). A call whose
        leader moves or goes silent while it runs fails at once with OutcomeUnknown (503,
        retryable: it may have applied)."""
        if voters is None:
            hosted = self.runtime.groups.get(group)
            voters = hosted.core.voters if hosted is not None else self.config.members()
        started = time.monotonic()
        while True:
            leader = self.leader_or_none(group, voters, started)
            try:
                if leader == self.node_id:
                    return await self._on_rpc(self.node_id, method, args)
                if leader is not None:
                    call = self.runtime.transport.call(
                        leader, method, args, self.config.request_timeout_s + 1
                    )
                    return await self.while_leads(group, leader, call)
            except OutcomeUnknown:
                raise
            except BrokerError as exc:
                if exc.code != "not_leader":
                    raise
            except RemoteError as exc:
                if exc.code == OUTCOME_UNKNOWN:
                    raise OutcomeUnknown(exc.message) from None
                if exc.code not in ("not_leader", "leader_unavailable"):  # those did nothing
                    raise BrokerError(exc.code, exc.message) from None
            if time.monotonic() - started >= self.election_timeout_s:
                # e.g. a leader elected a moment ago whose first entry has not committed
                raise BrokerError("leader_unavailable", f"{group} has no leader that serves yet")
            await asyncio.sleep(0.02)

    async def on_controller(self, method: str, args: Any) -> dict[str, Any]:
        """Run a controller operation on the metadata leader, wherever it is."""
        result: dict[str, Any] = await self.on_leader_of(
            META_GROUP, method, args, self.meta_voters()
        )
        return result

    async def barrier(self) -> None:
        """Make the local metadata at least as new as anything committed before this call."""
        started = time.monotonic()
        deadline = started + BARRIER_S
        while time.monotonic() < deadline:
            leader = self.leader_or_none(META_GROUP, self.meta_voters(), started)
            if leader is not None:
                read = self.runtime.read_barrier(META_GROUP, max(deadline - time.monotonic(), 0))
                try:
                    await self.while_leads(META_GROUP, leader, read)
                    return
                except (TimeoutError, NotLeaderError, OutcomeUnknown):
                    pass  # the leader moved or went silent under the read: look again
            await asyncio.sleep(0.05)
        raise BrokerError("leader_unavailable", "metadata unreachable (no quorum)")
