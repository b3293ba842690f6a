"""Segment log throughput beside a plain file written and read with the same bytes and fsyncs.

Owns the log benchmark: append (fsync per batch / batched) and read, 1 KB and 1 MB batches.
Run: `python bench/log_bench.py [--runs N] [--seconds S] [--dir DIR]`; prints log/raw per row.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Record, build_batch
from raftline.raftlog.segment import FileCache

KB = 1024
MB = 1024 * KB
BATCHED_FSYNC_BYTES = 1 * MB  # "batched": one fsync per this many bytes appended
# Passes over the written file per read run: one pass of 40 to 60 MB from the page cache takes
# only a few milliseconds, too short to time steadily.
READ_PASSES = 5


@dataclass(frozen=True)
class Case:
    name: str
    batch_bytes: int  # approximate size of one batch
    records_per_batch: int
    fsync_every: int  # bytes between fsyncs; 0: every batch
    count: int  # batches per run (upper bound; runs also stop at the time budget)
    per_call: int = 1  # batches per log append call (a Raft Ready carries several)


CASES = [
    Case("append 1 KB, fsync each", KB, 1, 0, 3000),
    Case("append 1 KB, fsync per 1 MB", KB, 1, BATCHED_FSYNC_BYTES, 40_000),
    Case("append 1 KB x64 per call, fsync per 1 MB", KB, 1, BATCHED_FSYNC_BYTES, 40_000, 64),
    Case("append 1 MB, fsync each", MB, 1000, 0, 60),
    Case("append 1 MB, fsync per 16 MB", MB, 1000, 16 * MB, 160),
]


def make_batches(case: Case) -> list[bytes]:
    value = os.urandom(max(case.batch_bytes // case.records_per_batch - 20, 1))
    one = build_batch([Record(value=value)] * case.records_per_batch, timestamp=0)
    return [one] * case.count


@dataclass
class Result:
    seconds: float
    nbytes: int
    batches: int

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / MB / self.seconds

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds


def raw_append(path: Path, batches: list[bytes], fsync_every: int, budget: float) -> Result:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    unsynced = n = total = 0
    start = time.perf_counter()
    deadline = start + budget
    for data in batches:
        os.write(fd, data)
        total += len(data)
        unsynced += len(data)
        n += 1
        if unsynced >= fsync_every:
            os.fdatasync(fd)
            unsynced = 0
            if time.perf_counter() > deadline:
                break
    os.fdatasync(fd)
    elapsed = time.perf_counter() - start
    os.close(fd)
    return Result(elapsed, total, n)


def log_config(fsync_every: int) -> LogConfig:
    if fsync_every == 0:
        return LogConfig(fsync="always")
    return LogConfig(fsync="interval", flush_interval_bytes=fsync_every, flush_interval_ms=10**9)


def log_append(path: Path, batches: list[bytes], case: Case, budget: float) -> Result:
    """The raw loop's shape: the log's own fsync policy syncs every `fsync_every` bytes
    and the deadline is checked after each sync. Calls are prepared before the clock starts,
    as the raw side's batch list is: one batch per `append`, or a list of (batch, term)
    pairs per `append_many`."""
    files = FileCache()
    log = PartitionLog(path, log_config(case.fsync_every), files)
    one_per_call, fsync_every = case.per_call == 1, case.fsync_every
    calls: list[bytes] | list[list[tuple[bytes, int]]] = batches
    if not one_per_call:
        calls = [
            [(data, 1) for data in batches[i : i + case.per_call]]
            for i in range(0, len(batches), case.per_call)
        ]
    call_bytes = len(batches[0]) * case.per_call  # every batch is the same
    unsynced = n = total = 0
    start = time.perf_counter()
    deadline = start + budget
    for call in calls:
        if one_per_call:
            log.append(call, 1)
        else:
            log.append_many(call)
        total += call_bytes
        unsynced += call_bytes
        n += 1
        if unsynced >= fsync_every:
            unsynced = 0
            if time.perf_counter() > deadline:
                break
    log.sync()
    elapsed = time.perf_counter() - start
    log.close()
    files.close_all()
    return Result(elapsed, total, n * case.per_call)


def raw_read(path: Path, chunk: int) -> Result:
    fd = os.open(path, os.O_RDONLY)
    total = n = 0
    start = time.perf_counter()
    for _ in range(READ_PASSES):
        position = 0
        while data := os.pread(fd, chunk, position):
            position += len(data)
            n += 1
        total += position
    elapsed = time.perf_counter() - start
    os.close(fd)
    return Result(elapsed, total, n)


def log_read(path: Path, chunk: int) -> Result:
    files = FileCache()
    log = PartitionLog(path, LogConfig(fsync="never"), files)
    total = n = 0
    start = time.perf_counter()
    for _ in range(READ_PASSES):
        offset, end = log.log_start_offset, log.next_offset
        while offset < end:
            data, offset = log.read_from(offset, chunk)
            total += len(data)
            n += 1
    elapsed = time.perf_counter() - start
    files.close_all()
    return Result(elapsed, total, n)


def best(results: list[Result]) -> Result:
    return max(results, key=lambda r: r.mb_per_s)


def interleaved(
    runs: int, raw: Callable[[int], Result], log: Callable[[int], Result]
) -> tuple[Result, Result]:
    """The best (log, raw) results of `runs` runs of each, taken turn about, each side first
    every other run: both see the same disk weather."""
    results: dict[str, list[Result]] = {"raw": [], "log": []}
    for run in range(runs):
        for side in ("raw", "log") if run % 2 == 0 else ("log", "raw"):
            results[side].append(raw(run) if side == "raw" else log(run))
    return best(results["log"]), best(results["raw"])


def measure(case: Case, root: Path, runs: int, seconds: float) -> list[tuple[str, Result, Result]]:
    """(row name, best log result, best raw result) of the case's appends and, for batched
    fsync with one batch per call, of reading back what the last run wrote (from the page
    cache, 1 MB per read)."""
    batches = make_batches(case)
    rows = [
        (
            case.name,
            *interleaved(
                runs,
                lambda run: raw_append(root / f"raw-{run}", batches, case.fsync_every, seconds),
                lambda run: log_append(root / f"log-{run}", batches, case, seconds),
            ),
        )
    ]
    if case.fsync_every and case.per_call == 1:
        size = f"{case.batch_bytes // KB} KB" if case.batch_bytes < MB else "1 MB"
        raw_path, log_dir = root / f"raw-{runs - 1}", root / f"log-{runs - 1}"
        read = interleaved(runs, lambda _: raw_read(raw_path, MB), lambda _: log_read(log_dir, MB))
        rows.append((f"read {size} batches, 1 MB reads", *read))
    return rows


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure")
    parser.add_argument("--seconds", type=float, default=2.0, help="time budget per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per side; the best counts")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="log-bench-", dir=args.dir))
    rows: list[tuple[str, Result, Result]] = []
    try:
        for case in CASES:
            rows += measure(case, root, args.runs, args.seconds)
            for path in root.iterdir():
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"machine: {machine()}")
    print(f"disk: {args.dir or tempfile.gettempdir()}, best of {args.runs} runs")
    header = f"| {'case':40} | {'log MB/s':>9} | {'log batches/s':>13} | {'raw MB/s':>9} | "
    header += f"{'raw batches/s':>13} | {'log/raw':>7} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for name, logged, raw in rows:
        print(
            f"| {name:40} | {logged.mb_per_s:9.1f} | {logged.batches_per_s:13.0f} | "
            f"{raw.mb_per_s:9.1f} | {raw.batches_per_s:13.0f} | "
            f"{logged.mb_per_s / raw.mb_per_s:7.0%} |"
        )


if __name__ == "__main__":
    main()
