"""Which segments of one partition are in the bucket: the replicated manifest state machine.

Owns the applied state of tiered storage for one partition (the segments uploaded, the remote
log start, which manifest revision is durable in the bucket, the objects left to delete) and
the commands that change it, applied from the partition's own Raft log (control batches of
type TIERED, see `raftlog.records`). Pure: no I/O, no clock; the node drives it.

Invariants (checked by `check()`, exercised by tests/test_tiered_manifest_model.py):
- `segments` are ordered and contiguous: each base offset is the previous last offset + 1, and
  after the first upload every upload starts at `next_offset` (retention may empty `segments`).
- Once an offset is covered by an object, it stays covered by that object until retention
  removes it: an `add` for a range already held is a no-op when it names the same object and
  refused otherwise, so no leader ever records a different object for a range already there.
- `durable_revision <= revision` and `durable_next <= next_offset`: local disk may drop
  offsets below `durable_next` only (a manifest naming them is in the bucket).
- An object becomes garbage only when retention removes its segment, and leaves `garbage`
  (`collected`) only once a manifest without it is durable (`revision <= durable_revision`).
- `applied_index` never decreases; commands at or below it are ignored (replays after restart).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

FORMAT_VERSION = 1
SNAPSHOT_VERSION = 1


@dataclass(frozen=True, slots=True)
class SegmentMeta:
    """One uploaded segment object, as the bucket manifest lists it (tiered/FORMAT.md §3)."""

    base_offset: int
    last_offset: int
    committed_offset: int
    terms: tuple[tuple[int, int], ...]  # (term, first offset) for each term starting in it
    size_bytes: int
    batch_count: int
    base_timestamp: int
    max_timestamp: int
    object: str
    index: str
    time_index: str
    txn_index: str | None
    aborted_transactions: int

    @property
    def keys(self) -> list[str]:
        """Every object of this segment."""
        keys = [self.object, self.index, self.time_index]
        return [*keys, self.txn_index] if self.txn_index else keys

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["terms"] = [list(t) for t in self.terms]
        out["base_term"] = self.terms[0][0] if self.terms else -1
        out["last_term"] = self.terms[-1][0] if self.terms else -1
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SegmentMeta:
        fields = {k: data[k] for k in cls.__dataclass_fields__}
        fields["terms"] = tuple((int(t), int(o)) for t, o in data["terms"])
        return cls(**fields)


@dataclass(frozen=True, slots=True)
class Effect:
    """What applying one command did. `accepted` False: the state did not change (`reason`)."""

    accepted: bool
    reason: str = ""


_OK = Effect(True)


@dataclass(slots=True)
class ManifestState:
    segments: list[SegmentMeta] = field(default_factory=list)
    start_offset: int = 0  # the first offset a reader may get (remote retention moves it)
    revision: int = 0  # bumped by every change of the manifest's content
    durable_revision: int = 0  # a manifest of this revision is in the bucket
    durable_next: int = 0  # ... and it holds every offset below this
    garbage: list[tuple[int, str]] = field(default_factory=list)  # (revision removed, key)
    applied_index: int = -1  # the Raft index of the last command applied

    # ---- reads -------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The first offset not in the bucket (where the next upload starts)."""
        return self.segments[-1].last_offset + 1 if self.segments else self.start_offset

    @property
    def uploaded_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    def segment_index(self, offset: int) -> int | None:
        """Position in `segments` of the one holding `offset` (offset >= start_offset)."""
        if offset < self.start_offset:
            return None
        lo, hi = 0, len(self.segments)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.segments[mid].last_offset < offset:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.segments) and self.segments[lo].base_offset <= offset:
            return lo
        return None

    def segment_for(self, offset: int) -> SegmentMeta | None:
        """The segment holding `offset`, if the bucket has it (offset >= start_offset)."""
        at = self.segment_index(offset)
        return None if at is None else self.segments[at]

    def collectable(self) -> list[str]:
        """Garbage objects no durable manifest names any more: safe to delete."""
        return [key for revision, key in self.garbage if revision <= self.durable_revision]

    # ---- the state machine -------------------------------------------------------------

    def apply(self, index: int, command: dict[str, Any]) -> Effect:
        """Apply the command committed at Raft index `index`."""
        if index <= self.applied_index:
            return Effect(False, "replayed")
        self.applied_index = index
        op = command.get("op")
        if op == "add":
            return self._add(SegmentMeta.from_json(command["segment"]))
        if op == "durable":
            return self._durable(int(command["revision"]), int(command["next_offset"]))
        if op == "truncate":
            return self._truncate(int(command["start_offset"]))
        if op == "collected":
            return self._collected(list(command["keys"]))
        return Effect(False, f"unknown op {op!r}")

    def _add(self, segment: SegmentMeta) -> Effect:
        if segment.last_offset < segment.base_offset:
            return Effect(False, "empty range")
        held = self.segment_for(segment.base_offset)
        if held is not None:
            if held == segment:
                return Effect(False, "already recorded")
            return Effect(False, f"range already held by {held.object}")
        if not self.segments and segment.base_offset < self.start_offset:
            return Effect(False, "below the remote log start")
        # Only a partition's first upload may start anywhere (the local log may start past 0
        # when it begins); after it, even once retention removed every segment, uploads
        # continue at next_offset: a later start means this state missed commands.
        if self.revision and segment.base_offset != self.next_offset:
            return Effect(False, f"gap: next upload starts at {self.next_offset}")
        if not self.segments:
            self.start_offset = segment.base_offset
        self.segments.append(segment)
        self.revision += 1
        return _OK

    def _durable(self, revision: int, next_offset: int) -> Effect:
        if revision > self.revision:
            return Effect(False, f"revision {revision} not reached")
        if revision <= self.durable_revision:
            return Effect(False, "older than the durable revision")
        self.durable_revision = revision
        self.durable_next = max(self.durable_next, min(next_offset, self.next_offset))
        return _OK

    def _truncate(self, start_offset: int) -> Effect:
        if start_offset <= self.start_offset:
            return Effect(False, "not past the remote log start")
        if start_offset > self.next_offset:
            return Effect(False, "past what the bucket holds")
        self.revision += 1
        kept = []
        for segment in self.segments:
            if segment.last_offset < start_offset:
                self.garbage.extend((self.revision, key) for key in segment.keys)
            else:
                kept.append(segment)
        self.segments = kept
        self.start_offset = start_offset
        return _OK

    def _collected(self, keys: list[str]) -> Effect:
        collectable = set(self.collectable())
        if not set(keys) <= collectable:
            return Effect(False, "not collectable yet")
        gone = set(keys)
        self.garbage = [(r, k) for r, k in self.garbage if k not in gone]
        return _OK

    # ---- snapshots and the bucket document ----------------------------------------------

    def copy(self) -> ManifestState:
        """An independent copy (segments are immutable and shared)."""
        return replace(self, segments=list(self.segments), garbage=list(self.garbage))

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": SNAPSHOT_VERSION,
            "segments": [s.to_json() for s in self.segments],
            "start_offset": self.start_offset,
            "revision": self.revision,
            "durable_revision": self.durable_revision,
            "durable_next": self.durable_next,
            "garbage": [list(g) for g in self.garbage],
            "applied_index": self.applied_index,
        }

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> ManifestState:
        if snapshot.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unknown tiered manifest snapshot version {snapshot.get('version')}")
        return cls(
            segments=[SegmentMeta.from_json(s) for s in snapshot["segments"]],
            start_offset=snapshot["start_offset"],
            revision=snapshot["revision"],
            durable_revision=snapshot["durable_revision"],
            durable_next=snapshot["durable_next"],
            garbage=[(int(r), str(k)) for r, k in snapshot["garbage"]],
            applied_index=snapshot["applied_index"],
        )

    def document(self, topic: str, topic_id: int, partition: int) -> dict[str, Any]:
        """The bucket's manifest.json for this state (tiered/FORMAT.md §3)."""
        return {
            "format_version": FORMAT_VERSION,
            "topic": topic,
            "topic_id": topic_id,
            "partition": partition,
            "revision": self.revision,
            "start_offset": self.start_offset,
            "next_offset": self.next_offset,
            "segments": [s.to_json() for s in self.segments],
        }

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> ManifestState:
        """The state a bucket manifest describes (a replica that missed the commands reads it)."""
        if document.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unknown manifest format {document.get('format_version')}")
        revision = int(document["revision"])
        segments = [SegmentMeta.from_json(s) for s in document["segments"]]
        state = cls(segments, int(document["start_offset"]), revision, revision)
        state.durable_next = state.next_offset
        return state

    def check(self) -> None:
        """Assert the invariants of the module header (cheap: for tests and debugging)."""
        for before, after in zip(self.segments, self.segments[1:], strict=False):
            assert after.base_offset == before.last_offset + 1, (before, after)
        for segment in self.segments:
            assert segment.base_offset <= segment.last_offset
        if self.segments:
            assert self.segments[-1].last_offset >= self.start_offset
        assert self.durable_revision <= self.revision
        assert self.durable_next <= self.next_offset
        named = {key for s in self.segments for key in s.keys}
        assert not named & {key for _, key in self.garbage}


def encode_command(command: dict[str, Any]) -> bytes:
    return json.dumps(command, separators=(",", ":"), sort_keys=True).encode()


def decode_command(value: bytes) -> dict[str, Any]:
    command = json.loads(value)
    if not isinstance(command, dict):
        raise ValueError("a tiered command is a JSON object")
    return command
