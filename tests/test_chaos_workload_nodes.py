"""How the chaos workload's client treats nodes: a node that stops answering is given up on.

A stand-in node on loopback hangs every request while "paused", like a SIGSTOPped node whose
socket still accepts connections.
"""

from __future__ import annotations

import asyncio
import random
import time

from aiohttp import web
from aiohttp.test_utils import TestServer

from raftline.chaos.workload import Nodes, Outcome, call, session


async def hanging_node(paused: asyncio.Event) -> TestServer:
    async def answer(request: web.Request) -> web.Response:
        if paused.is_set():
            await asyncio.sleep(3600)
        return web.json_response({"offsets": [{"partition": 0, "offset": 0}]})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_a_request_to_a_node_that_stops_answering_health_checks_is_given_up() -> None:
    paused = asyncio.Event()
    server = await hanging_node(paused)
    url = str(server.make_url("")).rstrip("/")
    nodes = Nodes([url], random.Random(1))
    try:
        async with session() as http:
            prober = asyncio.ensure_future(nodes.probe(http, time.monotonic() + 30))
            paused.set()
            started = time.monotonic()
            endpoint = nodes.endpoints[0]
            outcome = await call(http, "POST", f"{url}/v1/topics/t/messages", {}, (), endpoint.down)
            prober.cancel()
        assert outcome == Outcome("info", None, None, "node_down")  # it may still apply
        assert time.monotonic() - started < Nodes.PROBE_S + Nodes.PROBE_TIMEOUT_S + 1.0
    finally:
        await server.close()


def test_a_node_whose_request_for_a_partition_failed_is_avoided_for_that_partition() -> None:
    nodes = Nodes(["http://a", "http://b"], random.Random(7))
    first, second = nodes.endpoints
    nodes.observe(first, Outcome("info", 503, {}, "leader_unavailable"), scope=0)
    assert {nodes.pick(0).name for _ in range(50)} == {second.name}
    assert {nodes.pick(1).name for _ in range(50)} == {first.name, second.name}
    nodes.observe(second, Outcome("info", None, None, "TimeoutError"), scope=0)
    # Every node failed lately: any of them rather than none.
    assert {nodes.pick(0).name for _ in range(50)} == {first.name, second.name}


def test_a_partition_goes_to_its_known_leader_while_the_leader_answers() -> None:
    nodes = Nodes(["http://a", "http://b", "http://c"], random.Random(3))
    nodes.leaders[0] = 2
    assert {nodes.pick(0).name for _ in range(20)} == {"n2"}
    nodes.observe(nodes.endpoints[1], Outcome("info", 503, {}, "leader_unavailable"), scope=0)
    assert "n2" not in {nodes.pick(0).name for _ in range(50)}
