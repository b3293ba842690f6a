"""Log cleaner throughput beside a plain copy (read, write, fsync) of the same segment files.

Owns the cleaner benchmark: a compacted topic's log written with repeated keys, cleaned in one pass.
Run: `.venv/bin/python -m bench.cleaner_bench [--runs N] [--mb M] [--dir DIR]` from the repo root.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.log_bench import MB, machine
from raftline.raftlog.cleaner import Cleaner, CleanerConfig
from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Codec, Record, build_batch
from raftline.raftlog.segment import FileCache

SEGMENT_BYTES = 8 * MB
RECORDS_PER_BATCH = 100
VALUE_BYTES = 100
COPY_CHUNK = MB  # the cleaner's writer also writes in 1 MiB pieces


@dataclass(frozen=True)
class Case:
    name: str
    keys: int  # distinct keys the records are drawn from
    codec: int = Codec.NONE


CASES = [
    Case("10k keys (most records superseded)", 10_000),
    Case("10k keys, lz4 batches", 10_000, Codec.LZ4),
    Case("1M keys (few superseded)", 1_000_000),
]


@dataclass
class Result:
    seconds: float
    nbytes: int  # bytes of sealed segments read
    written: int = 0
    removed: int = 0
    records: int = 0  # records in the cleaned range (cleaner side)

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / MB / self.seconds

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds


def write_log(directory: Path, case: Case, total_bytes: int) -> None:
    """A compacted topic's log: batches of keyed records, keys drawn at random from `case.keys`
    (the same seed each time). The last segment stays active."""
    rng = random.Random(7)
    log = PartitionLog(
        directory,
        LogConfig(segment_bytes=SEGMENT_BYTES, fsync="never", retention_ms=-1),
        FileCache(),
    )
    records = 0
    while log.size_bytes < total_bytes:
        batch = []
        for i in range(records, records + RECORDS_PER_BATCH):
            key = rng.randrange(case.keys)
            # JSON-like text: compresses about as well as real events do
            value = b'{"user":%d,"seq":%d,"pad":"%s"}' % (key, i, b"%x" % rng.getrandbits(200))
            batch.append(Record(value=value.ljust(VALUE_BYTES), key=b"key-%d" % key))
        log.append(build_batch(batch, codec=case.codec, timestamp=0), term=1)
        records += RECORDS_PER_BATCH
    log.close()


def clean_once(template: Path, work: Path) -> Result:
    """One cleaner pass over a fresh copy of `template` (the copy is not timed)."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, work)
    files = FileCache()
    log = PartitionLog(work, LogConfig(segment_bytes=SEGMENT_BYTES, fsync="never"), files)
    cleaner = Cleaner(log, CleanerConfig(min_cleanable_dirty_ratio=0.0))
    start = time.perf_counter()
    stats = cleaner.clean(log.next_offset, now_ms=1)
    elapsed = time.perf_counter() - start
    log.close()
    files.close_all()
    # Offsets start at 0 and every record has one: the cleaned range holds `end` records.
    return Result(elapsed, stats.bytes_read, stats.bytes_written, stats.records_removed, stats.end)


def copy_once(template: Path, work: Path) -> Result:
    """The same sealed segment files read and written to new files in 1 MiB pieces, each new file
    fsynced, as the cleaner does for each segment it rewrites."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    segments = sorted(template.glob("*.log"))[:-1]  # the active segment is not cleaned either
    total = 0
    start = time.perf_counter()
    for segment in segments:
        source = os.open(segment, os.O_RDONLY)
        target = os.open(work / segment.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        position = 0
        while data := os.pread(source, COPY_CHUNK, position):
            os.write(target, data)
            position += len(data)
        os.fsync(target)
        os.close(target)
        os.close(source)
        total += position
    elapsed = time.perf_counter() - start
    return Result(elapsed, total, total)


def measure(case: Case, root: Path, runs: int, total_bytes: int) -> tuple[Result, Result]:
    """Best cleaner pass and best copy of `runs` each, taken turn about (each side first every
    other run)."""
    template = root / "template"
    shutil.rmtree(template, ignore_errors=True)
    write_log(template, case, total_bytes)
    cleaned: list[Result] = []
    copied: list[Result] = []
    for run in range(runs):
        for side in ("copy", "clean") if run % 2 == 0 else ("clean", "copy"):
            if side == "clean":
                cleaned.append(clean_once(template, root / "work"))
            else:
                copied.append(copy_once(template, root / "copy"))
    best = max(cleaned, key=lambda r: r.mb_per_s), max(copied, key=lambda r: r.mb_per_s)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure")
    parser.add_argument("--mb", type=int, default=64, help="log size per case, MB")
    parser.add_argument("--runs", type=int, default=3, help="runs per side; the best counts")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cleaner-bench-", dir=args.dir))
    rows = []
    try:
        for case in CASES:
            rows.append((case, *measure(case, root, args.runs, args.mb * MB)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"machine: {machine()}, load average {os.getloadavg()[0]:.1f}")
    print(
        f"log: {args.mb} MB of {RECORDS_PER_BATCH}-record batches, {VALUE_BYTES}-byte values, "
        f"{SEGMENT_BYTES // MB} MB segments; best of {args.runs} runs"
    )
    header = (
        f"| {'case':36} | {'cleaner MB/s':>12} | {'records/s':>9} | {'copy MB/s':>9} | "
        f"{'cleaner/copy':>12} | {'records removed':>15} | {'bytes left':>10} |"
    )
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for case, cleaned, copied in rows:
        print(
            f"| {case.name:36} | {cleaned.mb_per_s:12.1f} | {cleaned.records_per_s:9.0f} | "
            f"{copied.mb_per_s:9.1f} | {cleaned.mb_per_s / copied.mb_per_s:12.1%} | "
            f"{cleaned.removed / cleaned.records:15.0%} | "
            f"{cleaned.written / cleaned.nbytes:10.0%} |"
        )


if __name__ == "__main__":
    main()
