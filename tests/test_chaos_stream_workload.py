"""The chaos runs' push consumers on a real in-process node: every frame of a topic stream is
recorded as a poll, a stream that ends is reopened from the last position a frame named, and a
stream that skips what it moved past is caught by the queue checker.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest

from raftline.api import streams
from raftline.chaos import queue_checker
from raftline.chaos.history import Recorder, read_history
from raftline.chaos.stream_workload import StreamConsumer
from raftline.chaos.workload import Workload, session
from tests.inproc_harness import serving

pytestmark = pytest.mark.timeout(60)
SECONDS = 3.0


async def run_streamed(tmp_path: Path, close_streams_every_s: float = 0.0) -> dict[str, Any]:
    """Producers and one push consumer on a 1-partition topic for SECONDS, then final reads;
    the checker's verdict on the history. With `close_streams_every_s`, the node closes every
    open stream that often (as a node that stops or loses a partition would)."""
    recorder = Recorder(tmp_path / "history.jsonl")
    async with serving(tmp_path / "node") as (api, _):
        url = str(api.server.make_url("")).rstrip("/")
        work = Workload(recorder, [url], "pushed", 1, random.Random(5), replication_factor=1)
        consumer = StreamConsumer(work, process=9, partition=0)
        async with session() as http:
            assert await work.create_topic(http, time.monotonic() + 10)
            until = time.monotonic() + SECONDS
            clients = [work.produce(http, p, until) for p in range(2)]
            clients.append(consumer.follow(http, until))
            if close_streams_every_s:
                clients.append(close_streams(api.app, close_streams_every_s, until))
            await asyncio.gather(*clients)
            await work.final_reads(http, 8, time.monotonic() + 10)
    recorder.close()
    ops = read_history(recorder.path)
    streamed = [op for op in ops if op.process == 9 and op.type == "ok"]
    return {"check": queue_checker.check(ops), "frames": len(streamed), "ops": ops}


async def close_streams(app: Any, every_s: float, until: float) -> None:
    stats = app[streams.STATS_KEY]
    while time.monotonic() < until:
        await asyncio.sleep(every_s)
        for socket in list(stats.sockets):
            await socket.close()


def values_streamed(ops: list[Any]) -> int:
    return sum(len(op.value["messages"]) for op in ops if op.process == 9 and op.type == "ok")


async def test_a_followed_stream_is_recorded_frame_by_frame_and_checks_valid(
    tmp_path: Path,
) -> None:
    result = await run_streamed(tmp_path)
    assert result["check"]["valid"], result["check"]["anomaly_types"]
    assert result["frames"] > 5
    assert values_streamed(result["ops"]) > 0


async def test_a_stream_closed_by_the_node_is_reopened_from_where_it_got_to(
    tmp_path: Path,
) -> None:
    result = await run_streamed(tmp_path, close_streams_every_s=0.4)
    assert result["check"]["valid"], result["check"]["anomaly_types"]
    reopened = [op for op in result["ops"] if op.process == 9 and op.type == "fail"]
    assert reopened, "the node closed streams, so some frames must have been waited for in vain"
    assert values_streamed(result["ops"]) > 0


async def test_a_stream_leaving_out_what_it_moved_past_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted bug in the node: each stream frame drops its last message but still moves the
    position past it."""
    taken_from = streams.taken_from

    def dropping_the_last(topic: str, body: Any, budget: int) -> tuple[list[Any], int]:
        taken, reached = taken_from(topic, body, budget)
        return taken[:-1], reached

    monkeypatch.setattr(streams, "taken_from", dropping_the_last)
    result = await run_streamed(tmp_path)
    assert not result["check"]["valid"]
    assert {"int-poll-skip", "poll-skip"} & set(result["check"]["anomaly_types"])


async def test_a_stream_that_gets_no_frame_ends_at_until_though_its_node_answers_heartbeats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pongs every 0.1 s: aiohttp's own receive timeout would start again at each of them.
    monkeypatch.setattr("raftline.chaos.stream_workload.HEARTBEAT_S", 0.1)
    recorder = Recorder(tmp_path / "history.jsonl")
    async with serving(tmp_path / "node") as (api, _):
        url = str(api.server.make_url("")).rstrip("/")
        work = Workload(recorder, [url], "idle", 1, random.Random(5), replication_factor=1)
        async with session() as http:
            assert await work.create_topic(http, time.monotonic() + 10)
            until = time.monotonic() + 1.0
            await asyncio.wait_for(StreamConsumer(work, 9, 0).follow(http, until), timeout=5)
            assert time.monotonic() - until < 1.0
    recorder.close()
