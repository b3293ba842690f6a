"""Page cache upkeep: a log drops its written pages from the page cache once they are on disk
and further than cache_tail_bytes behind its end, and keeps the tail cached for readers."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest

from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Record, build_batch
from raftline.raftlog.segment import DROP_STEP_BYTES

MIB = 1 << 20
PAGE = mmap.PAGESIZE
BATCH = build_batch([Record(value=os.urandom(1000)) for _ in range(256)], timestamp=0)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


# The kernel may keep a few pages it holds in per-CPU batches when asked to drop a range.
FEW = 64


def resident(path: Path) -> list[bool]:
    """Whether each page of the file is in the page cache (mincore of a shared mapping)."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            pages = (size + PAGE - 1) // PAGE
            vector = ctypes.create_string_buffer(pages)
            if _libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return [bool(byte & 1) for byte in vector.raw[:pages]]
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)


@pytest.fixture
def droppable(tmp_path: Path) -> Path:
    """tmp_path, if its file system drops clean pages on request (tmpfs does not)."""
    probe = tmp_path / "probe"
    probe.write_bytes(os.urandom(16 * PAGE))
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if any(resident(probe)):
        pytest.skip("this file system keeps pages cached whatever the advice")
    probe.unlink()
    return tmp_path


def fill(directory: Path, config: LogConfig, size: int) -> Path:
    """Append BATCH with config's policy until the log holds `size` bytes; its segment file."""
    log = PartitionLog(directory, config)
    while log.size_bytes < size:
        log.append(BATCH, 1)
    log.sync()
    path = next(directory.glob("*.log"))
    log.close()
    return path


def test_synced_pages_beyond_the_tail_leave_the_page_cache(droppable: Path) -> None:
    path = fill(droppable, LogConfig(fsync="always", cache_tail_bytes=MIB), 3 * DROP_STEP_BYTES)
    pages = resident(path)
    assert sum(pages[: DROP_STEP_BYTES // PAGE]) < FEW


def test_the_tail_stays_in_the_page_cache(droppable: Path) -> None:
    path = fill(droppable, LogConfig(fsync="always", cache_tail_bytes=MIB), 3 * DROP_STEP_BYTES)
    pages = resident(path)
    assert all(pages[-(MIB // PAGE) :])


def test_a_negative_tail_keeps_every_page_cached(droppable: Path) -> None:
    path = fill(droppable, LogConfig(fsync="always", cache_tail_bytes=-1), 2 * DROP_STEP_BYTES)
    assert all(resident(path))


def test_without_fsync_pages_written_back_leave_the_page_cache(droppable: Path) -> None:
    log = PartitionLog(droppable, LogConfig(fsync="never", cache_tail_bytes=MIB))
    while log.size_bytes < 4 * MIB:
        log.append(BATCH, 1)
    log.flush()
    os.sync()  # the first 4 MiB are on disk: clean pages the next drop may take
    while log.size_bytes < DROP_STEP_BYTES + 2 * MIB:
        log.append(BATCH, 1)
    path = next(droppable.glob("*.log"))
    assert sum(resident(path)[: 4 * MIB // PAGE]) < FEW
    log.close()


def test_without_fsync_pages_beyond_the_tail_leave_the_page_cache_though_not_yet_on_disk(
    droppable: Path,
) -> None:
    # Nothing waits for the disk here: the drop must wait for the writeback it asked for, or
    # the pages still being written are passed over, and never asked for again.
    log = PartitionLog(droppable, LogConfig(fsync="never", cache_tail_bytes=MIB))
    while log.size_bytes < 2 * DROP_STEP_BYTES + 2 * MIB:
        log.append(BATCH, 1)
    path = next(droppable.glob("*.log"))
    assert sum(resident(path)[: 2 * DROP_STEP_BYTES // PAGE]) < FEW
    log.close()


def test_a_sealed_segment_leaves_the_page_cache_once_the_tail_is_past_it(
    droppable: Path,
) -> None:
    config = LogConfig(fsync="always", cache_tail_bytes=MIB, segment_bytes=2 * DROP_STEP_BYTES)
    log = PartitionLog(droppable, config)
    while log.size_bytes < 2 * DROP_STEP_BYTES + 2 * MIB:
        log.append(BATCH, 1)
    first = sorted(droppable.glob("*.log"))[0]
    assert sum(resident(first)) < FEW
    log.close()
