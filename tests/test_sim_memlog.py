"""The simulator's in-memory log: LogView reads, replacement on append, and the disk model
(unsynced writes are lost on crash, synced ones survive, a crash may keep a buffer prefix)."""

import pytest

from raftline.raftlog.memlog import MemLog, StorageError
from raftline.raftlog.types import Entry, HardState, SnapshotMeta


def entries(*spec: tuple[int, int, int]) -> list[Entry]:
    """(index, term, count) triples as entries with distinguishable payloads."""
    return [Entry(i, t, data=b"%d@%d" % (i, t), count=c) for i, t, c in spec]


def test_empty_log_uses_the_minus_one_sentinels() -> None:
    log = MemLog()
    assert (log.first_index(), log.last_index()) == (0, -1)
    assert log.term_at(-1) == 0
    assert log.term_at(0) is None
    assert log.snapshot_meta() == SnapshotMeta()
    assert log.hard_state == HardState()


def test_term_at_covers_every_offset_of_a_multi_offset_entry() -> None:
    log = MemLog()
    log.append(entries((0, 1, 3), (3, 2, 1)))
    assert [log.term_at(i) for i in range(5)] == [1, 1, 1, 2, None]
    assert log.last_index() == 3


def test_append_replaces_every_offset_at_and_after_its_first_entry() -> None:
    log = MemLog()
    log.append(entries((0, 1, 1), (1, 1, 2), (3, 1, 1)))
    removed = log.append(entries((1, 2, 1)))
    assert [(e.index, e.term) for e in removed] == [(1, 1), (3, 1)]
    assert [(e.index, e.term) for e in log.all_entries()] == [(0, 1), (1, 2)]


def test_append_after_a_gap_or_inside_an_entry_is_refused() -> None:
    log = MemLog()
    log.append(entries((0, 1, 3)))
    with pytest.raises(StorageError):
        log.append(entries((5, 1, 1)))
    with pytest.raises(StorageError):
        log.append(entries((1, 2, 1)))
    with pytest.raises(StorageError):
        log.append(entries((3, 1, 1), (5, 1, 1)))


def test_entries_start_at_a_boundary_and_stop_at_max_bytes_but_return_at_least_one() -> None:
    log = MemLog()
    log.append(entries((0, 1, 1), (1, 1, 2), (3, 1, 1), (4, 1, 1)))
    assert [e.index for e in log.entries(1, 4, 1 << 20)] == [1, 3, 4]
    assert [e.index for e in log.entries(1, 3, 1 << 20)] == [1, 3]
    assert [e.index for e in log.entries(1, 4, 1)] == [1]
    assert [e.index for e in log.entries(1, 4, 6)] == [1, 3]
    with pytest.raises(StorageError):
        log.entries(2, 4, 100)


def test_crash_loses_everything_written_since_the_last_fsync() -> None:
    log = MemLog()
    log.append(entries((0, 1, 1)))
    log.save(HardState(term=1, vote=1, commit=0))
    log.fsync()
    log.append(entries((1, 1, 1)))
    log.save(HardState(term=2, vote=3, commit=1))
    log.crash()
    assert log.last_index() == 0
    assert log.hard_state == HardState(term=1, vote=1, commit=0)


def test_crash_can_keep_a_prefix_of_the_unsynced_writes() -> None:
    log = MemLog()
    log.append(entries((0, 1, 1)))
    log.save(HardState(term=1, vote=2))
    log.crash(keep=1)
    assert log.last_index() == 0
    assert log.hard_state == HardState()


def test_a_synced_truncation_survives_a_crash() -> None:
    log = MemLog()
    log.append(entries((0, 1, 1), (1, 1, 1)))
    log.fsync()
    log.append(entries((1, 2, 1)))
    log.fsync()
    log.crash()
    assert [(e.index, e.term) for e in log.all_entries()] == [(0, 1), (1, 2)]


def test_saved_hard_state_is_a_copy_of_the_cores_object() -> None:
    log = MemLog()
    hard = HardState(term=1)
    log.save(hard)
    hard.term = 5
    assert log.hard_state.term == 1


def test_trim_moves_the_snapshot_point_to_the_end_of_an_entry() -> None:
    log = MemLog()
    log.append(entries((0, 1, 2), (2, 1, 1), (3, 2, 1)))
    meta = log.trim(2, (1, 2, 3), ())
    assert meta == SnapshotMeta(2, 1, (1, 2, 3), ())
    assert (log.first_index(), log.last_index()) == (3, 3)
    assert log.term_at(2) == 1
    assert log.term_at(1) is None
    with pytest.raises(StorageError):
        log.append(entries((2, 3, 1)))


def test_trim_inside_an_entry_or_outside_the_log_is_refused() -> None:
    log = MemLog()
    log.append(entries((0, 1, 3)))
    with pytest.raises(StorageError):
        log.trim(1, (1,), ())
    with pytest.raises(StorageError):
        log.trim(7, (1,), ())


def test_install_keeps_the_suffix_when_the_log_agrees_at_the_snapshot_point() -> None:
    log = MemLog()
    log.append(entries((0, 1, 1), (1, 1, 1), (2, 2, 1)))
    removed = log.install(SnapshotMeta(1, 1, (1,), ()))
    assert removed == []
    assert [(e.index, e.term) for e in log.all_entries()] == [(2, 2)]


def test_install_discards_a_log_that_disagrees_at_the_snapshot_point() -> None:
    log = MemLog()
    log.append(entries((0, 1, 1), (1, 1, 1), (2, 1, 1)))
    removed = log.install(SnapshotMeta(1, 3, (1,), ()))
    assert [(e.index, e.term) for e in removed] == [(2, 1)]
    assert log.all_entries() == []
    assert (log.last_index(), log.term_at(1)) == (1, 3)


def test_an_unsynced_install_is_lost_on_crash() -> None:
    log = MemLog()
    log.install(SnapshotMeta(9, 2, (1,), ()))
    log.crash()
    assert log.snapshot_meta() == SnapshotMeta()


def test_the_durable_view_shows_what_a_crash_would_leave() -> None:
    log = MemLog()
    log.append(entries((0, 1, 1)))
    log.save(HardState(term=1, vote=2))
    assert (log.durable_term_at(0), log.durable_hard_state()) == (None, HardState())
    log.fsync()
    assert (log.durable_term_at(0), log.durable_hard_state()) == (1, HardState(term=1, vote=2))
    assert log.unsynced == 0
