"""The disk side of a driver round: the records of rounds and writes, and writing them.

Owns the disk and fsync pools, each group's writes in flight (in order) with the rounds queued
behind them, and a write's work on its thread: Readys appended and saved, each log fsynced once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from raftline.node.call_threads import CallThreads
from raftline.node.group import Group, GroupStorage
from raftline.node.stages import StageTimes
from raftline.raftlog.types import HardState, Ready, SnapshotMeta

DISK_THREADS = 8  # writes that may be on disk at once
# A leader's next write may start while its last one fsyncs; a write whose fsync waits for an
# earlier one holds a disk thread, so a group with a stalled fsync holds at most this many.
WRITES_PER_GROUP = 2
FSYNC_THREADS = 8  # fsyncs that may be in flight at once


@dataclass(eq=False)
class Write:
    """One disk write of rounds (of one or more groups) on the disk pool."""

    rounds: list[Round]
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
    # Each group's rounds of it, in order; read several times per write (started, entries
    # written, returned, and the group's pending rounds in every round fed meanwhile).
    groups: dict[str, list[Round]] = field(init=False)

    def __post_init__(self) -> None:
        self.groups = {}
        for item in self.rounds:
            self.groups.setdefault(item.group.name, []).append(item)


@dataclass
class Round:
    group: Group
    ready: Ready | None
    accepted: list[tuple[asyncio.Future[tuple[int, int]], int, int]]
    trim: SnapshotMeta | None = None
    fed_at: float = 0.0  # time.monotonic() when the Ready was taken
    applied_early: bool = False  # committed entries went to the replica before its write ended
    written: bool = False  # its entries are in the log file (maybe not yet fsynced)
    # a follower's round whose write only appends after its log's last entry (no truncation,
    # no snapshot) in `term`: more rounds of the group may be fed beside it
    # (see Runtime._takeable)
    extends_in: int | None = None

    @property
    def touches_disk(self) -> bool:
        """False when the Ready holds only a commit-index change (kept in memory by the
        storage until the next term/vote write): such rounds skip the disk thread."""
        rd = self.ready
        return self.trim is not None or (
            rd is not None and (bool(rd.entries) or rd.snapshot is not None or rd.must_sync)
        )


def persist(
    rounds: list[Round],
    fsyncs: ThreadPoolExecutor,
    write: Write | None = None,
    entries_written: Callable[[], None] | None = None,
) -> int:
    """Disk thread: write every Ready, then fsync each touched log once (each log's fsync
    policy decides whether that fsync reaches the disk); apply requested trims. Calls
    `entries_written` (if given) once the entries are written, before the fsyncs.
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
    run_all(fsyncs, voted)
    if entries_written is not None:
        entries_written()
    if write is not None:
        write.appended = True
    timings = write.fsyncs if write is not None else None
    fsync_all(fsyncs, list(to_sync.values()), timings)
    if write is not None:
        write.returned_at = time.monotonic()
    return len(to_sync)


def appends_after(ready: Ready | None, last_index: int) -> bool:
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


def observe_disk_hand_offs(stage_times: StageTimes, write: Write, now: float) -> None:
    """What a write spent between threads, apart from the fsync calls themselves."""
    stages = stage_times.histograms
    stages["disk_queue"].observe(write.started_at - write.submitted_at)
    stages["disk_return"].observe(now - write.returned_at)
    if not write.fsyncs:
        return
    fsync_call, fsync_start = stages["fsync_call"], stages["fsync_start"]
    for handed, started, returned in write.fsyncs:
        fsync_call.observe(returned - started)
        if started > handed:  # run on a pool thread, not on the disk thread itself
            fsync_start.observe(started - handed)
    if len(write.fsyncs) > 1:
        stages["fsync_join"].observe(write.returned_at - max(t[2] for t in write.fsyncs))


