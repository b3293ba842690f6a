"""SIGKILL a writer at random moments: every batch it reported fsynced survives, nothing corrupt."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from raftline.raftlog import batch
from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import iter_batches
from raftline.raftlog.segment import FileCache

# Two threads append with fsync="always" and print "<base offset> <value>" once the append
# (and so its fsync) returned.
WRITER = """
import sys, threading
from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Record, build_batch

log = PartitionLog(sys.argv[1], LogConfig(segment_bytes=32 * 1024, fsync="always"))
lock = threading.Lock()

def write(thread):
    seq = 0
    while True:
        value = f"{sys.argv[2]}-{thread}-{seq}".encode()
        records = [Record(value=value)] * (1 + seq % 3)
        base = log.append(build_batch(records, timestamp=seq), term=int(sys.argv[2]))
        with lock:
            sys.stdout.write(f"{base} {value.decode()}\\n")
            sys.stdout.flush()
        seq += 1

print("started", flush=True)
threads = [threading.Thread(target=write, args=(t,), daemon=True) for t in range(2)]
for t in threads:
    t.start()
threads[0].join()
"""

CONFIG = LogConfig(segment_bytes=32 * 1024, fsync="never")


def run_writer_until_killed(directory: Path, round_: int, rng: random.Random) -> dict[int, bytes]:
    """Start the writer, SIGKILL it after a random delay, return what it reported fsynced."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), str(round_)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout))  # type: ignore[arg-type]
    reader.start()
    time.sleep(rng.uniform(0.02, 0.4))
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    reader.join(10)
    fsynced = {}
    for line in lines:
        if line.endswith("\n"):  # a line cut by the kill proves nothing
            base, value = line.split()
            fsynced[int(base)] = value.encode()
    return fsynced


def stored_batches(directory: Path) -> dict[int, bytes]:
    """Base offset -> first record value of every stored batch, CRC-checked, contiguous.

    The log is opened and dropped without a clean close, as by a crashed process."""
    files = FileCache()
    log = PartitionLog(directory, CONFIG, files)
    assert log.recovery.rebuilt_indexes == []
    out: dict[int, bytes] = {}
    offset = log.log_start_offset
    while offset < log.next_offset:
        data = log.read(offset, 1 << 20)
        for decoded in iter_batches(data):  # raises on any CRC or format damage
            assert decoded.header.base_offset == offset
            out[offset] = decoded.records[0].value or b""
            offset = decoded.header.last_offset + 1
    files.close_all()
    return out


def test_every_fsynced_batch_survives_sigkill(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "7")))
    fsynced: dict[int, bytes] = {}
    for round_ in range(1, 11):
        reported = run_writer_until_killed(tmp_path, round_, rng)
        stored = stored_batches(tmp_path)
        fsynced.update(reported)
        missing = {o: v for o, v in fsynced.items() if stored.get(o) != v}
        assert not missing, f"round {round_}: fsynced batches lost or changed: {missing}"
    assert len(fsynced) > 10


def test_torn_and_bit_flipped_tails_are_cut_back_to_the_last_intact_batch(tmp_path: Path) -> None:
    rng = random.Random(11)
    for round_ in range(1, 20):
        run_writer_until_killed(tmp_path, round_, rng)
        last = max(tmp_path.glob("*.log"))
        positions = [pos for pos, _ in batch.iter_headers(last.read_bytes())]
        if len(positions) >= 3:  # the tail to damage lies in one segment
            break
    before = stored_batches(tmp_path)
    # A torn write: the last batch lost its end.
    os.truncate(last, last.stat().st_size - 3)
    torn = stored_batches(tmp_path)
    assert torn == {o: v for o, v in before.items() if o < max(before)}
    # Flipped bits in what is now the last batch: its CRC fails and it is cut too.
    data = bytearray(last.read_bytes())
    data[positions[-2] + batch.HEADER_SIZE + 2] ^= 0x55
    last.write_bytes(data)
    flipped = stored_batches(tmp_path)
    assert flipped == {o: v for o, v in torn.items() if o < max(torn)}
