"""The multi-Raft driver: all Raft groups of a node on one asyncio loop, one timer, a disk pool.

Owns group lifecycle, driver rounds with group commit, proposals, read barriers and quiescence of
idle groups; node/rounds.py writes a round to disk, node/leaders.py keeps who leads what.

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
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from raftline.node import wire
from raftline.node.config import NodeConfig
from raftline.node.group import Accepted, Group, GroupStorage, Proposal, Replica
from raftline.node.leaders import LeaderView
from raftline.node.role_log import RoleLog
from raftline.node.rounds import (
    DiskWrites,
    Round,
    Write,
    appends_after,
    observe_disk_hand_offs,
)
from raftline.node.stages import StageTimes
from raftline.node.transport import RpcHandler, Transport
from raftline.raftlog.raft import RaftConfig, RaftNode
from raftline.raftlog.types import (
    Entry,
    EntryKind,
    Message,
    MessageType,
)

log = logging.getLogger(__name__)

_HEARTBEATS = (MessageType.HEARTBEAT, MessageType.HEARTBEAT_RESP)
_REPLICATION = (MessageType.APPEND, MessageType.HEARTBEAT)  # a leader's, sent before its fsync
ORPHANS_PER_GROUP = 16
LOOP_READ_BYTES = 1 << 20  # fetch reads up to this size may run on the loop (see read_log)
ORPHAN_GROUPS = 1024
# A round feeds at most this many groups; the others wait for the next round, after the loop has
# read its sockets and run its timers. Feeding tens of thousands of just-created groups in one
# round held the loop for seconds, long enough for peers to declare this node dead.
GROUPS_PER_ROUND = 512
TICKS_PER_FEED = 1  # see _feed


class GroupStopped(Exception):
    """The group was removed or the node is stopping before the request completed."""


class Runtime:
    def __init__(
        self, config: NodeConfig, on_rpc: RpcHandler, rng: random.Random | None = None
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.groups: dict[str, Group] = {}
        self._rng = rng or random.Random()
        self._active: set[str] = set()  # groups that receive ticks (not quiet)
        self._leading: set[str] = set()  # groups led here
        # The groups to feed, in the order they were touched (a key set again keeps its place):
        # rounds take from the front, so no group waits behind groups touched after it. A plain
        # dict, not a set class of its own: touched several times per message, on every node.
        self._dirty: dict[str, None] = {}
        self.first_groups: set[str] = set()  # fed first in every round (the metadata group)
        self._notices: dict[int, list[list[Any]]] = defaultdict(list)
        self._orphans: dict[str, list[Message]] = {}  # messages for groups not created yet
        # The driver's wake-up: a round is due, and the future it sleeps on when none was.
        # Not an asyncio.Event, whose wait and clear cost ~7 calls per round.
        self._round_due = False
        self._driver_asleep: asyncio.Future[None] | None = None
        self._disk = DiskWrites(self._entries_written, self._written)
        self._stopping = False
        self._failure: BaseException | None = None  # a write that failed: fatal to the driver
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
        self.leader_view = LeaderView(self.node_id, self.transport, self.groups)
        self.stats: dict[str, int] = defaultdict(int)
        self._role_log = RoleLog(log)
        self.stage_times = StageTimes()
        # Its histograms, observed straight (several per message: no call through StageTimes).
        self._stages = self.stage_times.histograms

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
        await self._disk.idle.wait()
        groups = list(self.groups.values())
        self.groups.clear()
        for group in groups:
            self._fail_waiters(group, "node stopping")
        self._reader.shutdown(wait=True)
        await asyncio.get_running_loop().run_in_executor(self._disk.pool, _close_all, groups)
        self._disk.shutdown()

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
        self._dirty.pop(name, None)
        self._fail_waiters(group, f"group {name} removed")
        if writes := self._disk.writes.get(name):
            await asyncio.wait([w.future for w in writes])
        await asyncio.get_running_loop().run_in_executor(self._disk.pool, group.storage.close)
        return group.storage

    async def run_on_disk(self, fn: Any, *args: Any) -> Any:
        """Run blocking storage work (opening or closing a log no round uses) on the disk pool."""
        return await asyncio.get_running_loop().run_in_executor(self._disk.pool, fn, *args)

    async def read_log(self, name: str, log: Any, offset: int, max_bytes: int, upto: int) -> bytes:
        """`log.read(offset, max_bytes, upto)` of group `name`'s thread-safe PartitionLog. A
        small read while no write of the group is writing entries (so nothing holds the log's
        lock for long: an fsync runs without it) runs right here: from the page cache it costs
        less than a thread hop, and a consumer's fetch usually comes while the leader's fsync of
        the batch it waited for still runs. Others run on the reader thread, beside (not after)
        the disk pool's writes and fsyncs."""
        if max_bytes <= LOOP_READ_BYTES and not self._disk.unwritten(name):
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
        group.proposals.append(Proposal(data, count, kind, fut, on_accept, time.monotonic()))
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
        self._dirty[name] = None
        self._signal_round()

    def _touch(self, group: Group, cause: str = "request") -> None:
        if group.quiet:
            self._wake(group, cause)
        self._dirty[group.name] = None
        self._signal_round()

    def _signal_round(self) -> None:
        """Have the driver run a round soon (once, however often this is called meanwhile)."""
        self._round_due = True
        asleep, self._driver_asleep = self._driver_asleep, None
        if asleep is not None and not asleep.done():
            asleep.set_result(None)

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
                self._dirty[group.name] = None
            else:
                self._touch(group, "message")
        for notice in notices:
            if notice and notice[0] == "l" and len(notice) == 4:
                self.leader_view.learn(str(notice[1]), notice[2], notice[3])
            elif len(notice) >= 2 and (group := self.groups.get(str(notice[1]))) is not None:
                group.notices.append((peer, notice))
                self._dirty[group.name] = None
        self.stats["messages_received"] += len(messages)
        self._signal_round()

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
            self.leader_view.link_down(peer)
            return
        missed = self.leader_view.link_up(peer)
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

    # timer

    async def _tick(self) -> None:
        interval = self.config.tick_ms / 1000
        lag = self._stages["loop_lag"]
        while True:
            due = time.monotonic() + interval
            await asyncio.sleep(interval)
            lag.observe(max(0.0, time.monotonic() - due))
            self.transport.tick()
            for name in self._active:
                if (group := self.groups.get(name)) is not None:
                    group.ticks += 1
            self._dirty.update(dict.fromkeys(self._active))
            self._signal_round()
            self._flush_notices()
            self._role_log.flush()

    # driver rounds

    async def _drive(self) -> None:
        while True:
            if not self._round_due:
                self._driver_asleep = asyncio.get_running_loop().create_future()
                await self._driver_asleep
            self._round_due = False
            if self._failure is not None:
                # A log that cannot be written must not acknowledge anything: stop the node.
                raise self._failure
            taken = self._take_dirty()
            rounds = [self._feed(g) for n in taken if (g := self.groups.get(n))]
            self._send_replication(rounds)
            self._apply_early(rounds)
            fresh: list[Round] = []
            behind: set[str] = set()
            for item in rounds:
                if (queue := self._disk.queued.get(item.group.name)) is not None:
                    queue.append(item)  # behind its group's writes in flight
                    behind.add(item.group.name)
                    if item.extends_in is not None:
                        self.stats["follower_rounds_beside_writes"] += 1
                else:
                    fresh.append(item)
            self._start(fresh)
            if behind:
                self._start_queued(behind)
            if len(taken) >= GROUPS_PER_ROUND:
                self._round_due = True  # more may wait: read the sockets first, then go on
                await asyncio.sleep(0)

    def _start(self, rounds: list[Round]) -> None:
        """Write the rounds of groups that touch the disk; finish the others at once. A
        group's rounds stay together, so that they are advanced in order."""
        by_group: dict[str, list[Round]] = defaultdict(list)
        for item in rounds:
            by_group[item.group.name].append(item)
        on_disk: list[Round] = []
        at_once: list[Round] = []
        for group_rounds in by_group.values():
            touches = any(r.touches_disk for r in group_rounds)
            (on_disk if touches else at_once).extend(group_rounds)
        if on_disk:
            self._disk.start(on_disk)
        for item in at_once:
            # A commit-index change at most (term and vote as saved: no must_sync), which the
            # storage keeps in memory: what persist() would do for it, without its machinery.
            if item.ready is not None and item.ready.hard_state is not None:
                item.group.storage.save(item.ready.hard_state)
        self._finish(at_once)

    def _start_queued(self, names: Iterable[str]) -> None:
        """Start the queued rounds of these groups as one more write once every earlier write
        of theirs has written its entries (its fsync may still run; the log orders fsyncs),
        if the queue has something to write; else they wait for the earlier writes to end."""
        start = []
        for name in names:
            queue = self._disk.queued.get(name)
            if (
                queue
                and name in self.groups
                and any(r.touches_disk for r in queue)
                and self._disk.may_start(name)
            ):
                start.extend(queue)
                queue.clear()
        if start:
            self._disk.start(start)

    def _takeable(self, name: str) -> bool:
        """A group may be fed unless it has writes in flight and is neither a leader whose
        writes only append (a trim or snapshot changes what the core may read from storage)
        nor a follower whose pending rounds and inputs can only extend its log."""
        writes = self._disk.writes.get(name)
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
            for r in w.groups[name]
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
            and all(r.extends_in == term for r in self._disk.pending(group.name))
        )

    def _take_dirty(self) -> list[str]:
        """Up to GROUPS_PER_ROUND touched groups that may be fed, first_groups first, then
        the longest touched; the others stay touched (those with writes in flight until their
        writes end)."""
        takeable = self._takeable if self._disk.writes else None
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
        for name in taken:
            del self._dirty[name]
        return taken

    def _written(self, write: Write, outcome: int | BaseException) -> None:
        """A write returned (`outcome`: logs synced, or its error): finish, per group and in
        order, every write that returned and has no earlier one still running; then start
        what was queued behind them."""
        if self._stopping:
            return
        if isinstance(outcome, BaseException):
            log.critical("persisting Raft state failed; stopping the driver", exc_info=outcome)
            self._failure = outcome
            self._signal_round()
            return
        self.stats["fsyncs"] += outcome
        now = time.monotonic()
        observe_disk_hand_offs(self.stage_times, write, now)
        for item in write.rounds:
            if item.ready is not None and item.ready.entries:
                stage = "leader_fsync" if item.ready.role == "leader" else "follower_persist"
                self._stages[stage].observe(now - item.fed_at)
        finished, freed = self._disk.finish(write)
        idle = [r for name, queue in freed.items() if name in self.groups for r in queue]
        self._finish(finished)
        for name in write.groups:
            if finished and name in self._disk.writes and (group := self.groups.get(name)):
                # The rounds behind those finished may apply now (_apply_early passes over
                # fresh rounds that commit nothing, so no later round is left to try).
                self._apply_written(group, self._disk.pending(name))
        if idle:  # rounds a leader was fed meanwhile: their writes (a group's at once) start now
            self._start(idle)
        self._start_queued(write.groups)

    def _feed(self, group: Group) -> Round:
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
            self._stages["follower_wait"].observe(now - group.inbox_since)
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
        proposals = group.proposals if group.proposals and self._disk.may_start(group.name) else []
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
            propose_wait = self._stages["propose_wait"]
            for proposal in proposals:
                propose_wait.observe(now - proposal.queued_at)
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
        if group.trim_to is not None and group.name not in self._disk.writes:
            index, group.trim_to = group.trim_to, None
            if group.storage.first_index() <= index <= core.applied:
                trim = core.snapshot_meta_at(index)
        ready = core.ready() if core.has_ready() else None
        if ready is not None and ready.entries and ready.role == "leader":
            group.uncommitted.append((ready.entries[-1].last_index, now))
        item = Round(group, ready, accepted, trim, fed_at=now)
        if trim is None and core.role == "follower" and appends_after(ready, last_before):
            item.extends_in = core.term
        return item

    @staticmethod
    def _guard(group: Group, fn: Callable[..., None], *args: Any) -> None:
        """Feed one input; a bad input is logged and dropped, never fatal to the node."""
        try:
            fn(*args)
        except Exception as exc:
            log.warning("Raft group %s rejected an input: %r", group.name, exc)

    def _send_replication(self, rounds: list[Round]) -> None:
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

    def _apply_early(self, rounds: list[Round]) -> None:
        """Apply what fresh rounds committed, if it is written (see _apply_written). A round
        that committed nothing is passed over: its group's earlier rounds were applied as soon
        as they could be (here, once their entries were written, or once the writes before
        them ended), and its own entries could only hold them back."""
        for item in rounds:
            if item.ready is not None and item.ready.committed:
                self._apply_written(item.group, [*self._disk.pending(item.group.name), item])

    def _entries_written(self, write: Write) -> None:
        """Loop: the disk thread wrote these entries and is about to fsync them. Apply what
        they let through, and let the groups' waiting proposals form the next write."""
        write.written = True
        now = time.monotonic()
        for item in write.rounds:
            item.written = True
            if item.ready is not None and item.ready.entries and item.ready.role == "leader":
                self._stages["leader_write"].observe(now - item.fed_at)
        for name in write.groups:
            group = self.groups.get(name)
            if group is None or name not in self._disk.writes:
                continue  # removed, or every write of the group already ended
            self._apply_written(group, self._disk.pending(name))
            if group.proposals and self._disk.may_start(name):
                self._dirty[name] = None
                self._signal_round()
        self._start_queued(write.groups)

    def _apply_written(self, group: Group, rounds: list[Round]) -> None:
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
                self._stages["commit"].observe(now - uncommitted.popleft()[1])

    def _finish(self, rounds: list[Round]) -> None:
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
                        self._dirty[msg.group] = None
                continue
            self.transport.send(peer, wire.encode_raft(messages, self._notices.pop(peer, [])))
            self.stats["messages_sent"] += len(messages)
        for item in rounds:
            self._settle(item)
        if self._notices:
            self._flush_notices()
        if self._dirty and (not self._disk.writes or any(map(self._takeable, self._dirty))):
            self._signal_round()

    def _settle(self, item: Round) -> None:
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
            self._dirty[group.name] = None
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
            self.leader_view.learn(group.name, group.leader, group.term)
        self.leader_view.changed(group.name)
        if group.role == "leader":
            for peer in self.leader_view.won(group.name):
                self._notices[peer].append(["l", group.name, self.node_id, group.term])
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


def _close_all(groups: list[Group]) -> None:
    for group in groups:
        try:
            group.storage.fsync()
            group.storage.close()
        except Exception:
            log.exception("closing the log of %s failed", group.name)
