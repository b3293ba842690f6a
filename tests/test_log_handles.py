"""Open file handles stay bounded by the node-wide LRU, even with 10,000 partition logs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftline.raftlog import batch
from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Record, build_batch
from raftline.raftlog.segment import FileCache


def open_fds(under: Path) -> int:
    """Descriptors this process holds on files below `under`."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the descriptor listdir itself used
        count += target.startswith(str(under))
    return count


def make_files(tmp_path: Path, n: int) -> list[Path]:
    paths = [tmp_path / f"f{i}" for i in range(n)]
    for path in paths:
        path.write_bytes(b"x")
    return paths


def test_cache_keeps_at_most_limit_descriptors_open(tmp_path: Path) -> None:
    cache = FileCache(limit=3)
    for path in make_files(tmp_path, 10):
        with cache.pin(path) as fd:
            assert os.pread(fd, 1, 0) == b"x"
        assert len(cache) <= 3
        assert open_fds(tmp_path) <= 3


def test_least_recently_used_descriptor_is_the_one_evicted(tmp_path: Path) -> None:
    cache = FileCache(limit=2)
    a, b, c = make_files(tmp_path, 3)
    with cache.pin(a) as fd_a:
        pass
    with cache.pin(b):
        pass
    with cache.pin(a) as again:
        assert again == fd_a  # a hit: a becomes the most recently used
    with cache.pin(c):
        pass
    with cache.pin(a) as still:
        assert still == fd_a  # b was evicted, not a


def test_evicted_descriptor_stays_usable_until_its_user_releases_it(tmp_path: Path) -> None:
    cache = FileCache(limit=1)
    a, b = make_files(tmp_path, 2)
    with cache.pin(a) as fd_a:
        with cache.pin(b):
            pass  # evicts a while it is pinned
        assert os.pread(fd_a, 1, 0) == b"x"
    with pytest.raises(OSError):
        os.fstat(fd_a)  # closed on release


def test_ten_thousand_logs_append_and_read_with_64_handles(tmp_path: Path) -> None:
    cache = FileCache(limit=64)
    config = LogConfig(fsync="never")
    logs = [PartitionLog(tmp_path / f"t-{i}", config, cache) for i in range(10_000)]
    for i, log in enumerate(logs):
        assert log.append(build_batch([Record(value=b"%d" % i)], timestamp=i), term=1) == 0
        if i % 500 == 0:
            assert open_fds(tmp_path) <= 64
    for i, log in enumerate(logs):
        header = batch.parse_header(log.read(0, 1 << 20))
        assert (header.base_offset, header.max_timestamp) == (0, i)
    assert len(cache) == 64
    assert open_fds(tmp_path) <= 64
