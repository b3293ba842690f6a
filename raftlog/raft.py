"""The sans-I/O Raft core: one RaftNode per group, fed ticks, peer messages and proposals.

Owns elections (pre-vote, check-quorum), replication and commit, membership, leadership transfer,
snapshot catch-up and read barriers. All output goes through ready()/advance(); no I/O, clocks
or global randomness in here.

Membership changes follow the Raft thesis (section 4.1): one voter added or removed at a time,
in force as soon as its CONFIG entry is in a log; a new leader must commit an entry of its own
term first, and only one change may be uncommitted. A removed leader keeps replicating without
counting itself until the change commits, then steps down and sends TIMEOUT_NOW to an up-to-date
voter. A voter whose removal is appended but not yet committed may still campaign.

Durability: every message in a Ready may depend on that Ready's entries and hard state (and
those of earlier Readys), which the driver persists first; the leader counts its own entries
toward commit only after advance(). The driver may take further Readys before advancing earlier
ones (asynchronous storage writes) as long as it persists and advances them in order: each
entry, snapshot and hard state is handed out once.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from .membership import ConfigHistory, Membership
from .progress import Progress, ProgressState
from .raft_log import RaftLog
from .read_index import ReadIndexQueue
from .types import (
    Entry,
    EntryKind,
    HardState,
    LogView,
    Message,
    MessageType,
    ReadState,
    Ready,
    SnapshotMeta,
)

FOLLOWER = "follower"
PRE_CANDIDATE = "pre_candidate"
CANDIDATE = "candidate"
LEADER = "leader"
LEARNER = "learner"

# VOTE context of a leadership-transfer campaign: voters grant it even inside a leader lease.
TRANSFER_CONTEXT = b"transfer"

_FROM_LEADER = (MessageType.APPEND, MessageType.HEARTBEAT, MessageType.SNAPSHOT)


@dataclass(slots=True)
class RaftConfig:
    election_ticks: int = 10  # randomized in [election_ticks, 2*election_ticks)
    heartbeat_ticks: int = 1
    max_append_bytes: int = 1 << 20  # flow control per APPEND message
    max_inflight: int = 64  # pipelined APPENDs per follower
    # ... and their entry bytes: a lagging follower's backlog stays well below the transport's
    # drop limit (node/transport.py MAX_WRITE_BUFFER), past which APPENDs are dropped, the
    # follower rejects the next one and everything after its match is sent again. 64 APPENDs
    # of 1 MB batches exceeded it.
    max_inflight_bytes: int = 16 << 20
    pre_vote: bool = True
    check_quorum: bool = True
    max_committed_bytes: int = 16 << 20  # committed entry data per Ready (bounds restart replay)

    def __post_init__(self) -> None:
        if self.heartbeat_ticks < 1 or self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("need 1 <= heartbeat_ticks < election_ticks")
        limits = (
            self.max_inflight,
            self.max_inflight_bytes,
            self.max_append_bytes,
            self.max_committed_bytes,
        )
        if min(limits) < 1:
            raise ValueError(
                "max_inflight, max_inflight_bytes, max_append_bytes and max_committed_bytes "
                "must be >= 1"
            )


class NotLeaderError(Exception):
    """Raised by leader-only operations on another replica; `leader` is the known leader."""

    def __init__(self, leader: int | None, reason: str = "not the leader") -> None:
        super().__init__(f"{reason} (leader: {leader})")
        self.leader = leader


class ConfigChangeError(Exception):
    """A membership change the leader cannot start now (one pending, too large, too early)."""


def _check_contiguous(prev: int, entries: list[Entry]) -> None:
    expected = prev + 1
    for entry in entries:
        if entry.index != expected or entry.count < 1:
            raise ValueError(
                f"APPEND entries not contiguous after offset {prev}: entry at {entry.index} "
                f"(count {entry.count}) where {expected} was expected"
            )
        expected += entry.count


class RaftNode:
    """One replica of one Raft group: feed it tick/step/propose, drain it with ready/advance."""

    def __init__(
        self,
        node_id: int,
        log: LogView,
        hard_state: HardState,
        voters: Iterable[int],
        learners: Iterable[int] = (),
        config: RaftConfig | None = None,
        rng: random.Random | None = None,
        applied: int = -1,
    ) -> None:
        self.node_id = node_id
        self.config = config or RaftConfig()
        self._rng = rng if rng is not None else random.Random(node_id)
        self._log = RaftLog(log)
        self.term = hard_state.term
        self.vote = hard_state.vote
        snap = log.snapshot_meta()
        self._configs = self._load_configs(snap, Membership.of(voters, learners))
        self.applied = max(applied, snap.index)
        self._handed_out = self.applied  # last committed offset given to the driver to apply
        self._readys_handed = self._readys_advanced = 0
        self.commit_index = max(hard_state.commit, self.applied)
        if self.commit_index > self._log.last_index():
            raise ValueError(
                f"commit/applied offset {self.commit_index} is beyond the log end "
                f"{self._log.last_index()}: storage lost committed entries"
            )
        # The hard state last handed out (or loaded): persisted, or being persisted.
        self._handed_hs = HardState(hard_state.term, hard_state.vote, hard_state.commit)
        self.role = LEARNER if node_id in self.learners else FOLLOWER
        self.leader_id: int | None = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = 0
        self._votes: dict[int, bool] = {}
        self._pre_vote_round = 0  # tells this pre-election's answers from delayed older ones
        self._progress: dict[int, Progress] = {}
        self._self_match = -1  # leader: last offset durable on its own disk
        self._transferee: int | None = None
        self._pending_conf_index = -1
        self._needs_flush = False
        self._msgs: list[Message] = []
        self._read_states: list[ReadState] = []
        self._reads = ReadIndexQueue()
        self._reset_timers()

    # -- volatile facts ------------------------------------------------------------------
    @property
    def voters(self) -> frozenset[int]:
        return self._configs.current.voters

    @property
    def learners(self) -> frozenset[int]:
        return self._configs.current.learners

    @property
    def last_index(self) -> int:
        return self._log.last_index()

    def term_at(self, index: int) -> int | None:
        """Term of the entry covering an offset in this replica's log (unstable tail included)."""
        return self._log.term_at(index)

    def entries(self, lo: int, hi: int) -> list[Entry]:
        """Entries covering offsets lo..hi of this replica's log (lo at an entry boundary)."""
        found: list[Entry] = []
        while lo <= hi:
            found.extend(self._log.slice(lo, hi, 1 << 20))
            lo = found[-1].last_index + 1
        return found

    def progress(self, peer: int) -> Progress | None:
        """Leader only: the replication progress of a follower (for tests and metrics)."""
        return self._progress.get(peer)

    def snapshot_meta_at(self, index: int) -> SnapshotMeta:
        """The SnapshotMeta the runtime should record when it trims the log through `index`."""
        if index > self.applied:
            raise ValueError(f"cannot snapshot at {index}: only {self.applied} is applied")
        term = self._log.term_at(index)
        if term is None:
            raise ValueError(f"offset {index} is not in the log")
        member = self._configs.at(index)
        return SnapshotMeta(
            index, term, tuple(sorted(member.voters)), tuple(sorted(member.learners))
        )

    # -- inputs --------------------------------------------------------------------------
    def tick(self) -> None:
        if self.role == LEADER:
            self._tick_leader()
            return
        self._election_elapsed += 1
        if self._promotable() and self._election_elapsed >= self._randomized_timeout:
            self._start_election(transfer=False)

    def campaign(self, pre_vote: bool = True) -> None:
        """Stand for election. `pre_vote=False` skips the pre-vote round (if configured) for
        a group no replica has led yet: nobody's leader is there to be disrupted, and the
        round only delays the first leader by a round trip and four messages."""
        if self.role == LEADER:
            return
        if not self._promotable():
            raise ValueError(f"node {self.node_id} is not a voter of this group")
        if pre_vote:
            self._start_election(transfer=False)
        else:
            self._become_candidate(transfer=False)

    def propose(self, data: bytes, count: int = 1, kind: EntryKind = EntryKind.DATA) -> int:
        self._require_leader()
        if count < 1:
            raise ValueError(f"an entry takes at least one offset, got count={count}")
        if not isinstance(data, bytes):
            raise TypeError(f"entry data must be bytes, got {type(data).__name__}")
        if kind == EntryKind.CONFIG:
            raise ValueError("membership changes go through propose_membership")
        return self._append_as_leader(kind, data, count).index

    def propose_membership(self, voters: Iterable[int], learners: Iterable[int] = ()) -> int:
        self._require_leader()
        member = Membership.of(voters, learners)
        if self._pending_conf_index > self.commit_index:
            raise ConfigChangeError("a membership change is still uncommitted")
        if self._log.term_at(self.commit_index) != self.term:
            raise ConfigChangeError("the leader has not committed an entry of its term yet")
        if member.voter_changes(self._configs.current) > 1:
            raise ConfigChangeError("change one voter at a time")
        entry = self._append_as_leader(EntryKind.CONFIG, member.encode(), 1)
        self._pending_conf_index = entry.index
        return entry.index

    def transfer_leadership(self, to: int) -> None:
        if self.role != LEADER:
            raise NotLeaderError(self.leader_id)
        if to == self.node_id or to == self._transferee:
            return
        if to not in self.voters:
            raise ValueError(f"cannot transfer leadership to non-voter {to}")
        self._transferee = to
        self._election_elapsed = 0  # the transfer gets one election timeout to finish
        if self._progress[to].match == self._log.last_index():
            self._send(MessageType.TIMEOUT_NOW, to)
        else:
            self._needs_flush = True

    def read_index(self, context: bytes) -> None:
        """Ask for a read barrier; it comes back as a ReadState once leadership is confirmed.

        `context` identifies the read and must be unique among this node's pending reads of
        the group (other nodes may use the same context).
        """
        if self.role == LEADER:
            if self._reads.pending(self.node_id, context):
                raise ValueError(f"a read with context {context!r} is already pending")
            self._leader_read(self.node_id, context)
        elif self.leader_id is not None:
            self._send(MessageType.READ_INDEX, self.leader_id, context=context)
        else:
            raise NotLeaderError(None, "no known leader to confirm a read")

    def compact(self, index: int) -> None:
        """The runtime trimmed the log through `index` (its LogView now starts after it)."""
        if index > self.applied:
            raise ValueError(f"cannot trim through {index}: only {self.applied} is applied")
        self._configs.compact(index)

    def step(self, msg: Message) -> None:
        if msg.dst != self.node_id:
            raise ValueError(f"message for node {msg.dst} delivered to node {self.node_id}")
        mtype = msg.type
        if msg.term > self.term:
            if (
                mtype in (MessageType.PRE_VOTE, MessageType.VOTE)
                and self._in_lease()
                and msg.context != TRANSFER_CONTEXT
            ):
                return  # a live leader exists: a rejoining node must not depose it
            # A pre-vote (or its grant) is about a future term: it never changes ours.
            if not (
                mtype == MessageType.PRE_VOTE
                or (mtype == MessageType.PRE_VOTE_RESP and not msg.reject)
            ):
                self._become_follower(msg.term, msg.src if mtype in _FROM_LEADER else None)
        elif msg.term < self.term:
            self._answer_stale(msg)
            return
        handler = self._handlers.get(mtype)
        if handler is None:
            raise ValueError(f"unknown message type {mtype!r}")
        handler(self, msg)

    # -- outputs -------------------------------------------------------------------------
    def has_ready(self) -> bool:
        return bool(
            self._msgs
            or self._log.has_unhanded()
            or (self._log.pending_snapshot is not None and not self._log.snapshot_handed_out)
            or self._read_states
            or self.commit_index > self._handed_out
            or (self._needs_flush and self.role == LEADER)
            or self._hard_state_changed()
        )

    def ready(self) -> Ready:
        if self._needs_flush:
            self._needs_flush = False
            if self.role == LEADER:
                self._flush()
        hard_state = None
        handed = self._handed_hs
        if self._hard_state_changed():
            hard_state = self._handed_hs = HardState(self.term, self.vote, self.commit_index)
        entries = self._log.hand_out()
        snapshot = self._log.hand_out_snapshot()
        rd = Ready(
            hard_state=hard_state,
            entries=entries,
            snapshot=snapshot,
            messages=self._msgs,
            committed=self._committed_entries(),
            read_states=self._read_states,
            # The commit index alone may be lost in a crash (it is re-learned); term, vote and
            # entries may not.
            must_sync=bool(entries)
            or snapshot is not None
            or (self.term, self.vote) != (handed.term, handed.vote),
            leader=self.leader_id,
            role=self.role,
            number=self._readys_handed,
        )
        self._readys_handed += 1
        self._msgs = []
        self._read_states = []
        return rd

    def advance(self, ready: Ready) -> None:
        if ready.number != self._readys_advanced:
            raise ValueError(
                f"Ready #{ready.number} advanced out of order: #{self._readys_advanced} is next"
            )
        self._readys_advanced += 1
        last = ready.entries[-1] if ready.entries else None
        self._log.persisted(last, ready.snapshot)
        if ready.committed:
            self.applied = max(self.applied, ready.committed[-1].last_index)
        if self.role == LEADER and last is not None:
            persisted = self._log.persisted_last_index()
            if persisted > self._self_match:
                self._self_match = persisted
                self._maybe_commit()

    # -- elections -----------------------------------------------------------------------
    def _promotable(self) -> bool:
        # A voter whose removal is appended but not committed must still be able to campaign:
        # its longer log may be the only one that can win, and it must commit its own removal.
        node_id = self.node_id
        return node_id in self.voters or node_id in self._configs.at(self.commit_index).voters

    def _in_lease(self) -> bool:
        return (
            self.config.check_quorum
            and self.leader_id is not None
            and self._election_elapsed < self.config.election_ticks
        )

    def _reset_timers(self) -> None:
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        ticks = self.config.election_ticks
        self._randomized_timeout = ticks + self._rng.randrange(ticks)

    def _reset_role_state(self) -> None:
        self._reset_timers()
        self._votes = {}
        self._progress = {}
        self._transferee = None
        self._needs_flush = False
        self._reads.clear()

    def _become_follower(self, term: int, leader: int | None) -> None:
        if term != self.term:
            self.term = term
            self.vote = None  # only a new term frees the vote
        self.role = LEARNER if self.node_id in self.learners else FOLLOWER
        self.leader_id = leader
        self._reset_role_state()

    def _start_election(self, transfer: bool) -> None:
        if self.config.pre_vote and not transfer:
            self._become_pre_candidate()
        else:
            self._become_candidate(transfer)

    def _become_pre_candidate(self) -> None:
        self.role = PRE_CANDIDATE
        self.leader_id = None  # forget the leader, or our own lease check blocks peers
        self._reset_role_state()
        self._votes[self.node_id] = True
        self._pre_vote_round += 1
        if self._count_votes()[0]:
            self._become_candidate(transfer=False)
            return
        self._request_votes(MessageType.PRE_VOTE, self.term + 1, self._pre_vote_context())

    def _become_candidate(self, transfer: bool) -> None:
        self.term += 1
        self.vote = self.node_id
        self.role = CANDIDATE
        self.leader_id = None
        self._reset_role_state()
        self._votes[self.node_id] = True
        if self._count_votes()[0]:
            self._become_leader()
            return
        self._request_votes(MessageType.VOTE, self.term, TRANSFER_CONTEXT if transfer else b"")

    def _request_votes(self, mtype: MessageType, term: int, context: bytes) -> None:
        last = self._log.last_index()
        last_term = self._log.last_term()
        for voter in sorted(self.voters):
            if voter != self.node_id:
                self._msgs.append(
                    Message(
                        mtype,
                        self.node_id,
                        voter,
                        term,
                        log_index=last,
                        log_term=last_term,
                        context=context,
                    )
                )

    def _pre_vote_context(self) -> bytes:
        return b"pre-vote %d" % self._pre_vote_round

    def _count_votes(self) -> tuple[bool, bool]:
        """(won, lost) among the current voters."""
        voters = self.voters
        granted = sum(1 for v, ok in self._votes.items() if ok and v in voters)
        refused = sum(1 for v, ok in self._votes.items() if not ok and v in voters)
        quorum = len(voters) // 2 + 1
        return granted >= quorum, len(voters) - refused < quorum

    def _on_vote_request(self, msg: Message) -> None:
        pre = msg.type == MessageType.PRE_VOTE
        can_vote = (
            self.vote == msg.src
            or (self.vote is None and self.leader_id is None)
            or (pre and msg.term > self.term)
        )
        last_term = self._log.last_term()
        up_to_date = msg.log_term > last_term or (
            msg.log_term == last_term and msg.log_index >= self._log.last_index()
        )
        resp = MessageType.PRE_VOTE_RESP if pre else MessageType.VOTE_RESP
        if can_vote and up_to_date:
            if not pre:
                self.vote = msg.src
                self._election_elapsed = 0
            # A granted pre-vote answers in the term it asked about.
            self._msgs.append(Message(resp, self.node_id, msg.src, msg.term, context=msg.context))
        else:
            self._msgs.append(
                Message(resp, self.node_id, msg.src, self.term, reject=True, context=msg.context)
            )

    def _on_vote_response(self, msg: Message) -> None:
        if msg.type == MessageType.PRE_VOTE_RESP:
            # Grants carry the term asked about; anything else answers another pre-election.
            expected = self.term if msg.reject else self.term + 1
            if (
                self.role != PRE_CANDIDATE
                or msg.term != expected
                or msg.context != self._pre_vote_context()
            ):
                return
        elif self.role != CANDIDATE:
            return
        self._votes.setdefault(msg.src, not msg.reject)
        won, lost = self._count_votes()
        if won:
            if self.role == PRE_CANDIDATE:
                self._become_candidate(transfer=False)
            else:
                self._become_leader()
        elif lost:
            self._become_follower(self.term, None)

    def _become_leader(self) -> None:
        self.role = LEADER
        self.leader_id = self.node_id
        self._reset_role_state()
        next_index = self._log.last_index() + 1
        members = self.voters | self.learners
        self._progress = {
            peer: Progress(next_index, self.config.max_inflight, self.config.max_inflight_bytes)
            for peer in sorted(members)
            if peer != self.node_id
        }
        self._self_match = self._log.persisted_last_index()
        # Conservative: no membership change until everything before our term is committed.
        self._pending_conf_index = self._log.last_index()
        self._append_as_leader(EntryKind.NOOP, b"", 1)

    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self.config.election_ticks:
            self._election_elapsed = 0
            if self.config.check_quorum and not self._quorum_recently_active():
                self._become_follower(self.term, None)
                return
            self._transferee = None  # a transfer gets one election timeout
        if self._heartbeat_elapsed >= self.config.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            self._expire_snapshots()
            self._broadcast_heartbeat(self._reads.newest_token())

    def _quorum_recently_active(self) -> bool:
        active = {self.node_id}
        for peer, pr in self._progress.items():
            if pr.recent_active:
                active.add(peer)
            pr.recent_active = False
        return self._is_quorum(active)

    def _is_quorum(self, nodes: set[int]) -> bool:
        voters = self.voters
        return sum(1 for v in voters if v in nodes) >= len(voters) // 2 + 1

    def _answer_stale(self, msg: Message) -> None:
        """A message from an older term: tell stale leaders and pre-candidates our term."""
        cfg = self.config
        if msg.type in (MessageType.APPEND, MessageType.HEARTBEAT) and (
            cfg.check_quorum or cfg.pre_vote
        ):
            # Without this a leader that keeps its quorum never learns that a node it cannot
            # reach moved on (its check-quorum keeps passing). A HEARTBEAT_RESP acknowledges no
            # offset, so it is harmless if the sender leads our term by the time it arrives.
            self._send(MessageType.HEARTBEAT_RESP, msg.src)
        elif msg.type == MessageType.PRE_VOTE:
            self._msgs.append(
                Message(MessageType.PRE_VOTE_RESP, self.node_id, msg.src, self.term, reject=True)
            )

    # -- replication: leader side --------------------------------------------------------
    def _require_leader(self) -> None:
        if self.role != LEADER:
            raise NotLeaderError(self.leader_id)
        if self._transferee is not None:
            raise NotLeaderError(self._transferee, "leadership transfer in progress")

    def _append_as_leader(self, kind: EntryKind, data: bytes, count: int) -> Entry:
        entry = Entry(self._log.last_index() + 1, self.term, kind, data, count)
        self._log.append_new(entry)
        if kind == EntryKind.CONFIG:
            self._configs.append(entry.index, Membership.decode(data))
            self._on_membership_change()
        self._needs_flush = True
        return entry

    def _flush(self) -> None:
        last = self._log.last_index()
        for peer, pr in self._progress.items():
            if pr.next <= last:  # else nothing to send (every acknowledgement flushes)
                self._send_appends(peer, pr, last, allow_empty=False)

    def _send_appends(self, peer: int, pr: Progress, last: int, allow_empty: bool) -> None:
        """Send what the follower's flow control allows: one probe, or a pipeline of batches."""
        log = self._log
        while not pr.paused():
            if pr.next > last and not allow_empty:
                return
            if pr.next < log.first_index():
                self._send_snapshot(peer, pr)
                return
            entries = (
                log.slice(pr.next, last, self.config.max_append_bytes) if pr.next <= last else []
            )
            prev = entries[0].index - 1 if entries else pr.next - 1
            prev_term = log.term_at(prev)
            if prev_term is None:
                self._send_snapshot(peer, pr)
                return
            self._msgs.append(
                Message(
                    MessageType.APPEND,
                    self.node_id,
                    peer,
                    self.term,
                    log_index=prev,
                    log_term=prev_term,
                    entries=entries,
                    commit=self.commit_index,
                )
            )
            if not entries:
                pr.probe_sent = pr.state is ProgressState.PROBE
                return
            pr.sent(entries[-1].last_index, sum(len(e.data) for e in entries))
            if pr.state is not ProgressState.REPLICATE:
                return
            allow_empty = False

    def _send_snapshot(self, peer: int, pr: Progress) -> None:
        meta = self._log.stable.snapshot_meta()
        if not meta.voters:
            member = self._configs.at(meta.index)
            meta = SnapshotMeta(
                meta.index, meta.term, tuple(sorted(member.voters)), tuple(sorted(member.learners))
            )
        self._msgs.append(
            Message(MessageType.SNAPSHOT, self.node_id, peer, self.term, snapshot=meta)
        )
        pr.become_snapshot(meta.index)

    def _expire_snapshots(self) -> None:
        """A snapshot lost in transit would stall a follower forever: retry after a while."""
        limit = 2 * self.config.election_ticks
        for pr in self._progress.values():
            if pr.state is ProgressState.SNAPSHOT:
                pr.snapshot_ticks += self.config.heartbeat_ticks
                if pr.snapshot_ticks >= limit:
                    pr.become_probe()
                    self._needs_flush = True

    def _broadcast_heartbeat(self, context: bytes) -> None:
        commit = self.commit_index
        for peer, pr in self._progress.items():
            self._msgs.append(
                Message(
                    MessageType.HEARTBEAT,
                    self.node_id,
                    peer,
                    self.term,
                    commit=min(pr.match, commit),
                    context=context,
                )
            )

    def _on_append_response(self, msg: Message) -> None:
        pr = self._progress.get(msg.src)
        if pr is None or self.role != LEADER:
            return
        pr.recent_active = True
        if msg.reject:
            next_probe = msg.reject_hint
            if msg.hint_term > 0:
                next_probe = self._log.probe_point(msg.reject_hint, msg.hint_term)
            if pr.rejected(msg.log_index, next_probe):
                self._needs_flush = True
            return
        grew = pr.acknowledged(msg.log_index)
        if pr.state is ProgressState.PROBE or (
            pr.state is ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot
        ):
            pr.become_replicate()
        self._needs_flush = True
        if grew:
            self._maybe_commit()
            if self.role != LEADER:
                return  # the commit removed us from the group
        if msg.src == self._transferee and pr.match == self._log.last_index():
            self._send(MessageType.TIMEOUT_NOW, msg.src)

    def _on_heartbeat_response(self, msg: Message) -> None:
        pr = self._progress.get(msg.src)
        if pr is None or self.role != LEADER:
            return
        pr.recent_active = True
        pr.probe_sent = False
        if pr.state is ProgressState.REPLICATE and pr.paused():
            pr.free_one()  # APPENDs may have been lost: let one more through
        last = self._log.last_index()
        if pr.match < last:
            # Also recovers lost APPENDs in replicate state: the follower rejects, we probe.
            self._send_appends(msg.src, pr, last, allow_empty=True)
        if msg.context:
            self._on_read_ack(msg.src, msg.context)

    def _on_snapshot_response(self, msg: Message) -> None:
        """The runtime reports how shipping a snapshot to a follower went."""
        pr = self._progress.get(msg.src)
        if pr is None or self.role != LEADER or pr.state is not ProgressState.SNAPSHOT:
            return
        pr.recent_active = True
        if not msg.reject:
            pr.acknowledged(msg.log_index)
        pr.become_probe()
        self._needs_flush = True

    def _maybe_commit(self) -> None:
        # A list, not a generator: this runs on every acknowledgement (and a generator costs
        # a call per voter).
        matches = [
            self._self_match
            if v == self.node_id
            else (pr.match if (pr := self._progress.get(v)) is not None else -1)
            for v in self.voters
        ]
        matches.sort()
        quorum_match = matches[(len(matches) - 1) // 2]
        # Figure 8: only an entry of the current term commits by counting replicas.
        if quorum_match > self.commit_index and self._log.term_at(quorum_match) == self.term:
            self._commit_to(quorum_match)

    def _commit_to(self, index: int) -> None:
        if index <= self.commit_index:
            return
        self.commit_index = index
        if self.role != LEADER:
            return
        if self._reads.has_parked() and self._log.term_at(index) == self.term:
            for requester, context in self._reads.unpark():
                self._leader_read(requester, context)
        if self.node_id not in self.voters and index >= self._configs.current_index:
            self._hand_over()
            self._become_follower(self.term, None)  # our removal is committed

    def _hand_over(self) -> None:
        """A removed leader lets an up-to-date voter campaign at once instead of leaving the
        group leaderless for an election timeout (followers' leases would delay others)."""
        last = self._log.last_index()
        ready = [
            v for v in sorted(self.voters) if (pr := self._progress.get(v)) and pr.match == last
        ]
        if ready:
            self._send(MessageType.TIMEOUT_NOW, ready[0])

    # -- replication: follower side ------------------------------------------------------
    def _accept_leader(self, msg: Message) -> bool:
        """Same-term message from the leader: follow it. False if we are the leader ourselves."""
        if self.role == LEADER:
            return False  # impossible in a correct cluster (one leader per term)
        if self.role in (PRE_CANDIDATE, CANDIDATE):
            self._become_follower(self.term, msg.src)
        self.leader_id = msg.src
        self._election_elapsed = 0
        return True

    def _on_append(self, msg: Message) -> None:
        if not self._accept_leader(msg):
            return
        if self._log.pending_snapshot is not None:
            return  # never hand out entries and a snapshot in one Ready; the leader retries
        log = self._log
        if msg.log_index < self.commit_index:
            self._send(MessageType.APPEND_RESP, msg.src, log_index=self.commit_index)
            return
        if log.term_at(msg.log_index) != msg.log_term:
            hint, hint_term = log.find_conflict_by_term(
                min(msg.log_index, log.last_index()), msg.log_term
            )
            self._send(
                MessageType.APPEND_RESP,
                msg.src,
                log_index=msg.log_index,
                reject=True,
                reject_hint=hint,
                hint_term=hint_term,
            )
            return
        entries = msg.entries
        _check_contiguous(msg.log_index, entries)
        for pos, entry in enumerate(entries):
            if log.term_at(entry.index) != entry.term:  # first new or conflicting entry
                self._append_entries(entries[pos:] if pos else entries)
                break
        last_new = entries[-1].last_index if entries else msg.log_index
        # Only what THIS append proved matching may commit; a stale tail beyond it may not.
        self._commit_to(min(msg.commit, last_new))
        self._send(MessageType.APPEND_RESP, msg.src, log_index=last_new)

    def _on_heartbeat(self, msg: Message) -> None:
        if not self._accept_leader(msg):
            return
        self._commit_to(min(msg.commit, self._log.last_index()))
        self._send(MessageType.HEARTBEAT_RESP, msg.src, context=msg.context)

    def _on_snapshot(self, msg: Message) -> None:
        if not self._accept_leader(msg):
            return
        snap = msg.snapshot
        if snap is None:
            raise ValueError("SNAPSHOT message without SnapshotMeta")
        if snap.index <= self.commit_index:
            self._send(MessageType.APPEND_RESP, msg.src, log_index=self.commit_index)
            return
        if self._log.term_at(snap.index) == snap.term:
            self._commit_to(snap.index)  # we hold the entries already: just fast-forward
        else:
            self._log.restore(snap)
            self.commit_index = self.applied = self._handed_out = snap.index
            member = Membership.of(snap.voters, snap.learners) if snap.voters else None
            self._configs.reset(snap.index, member or self._configs.current)
            self._on_membership_change()
        self._send(MessageType.APPEND_RESP, msg.src, log_index=snap.index)

    def _append_entries(self, entries: list[Entry]) -> None:
        """Append to the log (truncating a conflicting suffix) and apply CONFIG entries."""
        first = entries[0].index
        changed = False
        if first <= self._log.last_index():
            if first <= self.commit_index:
                raise RuntimeError(
                    f"refusing to truncate at {first}: offsets <= {self.commit_index} are committed"
                )
            changed = self._configs.truncate_from(first)
        self._log.append(entries)
        for entry in entries:
            if entry.kind == EntryKind.CONFIG:
                self._configs.append(entry.index, Membership.decode(entry.data))
                changed = True
        if changed:
            self._on_membership_change()

    def _on_membership_change(self) -> None:
        if self.role != LEADER:
            if self.role in (FOLLOWER, LEARNER):
                self.role = LEARNER if self.node_id in self.learners else FOLLOWER
            return
        members = self.voters | self.learners
        for peer in list(self._progress):
            if peer not in members:
                del self._progress[peer]
        next_index = self._log.last_index() + 1
        for peer in sorted(members):
            if peer != self.node_id and peer not in self._progress:
                self._progress[peer] = Progress(
                    next_index, self.config.max_inflight, self.config.max_inflight_bytes
                )
        if self._transferee is not None and self._transferee not in self.voters:
            self._transferee = None
        self._needs_flush = True
        self._maybe_commit()

    # -- leadership transfer and reads -----------------------------------------------------
    def _on_timeout_now(self, msg: Message) -> None:
        if self.role != LEADER and self._promotable():
            self._start_election(transfer=True)

    def _leader_read(self, requester: int, context: bytes) -> None:
        if self._log.term_at(self.commit_index) != self.term:
            # A fresh leader's commit index may lag the cluster's: wait for our own entry.
            self._reads.park(requester, context)
            return
        if self._reads.pending(requester, context):
            return  # a retried request: the pending one answers it
        token = self._reads.add(self.commit_index, requester, context)
        self._on_read_ack(self.node_id, token)
        if self._reads.pending(requester, context):
            self._broadcast_heartbeat(token)

    def _on_read_ack(self, peer: int, token: bytes) -> None:
        for done in self._reads.ack(peer, token, self._is_quorum):
            if done.requester == self.node_id:
                self._read_states.append(ReadState(done.index, done.context))
            else:
                self._send(
                    MessageType.READ_INDEX_RESP,
                    done.requester,
                    log_index=done.index,
                    context=done.context,
                )

    def _on_read_index(self, msg: Message) -> None:
        if self.role == LEADER:
            self._leader_read(msg.src, msg.context)

    def _on_read_index_response(self, msg: Message) -> None:
        self._read_states.append(ReadState(msg.log_index, msg.context))

    # -- helpers -----------------------------------------------------------------------------
    def _send(
        self,
        mtype: MessageType,
        to: int,
        *,
        log_index: int = 0,
        reject: bool = False,
        reject_hint: int = 0,
        hint_term: int = 0,
        context: bytes = b"",
    ) -> None:
        self._msgs.append(
            Message(
                mtype,
                self.node_id,
                to,
                self.term,
                log_index=log_index,
                reject=reject,
                reject_hint=reject_hint,
                hint_term=hint_term,
                context=context,
            )
        )

    def _hard_state_changed(self) -> bool:
        hs = self._handed_hs
        return hs.term != self.term or hs.vote != self.vote or hs.commit != self.commit_index

    def _committed_entries(self) -> list[Entry]:
        """Entries to apply next; never the same twice, even if ready() repeats before advance()."""
        if self.commit_index <= self._handed_out:
            return []
        committed = self._log.slice(
            self._handed_out + 1, self.commit_index, self.config.max_committed_bytes
        )
        self._handed_out = committed[-1].last_index
        return committed

    def _load_configs(self, snap: SnapshotMeta, bootstrap: Membership) -> ConfigHistory:
        """Membership from the snapshot point (or bootstrap) plus CONFIG entries in the log."""
        base = Membership.of(snap.voters, snap.learners) if snap.voters else bootstrap
        history = ConfigHistory(snap.index, base)
        log = self._log.stable
        lo, last = log.first_index(), log.last_index()
        while lo <= last:
            chunk = log.entries(lo, last, self.config.max_append_bytes)
            for entry in chunk:
                if entry.kind == EntryKind.CONFIG:
                    history.append(entry.index, Membership.decode(entry.data))
            lo = chunk[-1].last_index + 1
        return history

    _handlers = {
        MessageType.PRE_VOTE: _on_vote_request,
        MessageType.VOTE: _on_vote_request,
        MessageType.PRE_VOTE_RESP: _on_vote_response,
        MessageType.VOTE_RESP: _on_vote_response,
        MessageType.APPEND: _on_append,
        MessageType.APPEND_RESP: _on_append_response,
        MessageType.HEARTBEAT: _on_heartbeat,
        MessageType.HEARTBEAT_RESP: _on_heartbeat_response,
        MessageType.SNAPSHOT: _on_snapshot,
        MessageType.SNAPSHOT_RESP: _on_snapshot_response,
        MessageType.TIMEOUT_NOW: _on_timeout_now,
        MessageType.READ_INDEX: _on_read_index,
        MessageType.READ_INDEX_RESP: _on_read_index_response,
    }
