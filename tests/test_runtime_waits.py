"""What the runtime leaves waiting for a thread: commit saves never, fetch reads only if need be."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from inproc_harness import configs

from raftline.node.rounds import FSYNC_THREADS, Round, Write, persist
from raftline.node.runtime import Runtime
from raftline.raftlog.log import LogConfig
from raftline.raftlog.storage import RaftStorage
from raftline.raftlog.types import HardState, Ready


async def _no_rpc(peer: int, method: str, args: Any) -> None:
    return None


def _commit_round(storage: RaftStorage, commit: int) -> Round:
    saved = storage.hard_state
    ready = Ready(hard_state=HardState(saved.term, saved.vote, commit))
    return Round(SimpleNamespace(storage=storage), ready, [])  # type: ignore[arg-type]


class _ThreadNotingLog:
    """A log whose reads note the thread they ran on."""

    thread: threading.Thread | None = None

    def read(self, offset: int, max_bytes: int, upto: int) -> bytes:
        self.thread = threading.current_thread()
        return b""


async def test_a_fetch_read_runs_on_the_loop_while_the_groups_write_only_fsyncs(
    tmp_path: Path,
) -> None:
    runtime = Runtime(configs(tmp_path, 1)[0], on_rpc=_no_rpc)
    log = _ThreadNotingLog()
    try:
        write = Write([], written=True)  # entries in the file, its fsync still running
        runtime._disk.writes["g"] = [write]
        await runtime.read_log("g", log, 0, 4096, 1)
        assert log.thread is threading.current_thread()
        write.written = False  # still writing: the log's lock may be held for a while
        await runtime.read_log("g", log, 0, 4096, 1)
        assert log.thread is not threading.current_thread()
    finally:
        runtime._reader.shutdown(wait=True)
        runtime._disk.shutdown()


def test_commit_index_saves_of_several_groups_do_not_wait_for_busy_fsync_threads(
    tmp_path: Path,
) -> None:
    runtime = Runtime(configs(tmp_path, 1)[0], on_rpc=_no_rpc)
    storages = [RaftStorage(tmp_path / f"g{i}", LogConfig(fsync="always")) for i in range(2)]
    release = threading.Event()
    for _ in range(FSYNC_THREADS):  # every fsync thread stuck, as behind slow fsyncs
        runtime._disk.fsyncs.submit(release.wait)
    try:
        saving = threading.Thread(
            target=persist, args=([_commit_round(s, 7) for s in storages], runtime._disk.fsyncs)
        )
        saving.start()
        saving.join(timeout=5)
        assert not saving.is_alive(), "the commit saves waited for the fsync pool"
        assert [s.hard_state.commit for s in storages] == [7, 7]
    finally:
        release.set()
        runtime._disk.shutdown()
        runtime._reader.shutdown(wait=True)
        for storage in storages:
            storage.close()
