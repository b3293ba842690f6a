"""The aborted-transaction index per segment (`.txnindex`): format, upkeep and rebuild."""

from __future__ import annotations

import struct
from pathlib import Path

from raftline.node.eos.markers import build_marker
from raftline.node.producers import PartitionProducers
from raftline.raftlog.batch import iter_headers, parse_header
from raftline.raftlog.cleaner import Cleaner, CleanerConfig
from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Record, build_batch, iter_batches
from raftline.raftlog.txnindex import AbortedTxn, decode
from raftline.raftlog.types import Entry, EntryKind

PID = 7


def txn_batch(seq: int, key: bytes = b"k", pid: int = PID) -> bytes:
    return build_batch(
        [Record(value=b"v%d" % seq, key=key, timestamp=1000)],
        transactional=True,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
    )


def marker(commit: bool, epoch: int = 1, pid: int = PID) -> bytes:
    return build_marker(
        commit, producer_id=pid, producer_epoch=epoch, coordinator_epoch=1, timestamp=1000
    )


class Replica:
    """A log with the node's producer state applied from it, as a partition replica has."""

    def __init__(self, directory: Path, segment_bytes: int = 400) -> None:
        self.directory = directory
        self.log = PartitionLog(directory, LogConfig(segment_bytes=segment_bytes))
        self.producers = PartitionProducers(directory, log=self.log)
        self.producers.load(self.log.log_start_offset, self.log.next_offset - 1)
        self.replay(self.log.log_start_offset)

    def replay(self, start: int) -> None:
        offset = start
        while offset < self.log.next_offset:
            data, offset = self.log.read_from(offset, 1 << 20)
            for position, header in iter_headers(data):
                self._apply(header.base_offset, data[position : position + header.size])

    def write(self, batch: bytes) -> int:
        base = self.log.append(batch, term=1)
        self._apply(base, batch)
        return base

    def _apply(self, base: int, raw: bytes) -> None:
        header = parse_header(raw)
        kind = EntryKind.CONTROL if header.is_control else EntryKind.DATA
        self.producers.apply(Entry(base, 1, kind, bytes(raw), header.offset_count))

    def abort(self) -> int:
        return self.write(marker(False))

    def close(self) -> None:
        self.producers.write_snapshot(self.producers.snapshot_bytes())
        self.log.close()


def test_an_abort_is_indexed_in_kafkas_layout_beside_the_segment_of_its_marker(
    tmp_path: Path,
) -> None:
    replica = Replica(tmp_path)
    first = replica.write(txn_batch(0))
    for seq in range(1, 6):
        replica.write(txn_batch(seq))
    last = replica.abort()
    bases = replica.log.segment_bases
    assert len(bases) > 1, "the transaction spans segments"
    marker_segment = max(b for b in bases if b <= last)
    raw = (tmp_path / f"{marker_segment:020d}.txnindex").read_bytes()
    assert len(raw) == 34
    assert struct.unpack(">hqqqq", raw) == (0, PID, first, last, last + 1)
    assert replica.log.aborted_txns(first, last + 1) == [AbortedTxn(PID, first, last, last + 1)]
    sealed = [b for b in bases[:-1] if b != marker_segment]
    assert all((tmp_path / f"{b:020d}.txnindex").read_bytes() == b"" for b in sealed)


def test_a_fetch_range_gets_the_aborts_with_data_in_it_only(tmp_path: Path) -> None:
    replica = Replica(tmp_path, segment_bytes=1 << 20)
    a = replica.write(txn_batch(0))
    a_end = replica.abort()
    b = replica.write(build_batch([Record(value=b"plain", timestamp=1000)]))
    c = replica.write(txn_batch(0, pid=9))
    c_end = replica.write(marker(False, pid=9))
    assert [t.producer_id for t in replica.log.aborted_txns(0, c_end + 1)] == [PID, 9]
    assert replica.log.aborted_txns(a_end + 1, c) == []  # b alone: nothing aborted there
    assert [t.first_offset for t in replica.log.aborted_txns(b, c_end + 1)] == [c]
    assert replica.log.aborted_txns(a, a + 1)[0].last_offset == a_end


def test_truncation_forgets_the_aborts_whose_markers_it_removes(tmp_path: Path) -> None:
    replica = Replica(tmp_path, segment_bytes=1 << 20)
    replica.write(txn_batch(0))
    end = replica.abort()
    replica.log.truncate_suffix(end)
    assert replica.log.aborted_txns(0, end + 1) == []
    assert (tmp_path / f"{0:020d}.txnindex").read_bytes() == b""


