"""The Raft state file: two checksummed slots overwritten in place, one data sync per save."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from raftline.raftlog.state_file import SLOT_BYTES, StateFile, StateFileError
from raftline.raftlog.storage import STATE_FILE, RaftStorage
from raftline.raftlog.types import HardState


def test_the_newest_save_is_what_a_reopened_file_loads(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "s")
    for term in range(1, 6):
        state.save(b'{"term": %d}' % term)
    assert StateFile(tmp_path / "s").load() == b'{"term": 5}'


def test_saves_after_the_first_overwrite_the_file_in_place(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "s")
    state.save(b"one")
    inode = (tmp_path / "s").stat().st_ino
    for i in range(4):
        state.save(b"again %d" % i)
    assert (tmp_path / "s").stat().st_ino == inode  # no temp file renamed over it
    assert (tmp_path / "s").stat().st_size == 2 * SLOT_BYTES


def test_a_save_syncs_the_data_once_and_creates_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = StateFile(tmp_path / "s")
    state.save(b"first")
    syncs: list[str] = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fsync", lambda fd: syncs.append("fsync"))
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append("fdatasync"), real_fdatasync(fd)))
    state.save(b"second")
    assert syncs == ["fdatasync"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_a_torn_newest_slot_leaves_the_previous_state(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "s")
    state.save(b"older")
    state.save(b"newer")  # sequence 2: slot 0
    with open(tmp_path / "s", "r+b") as file:
        file.seek(20)
        file.write(b"\xff" * 8)  # the crash tore the write of slot 0
    assert StateFile(tmp_path / "s").load() == b"older"


def test_a_file_with_no_intact_slot_is_refused(tmp_path: Path) -> None:
    (tmp_path / "s").write_bytes(b"\x00" * 2 * SLOT_BYTES)
    with pytest.raises(StateFileError):
        StateFile(tmp_path / "s").load()


def test_a_state_too_large_for_a_slot_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StateFileError):
        StateFile(tmp_path / "s").save(b"x" * SLOT_BYTES)


def test_a_json_state_file_of_earlier_versions_is_read_and_then_replaced(tmp_path: Path) -> None:
    legacy = {
        "term": 7,
        "vote": 3,
        "commit": -1,
        "snapshot": {"index": -1, "term": 0, "voters": [], "learners": []},
    }
    (tmp_path / STATE_FILE).write_text(json.dumps(legacy))
    storage = RaftStorage(tmp_path)
    assert storage.hard_state == HardState(7, 3, -1)
    storage.save(HardState(8, None, -1))
    storage.close()
    assert RaftStorage(tmp_path).hard_state == HardState(8, None, -1)
    assert (tmp_path / STATE_FILE).read_bytes()[:1] != b"{"
