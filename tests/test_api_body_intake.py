"""Large request bodies taken from aiohttp and received straight into their bytes (api/body_intake).

An echo app on IntakeAppRunner answers each body's digest, size and how many bodies its
connection took; the connection must go on parsing requests after a taken body.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from raftline.api import body_intake
from raftline.api.codec import read_whole_body
from raftline.raftlog.speedups import C

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(C is None, reason="the intake needs the C extension"),
]

FAILURES = web.AppKey("failures", list)
LARGE = body_intake.LARGE_BODY_BYTES


async def _echo(request: web.Request) -> web.Response:
    try:
        body = await read_whole_body(request.content, request.content_length)
    except Exception as exc:
        request.app[FAILURES].append(exc)
        raise
    return web.json_response(
        {
            "md5": hashlib.md5(body).hexdigest(),
            "size": len(body),
            "taken": request.protocol.bodies_taken,
        }
    )


async def _refuse(request: web.Request) -> web.Response:
    return web.json_response({"refused": True}, status=400)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, int, web.Application]]:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[FAILURES] = []
    app.router.add_post("/echo", _echo)
    app.router.add_get("/echo", _echo)
    app.router.add_post("/refuse", _refuse)
    runner = body_intake.IntakeAppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield "127.0.0.1", port, app
    finally:
        await runner.cleanup()


async def _post(port: int, body: Any, session: aiohttp.ClientSession) -> dict[str, Any]:
    async with session.post(f"http://127.0.0.1:{port}/echo", data=body) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def test_this_aiohttp_keeps_what_the_intake_replaces() -> None:
    assert body_intake.TAKES_BODIES


async def test_a_large_body_arrives_whole_through_the_intake(server: Any) -> None:
    _, port, _ = server
    body = os.urandom(1_000_000)
    async with aiohttp.ClientSession() as session:
        answer = await _post(port, body, session)
    assert answer == {"md5": _md5(body), "size": len(body), "taken": 1}


async def test_a_connection_takes_one_large_body_after_another(server: Any) -> None:
    _, port, _ = server
    bodies = [os.urandom(size) for size in (LARGE + 1, 3_000_000, 1_000_000)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        answers = [await _post(port, body, session) for body in bodies]
    assert [(a["md5"], a["taken"]) for a in answers] == [
        (_md5(body), n) for n, body in enumerate(bodies, 1)
    ]


PLAIN_GET = b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"


def _post_bytes(body: bytes) -> bytes:
    return f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


async def _pipelined(server: Any, *requests: bytes) -> list[str]:
    """The requests written back to back on one connection, and each one's answer."""
    host, port, _ = server
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"".join(requests))
    answers = [await _read_response(reader) for _ in requests]
    writer.close()
    return answers


async def test_a_request_sent_right_behind_a_taken_body_is_parsed(server: Any) -> None:
    body = os.urandom(1_000_000)
    answers = await _pipelined(server, _post_bytes(body), PLAIN_GET)
    assert '"taken": 1' in answers[0] and _md5(body) in answers[0]
    assert f'"md5": "{_md5(b"")}", "size": 0' in answers[1]


async def test_a_large_body_pipelined_behind_another_request_arrives_whole(server: Any) -> None:
    body = os.urandom(1_000_000)
    answers = await _pipelined(server, PLAIN_GET, _post_bytes(body))
    assert f'"md5": "{_md5(b"")}", "size": 0' in answers[0]
    assert f'"md5": "{_md5(body)}", "size": {len(body)}' in answers[1]


async def test_a_body_sent_after_100_continue_is_taken(server: Any) -> None:
    host, port, _ = server
    body = os.urandom(2_000_000)
    reader, writer = await asyncio.open_connection(host, port)
    head = f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    writer.write(head.encode() + b"Expect: 100-continue\r\n\r\n")
    interim = await reader.readuntil(b"\r\n\r\n")
    writer.write(body)
    answer = await _read_response(reader)
    writer.close()
    assert interim.startswith(b"HTTP/1.1 100 Continue")
    assert '"taken": 1' in answer and _md5(body) in answer


async def test_a_connection_goes_on_after_a_large_body_its_handler_never_read(
    server: Any,
) -> None:
    _, port, _ = server
    body = os.urandom(1_000_000)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        async with session.post(f"http://127.0.0.1:{port}/refuse", data=body) as response:
            assert response.status == 400
        answer = await _post(port, body, session)
    assert (answer["md5"], answer["taken"]) == (_md5(body), 2)


async def test_a_small_body_is_left_to_aiohttp(server: Any) -> None:
    _, port, _ = server
    body = os.urandom(LARGE - 1)
    async with aiohttp.ClientSession() as session:
        answer = await _post(port, body, session)
    assert answer == {"md5": _md5(body), "size": len(body), "taken": 0}


async def test_a_body_over_the_api_limit_is_left_to_aiohttp(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, port, _ = server
    monkeypatch.setattr(body_intake, "MAX_TAKEN_BODY_BYTES", 2 * LARGE)
    body = os.urandom(2 * LARGE + 1)
    async with aiohttp.ClientSession() as session:
        answer = await _post(port, body, session)
    assert answer == {"md5": _md5(body), "size": len(body), "taken": 0}


async def test_a_chunked_body_is_left_to_aiohttp(server: Any) -> None:
    _, port, _ = server
    body = os.urandom(1_000_000)

    async def chunks() -> AsyncIterator[bytes]:
        for at in range(0, len(body), 100_000):
            yield body[at : at + 100_000]

    async with aiohttp.ClientSession() as session:
        answer = await _post(port, chunks(), session)
    assert answer == {"md5": _md5(body), "size": len(body), "taken": 0}


async def test_a_client_gone_mid_body_fails_only_its_own_request(server: Any) -> None:
    host, port, app = server
    _, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
    writer.write(os.urandom(LARGE + 50_000))
    await writer.drain()
    await asyncio.sleep(0.2)  # the intake has taken the connection
    writer.close()
    for _ in range(100):
        if app[FAILURES]:
            break
        await asyncio.sleep(0.02)
    assert len(app[FAILURES]) == 1
    body = os.urandom(LARGE + 1)
    async with aiohttp.ClientSession() as session:
        answer = await _post(port, body, session)
    assert answer["md5"] == _md5(body)


def test_unfilled_bytes_are_filled_through_their_view() -> None:
    assert C is not None
    data, view = C.unfilled_bytes(5)
    view[:] = b"hello"
    view.release()
    assert type(data) is bytes and data == b"hello"


def test_unfilled_bytes_refuse_a_negative_size() -> None:
    assert C is not None
    with pytest.raises(ValueError, match="size >= 0"):
        C.unfilled_bytes(-1)


async def _read_response(reader: asyncio.StreamReader) -> str:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return (await reader.readexactly(length)).decode()
