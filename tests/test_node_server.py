"""The `raftline serve` process: once serving, the heap it started with is frozen, so full
garbage collections never scan it again (they stalled the loop ~20 ms)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest
from inproc_harness import configs

from raftline.node.server import run

pytestmark = pytest.mark.timeout(60)


async def test_a_serving_node_has_frozen_its_startup_heap(tmp_path: Path) -> None:
    gc.unfreeze()
    stop = asyncio.Event()
    serving = asyncio.ensure_future(run(configs(tmp_path, 1)[0], stop))
    try:
        for _ in range(200):
            if gc.get_freeze_count() > 0:
                break
            await asyncio.sleep(0.05)
        assert gc.get_freeze_count() > 0
    finally:
        stop.set()
        await asyncio.wait_for(serving, 30)
        gc.unfreeze()
