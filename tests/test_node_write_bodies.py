"""A serving node's HTTP messages reach the transport as head and body, the body not copied
(node/server.write_bodies_in_place)."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import http_writer
from multidict import CIMultiDict

from raftline.node.server import write_bodies_in_place


class RecordingTransport:
    """What a StreamWriter hands its transport: each write's buffers."""

    def __init__(self) -> None:
        self.writes: list[list[Any]] = []

    def write(self, data: Any) -> None:
        self.writes.append([data])

    def writelines(self, buffers: Any) -> None:
        self.writes.append(list(buffers))

    def is_closing(self) -> bool:
        return False


async def test_a_large_body_goes_to_the_transport_as_its_own_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http_writer, "SKIP_WRITELINES", http_writer.SKIP_WRITELINES)
    write_bodies_in_place()
    transport = RecordingTransport()
    writer = http_writer.StreamWriter(
        SimpleNamespace(transport=transport, _paused=False), asyncio.get_running_loop()
    )
    body = os.urandom(1_000_000)
    await writer.write_headers("HTTP/1.1 200 OK", CIMultiDict({"Content-Length": str(len(body))}))
    await writer.write_eof(body)
    sent = [buffer for write in transport.writes for buffer in write]
    assert any(buffer is body for buffer in sent)  # handed over, not joined with the head
    assert b"".join(sent).endswith(body) and sent[0].startswith(b"HTTP/1.1 200 OK")
