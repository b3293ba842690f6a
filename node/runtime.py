"""The multi-Raft driver: all Raft groups of a node on one asyncio loop, one timer, a disk pool.

Owns group lifecycle, driver rounds with group commit, proposals, read barriers, leader views and
quiescence of idle groups.

A driver round takes the touched groups: (1) on the loop, feed each its ticks, messages,
proposals and read requests and collect the Readys; send leaders' APPENDs and HEARTBEATs at once
(followers write while the leader does) and apply leaders' committed entries that are already
written (acks need no later fsync); (2) on a disk thread, write every Ready's entries and hard
state, then fsync each touched log once; (3) back on the loop, send the other messages (one
frame per peer), apply the other committed entries, answer read barriers and advance.
Rounds are pipelined: while one round is on disk, the loop runs further rounds for the other
groups (an ack of partition A never waits for partition B's fsync). A leader goes on being fed
(asynchronous storage writes, see raftlog.raft): it commits on its followers' acknowledgements
and applies what they made durable as soon as its own copy is written, before its own fsync
returns. Its proposals wait only while its write in flight is writing entries; once that write
is fsyncing, they form the next write (the log orders the fsyncs), so a slow fsync of the
leader's holds back neither replication nor commit. A follower is fed beside its writes in
flight only while they and what waits in its inbox can only extend its log (APPENDs and
HEARTBEATs of the leader it follows, in its term, rounds that truncate nothing): an APPEND that
arrives while the last one fsyncs is then written at once and its fsync follows that one,
instead of waiting for it to end, for the loop to take up its outcome and for a disk thread to
be woken again (on a busy machine each of those hand-offs is a wait for a CPU, on the commit
path). Anything else waits for the writes to finish; so do rounds fed while a write is still
writing its entries, which is what batches a partition's concurrent writes into one append and
one fsync. Writes of one group finish (advance the core, send the acknowledgements) in order.
The loop reads a group's storage during its writes only below the offsets being written (the
core keeps those in memory), and never while a write of the group truncates.

Quiescence. A leader whose group had no proposals and no replication traffic (anything but
heartbeats) for `quiet_after_ticks` ticks, and has every entry committed, stops ticking it and tells
each follower node ("q", group, term, commit, last index). A follower whose term, leader, commit and
persisted last index all match stops ticking too (no heartbeats expected, so no election timer
runs); one that does not match answers ("w", group) and the leader resumes ticking. Any Raft
message, proposal, read, leadership transfer or link change (peer up or down) for the group wakes it
again; in particular followers of a quiet group wake as soon as the transport counts the leader's
node as gone (connection lost, or no frame within the dead-after window while every live node
pings each tick; the window widens while this node's own loop stalls, see node/liveness.py).
If that node is heard again on the same connection before such a follower moved on, the follower
goes quiet again (see _on_link). Safety never depends on this: a quiet replica is just a replica
that receives no ticks, and Raft tolerates any delay; only liveness relies on the node-pair link
noticing a dead leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, Protocol

from raftline.node import wire
from raftline.node.config import NodeConfig
from raftline.node.role_log import RoleLog
from raftline.node.stages import StageTimes
from raftline.node.transport import RpcHandler, Transport
from raftline.raftlog.raft import RaftConfig, RaftNode
from raftline.raftlog.types import (
    Entry,
    EntryKind,
    HardState,
    LogView,
    Message,
    MessageType,
    Ready,
    SnapshotMeta,
)

log = logging.getLogger(__name__)

_HEARTBEATS = (MessageType.HEARTBEAT, MessageType.HEARTBEAT_RESP)
_REPLICATION = (MessageType.APPEND, MessageType.HEARTBEAT)  # a leader's, sent before its fsync
ORPHANS_PER_GROUP = 16
DISK_THREADS = 8  # writes that may be on disk at once
# A leader's next write may start while its last one fsyncs; a write whose fsync waits for an
# earlier one holds a disk thread, so a group with a stalled fsync holds at most this many.
WRITES_PER_GROUP = 2
FSYNC_THREADS = 8  # fsyncs that may be in flight at once
LOOP_READ_BYTES = 1 << 20  # fetch reads up to this size may run on the loop (see read_log)
ORPHAN_GROUPS = 1024
# A round feeds at most this many groups; the others wait for the next round, after the loop has
# read its sockets and run its timers. Feeding tens of thousands of just-created groups in one
# round held the loop for seconds, long enough for peers to declare this node dead.
GROUPS_PER_ROUND = 512
TICKS_PER_FEED = 1  # see _feed


class GroupStopped(Exception):
    """The group was removed or the node is stopping before the request completed."""


class GroupStorage(LogView, Protocol):
    """What the driver needs from a group's durable log (raftlog.storage.RaftStorage)."""

    @property
    def hard_state(self) -> HardState: ...
    def append(self, entries: list[Entry]) -> Any: ...
    def save(self, hard_state: HardState) -> None: ...
    def install(self, meta: Any) -> Any: ...
    def trim(self, index: int, voters: tuple[int, ...], learners: tuple[int, ...]) -> Any: ...
    def retention_point(self) -> int: ...
    def fsync(self) -> None: ...
    def close(self) -> None: ...


class _DirtyGroups:
    """The groups to feed, in the order they were touched: a set that rounds take from the
    front, so that no group waits behind groups touched after it."""

    def __init__(self) -> None:
        self._names: dict[str, None] = {}

    def add(self, name: str) -> None:
        self._names.setdefault(name, None)

    def update(self, names: Iterable[str]) -> None:
        for name in names:
            self._names.setdefault(name, None)

    def discard(self, name: str) -> None:
        self._names.pop(name, None)

    def difference_update(self, names: Iterable[str]) -> None:
        for name in names:
            self._names.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class Replica(Protocol):
    """The state machine a group drives (a partition or the metadata)."""

    def on_commit(self, entries: list[Entry]) -> None: ...
    def on_role(self, role: str, leader: int | None, term: int) -> None: ...


Accepted = Callable[[int, int], None]


@dataclass(slots=True)
class _Proposal:
    data: bytes
    count: int
    kind: EntryKind
    future: asyncio.Future[tuple[int, int]]
    on_accept: Accepted | None
    queued_at: float


