"""A log tells its owner each time it seals a segment (`on_roll`): the cue for retention."""

from __future__ import annotations

from pathlib import Path

from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Record, build_batch
from raftline.raftlog.segment import FileCache


def test_on_roll_is_called_once_per_sealed_segment(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=1024, fsync="never"), FileCache())
    calls: list[int] = []
    log.on_roll = lambda: calls.append(len(log.segment_bases))
    for i in range(20):
        log.append(build_batch([Record(b"%02d" % i + b"v" * 200)]), term=1)
    assert len(log.sealed_segments()) >= 3
    # Called once the new active segment is in place, once per roll.
    assert calls == list(range(2, len(log.segment_bases) + 1))
