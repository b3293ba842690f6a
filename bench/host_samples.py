"""What the host and the servers under test did, second by second, during a sustained run.

Owns the sampler thread (page cache Dirty and Writeback, the servers' RSS and CPU, load
average) and the plain-file yardstick writer that sustained runs are judged against.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

MB = 1_000_000
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def meminfo_mb(names: tuple[str, ...] = ("Dirty", "Writeback", "Cached", "MemAvailable")) -> dict:
    """Chosen /proc/meminfo fields in MB."""
    values: dict[str, float] = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in names:
            values[key] = int(rest.split()[0]) * 1024 / MB
    return values


def session_processes(session_ids: set[int]) -> list[int]:
    """Every process whose session is one of `session_ids` (peers start theirs in own sessions,
    so a server's children, such as RabbitMQ's beam.smp, are found too)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry.name))
        except OSError:
            continue
        if int(fields[3]) in session_ids:
            found.append(int(entry.name))
    return found


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat fields after the command name (index 0 is the state)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def _cpu_and_rss(pids: list[int]) -> tuple[dict[int, float], float]:
    """CPU seconds used so far by each of `pids` and their resident MB in all (gone ones
    are left out)."""
    cpu: dict[int, float] = {}
    rss = 0.0
    for pid in pids:
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue
        cpu[pid] = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        rss += int(fields[21]) * _PAGE_BYTES / MB
    return cpu, rss


@dataclass
class HostSampler:
    """Samples once a second on a thread, from `start()` until `stop()`; t is seconds since
    `origin` (time.monotonic())."""

    session_ids: set[int]
    origin: float = field(default_factory=time.monotonic)
    interval_s: float = 1.0
    samples: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="host-sampler", daemon=True)

    def start(self) -> HostSampler:
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, float]]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.samples

    def _loop(self) -> None:
        last_cpu: dict[int, float] | None = None
        last_t = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            pids = session_processes(self.session_ids)
            cpu, rss = _cpu_and_rss(pids)
            sample = {
                "t": round(now - self.origin, 2),
                **{k: round(v, 1) for k, v in meminfo_mb().items()},
                "server_rss_mb": round(rss, 1),
                "load_1m": os.getloadavg()[0],
            }
            if last_cpu is not None and now > last_t:
                # Per process: a child that exits (Redis' AOF rewrite) must not count negative.
                used = sum(max(0.0, t - last_cpu.get(pid, t)) for pid, t in cpu.items())
                sample["server_cpu_pct"] = round(100 * used / (now - last_t), 1)
            last_cpu, last_t = cpu, now
            self.samples.append(sample)
            self._stop.wait(self.interval_s)


@dataclass(frozen=True)
class YardstickPlan:
    """A plain file written the way a log with retention writes: `write_bytes` per write,
    fdatasync every `sync_bytes`, a new file every `file_bytes`, the oldest files deleted
    beyond `keep_files`; for `seconds` or `max_bytes`, whichever comes first."""

    seconds: float = 60.0
    max_bytes: int = 20 * 1000 * MB
    write_bytes: int = 1024 * 1024
    sync_bytes: int = 1024 * 1024
    file_bytes: int = 1 << 30
    keep_files: int = 4
    # Written bytes further behind than this are dropped from the page cache after each
    # fdatasync, as Raftline's log does (raftlog.log.LogConfig.cache_tail_bytes); -1: never.
    cache_tail_bytes: int = -1


def plain_file_writer(directory: Path, plan: YardstickPlan) -> list[float]:
    """Write per `plan` under `directory` (then removed); returns MB/s for each second."""
    directory.mkdir(parents=True, exist_ok=True)
    block = os.urandom(plan.write_bytes)
    per_second: list[float] = []
    files: list[Path] = []
    fd = -1
    written = in_file = unsynced = dropped_to = 0
    began = time.monotonic()
    try:
        while written < plan.max_bytes:
            now = time.monotonic()
            second = int(now - began)
            if now - began >= plan.seconds:
                break
            if fd < 0 or in_file >= plan.file_bytes:
                if fd >= 0:
                    os.fdatasync(fd)
                    os.close(fd)
                files.append(directory / f"{len(files):08d}.log")
                fd = os.open(files[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                in_file = dropped_to = 0
                while len(files) > plan.keep_files:
                    files.pop(0).unlink()
            os.write(fd, block)
            written += plan.write_bytes
            in_file += plan.write_bytes
            unsynced += plan.write_bytes
            if unsynced >= plan.sync_bytes:
                os.fdatasync(fd)
                unsynced = 0
                drop_below = in_file - plan.cache_tail_bytes
                if plan.cache_tail_bytes >= 0 and drop_below - dropped_to >= 8 << 20:
                    os.posix_fadvise(
                        fd, dropped_to, drop_below - dropped_to, os.POSIX_FADV_DONTNEED
                    )
                    dropped_to = drop_below
            while len(per_second) <= second:
                per_second.append(0.0)
            per_second[second] += plan.write_bytes / MB
    finally:
        if fd >= 0:
            os.close(fd)
        for path in files:
            path.unlink(missing_ok=True)
        directory.rmdir()
    # The last second is partial: keep it only if it is the only one.
    return per_second[:-1] if len(per_second) > 1 else per_second