def test_retention_deletes_the_index_with_its_segment(tmp_path: Path) -> None:
    replica = Replica(tmp_path)
    replica.write(txn_batch(0))
    end = replica.abort()
    while len(replica.log.segment_bases) < 3:
        replica.write(build_batch([Record(value=b"x" * 50, timestamp=1000)]))
    marker_segment = max(b for b in replica.log.segment_bases if b <= end)
    replica.log.drop_prefix(replica.log.segment_bases[-1])
    assert not (tmp_path / f"{marker_segment:020d}.txnindex").exists()


def test_a_reopened_log_keeps_its_index_and_a_replay_adds_nothing_twice(tmp_path: Path) -> None:
    replica = Replica(tmp_path)
    first = replica.write(txn_batch(0))
    end = replica.abort()
    replica.log.close()  # no producer snapshot: the reopened replica replays everything
    again = Replica(tmp_path)
    assert again.log.aborted_txns(0, end + 1) == [AbortedTxn(PID, first, end, end + 1)]


def test_a_torn_entry_is_cut_on_open(tmp_path: Path) -> None:
    replica = Replica(tmp_path, segment_bytes=1 << 20)
    replica.write(txn_batch(0))
    end = replica.abort()
    replica.close()
    path = tmp_path / f"{0:020d}.txnindex"
    path.write_bytes(path.read_bytes() + b"\x00" * 10)
    again = Replica(tmp_path, segment_bytes=1 << 20)
    assert len(again.log.aborted_txns(0, end + 1)) == 1
    assert len(path.read_bytes()) == 34


def test_a_missing_index_of_a_sealed_segment_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    replica = Replica(tmp_path)
    first = replica.write(txn_batch(0))
    for seq in range(1, 6):
        replica.write(txn_batch(seq))
    end = replica.abort()
    while replica.log.segment_bases[-1] <= end:
        replica.write(build_batch([Record(value=b"x" * 50, timestamp=1000)]))
    replica.close()  # a producer snapshot past the abort: no replay would see the marker
    for path in tmp_path.glob("*.txnindex"):
        path.unlink()
    again = Replica(tmp_path)
    assert again.log.txn_index_gap is None
    assert again.log.aborted_txns(0, end + 1) == [AbortedTxn(PID, first, end, end + 1)]
    sealed = again.log.segment_bases[:-1]
    assert all((tmp_path / f"{b:020d}.txnindex").exists() for b in sealed)


def test_aborts_below_a_producer_snapshot_are_durable_before_it(tmp_path: Path) -> None:
    replica = Replica(tmp_path, segment_bytes=1 << 20)
    replica.write(txn_batch(0))
    replica.abort()
    assert replica.log._segments[-1].txns.dirty
    replica.producers.write_snapshot(replica.producers.snapshot_bytes())
    assert not replica.log._segments[-1].txns.dirty


def test_the_cleaner_empties_aborted_batches_and_keeps_the_index(tmp_path: Path) -> None:
    replica = Replica(tmp_path, segment_bytes=1 << 20)
    replica.write(build_batch([Record(value=b"plain", key=b"k", timestamp=1000)]))
    aborted = replica.write(txn_batch(0))
    end = replica.abort()
    replica.write(txn_batch(0, pid=9))  # a transaction still open: kept whole
    replica.log._roll()
    stats = Cleaner(replica.log, CleanerConfig(min_cleanable_dirty_ratio=0.0)).clean(
        replica.log.next_offset, 2000
    )
    assert stats.records_removed == 1
    data, _ = replica.log.read_from(0, 1 << 20)
    batches = {b.header.base_offset: b for b in iter_batches(data)}
    assert batches[aborted].records == [] and batches[aborted].header.producer_id == PID
    assert [r.value for r in batches[0].records] == [b"plain"]
    assert len(batches[end + 1].records) == 1
    assert replica.log.aborted_txns(0, end + 1)[0].first_offset == aborted
    replica.close()
    assert PartitionLog(tmp_path).aborted_txns(0, end + 1)[0].last_offset == end


def test_the_file_decodes_to_its_entries() -> None:
    entry = AbortedTxn(3, 10, 20, 21)
    assert decode(struct.pack(">hqqqq", 0, *entry)) == [entry]
