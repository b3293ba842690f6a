"""Who leads each Raft group as seen from this node, and whether the links to those leaders hold.

Owns the announced leaders (also of groups not hosted here), the watches of forwarders waiting on
a leader, leaderships still to announce to peers that were down, and when each link went down.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from typing import Any

from raftline.node.group import Group
from raftline.node.transport import Transport


class LeaderView:
    """The leader of each group as this node knows it; the runtime feeds it what it learns."""

    def __init__(self, node_id: int, transport: Transport, groups: Mapping[str, Group]) -> None:
        self.node_id = node_id
        self._transport = transport
        self._groups = groups  # the runtime's: a local replica's view comes first
        # group -> (leader node, term) as last announced; covers groups this node does not host.
        self._announced: dict[str, tuple[int, int]] = {}
        # group -> futures of forwarders waiting on a leader (the node each expects to lead)
        self._watches: dict[str, dict[asyncio.Future[None], int]] = {}
        # called with a group's name whenever its leader as seen here may have changed
        self.listeners: list[Callable[[str], None]] = []
        # peer -> groups whose leadership here began while its link was down: told on revival
        self._unannounced: dict[int, set[str]] = defaultdict(set)
        # peer -> when its link went down (silent or closed), while it stays down
        self._link_down_at: dict[int, float] = {}

    def link_down_for(self, peer: int) -> float:
        """Seconds since the link to `peer` went down; 0 while it is up (or never came up)."""
        down_at = self._link_down_at.get(peer)
        return 0.0 if down_at is None else time.monotonic() - down_at

    def leader_of(self, name: str) -> int | None:
        """The group's leader as known here: the local replica's view, else the last announced."""
        group = self._groups.get(name)
        if group is not None and group.leader is not None:
            return group.leader
        seen = self._announced.get(name)
        # Naming this node there is stale: while it leads, its replica above says so.
        return seen[0] if seen and seen[0] != self.node_id else None

    def leader_moved(self, name: str, leader: int) -> asyncio.Future[None]:
        """A future that is done once `leader` no longer leads group `name` as seen here: a
        new leader announced itself or this node's replica saw one, or `leader`'s link went
        down. A node forwarding a request to `leader` races it against this, so a leader that
        is gone never holds the request until its timeout. When `leader` is this node, it is
        done once this node cannot reach a majority of the group's voters: a read barrier
        (or anything else that needs a quorum's answer) would wait for a step-down otherwise.
        Cancel it when done with it."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.leader_of(name) != leader or not self._leads_reachably(name, leader):
            fut.set_result(None)
            return fut
        watches = self._watches.setdefault(name, {})
        watches[fut] = leader

        def forget(_: asyncio.Future[None]) -> None:
            watches.pop(fut, None)
            if not watches and self._watches.get(name) is watches:
                del self._watches[name]

        fut.add_done_callback(forget)
        return fut

    def _leads_reachably(self, name: str, leader: int) -> bool:
        """Whether `leader` can go on leading `name` as seen here: a peer whose link is up, or
        this node while it reaches a majority of the group's voters."""
        if leader != self.node_id:
            return self._transport.alive(leader)
        group = self._groups.get(name)
        return group is not None and self.reaches_majority(group.core.voters)

    def reaches_majority(self, voters: Collection[int]) -> bool:
        """Whether this node's links are up to a majority of `voters` (itself counts)."""
        return sum(1 for v in voters if self._transport.alive(v)) > len(voters) // 2

    def changed(self, name: str) -> None:
        """The group's leader as seen here may have changed: tell the listeners, and end the
        watches of leaders it no longer is."""
        for listener in self.listeners:
            listener(name)
        watches = self._watches.get(name)
        if watches:
            leader = self.leader_of(name)
            for fut, expected in list(watches.items()):
                if expected != leader and not fut.done():
                    fut.set_result(None)

    def learn(self, name: str, node: Any, term: Any) -> None:
        """A leader announced (by itself, or by the local replica): kept unless an announcement
        of a later term is known."""
        if type(node) is not int or type(term) is not int:
            return
        seen = self._announced.get(name)
        if seen is None or term >= seen[1]:
            self._announced[name] = (node, term)
            self.changed(name)

    def won(self, name: str) -> list[int]:
        """This node now leads group `name`: the peers to tell at once (their links are up);
        the others are told when their links come back (see link_up)."""
        reachable = []
        for peer in self._transport.addresses:
            if self._transport.alive(peer):
                reachable.append(peer)
            else:
                self._unannounced[peer].add(name)
        return reachable

    def link_down(self, peer: int) -> None:
        """The link to `peer` went down (silent, or closed): forwards waiting on it as a leader
        give up."""
        self._link_down_at.setdefault(peer, time.monotonic())  # silent, then closed: first
        for name, watches in list(self._watches.items()):
            for fut, expected in list(watches.items()):
                if not fut.done() and not self._leads_reachably(name, expected):
                    fut.set_result(None)

    def link_up(self, peer: int) -> set[str]:
        """The link to `peer` is up: the groups whose leadership here began while it was
        down, which it has yet to be told of."""
        self._link_down_at.pop(peer, None)
        return self._unannounced.pop(peer, set())
