"""RaftStorage answers every LogView question like the simulator's MemLog under random sequences."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftline.raftlog.log import LogConfig
from raftline.raftlog.memlog import MemLog
from raftline.raftlog.records import Record, build_batch
from raftline.raftlog.segment import FileCache
from raftline.raftlog.storage import RaftStorage
from raftline.raftlog.types import Entry, EntryKind, SnapshotMeta

CONFIG = LogConfig(segment_bytes=500, index_interval_bytes=100, fsync="never")

entry_shapes = st.lists(
    st.tuples(st.sampled_from(list(EntryKind)[:3]), st.integers(1, 3), st.binary(max_size=20)),
    min_size=1,
    max_size=4,
)


def comparable(entry: Entry) -> tuple[int, int, EntryKind, int, bytes]:
    # Stored DATA batches carry the stamped offset and term in their first 16 bytes.
    data = entry.data[16:] if entry.kind == EntryKind.DATA else entry.data
    return entry.index, entry.term, entry.kind, entry.count, data


class StorageModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="storage-model-"))
        self.files = FileCache(limit=4)
        self.storage = RaftStorage(self.tmp, CONFIG, self.files, cache_bytes=300)
        self.model = MemLog()

    def teardown(self) -> None:
        self.files.close_all()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def boundaries(self) -> list[int]:
        """Offsets where an append may start: entry starts after the trim point, and the end."""
        stored = self.model.all_entries()
        return [e.index for e in stored] + [self.model.last_index() + 1]

    @rule(data=st.data(), shapes=entry_shapes, term=st.integers(1, 4))
    def append(self, data: st.DataObject, shapes: list, term: int) -> None:
        index = data.draw(st.sampled_from(self.boundaries()))
        entries = []
        for kind, n, payload in shapes:
            if kind == EntryKind.DATA:
                body = build_batch([Record(value=payload)] * n, timestamp=0)
                entries.append(Entry(index, term, kind, body, n))
            else:
                entries.append(Entry(index, term, kind, payload, 1))
            index = entries[-1].last_index + 1
        self.model.append(entries)
        self.storage.append(entries)

    @precondition(lambda self: self.model.all_entries())
    @rule(data=st.data())
    def trim(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.model.all_entries()))
        self.model.trim(entry.last_index, (1,), ())
        self.storage.trim(entry.last_index, (1,), ())

    @rule(data=st.data(), term=st.integers(1, 4))
    def install(self, data: st.DataObject, term: int) -> None:
        snap = self.model.snapshot_meta().index
        index = data.draw(st.integers(snap + 1, self.model.last_index() + 3))
        meta = SnapshotMeta(index, term, (1, 2), ())
        self.model.install(meta)
        self.storage.install(meta)

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        if clean:
            self.storage.close()
        self.storage = RaftStorage(self.tmp, CONFIG, self.files, cache_bytes=300)

    @rule(data=st.data(), max_bytes=st.integers(1, 400))
    def entries_within_max_bytes(self, data: st.DataObject, max_bytes: int) -> None:
        stored = self.model.all_entries()
        if not stored:
            return
        lo = data.draw(st.sampled_from(stored)).index
        hi = data.draw(st.integers(lo, self.model.last_index()))
        got = self.storage.entries(lo, hi, max_bytes)
        assert [comparable(e) for e in got] == [
            comparable(e) for e in self.model.entries(lo, hi, max_bytes)
        ]

    @invariant()
    def same_log_view(self) -> None:
        s, m = self.storage, self.model
        assert (s.first_index(), s.last_index()) == (m.first_index(), m.last_index())
        assert s.snapshot_meta() == m.snapshot_meta()
        for index in range(m.snapshot_meta().index - 1, m.last_index() + 2):
            assert s.term_at(index) == m.term_at(index), index
        if m.all_entries():
            got = s.entries(m.first_index(), m.last_index(), 1 << 20)
            assert [comparable(e) for e in got] == [comparable(e) for e in m.all_entries()]


StorageModel.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStorageModel = StorageModel.TestCase
