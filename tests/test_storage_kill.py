"""RaftStorage under SIGKILL: once a round's fsync() returns, its entries are in the file.

A killed process loses its memory but not the page cache, whatever the fsync policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftline.raftlog.log import LogConfig
from raftline.raftlog.records import Record, build_batch
from raftline.raftlog.storage import RaftStorage
from raftline.raftlog.types import Entry, EntryKind


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
def test_entries_of_a_finished_round_survive_a_killed_process(tmp_path: Path, policy: str) -> None:
    # An interval no round reaches: only the round's own fsync() can put the entries out.
    config = LogConfig(fsync=policy, flush_interval_ms=3_600_000, flush_interval_bytes=1 << 30)
    storage = RaftStorage(tmp_path, config)
    storage.append([Entry(0, 1, EntryKind.DATA, build_batch([Record(value=b"acked")]), 1)])
    storage.fsync()  # the runtime's end of round: the follower now reports the entry persisted
    # No close(): what a second process opening the directory sees is what a SIGKILL leaves.
    survivor = RaftStorage(tmp_path, LogConfig(fsync=policy))
    assert survivor.last_index() == 0
