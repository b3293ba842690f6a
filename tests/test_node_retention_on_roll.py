"""Retention trims a partition's log as soon as it rolls a segment, not only at the periodic
pass: a log that fills fast then drops one segment at a time, not all that piled up."""

from __future__ import annotations

from pathlib import Path

from inproc_harness import configs, short_retention_log, start_all, wait_for


async def test_a_log_that_rolls_is_trimmed_before_the_periodic_pass(tmp_path: Path) -> None:
    [config] = configs(tmp_path, 1)
    config.retention_check_s, config.fsync = 3600.0, "never"
    [broker] = await start_all([config])
    try:
        replica = await short_retention_log(broker)
        await wait_for(lambda: replica.log.log_start_offset > 10, timeout=10)
        assert replica.log.size_bytes <= 4096 + 2 * 2048
    finally:
        await broker.stop()