class DiskWrites:
    """The writes on the disk pool, in order per group. `start` hands rounds to a disk thread;
    on the loop, `entries_written(write)` runs once a leader's write has written its entries
    (its fsyncs may still run) and `returned(write, outcome)` once the write returned, with
    the number of logs synced or its error."""

    def __init__(
        self,
        entries_written: Callable[[Write], None],
        returned: Callable[[Write, int | BaseException], None],
    ) -> None:
        # group -> its disk writes not yet finished, oldest first, and the rounds queued
        # behind them (a leader's, fed meanwhile); a group is in both or in neither.
        self.writes: dict[str, list[Write]] = {}
        self.queued: dict[str, list[Round]] = {}
        self._in_flight = 0  # disk writes not yet returned
        self.idle = asyncio.Event()  # set while no round is on disk
        self.idle.set()
        self._entries_written = entries_written
        self._returned = returned
        self.pool = CallThreads(DISK_THREADS, "raftline-disk")
        # Fsyncs of different partition logs run side by side: the filesystem folds concurrent
        # fsyncs into one journal commit (16 logs: ~1.7 ms against ~5.5 ms serial).
        self.fsyncs = ThreadPoolExecutor(
            max_workers=FSYNC_THREADS, thread_name_prefix="raftline-fsync"
        )

    def start(self, rounds: list[Round]) -> None:
        """Start the rounds' disk write on the pool."""
        write = Write(rounds)
        # Only leaders apply entries before their fsync: only they need the written signal.
        leads = any(r.ready is not None and r.ready.role == "leader" for r in rounds)
        loop = asyncio.get_running_loop()
        write.future = loop.create_future()
        self.pool.run(self._persist_and_return, rounds, loop, leads, write)
        for name in write.groups:
            self.writes.setdefault(name, []).append(write)
            self.queued.setdefault(name, [])
        self._in_flight += 1
        self.idle.clear()

    def _persist_and_return(
        self, rounds: list[Round], loop: asyncio.AbstractEventLoop, leads: bool, write: Write
    ) -> None:
        """Disk thread: persist, then hand the outcome to the loop in one hop (through
        run_in_executor's two futures, `returned` ran a loop iteration later: on a busy loop,
        milliseconds on every follower's acknowledgement and leader's fsync)."""
        entries_written = (
            partial(loop.call_soon_threadsafe, self._entries_written, write) if leads else None
        )
        outcome: int | BaseException
        try:
            outcome = persist(rounds, self.fsyncs, write, entries_written)
        except BaseException as error:
            outcome = error
        with contextlib.suppress(RuntimeError):  # the loop is closed: the node is gone
            loop.call_soon_threadsafe(self._return, write, outcome)

    def _return(self, write: Write, outcome: int | BaseException) -> None:
        write.done = True
        self._in_flight -= 1
        if not self._in_flight:
            self.idle.set()
        if write.future is not None and not write.future.done():
            write.future.set_result(None)
        self._returned(write, outcome)

    def finish(self, write: Write) -> tuple[list[Round], dict[str, list[Round]]]:
        """`write` returned: per group of it, the rounds of every write that returned and has
        no earlier one still running, in order; and the queued rounds of the groups left with
        no write, which are no longer tracked here."""
        finished: list[Round] = []
        freed: dict[str, list[Round]] = {}
        for name in write.groups:
            writes = self.writes.get(name)
            while writes and writes[0].done:
                finished.extend(writes.pop(0).groups[name])
            if writes:
                continue
            self.writes.pop(name, None)
            freed[name] = self.queued.pop(name, [])
        return finished, freed

    def pending(self, name: str) -> list[Round]:
        """The group's rounds not finished yet, in order: in writes, then queued."""
        rounds = [r for w in self.writes.get(name, ()) for r in w.groups[name]]
        return rounds + self.queued.get(name, [])

    def unwritten(self, name: str) -> bool:
        """The group has a write whose entries are not yet in its log file (as the loop was
        told, or as the disk thread marked: read just before it marks, the group waits for
        that write to end instead)."""
        return any(not (w.written or w.appended) for w in self.writes.get(name, ()))

    def may_start(self, name: str) -> bool:
        """The group's next write may start now: fewer than WRITES_PER_GROUP of its writes are
        in flight and all have written their entries (their fsyncs may still run; the log
        orders the fsyncs). Its proposals and queued rounds wait until then."""
        return len(self.writes.get(name, ())) < WRITES_PER_GROUP and not self.unwritten(name)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)
        self.fsyncs.shutdown(wait=True)
