"""What a one-message produce request costs besides the commit, POST against produce stream.

Owns the in-process probe of the request's own cost: one broker (RF 1: the Raft path is the
same for both, bench.commit_calls counts it) behind its HTTP app, and the AsyncClient on the
same event loop, sending acks=all produces of one 1 KB message one after the other to the
leader, in passes that alternate the transport (`produce_batch(transport=...)`). Per pass:
`python_calls_per_msg` under cProfile (the same at any machine load), split by where the
function lives (client: raftline.clients and aiohttp's client; node: the API, node, log and
aiohttp's server; shared: asyncio, aiohttp's parsers and streams, the rest), and
`cpu_us_per_msg`, the process's CPU in a second pass without the profiler (client and node
together; it moves with the load).

Run: .venv/bin/python -m bench.produce_calls [--messages 1000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.inproc import configs, free_port_base, start_all
from raftline.api.app import create_app
from raftline.clients.aio import AsyncClient
from raftline.clients.wire import TRANSPORTS

TOPIC = "produce-calls"
WARMUP_MESSAGES = 200
PAYLOAD = b"x" * 1024
_CLIENT = ("/clients/", "aiohttp/client", "aiohttp/connector")
_NODE = ("/api/", "/node/", "/raftlog/", "aiohttp/web")


def side(filename: str) -> str:
    """Which end of the request a profiled function belongs to."""
    if any(part in filename for part in _CLIENT):
        return "client"
    if any(part in filename for part in _NODE):
        return "node"
    return "shared"


async def _sent(client: AsyncClient, url: str, transport: str, messages: int) -> None:
    for _ in range(messages):
        await client.produce_batch(TOPIC, 0, [PAYLOAD], "all", url=url, transport=transport)


async def _pass(client: AsyncClient, url: str, transport: str, messages: int) -> dict[str, Any]:
    await _sent(client, url, transport, WARMUP_MESSAGES)  # connections, the stream, metadata
    profile = cProfile.Profile()
    profile.enable()
    await _sent(client, url, transport, messages)
    profile.disable()
    calls: dict[str, int] = {"client": 0, "node": 0, "shared": 0}
    for (filename, _, _), (_, total, *_) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        calls[side(filename)] += total
    began = time.process_time()
    await _sent(client, url, transport, messages)
    cpu = time.process_time() - began
    return {
        "transport": transport,
        "python_calls_per_msg": round(sum(calls.values()) / messages),
        **{f"{name}_calls_per_msg": round(count / messages) for name, count in calls.items()},
        "cpu_us_per_msg": round(1e6 * cpu / messages),
    }


async def measure(root: Path, messages: int, rounds: int) -> list[dict[str, Any]]:
    [config] = configs(root, 1, free_port_base())
    [broker] = await start_all([config])
    runner = web.AppRunner(create_app(broker, self_http=config.http))
    await runner.setup()
    host, port = config.http.rsplit(":", 1)
    await web.TCPSite(runner, host, int(port)).start()
    url = f"http://{config.http}"
    results = []
    try:
        async with AsyncClient(url) as client:
            await client.create_topic(TOPIC, 1, 1)
            for _ in range(rounds):
                for transport in TRANSPORTS:
                    results.append(await _pass(client, url, transport, messages))
    finally:
        await runner.cleanup()
        await broker.stop()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.produce_calls", description=__doc__)
    parser.add_argument("--messages", type=int, default=1000, help="per pass")
    parser.add_argument("--rounds", type=int, default=2, help="passes of each transport")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="produce-calls-"))
    try:
        for result in asyncio.run(measure(root, args.messages, args.rounds)):
            print(json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
