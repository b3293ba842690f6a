"""The machine's own ceiling for large messages: loopback TCP into memory, then the page cache.

Owns the probe that does only what any broker must do with a 1 MB publish at RF 1 without fsync
(receive it from a socket into its own buffer, check a CRC-32C, write it to a log file that drops
its pages 64 MiB behind its end, as raftlog does) and nothing else, so a broker's MB/s can be read
against what the machine allows, measured in the same session.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import crc32c

from raftline.raftlog.speedups import C

MIB = 1 << 20
SEGMENT_BYTES = 1 << 30
KEEP_SEGMENTS = 4
DROP_BEHIND = 64 * MIB
DROP_STEP = 8 * MIB


def _send(port: int, size: int, seconds: float) -> None:
    payload = os.urandom(size)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.sendall(payload)


def _receive_into(conn: socket.socket, size: int) -> bytes | None:
    """A fresh message's own bytes, filled by the kernel: as Raftline receives a body."""
    body, view = C.unfilled_bytes(size)
    got = 0
    while got < size:
        n = conn.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return body


def intake(size: int, seconds: float, directory: Path, crc: bool = True) -> dict[str, Any]:
    """Receive `size`-byte messages for `seconds` from another process and append each to a
    rolling log; returns MB/s and the receiver's CPU seconds per MB."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sender = multiprocessing.get_context("spawn").Process(target=_send, args=(port, size, seconds))
    sender.start()
    conn, _ = listener.accept()
    segments: list[Path] = []
    fd = -1
    position = dropped = received = 0
    cpu0, start = time.process_time(), time.monotonic()
    try:
        while (body := _receive_into(conn, size)) is not None:
            if crc:
                crc32c.crc32c(body)
            if fd < 0 or position + size > SEGMENT_BYTES:
                if fd >= 0:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
                segments.append(directory / f"{len(segments):020d}.log")
                fd = os.open(segments[-1], os.O_CREAT | os.O_WRONLY, 0o644)
                position = dropped = 0
                if len(segments) > KEEP_SEGMENTS:
                    segments.pop(0).unlink()
            os.pwrite(fd, body, position)
            position += size
            received += size
            if position - dropped - DROP_BEHIND >= DROP_STEP:
                behind = position - DROP_BEHIND - dropped
                os.posix_fadvise(fd, dropped, behind, os.POSIX_FADV_DONTNEED)
                dropped = position - DROP_BEHIND
        elapsed = time.monotonic() - start
        cpu = time.process_time() - cpu0
    finally:
        if fd >= 0:
            os.close(fd)
        conn.close()
        listener.close()
        sender.join()
    return {
        "message_bytes": size,
        "seconds": round(elapsed, 2),
        "mb_per_s": round(received / MIB / elapsed, 1),
        "receiver_cpu_ms_per_mb": round(cpu * 1000 / (received / MIB), 3),
        "crc": crc,
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=MIB, help="message bytes (default 1 MiB)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-crc", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="log folder (default: temp)")
    args = parser.parse_args()
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            print(json.dumps(intake(args.size, args.seconds, Path(tmp), crc=not args.no_crc)))


if __name__ == "__main__":
    main()
