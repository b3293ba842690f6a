"""The producer endpoints of the v1 contract (API.md "Idempotent and transactional producers").

Owns `POST /v1/producers` (a producer id for an idempotent producer, or a transactional id's
producer with a new epoch) and the transaction calls (commit, abort, consumer offsets), each one
call to the broker (Broker.new_producer, Broker.txn_call); produce itself stays in app.py.
"""

from __future__ import annotations

import msgpack
import orjson
from aiohttp import web

from raftline.api import validation
from raftline.api.app import MSGPACK_TYPES, _state, read_body, read_raw_body, reply
from raftline.api.errors import ApiError, invalid


async def new_producer(request: web.Request) -> web.Response:
    """`POST /v1/producers`: a fresh producer id (epoch 0) for an idempotent producer; with a
    transactional_id, the id's producer with its epoch bumped: every earlier epoch is fenced
    and its open transaction aborted (markers written) before the answer."""
    raw = await read_raw_body(request)
    body = None
    if raw.strip():
        try:
            body = (
                msgpack.unpackb(raw, raw=False)
                if request.content_type in MSGPACK_TYPES
                else orjson.loads(raw)
            )
        except Exception as exc:
            raise invalid(f"body is not valid JSON: {exc}") from None
    tid, timeout_ms = validation.new_producer_request(body)
    broker = _state(request).broker
    if tid is not None:
        answer = await broker.txn_call(tid, "txn_init", {"timeout_ms": timeout_ms})
        return reply(request, answer)
    producer_id, epoch = await broker.new_producer()
    return reply(request, {"producer_id": producer_id, "producer_epoch": epoch})


async def end_transaction(request: web.Request) -> web.Response:
    """`POST /v1/transactions/{tid}/commit|abort`: decide, write the markers to every partition
    of the transaction, answer the (bumped) producer id and epoch for the next one."""
    tid = validation.transactional_id(request.match_info["transactional_id"])
    action = request.match_info["action"]
    if action not in ("commit", "abort"):
        raise ApiError("not_found", f"no transaction action {action!r}")
    producer_id, epoch = validation.end_txn_request(await read_body(request))
    args = {"producer_id": producer_id, "producer_epoch": epoch, "commit": action == "commit"}
    answer = await _state(request).broker.txn_call(tid, "txn_end", args)
    return reply(request, answer)


async def transaction_offsets(request: web.Request) -> web.Response:
    """`POST /v1/transactions/{tid}/offsets`: consumer offsets that the group gets if and when
    the transaction commits (consume-transform-produce); never with an abort."""
    tid = validation.transactional_id(request.match_info["transactional_id"])
    body = await read_body(request)
    pid, epoch, group, offsets = validation.txn_offsets_request(body)
    args = {"producer_id": pid, "producer_epoch": epoch, "group": group, "offsets": offsets}
    # KIP-447: with the member and generation given, refused (409 stale_generation) unless
    # that member may commit these partitions now
    args.update(validation.txn_member(body))
    await _state(request).broker.txn_call(tid, "txn_add_offsets", args)
    return web.Response(status=204)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/producers", new_producer)
    app.router.add_post("/v1/transactions/{transactional_id}/offsets", transaction_offsets)
    app.router.add_post("/v1/transactions/{transactional_id}/{action}", end_transaction)
