"""Retention trims a partition's log as soon as it rolls a segment, not only at the periodic
pass: a log that fills fast then drops one segment at a time, not all that piled up."""

from __future__ import annotations

from pathlib import Path

from inproc_harness import configs, start_all, wait_for

from raftline.raftlog.records import Record, build_batch


async def test_a_log_that_rolls_is_trimmed_before_the_periodic_pass(tmp_path: Path) -> None:
    [config] = configs(tmp_path, 1)
    config.retention_check_s, config.fsync = 3600.0, "never"
    [broker] = await start_all([config])
    try:
        settings = {"segment.bytes": "2048", "retention.bytes": "4096"}
        await broker.create_topic("short", 1, 1, settings)
        for i in range(60):
            batch = build_batch([Record(f"{i:04d}".encode() + b"v" * 200)])
            await broker.produce("short", 0, batch, "all")
        replica = next(r for r in broker.partitions.values() if r.topic == "short")
        await wait_for(lambda: replica.log.log_start_offset > 10, timeout=10)
        assert replica.log.size_bytes <= 4096 + 2 * 2048
    finally:
        await broker.stop()
