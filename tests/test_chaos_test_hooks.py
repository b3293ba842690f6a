"""The clock and delay nemeses drive the node's test hooks with bodies the node accepts."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from raftline.chaos.cluster import Node
from raftline.chaos.nemesis import ClockSkew, MessageDelay
from raftline.node.clock import WallClock
from raftline.node.netfaults import LinkFaults


@dataclass
class Nodes:
    nodes: list[Node]


@pytest.fixture
def hooks() -> Iterator[tuple[Nodes, list[tuple[str, Any]]]]:
    """Nodes whose HTTP API is a stub recording each POST's path and JSON body."""
    posts: list[tuple[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            posts.append((self.path, json.loads(self.rfile.read(length))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield Nodes([Node(i, f"raftline{i}", url) for i in (1, 2, 3)]), posts
    finally:
        server.shutdown()


def test_delay_nemesis_sets_link_faults_the_node_accepts_and_clears_them_on_every_node(
    hooks: tuple[Nodes, list[tuple[str, Any]]],
) -> None:
    cluster, posts = hooks
    delay = MessageDelay(cluster)  # type: ignore[arg-type]
    detail = delay.start(random.Random(4))
    assert len(posts) == len(detail["nodes"]) >= 1
    assert all(path == "/v1/admin/network" and LinkFaults.parse(body) for path, body in posts)
    posts.clear()
    delay.stop()
    assert [(p, LinkFaults.parse(b)) for p, b in posts] == [("/v1/admin/network", None)] * 3


def test_clock_nemesis_sends_offsets_the_node_accepts_and_zero_on_every_node_to_heal(
    hooks: tuple[Nodes, list[tuple[str, Any]]],
) -> None:
    cluster, posts = hooks
    skew = ClockSkew(cluster)  # type: ignore[arg-type]
    detail = skew.start(random.Random(5))
    sent = [body["offset_ms"] for path, body in posts if path == "/v1/admin/clock"]
    assert sent == list(detail["offsets_ms"].values()) and len(sent) >= 1
    for offset in sent:
        WallClock().set_offset_ms(offset)  # raises if the node would answer 400
    posts.clear()
    skew.stop()
    assert posts == [("/v1/admin/clock", {"offset_ms": 0})] * 3
