"""A fetch that loses the race with local retention (the log start moved past its offset after
the range check, before the read) answers offset_out_of_range like any fetch below the start."""

from __future__ import annotations

from pathlib import Path

import pytest
from inproc_harness import configs, short_retention_log, start_all, wait_for

from raftline.node.broker import BrokerError


async def test_a_read_below_a_log_start_retention_just_moved_is_offset_out_of_range(
    tmp_path: Path,
) -> None:
    [config] = configs(tmp_path, 1)
    config.retention_check_s, config.fsync = 0.1, "never"
    [broker] = await start_all([config])
    try:
        replica = await short_retention_log(broker)
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