@dataclass(eq=False)
class Group:
    name: str
    core: RaftNode
    storage: GroupStorage
    replica: Replica
    applied: int
    inbox: list[Message] = field(default_factory=list)
    notices: list[tuple[int, list[Any]]] = field(default_factory=list)
    proposals: list[_Proposal] = field(default_factory=list)
    reads: list[tuple[bytes, asyncio.Future[None]]] = field(default_factory=list)
    pending_reads: dict[bytes, asyncio.Future[None]] = field(default_factory=dict)
    waiting_reads: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    ticks: int = 0
    campaign: bool = False
    campaign_pre_vote: bool = True
    transfer_to: int | None = None
    trim_to: int | None = None
    snapshot_state: tuple[int, bytes] | None = None  # (index, state) of a received snapshot
    quiet: bool = False
    waits_for: int | None = None  # a fresh follower's expected first leader (see add_group)
    woken_by_link: int | None = None  # the node whose link loss woke this quiet group
    idle_ticks: int = 0
    inbox_since: float | None = None  # when the oldest APPEND in the inbox arrived
    # a leader's rounds with entries not yet applied: (last index, fed at), oldest first
    uncommitted: deque[tuple[int, float]] = field(default_factory=deque)
    role: str = "follower"
    leader: int | None = None
    term: int = 0

    def peers(self, me: int) -> set[int]:
        return set(self.core.voters | self.core.learners) - {me}


@dataclass(eq=False)
class _Write:
    """One disk write of rounds (of one or more groups) on the disk pool."""

    rounds: list[_Round]
    future: asyncio.Future[None] | None = None  # done once the loop took up its outcome
    submitted_at: float = field(default_factory=time.monotonic)
    started_at: float = 0.0  # when a disk thread took it
    returned_at: float = 0.0  # when its disk thread was done with it
    # per log fsync: (handed to the thread that ran it, started, returned), time.monotonic()
    fsyncs: list[tuple[float, float, float]] = field(default_factory=list)
    written: bool = False  # its entries are in the log files; its fsyncs may still run
    # Set by its disk thread once its entries are in the log files, without waking the loop
    # (which reads it when input arrives): a follower's next write may then start.
    appended: bool = False
    done: bool = False

    @cached_property
    def groups(self) -> dict[str, None]:
        # Read several times per write (start, entries written, returned): built once.
        return dict.fromkeys(r.group.name for r in self.rounds)

    def rounds_of(self, name: str) -> list[_Round]:
        return [r for r in self.rounds if r.group.name == name]


@dataclass
class _Round:
    group: Group
    ready: Ready | None
    accepted: list[tuple[asyncio.Future[tuple[int, int]], int, int]]
    trim: SnapshotMeta | None = None
    fed_at: float = 0.0  # time.monotonic() when the Ready was taken
    applied_early: bool = False  # committed entries went to the replica before its write ended
    written: bool = False  # its entries are in the log file (maybe not yet fsynced)
    # a follower's round whose write only appends after its log's last entry (no truncation,
    # no snapshot) in `term`: more rounds of the group may be fed beside it (see _takeable)
    extends_in: int | None = None

    @property
    def writes(self) -> bool:
        return self.ready is not None or self.trim is not None

    @property
    def touches_disk(self) -> bool:
        """False when the Ready holds only a commit-index change (kept in memory by the
        storage until the next term/vote write): such rounds skip the disk thread."""
        rd = self.ready
        return self.trim is not None or (
            rd is not None and (bool(rd.entries) or rd.snapshot is not None or rd.must_sync)
        )


