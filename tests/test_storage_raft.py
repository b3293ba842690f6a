"""RaftStorage: the LogView over the partition log, entries as batches, hard state, trim points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raftline.raftlog import batch
from raftline.raftlog.log import LogConfig
from raftline.raftlog.raft import RaftNode
from raftline.raftlog.records import Record, build_batch, decode_batch
from raftline.raftlog.state_file import StateFile
from raftline.raftlog.storage import STATE_FILE, RaftStorage, StorageError
from raftline.raftlog.types import Entry, EntryKind, HardState, SnapshotMeta


def data_entry(index: int, term: int, n: int = 1, tag: str = "v") -> Entry:
    payload = build_batch([Record(value=f"{tag}{index}-{i}".encode()) for i in range(n)])
    return Entry(index, term, EntryKind.DATA, payload, n)


def sample_log() -> list[Entry]:
    return [
        Entry(0, 1, EntryKind.NOOP, b"", 1),
        data_entry(1, 1, n=3),
        Entry(4, 1, EntryKind.CONFIG, b'{"voters": [1, 2, 3], "learners": []}', 1),
        data_entry(5, 2, n=2),
    ]


def reopened(storage: RaftStorage) -> RaftStorage:
    storage.close()
    return RaftStorage(storage.directory)


def test_new_storage_is_empty_with_the_never_trimmed_sentinels(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    assert (storage.first_index(), storage.last_index()) == (0, -1)
    assert storage.snapshot_meta() == SnapshotMeta()
    assert storage.term_at(-1) == 0 and storage.term_at(0) is None
    assert storage.hard_state == HardState()


def test_entries_read_back_from_disk_with_kind_index_term_count_and_data(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    written = sample_log()
    storage.append(written)
    storage = reopened(storage)  # empty cache: everything comes from the segment files
    got = storage.entries(0, storage.last_index(), 1 << 20)
    assert [(e.index, e.term, e.kind, e.count) for e in got] == [
        (e.index, e.term, e.kind, e.count) for e in written
    ]
    assert got[0].data == b"" and got[2].data == written[2].data
    for stored, original in ((got[1], written[1]), (got[3], written[3])):
        header = batch.parse_header(stored.data)
        assert (header.base_offset, header.leader_epoch) == (stored.index, stored.term)
        assert stored.data[16:] == original.data[16:]  # only offset and term were stamped
        assert decode_batch(stored.data).records[0].offset == stored.index


def test_term_at_covers_every_offset_of_a_multi_record_entry(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    storage = reopened(storage)
    assert [storage.term_at(i) for i in range(-1, 8)] == [0, 1, 1, 1, 1, 1, 2, 2, None]


def test_an_entry_replaces_every_stored_offset_at_or_after_it(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    storage.append([data_entry(4, 3, tag="new")])
    assert storage.last_index() == 4
    storage = reopened(storage)
    last = storage.entries(4, 4, 1 << 20)
    assert [(e.index, e.term, e.kind) for e in last] == [(4, 3, EntryKind.DATA)]
    assert decode_batch(last[0].data).records[0].value == b"new4-0"


def test_append_that_would_split_a_stored_entry_is_refused(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    with pytest.raises(StorageError, match="splits"):
        storage.append([data_entry(2, 3)])
    assert storage.last_index() == 6


def test_append_leaving_a_gap_or_with_a_wrong_count_is_refused(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    with pytest.raises(StorageError):
        storage.append([data_entry(1, 1)])
    with pytest.raises(StorageError, match="count"):
        storage.append([Entry(0, 1, EntryKind.DATA, data_entry(0, 1, n=2).data, 1)])
    with pytest.raises(StorageError):
        storage.append([data_entry(0, 1), data_entry(2, 1)])
    assert storage.last_index() == -1


def test_entries_stop_at_max_bytes_but_return_at_least_one(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append([data_entry(i, 1) for i in range(10)])
    size = len(data_entry(0, 1).data)
    for fresh in (storage, reopened(storage)):
        assert len(fresh.entries(0, 9, 1)) == 1
        assert len(fresh.entries(0, 9, 3 * size)) == 3
        assert [e.index for e in fresh.entries(2, 4, 1 << 20)] == [2, 3, 4]


def test_entries_include_the_entry_covering_hi(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    storage = reopened(storage)
    assert [e.index for e in storage.entries(0, 2, 1 << 20)] == [0, 1]


def test_entries_must_start_at_an_entry_boundary_inside_the_log(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    storage = reopened(storage)
    with pytest.raises(StorageError, match="boundary"):
        storage.entries(2, 4, 1 << 20)
    with pytest.raises(StorageError):
        storage.entries(0, 7, 1 << 20)


def test_tail_reads_are_served_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = RaftStorage(tmp_path)
    written = sample_log()
    storage.append(written)

    def no_disk(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("tail read hit the disk")

    monkeypatch.setattr(storage.log, "read", no_disk)
    monkeypatch.setattr(storage.log, "header_at", no_disk)
    assert storage.entries(1, 6, 1 << 20) == written[1:]
    assert storage.term_at(6) == 2


def test_term_and_vote_are_durable_as_soon_as_saved(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.save(HardState(term=4, vote=2, commit=-1))
    # No close: a crash right after save must still find the vote.
    assert RaftStorage(tmp_path).hard_state == HardState(4, 2, -1)
    assert not list(tmp_path.glob("*.tmp"))
    assert json.loads(StateFile(tmp_path / STATE_FILE).load() or b"")["vote"] == 2


def test_commit_only_changes_are_written_on_close(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    storage.save(HardState(term=1, vote=1, commit=-1))
    storage.save(HardState(term=1, vote=1, commit=5))
    assert reopened(storage).hard_state == HardState(1, 1, 5)


def test_commit_beyond_a_lost_log_tail_is_clamped_on_open(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    storage.save(HardState(term=1, vote=1, commit=6))
    storage.close()
    storage = RaftStorage(tmp_path)
    storage.append([data_entry(5, 2)])  # simulate a lost suffix: offsets 6.. are gone
    storage.close()
    assert RaftStorage(tmp_path).hard_state.commit == 5


def test_trim_moves_the_first_index_and_keeps_the_term_at_the_trim_point(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    meta = storage.trim(3, (1, 2, 3), ())
    assert meta == SnapshotMeta(3, 1, (1, 2, 3), ())
    for view in (storage, reopened(storage)):
        assert view.first_index() == 4 and view.last_index() == 6
        assert view.term_at(3) == 1 and view.term_at(2) is None
        assert [e.index for e in view.entries(4, 6, 1 << 20)] == [4, 5]


def test_trim_inside_an_entry_is_refused(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    with pytest.raises(StorageError, match="does not end an entry"):
        storage.trim(2, (1,), ())


def test_install_matching_the_log_keeps_the_suffix(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    storage.install(SnapshotMeta(4, 1, (1, 2, 3), ()))
    assert (storage.first_index(), storage.last_index()) == (5, 6)
    assert [e.index for e in storage.entries(5, 6, 1 << 20)] == [5]


def test_install_conflicting_with_the_log_discards_it(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    storage.install(SnapshotMeta(4, 9, (1,), ()))
    assert (storage.first_index(), storage.last_index()) == (5, 4)
    assert storage.term_at(4) == 9
    storage.append([data_entry(5, 9)])
    assert reopened(storage).term_at(5) == 9


def test_install_beyond_the_log_end_restarts_the_log_after_it(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    storage.install(SnapshotMeta(100, 7, (1,), ()))
    storage = reopened(storage)
    assert (storage.first_index(), storage.last_index(), storage.term_at(100)) == (101, 100, 7)


def test_a_trim_interrupted_after_the_state_write_is_finished_on_open(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.append(sample_log())
    storage.save(HardState(1, 1, -1))
    storage.close()
    state_file = StateFile(tmp_path / STATE_FILE)
    state = json.loads(state_file.load() or b"")
    state["snapshot"] = {"index": 4, "term": 1, "voters": [1], "learners": []}
    state_file.save(json.dumps(state).encode())  # the log was not trimmed yet
    storage = RaftStorage(tmp_path)
    assert storage.log.log_start_offset == 5
    assert (storage.first_index(), storage.last_index()) == (5, 6)


def test_retention_point_is_the_last_offset_of_expired_segments(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=400, retention_ms=1000, fsync="never")
    storage = RaftStorage(tmp_path, config)
    storage.append([data_entry(i, 1) for i in range(20)])
    point = storage.retention_point(now_ms=10**14)  # far after the batches were built
    assert point == storage.log.segment_bases[-1] - 1
    storage.trim(point, (1,), ())
    assert storage.first_index() == point + 1


def drive(node: RaftNode, storage: RaftStorage) -> list[Entry]:
    """The driver loop of raft_api.md for one node; returns committed entries."""
    committed: list[Entry] = []
    while node.has_ready():
        rd = node.ready()
        storage.append(rd.entries)
        if rd.hard_state:
            storage.save(rd.hard_state)
        if rd.snapshot:
            storage.install(rd.snapshot)
        if rd.must_sync:
            storage.fsync()
        committed.extend(rd.committed)
        node.advance(rd)
    return committed


def test_a_single_node_raft_group_runs_on_the_segment_log_across_restarts(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    node = RaftNode(1, storage, storage.hard_state, voters=[1])
    node.campaign()
    drive(node, storage)
    payloads = [build_batch([Record(value=b"a")] * 2), build_batch([Record(value=b"b")])]
    offsets = [node.propose(p, count=batch.parse_header(p).offset_count) for p in payloads]
    committed = drive(node, storage)
    assert [e.index for e in committed if e.kind == EntryKind.DATA] == offsets
    storage = reopened(storage)
    node = RaftNode(1, storage, storage.hard_state, voters=[1])
    node.campaign()
    drive(node, storage)
    assert node.role == "leader" and node.term == 2
    stored = storage.entries(storage.first_index(), storage.last_index(), 1 << 20)
    assert [(e.kind, e.term) for e in stored] == [
        (EntryKind.NOOP, 1),
        (EntryKind.DATA, 1),
        (EntryKind.DATA, 1),
        (EntryKind.NOOP, 2),
    ]
