"""The simulator's checker is not vacuous: cores with known Raft bugs planted (by subclassing)
fail within a bounded number of seeds, with the rule each bug breaks."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from raftline.raftlog import simcluster
from raftline.raftlog.invariants import Checker
from raftline.raftlog.raft import LEADER, RaftNode
from raftline.raftlog.simchaos import run_seed
from raftline.raftlog.types import Entry, HardState, Message, MessageType, ReadState, Ready


class CommitsPreviousTermByCounting(RaftNode):
    """Figure 8 bug: the leader commits whatever a quorum holds, whatever its term."""

    def _maybe_commit(self) -> None:
        matches = sorted(
            self._self_match
            if v == self.node_id
            else (pr.match if (pr := self._progress.get(v)) is not None else -1)
            for v in self.voters
        )
        quorum_match = matches[(len(matches) - 1) // 2]
        if quorum_match > self.commit_index:
            self._commit_to(quorum_match)


class VoteNotSynced(RaftNode):
    """Term and vote are written but not fsynced before the vote reply leaves."""

    def ready(self) -> Ready:
        rd = super().ready()
        rd.must_sync = bool(rd.entries) or rd.snapshot is not None
        return rd


class GrantsVoteBeforeSync(RaftNode):
    """Its own candidacy is synced, but a vote granted to a peer leaves before the fsync."""

    def ready(self) -> Ready:
        rd = super().ready()
        hard = rd.hard_state
        if hard is not None and hard.vote not in (None, self.node_id) and not rd.entries:
            rd.must_sync = False
        return rd


class VoteNotPersisted(RaftNode):
    """The vote never reaches the hard state on disk."""

    def ready(self) -> Ready:
        rd = super().ready()
        if rd.hard_state is not None:
            rd.hard_state = HardState(rd.hard_state.term, None, rd.hard_state.commit)
        return rd


class IgnoresPreviousTerm(RaftNode):
    """An APPEND is accepted when the follower holds the previous offset, whatever its term."""

    def step(self, msg: Message) -> None:
        if msg.type == MessageType.APPEND and msg.term >= self.term:
            held = self.term_at(msg.log_index)
            if held is not None:
                msg = replace(msg, log_term=held)
        super().step(msg)


class VotesForStaleLogs(RaftNode):
    """Votes are granted without the candidate's-log-is-up-to-date check."""

    def step(self, msg: Message) -> None:
        if msg.type in (MessageType.VOTE, MessageType.PRE_VOTE):
            msg = replace(msg, log_index=1 << 40, log_term=1 << 30)
        super().step(msg)


class AcksBeforeSync(RaftNode):
    """Appended entries are acknowledged without waiting for the fsync."""

    def ready(self) -> Ready:
        rd = super().ready()
        hard = rd.hard_state
        if rd.entries and (hard is None or (hard.term, hard.vote) == (self.term, self.vote)):
            rd.must_sync = rd.snapshot is not None
        return rd


class KeepsHandOutAcrossTruncation(RaftNode):
    """Asynchronous storage: entries that replace a suffix still being written are never
    handed out, so the disk keeps the replaced ones."""

    def _append_entries(self, entries: list[Entry]) -> None:
        handed = self._log.handed_out
        super()._append_entries(entries)
        self._log.handed_out = max(handed, self._log.handed_out)


class CountsOwnWriteAtHandOut(RaftNode):
    """Asynchronous storage: the leader counts its entries toward commit as soon as it hands
    them to the disk, not once they are written."""

    def ready(self) -> Ready:
        rd = super().ready()
        if self.role == LEADER and rd.entries:
            self._self_match = rd.entries[-1].last_index
            self._maybe_commit()
        return rd


class ReadsLocalCommit(RaftNode):
    """Read barriers are answered from the local commit index, without asking the leader."""

    def read_index(self, context: bytes) -> None:
        self._read_states.append(ReadState(self.commit_index, context))


class MergesReadsByContext(RaftNode):
    """A leader takes a read whose context it already holds (from any node) for a retry of
    that read, and leaves it unanswered."""

    def _leader_read(self, requester: int, context: bytes) -> None:
        if not any(held == context for _, held in self._reads._tokens):
            super()._leader_read(requester, context)


class NeverCampaigns(RaftNode):
    """Election timeouts never fire (a stuck timer)."""

    def tick(self) -> None:
        if self.role == "leader":
            super().tick()


def first_failure(monkeypatch: pytest.MonkeyPatch, core: type[RaftNode], seeds: int) -> str:
    monkeypatch.setattr(simcluster, "RaftNode", core)
    for seed in range(seeds):
        result = run_seed(seed)
        if result.violation is not None:
            return result.violation
    raise AssertionError(f"{core.__name__} survived {seeds} seeds")


@pytest.mark.parametrize(
    ("core", "seeds", "rule"),
    [
        (CommitsPreviousTermByCounting, 100, "previous-term entry committed by counting"),
        (VoteNotSynced, 5, "self-vote was durable"),
        (GrantsVoteBeforeSync, 20, "vote sent before it was durable"),
        (VoteNotPersisted, 5, "durable"),
        (IgnoresPreviousTerm, 300, "log matching|storage refused a write"),
        (VotesForStaleLogs, 150, "leader completeness"),
        (AcksBeforeSync, 20, "append acknowledged before it was durable"),
        (ReadsLocalCommit, 100, "stale read index"),
        (MergesReadsByContext, 20, "read not answered"),
        (NeverCampaigns, 5, "no progress after healing"),
        (KeepsHandOutAcrossTruncation, 100, "log matching|storage refused a write"),
        (CountsOwnWriteAtHandOut, 1400, "leader completeness"),
    ],
)
def test_the_simulator_finds_a_planted_bug(
    monkeypatch: pytest.MonkeyPatch, core: type[RaftNode], seeds: int, rule: str
) -> None:
    assert re.search(rule, first_failure(monkeypatch, core, seeds))


def test_the_unmodified_core_passes_the_same_seeds() -> None:
    assert all(run_seed(seed).violation is None for seed in range(50))


def test_an_unsynced_vote_is_caught_by_its_consequences_without_the_durability_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the send-time durability checks off, a crash that loses a granted vote still shows
    up as a node voting twice in one term (or two leaders in it)."""
    record_vote = Checker.on_vote_granted

    def record_only(
        checker: Checker, voter: int, term: int, candidate: int, durable: HardState
    ) -> None:
        record_vote(checker, voter, term, candidate, HardState(term, candidate))

    monkeypatch.setattr(Checker, "on_vote_granted", record_only)
    monkeypatch.setattr(Checker, "on_campaign", lambda *args: None)
    violation = first_failure(monkeypatch, VoteNotSynced, 300)
    assert "two votes in one term" in violation or "two leaders in one term" in violation