class Runtime:
    def __init__(
        self, config: NodeConfig, on_rpc: RpcHandler, rng: random.Random | None = None
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.groups: dict[str, Group] = {}
        # group -> (leader node, term) as last announced; covers groups this node does not host.
        self.leader_view: dict[str, tuple[int, int]] = {}
        # group -> futures of forwarders waiting on a leader (the node each expects to lead)
        self._leader_watches: dict[str, dict[asyncio.Future[None], int]] = {}
        self._rng = rng or random.Random()
        # called with a group's name whenever its leader as seen here may have changed
        self.leader_listeners: list[Callable[[str], None]] = []
        self._active: set[str] = set()  # groups that receive ticks (not quiet)
        self._leading: set[str] = set()  # groups led here
        self._dirty = _DirtyGroups()
        self.first_groups: set[str] = set()  # fed first in every round (the metadata group)
        self._notices: dict[int, list[list[Any]]] = defaultdict(list)
        # peer -> groups whose leadership here began while its link was down: told on revival
        self._unannounced: dict[int, set[str]] = defaultdict(set)
        # peer -> when its link went down (silent or closed), while it stays down
        self._link_down_at: dict[int, float] = {}
        self._orphans: dict[str, list[Message]] = {}  # messages for groups not created yet
        self._wakeup = asyncio.Event()
        # group -> its disk writes not yet finished, oldest first, and the rounds queued
        # behind them (a leader's, fed meanwhile); a group is in both or in neither.
        self._writes: dict[str, list[_Write]] = {}
        self._queued: dict[str, list[_Round]] = {}
        self._in_flight = 0  # disk writes not yet returned
        self._disk_idle = asyncio.Event()  # set while no round is on disk
        self._disk_idle.set()
        self._stopping = False
        self._failure: BaseException | None = None  # a write that failed: fatal to the driver
        self._disk = ThreadPoolExecutor(
            max_workers=DISK_THREADS, thread_name_prefix="raftline-disk"
        )
        # Fsyncs of different partition logs run side by side: the filesystem folds concurrent
        # fsyncs into one journal commit (16 logs: ~1.7 ms against ~5.5 ms serial).
        self._fsyncs = ThreadPoolExecutor(
            max_workers=FSYNC_THREADS, thread_name_prefix="raftline-fsync"
        )
        # Fetch reads: the log is thread-safe, and a read must not queue behind a round's fsync.
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raftline-read")
        self._read_ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self.driver: asyncio.Task[None] | None = None  # ends only on stop or a fatal disk error
        self.transport = Transport(
            config.node_id,
            config.raft,
            config.members(),
            on_raft=self._on_raft,
            on_rpc=on_rpc,
            on_link=self._on_link,
            on_gone=self._on_gone,
            dead_after_s=2 * config.election_ticks * config.tick_ms / 1000,
            tick_s=config.tick_ms / 1000,
        )
        self.stats: dict[str, int] = defaultdict(int)
        self._role_log = RoleLog(log)
        self.stage_times = StageTimes()

    # lifecycle

    async def start(self) -> None:
        await self.transport.start()
        self.driver = asyncio.ensure_future(self._drive())
        self._tasks = [self.driver, asyncio.ensure_future(self._tick())]

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.transport.stop()
        await self._disk_idle.wait()
        groups = list(self.groups.values())
        self.groups.clear()
        for group in groups:
            self._fail_waiters(group, "node stopping")
        self._reader.shutdown(wait=True)
        await asyncio.get_running_loop().run_in_executor(self._disk, _close_all, groups)
        self._disk.shutdown(wait=True)
        self._fsyncs.shutdown(wait=True)

    def add_group(
        self,
        name: str,
        storage: GroupStorage,
        voters: Iterable[int],
        replica: Replica,
        applied: int,
        wait_for: int | None = None,
    ) -> Group:
        """Drive a group from now on. `wait_for`: the node expected to campaign first in a
        fresh group; while it is alive, this replica starts quiet (no election timer of its
        own) until that node's vote request or any other Raft message wakes it, or that
        node's link goes down. Without it, every replica of a batch of new partitions whose
        leader's node had not yet created them would campaign on its own timer."""
        raft_config = RaftConfig(election_ticks=self.config.election_ticks)
        core = RaftNode(
            self.node_id,
            storage,
            storage.hard_state,
            voters,
            config=raft_config,
            rng=random.Random(self._rng.random()),
            applied=applied,
        )
        group = Group(name, core, storage, replica, applied=applied, term=core.term)
        group.inbox.extend(self._orphans.pop(name, []))
        group.waits_for = wait_for
        self.groups[name] = group
        if (
            not group.inbox
            and wait_for is not None
            and wait_for != self.node_id
            and self.transport.alive(wait_for)
        ):
            group.quiet = True
            return group
        self._active.add(name)
        self._touch(group)
        return group

    async def remove_group(self, name: str) -> GroupStorage | None:
        """Stop driving a group and close its storage (after any round using it); returns it."""
        group = self.groups.pop(name, None)
        if group is None:
            return None
        self._active.discard(name)
        self._leading.discard(name)
        self._dirty.discard(name)
        self._fail_waiters(group, f"group {name} removed")
        if writes := self._writes.get(name):
            await asyncio.wait([w.future for w in writes])
        await asyncio.get_running_loop().run_in_executor(self._disk, group.storage.close)
        return group.storage

    async def run_on_disk(self, fn: Any, *args: Any) -> Any:
        """Run blocking storage work (opening or closing a log no round uses) on the disk pool."""
        return await asyncio.get_running_loop().run_in_executor(self._disk, fn, *args)

    async def read_log(self, name: str, log: Any, offset: int, max_bytes: int, upto: int) -> bytes:
        """`log.read(offset, max_bytes, upto)` of group `name`'s thread-safe PartitionLog. A
        small read while no write of the group is writing entries (so nothing holds the log's
        lock for long: an fsync runs without it) runs right here: from the page cache it costs
        less than a thread hop, and a consumer's fetch usually comes while the leader's fsync of
        the batch it waited for still runs. Others run on the reader thread, beside (not after)
        the disk pool's writes and fsyncs."""
        if max_bytes <= LOOP_READ_BYTES and not self._unwritten(name):
            data: bytes = log.read(offset, max_bytes, upto)
            return data
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, log.read, offset, max_bytes, upto)

    # inputs

    def propose(
        self,
        name: str,
        data: bytes,
        count: int = 1,
        kind: EntryKind = EntryKind.DATA,
        on_accept: Accepted | None = None,
    ) -> asyncio.Future[tuple[int, int]]:
        """Queue a proposal; the future gets (base offset, term) once the leader persisted it, or
        NotLeaderError. Proposals queued in the same round share one append and one fsync.
        `on_accept(offset, term)` runs as soon as the core accepts it, before anything commits."""
        group = self.groups[name]
        fut: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        group.proposals.append(_Proposal(data, count, kind, fut, on_accept, time.monotonic()))
        self._touch(group)
        return fut

    async def read_barrier(self, name: str, timeout: float) -> None:
        """Return once this replica has applied everything committed when the call was made."""
        group = self.groups[name]
        context = next(self._read_ids).to_bytes(8, "big")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        group.reads.append((context, fut))
        self._touch(group)
        try:
            await asyncio.wait_for(fut, timeout)
        finally:
            group.pending_reads.pop(context, None)

    def campaign(self, name: str, pre_vote: bool = True) -> None:
        """Have the local replica stand for election (see RaftNode.campaign for pre_vote)."""
        group = self.groups[name]
        group.campaign = True
        group.campaign_pre_vote = pre_vote
        self._touch(group)

    def transfer_leadership(self, name: str, to: int) -> None:
        group = self.groups[name]
        group.transfer_to = to
        self._touch(group)

    def trim(self, name: str, index: int) -> None:
        """Drop the group's log through `index` (an entry's last offset, already applied) in
        the next round; followers that need older entries get the trim point as a snapshot."""
        group = self.groups[name]
        group.trim_to = index
        self._dirty.add(name)
        self._wakeup.set()

    def link_down_for(self, peer: int) -> float:
        """Seconds since the link to `peer` went down; 0 while it is up (or never came up)."""
        down_at = self._link_down_at.get(peer)
        return 0.0 if down_at is None else time.monotonic() - down_at

    def leader_of(self, name: str) -> int | None:
        """The group's leader as known here: the local replica's view, else the last announced."""
        group = self.groups.get(name)
        if group is not None and group.leader is not None:
            return group.leader
        seen = self.leader_view.get(name)
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
        watches = self._leader_watches.setdefault(name, {})
        watches[fut] = leader

        def forget(_: asyncio.Future[None]) -> None:
            watches.pop(fut, None)
            if not watches and self._leader_watches.get(name) is watches:
                del self._leader_watches[name]

        fut.add_done_callback(forget)
        return fut

    def _leads_reachably(self, name: str, leader: int) -> bool:
        """Whether `leader` can go on leading `name` as seen here: a peer whose link is up, or
        this node while it reaches a majority of the group's voters."""
        if leader != self.node_id:
            return self.transport.alive(leader)
        group = self.groups.get(name)
        return group is not None and self.reaches_majority(group.core.voters)

    def reaches_majority(self, voters: Collection[int]) -> bool:
        """Whether this node's links are up to a majority of `voters` (itself counts)."""
        return sum(1 for v in voters if self.transport.alive(v)) > len(voters) // 2

    def _leader_changed(self, name: str) -> None:
        for listener in self.leader_listeners:
            listener(name)
        watches = self._leader_watches.get(name)
        if watches:
            leader = self.leader_of(name)
            for fut, expected in list(watches.items()):
                if expected != leader and not fut.done():
                    fut.set_result(None)

    def _touch(self, group: Group, cause: str = "request") -> None:
        if group.quiet:
            self._wake(group, cause)
        self._dirty.add(group.name)
        self._wakeup.set()

    def _wake(self, group: Group, cause: str) -> None:
        self.stats[f"woken_by_{cause}"] += 1  # what keeps groups from staying quiet
        group.quiet = False
        group.idle_ticks = 0
        self._active.add(group.name)

    # transport callbacks

    def _on_raft(self, peer: int, messages: list[Message], notices: list[list[Any]]) -> None:
        for msg in messages:
            group = self.groups.get(msg.group)
            if msg.dst != self.node_id or msg.src != peer:
                self.stats["messages_dropped"] += 1
                continue
            if group is None:
                self._hold_orphan(msg)
                continue
            if msg.type == MessageType.APPEND and group.inbox_since is None:
                group.inbox_since = time.monotonic()
            group.inbox.append(msg)
            if msg.type == MessageType.HEARTBEAT_RESP:
                # Answers to the heartbeats sent just before going quiet must not wake the group.
                self._dirty.add(group.name)
            else:
                self._touch(group, "message")
        for notice in notices:
            if notice and notice[0] == "l" and len(notice) == 4:
                self._learn_leader(str(notice[1]), notice[2], notice[3])
            elif len(notice) >= 2 and (group := self.groups.get(str(notice[1]))) is not None:
                group.notices.append((peer, notice))
                self._dirty.add(group.name)
        self.stats["messages_received"] += len(messages)
        self._wakeup.set()

    def _hold_orphan(self, msg: Message) -> None:
        """Keep a few messages for a group this node has not created yet (its metadata lags the
        leader's by a moment), so a new partition's first election need not time out."""
        held = self._orphans.setdefault(msg.group, [])
        if len(held) < ORPHANS_PER_GROUP:
            held.append(msg)
        else:
            self.stats["messages_dropped"] += 1
        while len(self._orphans) > ORPHAN_GROUPS:
            dropped = self._orphans.pop(next(iter(self._orphans)))
            self.stats["messages_dropped"] += len(dropped)

    def _on_gone(self, peer: int) -> None:
        """The peer's connection closed, or it was silent past the dead-after window (which
        widens while this node stalls): wake only the quiet groups it leads (their followers
        must elect) and fresh ones waiting for it. Waking every group on every link change
        made a node with tens of thousands of groups tick them all at once."""
        for group in self.groups.values():
            if group.quiet and (
                group.leader == peer or (group.leader is None and group.waits_for == peer)
            ):
                self._touch(group, "link")
                group.woken_by_link = peer

    def _on_link(self, peer: int, up: bool, revived: bool = False) -> None:
        """Link down (silent for `dead_after_s`, or closed): forwards waiting on the peer as
        a leader give up. Link up: wake the quiet groups led here that it replicates (it may
        have restarted and must learn the leader). `revived`: the peer was only silent for a
        while (the same connection, so the peer did not restart and nothing sent to it
        meanwhile was lost): the followers its silence woke go quiet again if nothing changed
        since, and nothing else wakes. On a loaded machine peers fall silent now and then,
        and each time every group they led woke, elected or heartbeated, then went quiet.
        Either way the peer learns of the leaderships won here while it was silent: else a
        node forwards to a former leader (a network partition's heal) long after the move."""
        if not up:
            self._link_down_at.setdefault(peer, time.monotonic())  # silent, then closed: first
            for name, watches in list(self._leader_watches.items()):
                for fut, expected in list(watches.items()):
                    if not fut.done() and not self._leads_reachably(name, expected):
                        fut.set_result(None)
            return
        self._link_down_at.pop(peer, None)
        missed = self._unannounced.pop(peer, set())
        for group in self.groups.values():
            if group.woken_by_link == peer:
                group.woken_by_link = None
                if revived and self._unchanged_follower(group, peer):
                    group.quiet = True  # as it was before the peer fell silent
                    self._active.discard(group.name)
                    self.stats["quiet_again_after_link"] += 1
                    continue
            if group.leader == peer and not group.quiet:
                # Woken when the link went down, this follower's election timer runs while
                # its leader may still be quiet: wake the leader, or a short link loss
                # turns into an election of every group the peer leads.
                self._notices[peer].append(["w", group.name])
            elif group.role == "leader" and (not revived or group.name in missed):
                self._notices[peer].append(["l", group.name, self.node_id, group.term])
                replicates = peer in group.core.voters or peer in group.core.learners
                if not revived and group.quiet and replicates:
                    self._touch(group, "link")
        self._flush_notices()

    @staticmethod
    def _unchanged_follower(group: Group, leader: int) -> bool:
        """Still following `leader` in the same term, with nothing waiting to be fed."""
        core = group.core
        return (
            core.role == "follower"
            and core.leader_id == leader == group.leader
            and core.term == group.term
            and not (group.inbox or group.proposals or group.reads or group.notices)
        )

    def _learn_leader(self, name: str, node: Any, term: Any) -> None:
        if type(node) is not int or type(term) is not int:
            return
        seen = self.leader_view.get(name)
        if seen is None or term >= seen[1]:
            self.leader_view[name] = (node, term)
            self._leader_changed(name)

    # timer

    async def _tick(self) -> None:
        interval = self.config.tick_ms / 1000
        lag = self.stage_times.histograms["loop_lag"]
        while True:
            due = time.monotonic() + interval
            await asyncio.sleep(interval)
            lag.observe(max(0.0, time.monotonic() - due))
            self.transport.tick()
            for name in self._active:
                if (group := self.groups.get(name)) is not None:
                    group.ticks += 1
            self._dirty.update(self._active)
            self._wakeup.set()
            self._flush_notices()
            self._role_log.flush()

    # driver rounds

    async def _drive(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if self._failure is not None:
                # A log that cannot be written must not acknowledge anything: stop the node.
                raise self._failure
            taken = self._take_dirty()
            rounds = [self._feed(g) for n in taken if (g := self.groups.get(n))]
            self._send_replication(rounds)
            self._apply_early(rounds)
            for item in rounds:
                if (queue := self._queued.get(item.group.name)) is not None:
                    queue.append(item)  # behind its group's writes in flight
                    if item.extends_in is not None:
                        self.stats["follower_rounds_beside_writes"] += 1
            self._start([r for r in rounds if r.group.name not in self._queued])
            self._start_queued({r.group.name for r in rounds if r.group.name in self._queued})
            if len(taken) >= GROUPS_PER_ROUND:
                self._wakeup.set()  # more may wait: read the sockets first, then go on
                await asyncio.sleep(0)

    def _start(self, rounds: list[_Round]) -> None:
        """Write the rounds of groups that touch the disk; finish the others at once. A
        group's rounds stay together, so that they are advanced in order."""
        by_group: dict[str, list[_Round]] = defaultdict(list)
        for item in rounds:
            by_group[item.group.name].append(item)
        on_disk: list[_Round] = []
        at_once: list[_Round] = []
        for group_rounds in by_group.values():
            touches = any(r.touches_disk for r in group_rounds)
            (on_disk if touches else at_once).extend(group_rounds)
        if on_disk:
            self._write(on_disk)
        if writes := [r for r in at_once if r.writes]:
            self._persist(writes)  # commit-index changes only: kept in memory, no I/O
        self._finish(at_once)

    def _start_queued(self, names: Iterable[str]) -> None:
        """Start the queued rounds of these groups as one more write once every earlier write
        of theirs has written its entries (its fsync may still run; the log orders fsyncs),
        if the queue has something to write; else they wait for the earlier writes to end."""
        start = []
        for name in names:
            queue = self._queued.get(name)
            if (
                queue
                and name in self.groups
                and any(r.touches_disk for r in queue)
                and len(self._writes[name]) < WRITES_PER_GROUP
                and not self._unwritten(name)
            ):
                start.extend(queue)
                queue.clear()
        if start:
            self._write(start)

    def _holds_proposals(self, name: str) -> bool:
        """Proposals wait until the group's next write can start (see _start_queued)."""
        writes = self._writes.get(name, ())
        return len(writes) >= WRITES_PER_GROUP or self._unwritten(name)

    def _unwritten(self, name: str) -> bool:
        """The group has a write whose entries are not yet in its log file (as the loop was
        told, or as the disk thread marked: read just before it marks, the group waits for
        that write to end instead)."""
        return any(not (w.written or w.appended) for w in self._writes.get(name, ()))

    def _takeable(self, name: str) -> bool:
        """A group may be fed unless it has writes in flight and is neither a leader whose
        writes only append (a trim or snapshot changes what the core may read from storage)
        nor a follower whose pending rounds and inputs can only extend its log."""
        writes = self._writes.get(name)
        if not writes:
            return True
        group = self.groups.get(name)
        if group is None or group.trim_to is not None:
            return False
        if group.core.role != "leader":
            return self._only_extends(group)
        return not any(
            r.trim is not None or (r.ready is not None and r.ready.snapshot is not None)
            for w in writes
            for r in w.rounds_of(name)
        )

    def _only_extends(self, group: Group) -> bool:
        """A follower with writes in flight: every round not finished appends after its log
        without truncating in the current term, and its inputs are only the replication of
        the leader it follows in that term. Stepping those cannot truncate what is being
        written nor change the term or vote (in one term the leader's log only grows), so the
        round they make can be written once the earlier writes have written their entries."""
        core = group.core
        term, leader = core.term, core.leader_id
        return (
            core.role == "follower"
            and leader is not None
            and bool(group.inbox)
            and not (group.notices or group.proposals or group.reads or group.campaign)
            and group.transfer_to is None
            and all(
                m.type in _REPLICATION and m.src == leader and m.term == term for m in group.inbox
            )
            and all(r.extends_in == term for r in self._pending(group.name))
        )

    def _take_dirty(self) -> list[str]:
        """Up to GROUPS_PER_ROUND touched groups that may be fed, first_groups first, then
        the longest touched; the others stay touched (those with writes in flight until their
        writes end)."""
        takeable = self._takeable if self._writes else None
        taken = [
            name
            for name in self.first_groups
            if name in self._dirty and (takeable is None or takeable(name))
        ]
        for name in self._dirty:
            if len(taken) >= GROUPS_PER_ROUND:
                break
            if (takeable is None or takeable(name)) and name not in self.first_groups:
                taken.append(name)
        self._dirty.difference_update(taken)
        return taken

    def _write(self, rounds: list[_Round]) -> None:
        """Start the rounds' disk writes on the pool; `_written` finishes them on the loop."""
        write = _Write(rounds)
        # Only leaders apply entries before their fsync: only they need the written signal.
        leads = any(r.ready is not None and r.ready.role == "leader" for r in rounds)
        loop = asyncio.get_running_loop()
        write.future = loop.create_future()
        self._disk.submit(self._persist_and_return, rounds, loop, leads, write)
        for name in write.groups:
            self._writes.setdefault(name, []).append(write)
            self._queued.setdefault(name, [])
        self._in_flight += 1
        self._disk_idle.clear()

    def _persist_and_return(
        self, rounds: list[_Round], loop: asyncio.AbstractEventLoop, leads: bool, write: _Write
    ) -> None:
        """Disk thread: persist, then hand the outcome to the loop in one hop (through
        run_in_executor's two futures, `_written` ran a loop iteration later: on a busy loop,
        milliseconds on every follower's acknowledgement and leader's fsync)."""
        outcome: int | BaseException
        try:
            outcome = self._persist(rounds, loop if leads else None, write)
        except BaseException as error:
            outcome = error
        with contextlib.suppress(RuntimeError):  # the loop is closed: the node is gone
            loop.call_soon_threadsafe(self._written, write, outcome)

    def _written(self, write: _Write, outcome: int | BaseException) -> None:
        """A write returned (`outcome`: logs synced, or its error): finish, per group and in
        order, every write that returned and has no earlier one still running; then start
        what was queued behind them."""
        write.done = True
        self._in_flight -= 1
        if not self._in_flight:
            self._disk_idle.set()
        if write.future is not None and not write.future.done():
            write.future.set_result(None)
        if self._stopping:
            return
        if isinstance(outcome, BaseException):
            log.critical("persisting Raft state failed; stopping the driver", exc_info=outcome)
            self._failure = outcome
            self._wakeup.set()
            return
        self.stats["fsyncs"] += outcome
        now = time.monotonic()
        self._observe_disk_hand_offs(write, now)
        for item in write.rounds:
            if item.ready is not None and item.ready.entries:
                stage = "leader_fsync" if item.ready.role == "leader" else "follower_persist"
                self.stage_times.observe(stage, now - item.fed_at)
        finished: list[_Round] = []
        idle: list[_Round] = []
        for name in write.groups:
            writes = self._writes.get(name)
            while writes and writes[0].done:
                finished.extend(writes.pop(0).rounds_of(name))
            if writes:
                continue
            self._writes.pop(name, None)
            queue = self._queued.pop(name, [])
            if name in self.groups:
                idle.extend(queue)
        self._finish(finished)
        if idle:  # rounds a leader was fed meanwhile: their writes (a group's at once) start now
            self._start(idle)
        self._start_queued(write.groups)

    def _observe_disk_hand_offs(self, write: _Write, now: float) -> None:
        """What a write spent between threads, apart from the fsync calls themselves."""
        observe = self.stage_times.observe
        observe("disk_queue", write.started_at - write.submitted_at)
        observe("disk_return", now - write.returned_at)
        if not write.fsyncs:
            return
        for handed, started, returned in write.fsyncs:
            observe("fsync_call", returned - started)
            if started > handed:  # run on a pool thread, not on the disk thread itself
                observe("fsync_start", started - handed)
        if len(write.fsyncs) > 1:
            observe("fsync_join", write.returned_at - max(t[2] for t in write.fsyncs))

    def _feed(self, group: Group) -> _Round:
        core = group.core
        # At most one tick per feed, after the messages: a node too busy to feed a group every
        # tick stretches its timeouts instead of firing them in a burst, and a heartbeat that
        # waited in the inbox counts before the ticks that passed meanwhile. Fed tick by tick,
        # a starved node with thousands of new groups timed out elections faster than the
        # votes could come back, and elected for minutes.
        ticks, group.ticks = min(group.ticks, TICKS_PER_FEED), 0
        busy = bool(group.proposals) or bool(group.reads)
        last_before = core.last_index
        now = time.monotonic()
        if group.inbox_since is not None:
            self.stage_times.observe("follower_wait", now - group.inbox_since)
            group.inbox_since = None
        for msg in group.inbox:
            busy |= msg.type not in _HEARTBEATS
            if msg.type == MessageType.SNAPSHOT and msg.snapshot is not None:
                # The state the leader sent beside it, for the replica if the core installs it.
                group.snapshot_state = (msg.snapshot.index, msg.context)
            self._guard(group, core.step, msg)
        group.inbox.clear()
        for _ in range(ticks):
            self._guard(group, core.tick)
        for peer, notice in group.notices:
            self._on_notice(group, peer, notice)
        group.notices.clear()
        if group.campaign:
            group.campaign = False
            self._guard(group, core.campaign, group.campaign_pre_vote)
        if group.transfer_to is not None:
            busy = True
            to, group.transfer_to = group.transfer_to, None
            self._guard(group, core.transfer_leadership, to)
        accepted = []
        # Proposals wait while a write of the group is writing its entries (not while it
        # fsyncs): they then go to disk and to the followers as one batch (sending each as it
        # came cost a third of the max rate with fsync).
        proposals = [] if self._holds_proposals(group.name) else group.proposals
        for proposal in proposals:
            try:
                index = core.propose(proposal.data, proposal.count, proposal.kind)
            except Exception as exc:  # NotLeaderError, or a proposal the core refuses
                if not proposal.future.done():
                    proposal.future.set_exception(exc)
                continue
            accepted.append((proposal.future, index, core.term))
            if proposal.on_accept is not None:
                proposal.on_accept(index, core.term)
        if proposals:
            group.proposals = []
            self.stage_times.observe_since("propose_wait", now, (p.queued_at for p in proposals))
        for context, read in group.reads:
            if read.done():
                continue
            try:
                core.read_index(context)
            except Exception as exc:  # no known leader to confirm the read
                read.set_exception(exc)
                continue
            group.pending_reads[context] = read
        group.reads.clear()
        group.idle_ticks = 0 if busy else group.idle_ticks + ticks
        trim = None
        if group.trim_to is not None and group.name not in self._writes:
            index, group.trim_to = group.trim_to, None
            if group.storage.first_index() <= index <= core.applied:
                trim = core.snapshot_meta_at(index)
        ready = core.ready() if core.has_ready() else None
        if ready is not None and ready.entries and ready.role == "leader":
            group.uncommitted.append((ready.entries[-1].last_index, now))
        item = _Round(group, ready, accepted, trim, fed_at=now)
        if trim is None and core.role == "follower" and _appends_after(ready, last_before):
            item.extends_in = core.term
        return item

    @staticmethod
    def _guard(group: Group, fn: Callable[..., None], *args: Any) -> None:
        """Feed one input; a bad input is logged and dropped, never fatal to the node."""
        try:
            fn(*args)
        except Exception as exc:
            log.warning("Raft group %s rejected an input: %r", group.name, exc)

    def _persist(
        self,
        rounds: list[_Round],
        loop: asyncio.AbstractEventLoop | None = None,
        write: _Write | None = None,
    ) -> int:
        """Disk thread: write every Ready, then fsync each touched log once (each log's fsync
        policy decides whether that fsync reaches the disk); apply requested trims. Tells
        `loop` (if given) when the entries of `write` are written, before the fsyncs.
        Returns the number of logs synced."""
        if write is not None:
            write.started_at = time.monotonic()
        to_sync: dict[int, GroupStorage] = {}
        saves: dict[int, tuple[GroupStorage, list[HardState]]] = {}
        for item in rounds:
            rd, storage = item.ready, item.group.storage
            if item.trim is not None:
                storage.trim(item.trim.index, item.trim.voters, item.trim.learners)
            if rd is None:
                continue
            if rd.snapshot is not None:
                storage.install(rd.snapshot)
            if rd.entries:
                storage.append(rd.entries)
            if rd.hard_state is not None:
                saves.setdefault(id(storage), (storage, []))[1].append(rd.hard_state)
            if rd.must_sync or rd.entries:
                to_sync[id(storage)] = storage
        # A term or vote change is a state file written and fsynced (three syncs): saved one
        # after the other, a round of a thousand new groups' votes took seconds, longer than
        # an election timeout. Each group's saves keep their order; groups go side by side.
        # A commit-index change is kept in memory: saved right here. Handed to the fsync pool
        # it waited for a free thread behind other logs' fsyncs, holding up this write and,
        # in a round of commit changes only (run on the loop), the event loop itself.
        voted = []
        for storage, states in saves.values():
            if _changes_vote(storage, states):
                voted.append(partial(_save_all, storage, states))
            else:
                _save_all(storage, states)
        run_all(self._fsyncs, voted)
        if loop is not None and write is not None:
            loop.call_soon_threadsafe(self._entries_written, write)
        if write is not None:
            write.appended = True
        timings = write.fsyncs if write is not None else None
        fsync_all(self._fsyncs, list(to_sync.values()), timings)
        if write is not None:
            write.returned_at = time.monotonic()
        return len(to_sync)

    def _send_replication(self, rounds: list[_Round]) -> None:
        """Send leaders' APPENDs and HEARTBEATs before this round's disk writes: followers
        then write and fsync in parallel with the leader. Safe because the core counts the
        leader's own entries toward commit only once they are durable (advance), and these
        messages need nothing else from this round's writes as long as its term and vote are
        already durable (a Ready that changes them keeps its messages until after the fsync)."""
        outbox: dict[int, list[Message]] = defaultdict(list)
        for item in rounds:
            rd = item.ready
            if rd is None or not rd.messages or rd.role != "leader":
                continue
            durable = item.group.storage.hard_state
            if item.group.core.term != durable.term or (
                rd.hard_state is not None and rd.hard_state.vote != durable.vote
            ):
                continue
            later = []
            for msg in rd.messages:
                if msg.type in _REPLICATION and msg.dst != self.node_id:
                    msg.group = item.group.name
                    outbox[msg.dst].append(msg)
                else:
                    later.append(msg)
            rd.messages = later
        for peer, messages in outbox.items():
            self.transport.send(peer, wire.encode_raft(messages, []))
            self.stats["messages_sent"] += len(messages)

    def _apply_early(self, rounds: list[_Round]) -> None:
        """Apply what fresh rounds committed, if it is written (see _apply_written)."""
        for item in rounds:
            self._apply_written(item.group, [*self._pending(item.group.name), item])

    def _pending(self, name: str) -> list[_Round]:
        """The group's rounds not finished yet, in order: in writes, then queued."""
        rounds = [r for w in self._writes.get(name, ()) for r in w.rounds_of(name)]
        return rounds + self._queued.get(name, [])

    def _entries_written(self, write: _Write) -> None:
        """Loop: the disk thread wrote these entries and is about to fsync them. Apply what
        they let through, and let the groups' waiting proposals form the next write."""
        write.written = True
        now = time.monotonic()
        for item in write.rounds:
            item.written = True
            if item.ready is not None and item.ready.entries and item.ready.role == "leader":
                self.stage_times.observe("leader_write", now - item.fed_at)
        for name in write.groups:
            group = self.groups.get(name)
            if group is None or name not in self._writes:
                continue  # removed, or every write of the group already ended
            self._apply_written(group, self._pending(name))
            if group.proposals and not self._holds_proposals(name):
                self._dirty.add(name)
                self._wakeup.set()
        self._start_queued(write.groups)

    def _apply_written(self, group: Group, rounds: list[_Round]) -> None:
        """Apply a leader's committed entries before the fsync of the rounds (of this group, in
        order) that carry them, so that acks and long-polls do not wait for it. Safe: an entry
        commits only once a quorum holds it durably, and it is applied here only once the
        leader's own copy is in its log file too (readable by fetches), that is, if no round
        still to be written holds it; otherwise it is applied later, when its round's write
        is done or ends. Entries are applied in order: never past an earlier round's."""
        unwritten = min(
            (
                r.ready.entries[0].index
                for r in rounds
                if r.ready and r.ready.entries and not r.written
            ),
            default=None,
        )
        for item in rounds:
            rd = item.ready
            if rd is None or not rd.committed or item.applied_early:
                continue
            if rd.role != "leader" or rd.snapshot is not None:
                return
            if unwritten is not None and rd.committed[-1].last_index >= unwritten:
                return
            item.applied_early = True
            self._apply(group, rd.committed)

    def _apply(self, group: Group, committed: list[Entry]) -> None:
        try:
            group.replica.on_commit(committed)
        except Exception:
            log.exception("applying committed entries of %s failed", group.name)
        group.applied = committed[-1].last_index
        group.idle_ticks = 0
        uncommitted = group.uncommitted
        if uncommitted and uncommitted[0][0] <= group.applied:
            now = time.monotonic()
            while uncommitted and uncommitted[0][0] <= group.applied:
                self.stage_times.observe("commit", now - uncommitted.popleft()[1])

    def _finish(self, rounds: list[_Round]) -> None:
        outbox: dict[int, list[Message]] = defaultdict(list)
        for item in rounds:
            if item.ready is not None:
                for msg in item.ready.messages:
                    msg.group = item.group.name
                    if msg.type == MessageType.SNAPSHOT and msg.snapshot is not None:
                        msg.context = self._snapshot_state(item.group, msg.snapshot.index)
                    outbox[msg.dst].append(msg)
        for peer, messages in outbox.items():
            if peer == self.node_id:
                for msg in messages:
                    if (group := self.groups.get(msg.group)) is not None:
                        group.inbox.append(msg)
                        self._dirty.add(msg.group)
                continue
            self.transport.send(peer, wire.encode_raft(messages, self._notices.pop(peer, [])))
            self.stats["messages_sent"] += len(messages)
        for item in rounds:
            self._settle(item)
        self._flush_notices()
        if self._dirty and (not self._writes or any(map(self._takeable, self._dirty))):
            self._wakeup.set()

    def _settle(self, item: _Round) -> None:
        group, rd = item.group, item.ready
        core = group.core
        if item.trim is not None:
            self._guard(group, core.compact, item.trim.index)
        if rd is not None:
            if rd.snapshot is not None:
                self._installed(group, rd.snapshot.index)
            if rd.committed and not item.applied_early:
                self._apply(group, rd.committed)
            for state in rd.read_states:
                read = group.pending_reads.pop(state.context, None)
                if read is not None and not read.done():
                    group.waiting_reads.append((state.index, read))
            if group.waiting_reads:
                still = []
                for index, read in group.waiting_reads:
                    if index <= group.applied:
                        if not read.done():
                            read.set_result(None)
                    else:
                        still.append((index, read))
                group.waiting_reads = still
            if rd.entries:
                group.idle_ticks = 0
            core.advance(rd)
        for fut, index, term in item.accepted:
            if not fut.done():
                fut.set_result((index, term))
        if (core.role, core.leader_id, core.term) != (group.role, group.leader, group.term):
            self._role_changed(group)
        if (core.has_ready() or group.proposals) and group.name in self.groups:
            self._dirty.add(group.name)
        elif (
            group.role == "leader"
            and not group.quiet
            and group.idle_ticks >= self.config.quiet_after_ticks
            # A leader with entries a quorum has not acknowledged keeps ticking: only its
            # heartbeats bring them a retry, and only its check-quorum ends a leadership that
            # lost its followers (answering the waiting writers).
            and core.commit_index >= core.last_index
        ):
            self._quiesce(group)

    @staticmethod
    def _snapshot_state(group: Group, index: int) -> bytes:
        """Leader: the replica's state to ship beside a Raft snapshot at `index` (its
        `snapshot_state`, if it has one: partitions send producer state)."""
        make = getattr(group.replica, "snapshot_state", None)
        if make is None:
            return b""
        try:
            return bytes(make(index))
        except Exception:
            log.exception("state for the snapshot of %s at %d", group.name, index)
            return b""

    @staticmethod
    def _installed(group: Group, index: int) -> None:
        """The storage installed a snapshot at `index`: hand the replica the state shipped
        with it (if the message that carried it was for this index)."""
        shipped, group.snapshot_state = group.snapshot_state, None
        install = getattr(group.replica, "on_snapshot", None)
        if install is None:
            return
        payload = shipped[1] if shipped is not None and shipped[0] == index else None
        try:
            install(index, payload or None)
        except Exception:
            log.exception("installing the snapshot of %s at %d", group.name, index)

    def _role_changed(self, group: Group) -> None:
        core = group.core
        group.role, group.leader, group.term = core.role, core.leader_id, core.term
        group.uncommitted.clear()  # a past leadership's rounds: never timed to a commit
        if group.role == "leader":
            self._leading.add(group.name)
            self.stats["leaderships_won"] += 1  # elections won here: past a group's first, churn
        else:
            self._leading.discard(group.name)
        # What a post-mortem of a failover needs first: who led what, when (counted, not
        # written one by one, when thousands of groups change at once).
        self._role_log.changed(
            group.name, group.role, group.term, group.leader, core.commit_index, core.last_index
        )
        if group.leader is not None:
            self._learn_leader(group.name, group.leader, group.term)
        self._leader_changed(group.name)
        if group.role == "leader":
            for peer in self.transport.addresses:
                if self.transport.alive(peer):
                    self._notices[peer].append(["l", group.name, self.node_id, group.term])
                else:
                    self._unannounced[peer].add(group.name)
        try:
            group.replica.on_role(group.role, group.leader, group.term)
        except Exception:
            log.exception("role change handler of %s failed", group.name)

    # quiescence

    def _quiesce(self, group: Group) -> None:
        group.quiet = True
        self._active.discard(group.name)
        notice = [
            "q",
            group.name,
            group.term,
            group.core.commit_index,
            group.storage.last_index(),
        ]
        for peer in group.peers(self.node_id):
            self._notices[peer].append(notice)
        self.stats["quiesced"] += 1

    def _on_notice(self, group: Group, peer: int, notice: list[Any]) -> None:
        core = group.core
        if notice[0] == "w":
            self._wake(group, "notice")
        elif notice[0] == "q" and len(notice) == 5:
            _, _, term, commit, last_index = notice
            if (
                core.role == "follower"
                and core.term == term
                and core.leader_id == peer
                and core.commit_index == commit
                and group.storage.last_index() == last_index
                and not group.proposals
            ):
                group.quiet = True
                self._active.discard(group.name)
            else:
                self._notices[peer].append(["w", group.name])

    def quiet_groups(self) -> int:
        return len(self.groups) - len(self._active)

    def leading_groups(self) -> int:
        """Groups led here, kept as roles change: /metrics read every second counted them
        over every group (part of the 16% of a node's loop the bench's polling took at 40 k
        partitions)."""
        return len(self._leading)

    def _flush_notices(self) -> None:
        for peer in list(self._notices):
            notices = self._notices.pop(peer)
            with contextlib.suppress(wire.FrameError):
                self.transport.send(peer, wire.encode_raft([], notices))

    def _fail_waiters(self, group: Group, reason: str) -> None:
        error = GroupStopped(reason)
        for proposal in group.proposals:
            if not proposal.future.done():
                proposal.future.set_exception(error)
        for fut in [r for _, r in group.reads] + list(group.pending_reads.values()):
            if not fut.done():
                fut.cancel()
        for _, fut in group.waiting_reads:
            if not fut.done():
                fut.cancel()


def _appends_after(ready: Ready | None, last_index: int) -> bool:
    """The Ready writes no snapshot and no entry at or below `last_index` (which would
    truncate the log there): at most entries right after it, and hard state."""
    if ready is None:
        return True
    return ready.snapshot is None and (
        not ready.entries or ready.entries[0].index == last_index + 1
    )


def fsync_all(
    pool: ThreadPoolExecutor,
    storages: list[GroupStorage],
    timings: list[tuple[float, float, float]] | None = None,
) -> None:
    """Fsync every log of a round, in parallel on `pool` when there are several; raises the
    first failure once all have finished (a log that failed to sync fails the node). Each
    fsync's (handed over, started, returned) times go to `timings` if given."""
    if timings is None:
        run_all(pool, [storage.fsync for storage in storages])
        return
    handed = time.monotonic()
    run_all(pool, [partial(_timed, storage.fsync, handed, timings) for storage in storages])


def _timed(
    call: Callable[[], None], handed: float, timings: list[tuple[float, float, float]]
) -> None:
    started = time.monotonic()
    call()
    timings.append((handed, started, time.monotonic()))  # list.append: thread-safe


def run_all(pool: ThreadPoolExecutor, calls: list[Callable[[], None]]) -> None:
    """Run the calls in parallel: the first on the calling thread, the others on `pool`;
    raises the first failure once all have finished. (The caller runs one itself rather than
    idle: one thread fewer to wake, which on a busy machine is time on the ack path.)"""
    if not calls:
        return
    done = [pool.submit(call) for call in calls[1:]]
    try:
        calls[0]()
    finally:
        futures.wait(done)
    for call in done:
        call.result()


def _save_all(storage: GroupStorage, states: list[HardState]) -> None:
    for state in states:
        storage.save(state)


def _changes_vote(storage: GroupStorage, states: list[HardState]) -> bool:
    """Whether saving `states` writes the state file: only a new term or vote does."""
    saved = storage.hard_state
    return any((s.term, s.vote) != (saved.term, saved.vote) for s in states)


def _close_all(groups: list[Group]) -> None:
    for group in groups:
        try:
            group.storage.fsync()
            group.storage.close()
        except Exception:
            log.exception("closing the log of %s failed", group.name)
