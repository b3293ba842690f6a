"""A fetch that loses the race with local retention (the log start moved past its offset after
the range check, before the read) answers offset_out_of_range like any fetch below the start."""

from __future__ import annotations

from pathlib import Path

import pytest
from inproc_harness import configs, start_all, wait_for

from raftline.node.broker import BrokerError
from raftline.raftlog.records import Record, build_batch


async def test_a_read_below_a_log_start_retention_just_moved_is_offset_out_of_range(
    tmp_path: Path,
) -> None:
    [config] = configs(tmp_path, 1)
    config.retention_check_s, config.fsync = 0.1, "never"
    [broker] = await start_all([config])
    try:
        settings = {"segment.bytes": "2048", "retention.bytes": "4096"}
        await broker.create_topic("short", 1, 1, settings)
        for i in range(60):
            batch = build_batch([Record(f"{i:04d}".encode() + b"v" * 200)])
            await broker.produce("short", 0, batch, "all")
        replica = next(r for r in broker.partitions.values() if r.topic == "short")
        await wait_for(lambda: replica.log.log_start_offset > 10, timeout=30)
        # The state a fetch finds when retention ran between its range check and its read.
        with pytest.raises(BrokerError) as raised:
            await replica._read(0, 1000, replica.high_watermark)
        error = raised.value
        assert error.code == "offset_out_of_range"
        assert error.extra == {
            "log_start_offset": replica.log_start_offset,
            "high_watermark": replica.high_watermark,
        }
    finally:
        await broker.stop()
