"""The aiohttp Application serving the v1 HTTP contract on top of one node's Broker.

Owns routing, body/answer encodings (JSON, msgpack), partition choice, leader forwarding and health.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack
import orjson
from aiohttp import web

from raftline.api import codec, validation
from raftline.api.errors import ApiError, from_broker_error, invalid
from raftline.api.filters import RecordFilter, from_query
from raftline.api.forward import FORWARDED_HEADER, Forwarder, LeaderMoved, LeaderUnreachable
from raftline.api.openapi import openapi_document
from raftline.api.partitioner import partition_for_key
from raftline.node.errors import BrokerError, NotLeader, OutcomeUnknown
from raftline.node.netfaults import LinkFaults
from raftline.raftlog.batch import CorruptBatchError, check_crc, parse_header

if TYPE_CHECKING:
    from raftline.node.broker import Broker

log = logging.getLogger(__name__)

MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack")
# Largest body: a 10 MB message as base64 inside JSON, plus room for its siblings.
MAX_BODY_BYTES = 32 * 1024 * 1024
PRODUCE_TIMEOUT_S = 15.0
TOPIC_CACHE_S = 1.0
DESCRIBE_WAIT_S = 0.5  # a first describe longer than this runs on in the background
# An answer this node got from the partition's leader names that leader (its node id), so that
# a client with a stale leader in its metadata sends its next request there, not here again.
LEADER_HEADER = "Raftline-Leader"
# The leaders this request was forwarded to: a list per request (a produce's partitions may run
# in tasks of their own, which share the list through their copied context).
_forwarded_to: contextvars.ContextVar[list[int]] = contextvars.ContextVar("forwarded_to")
FILTER_SCAN_BYTES = 8 << 20  # a filtered fetch answers after reading this much without a match


@dataclass(slots=True)
class TopicMeta:
    partitions: int
    max_message_bytes: int
    compression: str
    fetched_at: float


class ApiState:
    """Per-app state: topic metadata cache, sticky partition cursors, forwarding, metrics."""

    def __init__(self, broker: Broker, self_http: str | None) -> None:
        self.broker = broker
        self.self_http = self_http
        self.forwarder = Forwarder()
        self.topics: dict[str, TopicMeta] = {}
        self.refreshing: set[str] = set()
        self.sticky: dict[str, itertools.count[int]] = {}
        self.background: set[asyncio.Task[None]] = set()
        self.requests: dict[tuple[str, str, int], int] = {}
        self.seconds: dict[tuple[str, str], float] = {}  # time spent answering, per route
        self.metric_sources: list[Callable[[], list[str]]] = []  # more /metrics lines (streams)

    async def topic_meta(self, topic: str) -> TopicMeta:
        """Partition count and limits of a topic. A stale entry is served while a background
        refresh runs: describing needs a metadata read barrier, which stalls for seconds while
        the metadata group elects a new leader, and produce must not wait on that."""
        cached = self.topics.get(topic)
        if cached is None:
            partitions = await self.broker.topic_partition_count(topic)  # local, no barrier
            try:
                return await asyncio.wait_for(self._describe(topic), DESCRIBE_WAIT_S)
            except (TimeoutError, BrokerError) as exc:
                if isinstance(exc, BrokerError) and not exc.retryable:
                    raise
                # Metadata is electing a leader: go on with the widest limit until it answers.
                cached = TopicMeta(
                    partitions,
                    validation.LIMIT_MAX_MESSAGE_BYTES,
                    codec.DEFAULT_COMPRESSION,
                    fetched_at=0.0,
                )
                self.topics[topic] = cached
        if time.monotonic() - cached.fetched_at >= TOPIC_CACHE_S and topic not in self.refreshing:
            self.refreshing.add(topic)
            task = asyncio.ensure_future(self._refresh(topic))
            self.background.add(task)
            task.add_done_callback(self.background.discard)
        return cached

    async def _describe(self, topic: str) -> TopicMeta:
        partitions, config = await self.broker.topic_settings(topic)
        meta = TopicMeta(
            partitions=partitions,
            max_message_bytes=validation.max_message_bytes(config),
            compression=str(config.get("compression.type", codec.DEFAULT_COMPRESSION)),
            fetched_at=time.monotonic(),
        )
        self.topics[topic] = meta
        return meta

    async def _refresh(self, topic: str) -> None:
        try:
            await self._describe(topic)
        except BrokerError as exc:
            if exc.code == "unknown_topic":
                self.topics.pop(topic, None)
        except Exception:  # the next request retries; the cached limits stay meanwhile
            log.debug("refreshing topic %s failed", topic, exc_info=True)
        finally:
            self.refreshing.discard(topic)

    def next_sticky(self, topic: str, partitions: int) -> int:
        cursor = self.sticky.setdefault(topic, itertools.count())
        return next(cursor) % partitions

    async def with_leader(
        self,
        local: Callable[[], Awaitable[Any]],
        remote: Callable[[str], Awaitable[Any]],
        forwarded: bool,
        repeatable: bool = False,
    ) -> Any:
        """Run `local`; when this node does not lead, run `remote` on the leader. An election
        is waited out for at most an election timeout, and not at all where this node cannot
        reach a majority of the replicas or the leader it knows has been unreachable for an
        election timeout already: then 503 leader_unavailable, so the client tries
        another node. A forwarded request whose leader moves or goes silent is given up at
        once: sent again to the new leader when `repeatable` (a read), else answered with a
        503 (a write's outcome is then unknown, so it is never sent twice from here). A
        leader that answers it no longer leads is not asked again: the request goes to the
        next leader known here, or is answered with a 503 at once (this node may have missed
        the election, and an election timeout would pass before it learns more)."""
        broker = self.broker
        deadline = time.monotonic() + broker.router.election_timeout_s
        delay = 0.02
        refused: int | None = None  # the leader this node knew, which said it does not lead
        while True:
            target: NotLeader | None = None
            try:
                return await local()
            except NotLeader as exc:
                if forwarded or not exc.electable:
                    raise from_broker_error(exc) from None
                if refused is not None and exc.leader in (None, refused):
                    raise ApiError(
                        "leader_unavailable",
                        f"node {refused} does not lead {exc.group} and no other leader is known",
                    ) from None
                target = exc
            except OutcomeUnknown:
                raise
            except BrokerError as exc:
                # A leader elected a moment ago serves once its term has committed.
                if exc.code != "leader_unavailable" or time.monotonic() >= deadline:
                    raise
            if target is not None and target.leader is not None and target.leader_http:
                # Many of these: clients that send to a node other than the leader (a stale
                # leader in their metadata), each request then paying a second HTTP hop.
                broker.counters["forwarded_requests"] += 1
                with contextlib.suppress(LookupError):  # outside a request: nobody to tell
                    _forwarded_to.get().append(target.leader)
                forward = remote(target.leader_http)
                try:
                    return await broker.router.while_leads(target.group, target.leader, forward)
                except OutcomeUnknown:
                    if not repeatable:
                        raise
                    # A new leader is being elected: wait for it as for any election.
                    deadline = time.monotonic() + broker.router.election_timeout_s
                except LeaderMoved:
                    refused = target.leader
                except LeaderUnreachable:
                    pass  # look the leader up again: this node learns of moves as they happen
            if time.monotonic() >= deadline:
                raise ApiError("leader_unavailable", "no reachable leader for the partition")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)


STATE_KEY = web.AppKey("api_state", ApiState)


# ---- encodings -----------------------------------------------------------------------------


def wants_msgpack(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return any(kind in accept for kind in MSGPACK_TYPES)


def reply(
    request: web.Request,
    data: Any,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> web.Response:
    if wants_msgpack(request):
        return web.Response(
            body=msgpack.packb(data, use_bin_type=True),
            status=status,
            content_type="application/msgpack",
            headers=headers,
        )
    # orjson: several times faster than json.dumps on fetch answers of thousands of messages.
    return web.Response(
        body=orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS),
        status=status,
        content_type="application/json",
        headers=headers,
    )


async def read_raw_body(request: web.Request) -> bytes:
    return await codec.read_whole_body(request.content, request.content_length, MAX_BODY_BYTES)


async def read_body(request: web.Request) -> Any:
    raw = await read_raw_body(request)
    if not raw:
        raise invalid("request body is empty")
    if request.content_type in MSGPACK_TYPES:
        try:
            return msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises many unrelated types for garbage
            raise invalid(f"body is not valid msgpack: {exc}") from None
    # Anything else is read as JSON: curl's default form content type included.
    try:
        return orjson.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise invalid(f"body is not valid JSON: {exc}") from None


def error_response(request: web.Request, error: ApiError) -> web.Response:
    return reply(request, error.body(), status=error.status, headers=error.headers())


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    started = time.monotonic()
    forwarded_to: list[int] = []
    _forwarded_to.set(forwarded_to)
    try:
        response = await handler(request)
    except ApiError as exc:
        response = error_response(request, exc)
    except BrokerError as exc:
        response = error_response(request, from_broker_error(exc))
    except web.HTTPRequestEntityTooLarge:
        response = error_response(
            request, ApiError("message_too_large", "request body exceeds the size limit")
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "invalid_request")
        response = error_response(request, ApiError(code, exc.reason, status=exc.status))
    except TimeoutError:
        response = error_response(request, ApiError("timeout", "the request timed out"))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        response = error_response(
            request, ApiError("internal_error", "internal error; see the node's log")
        )
    if len(set(forwarded_to)) == 1 and response.status < 500 and not response.prepared:
        response.headers[LEADER_HEADER] = str(forwarded_to[0])
    route = request.match_info.route.resource
    name = route.canonical if route is not None else "unmatched"
    key = (request.method, name, response.status)
    state.requests[key] = state.requests.get(key, 0) + 1
    timed = (request.method, name)
    state.seconds[timed] = state.seconds.get(timed, 0.0) + time.monotonic() - started
    return response


# ---- handlers ------------------------------------------------------------------------------


def _state(request: web.Request) -> ApiState:
    return request.app[STATE_KEY]


def _topic(request: web.Request) -> str:
    return validation.topic_name(request.match_info["topic"])


async def healthz(request: web.Request) -> web.Response:
    return reply(request, {"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if _state(request).broker.ready():
        return reply(request, {"status": "ready"})
    error = ApiError(
        "not_ready", "the node has not joined the cluster yet", status=503, retryable=True
    )
    return error_response(request, error)


async def metrics(request: web.Request) -> web.Response:
    state = _state(request)
    lines = [
        "# HELP raftline_http_requests_total HTTP requests answered, by route and status.",
        "# TYPE raftline_http_requests_total counter",
    ]
    for (method, route, status), count in sorted(state.requests.items()):
        lines.append(
            f'raftline_http_requests_total{{method="{method}",route="{route}",'
            f'status="{status}"}} {count}'
        )
    lines += [
        "# HELP raftline_http_request_seconds_total Time spent answering HTTP requests, by route.",
        "# TYPE raftline_http_request_seconds_total counter",
    ]
    for (method, route), seconds in sorted(state.seconds.items()):
        lines.append(
            f'raftline_http_request_seconds_total{{method="{method}",route="{route}"}} '
            f"{seconds:.6f}"
        )
    for source in state.metric_sources:
        lines += source()
    text = state.broker.metrics_text().rstrip("\n") + "\n" + "\n".join(lines) + "\n"
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


async def cluster(request: web.Request) -> web.Response:
    return reply(request, await _state(request).broker.cluster())


async def create_topic(request: web.Request) -> web.Response:
    state = _state(request)
    spec = validation.create_topic_request(await read_body(request))
    # The controller picks the default factor and refuses one above the cluster's size: this
    # node's view of the registered nodes may lag just after the cluster starts.
    description = await state.broker.create_topic(
        spec.name, spec.partitions, spec.replication_factor, spec.config
    )
    state.topics.pop(spec.name, None)
    return reply(request, description, status=201)


async def list_topics(request: web.Request) -> web.Response:
    return reply(request, {"topics": await _state(request).broker.list_topics()})


async def describe_topic(request: web.Request) -> web.Response:
    return reply(request, await _state(request).broker.describe_topic(_topic(request)))


async def delete_topic(request: web.Request) -> web.Response:
    state = _state(request)
    topic = _topic(request)
    await state.broker.delete_topic(topic)
    state.topics.pop(topic, None)
    state.sticky.pop(topic, None)
    return web.Response(status=204)


def _assign_partitions(
    state: ApiState, topic: str, meta: TopicMeta, messages: list[validation.ProduceMessage]
) -> dict[int, list[int]]:
    """Message indexes per partition: explicit partition > key hash > one sticky partition."""
    groups: dict[int, list[int]] = {}
    sticky: int | None = None
    for index, message in enumerate(messages):
        if message.size > meta.max_message_bytes:
            raise ApiError(
                "message_too_large",
                f"messages[{index}] is {message.size} bytes; the topic allows "
                f"{meta.max_message_bytes} (max.message.bytes)",
            )
        if message.partition is not None:
            if message.partition >= meta.partitions:
                raise ApiError(
                    "unknown_partition",
                    f"topic {topic!r} has no partition {message.partition} "
                    f"({meta.partitions} partitions)",
                )
            partition = message.partition
        elif message.key is not None:
            partition = partition_for_key(message.key, meta.partitions)
        else:
            if sticky is None:
                sticky = state.next_sticky(topic, meta.partitions)
            partition = sticky
        groups.setdefault(partition, []).append(index)
    return groups


async def _produce_partition(
    state: ApiState,
    topic: str,
    partition: int,
    batch: bytes,
    acks: str,
    transactional_id: str | None = None,
) -> tuple[int, bool]:
    """(base offset, duplicate): duplicate when an idempotent producer's batch was there."""

    async def local() -> tuple[int, bool]:
        async with asyncio.timeout(PRODUCE_TIMEOUT_S):  # unlike wait_for, no task per request
            # Every batch reaching here was built by codec or passed records.check_batch.
            return await state.broker.append(
                topic, partition, batch, acks, crc_checked=True, transactional_id=transactional_id
            )

    async def remote(leader: str) -> tuple[int, bool]:
        return await state.forwarder.produce(
            leader, topic, partition, batch, acks, transactional_id
        )

    result: tuple[int, bool] = await state.with_leader(local, remote, forwarded=False)
    return result


async def produce(request: web.Request) -> web.Response:
    if request.content_type == codec.BATCH_CONTENT_TYPE:
        return await _produce_batch(request)
    state = _state(request)
    topic = _topic(request)
    spec = validation.produce_request(await read_body(request))
    meta = await state.topic_meta(topic)
    groups = _assign_partitions(state, topic, meta, spec.messages)
    if spec.producer is not None and len(groups) != 1:
        raise invalid(
            "with producer_id, producer_epoch and sequence every message must go to one "
            f"partition; these go to {sorted(groups)}"
        )
    now_ms = state.broker.clock.now_ms()
    batches = {
        partition: codec.encode_batch(
            [spec.messages[i] for i in indexes], meta.compression, now_ms, spec.producer
        )
        for partition, indexes in groups.items()
    }
    tid = spec.producer.transactional_id if spec.producer is not None else None
    work = [
        _produce_partition(state, topic, partition, batch, spec.acks, tid)
        for partition, batch in batches.items()
    ]
    if spec.acks == "none":
        task = asyncio.ensure_future(_fire_and_forget(work))
        state.background.add(task)
        task.add_done_callback(state.background.discard)
        return reply(request, {}, status=202)
    results = await asyncio.gather(*work)
    offsets: list[dict[str, int] | None] = [None] * len(spec.messages)
    for (partition, indexes), (base, _) in zip(groups.items(), results, strict=True):
        for delta, index in enumerate(indexes):
            offsets[index] = {"partition": partition, "offset": base + delta}
    answer: dict[str, Any] = {"offsets": offsets}
    if any(duplicate for _, duplicate in results):
        answer["duplicate"] = True  # an idempotent retry: nothing written, the original's offsets
    return reply(request, answer)


async def _produce_batch(request: web.Request) -> web.Response:
    """A record batch the producer built (`?partition=P&acks=...`): checked, then stored as
    sent. Answers `{"partition", "base_offset", "count"}`; the records got consecutive offsets."""
    state = _state(request)
    topic = _topic(request)
    text = request.query.get("partition")
    if text is None:
        raise invalid(f"a {codec.BATCH_CONTENT_TYPE} body needs the partition query parameter")
    partition = validation.partition_index(text)
    acks = request.query.get("acks", "all")
    if acks not in validation.ACKS:
        raise invalid(f"acks must be one of {', '.join(validation.ACKS)}")
    tid = request.query.get("transactional_id")
    if tid is not None:
        tid = validation.transactional_id(tid)
    body = await read_raw_body(request)
    batch, count = await checked_batch(state, topic, partition, body, tid)
    work = _produce_partition(state, topic, partition, batch, acks, tid)
    if acks == "none":
        task = asyncio.ensure_future(_fire_and_forget([work]))
        state.background.add(task)
        task.add_done_callback(state.background.discard)
        return reply(request, {}, status=202)
    base, duplicate = await work
    answer: dict[str, Any] = {"partition": partition, "base_offset": base, "count": count}
    if duplicate:
        answer["duplicate"] = True
    return reply(request, answer)


async def checked_batch(
    state: ApiState, topic: str, partition: int, body: bytes, tid: str | None
) -> tuple[bytes, int]:
    """A producer-built batch for `partition`, checked against the topic (codec.produced_batch):
    the batch to store and its record count. Shared by the POST and the produce stream."""
    meta = await state.topic_meta(topic)
    if partition >= meta.partitions:
        raise ApiError(
            "unknown_partition",
            f"topic {topic!r} has no partition {partition} ({meta.partitions} partitions)",
        )
    return codec.produced_batch(
        body, meta.max_message_bytes, meta.compression, transactional=tid is not None
    )


async def append_here(
    state: ApiState,
    topic: str,
    partition: int,
    batch: bytes,
    acks: str,
    tid: str | None = None,
) -> tuple[int, bool]:
    """Append a checked batch on this node, which must lead the partition (no forwarding):
    (base offset, duplicate). Not leading is an error naming the leader, when one is known."""
    try:
        async with asyncio.timeout(PRODUCE_TIMEOUT_S):
            return await state.broker.append(
                topic, partition, batch, acks, crc_checked=True, transactional_id=tid
            )
    except NotLeader as exc:
        error = from_broker_error(exc)
        error.extra["leader_http"] = exc.leader_http
        raise error from None


async def _fire_and_forget(work: list[Awaitable[int]]) -> None:
    results = await asyncio.gather(*work, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            log.warning("acks=none produce failed: %s", result)


async def internal_batch(request: web.Request) -> web.Response:
    """A batch forwarded by another node: append here or say who leads (never forward again)."""
    state = _state(request)
    topic = _topic(request)
    partition = validation.partition_index(request.match_info["partition"])
    acks = request.query.get("acks", "all")
    if acks not in validation.ACKS:
        raise invalid("acks must be one of all, leader, none")
    tid = request.query.get("transactional_id")
    batch = await read_raw_body(request)
    try:
        header = parse_header(batch)
        if len(batch) != header.size:
            raise CorruptBatchError(f"body of {len(batch)} bytes holds a {header.size}-byte batch")
        check_crc(batch, header)
    except CorruptBatchError as exc:
        raise invalid(f"body is not one record batch: {exc}") from None
    base, duplicate = await append_here(state, topic, partition, batch, acks, tid)
    return reply(request, {"base_offset": base, "duplicate": duplicate})


async def _fetch_local(
    state: ApiState,
    topic: str,
    partition: int,
    spec: validation.FetchRequest,
    raw: bool,
    record_filter: RecordFilter | None = None,
) -> dict[str, Any]:
    """The JSON answer's fields; with `raw`, whole batches under "batches" instead of
    "messages". With `record_filter`, only the records it matches (decoded, never raw); the
    others are passed over, and a fetch that has read FILTER_SCAN_BYTES without a match
    answers nothing with `next_offset` past them, so one request's work stays bounded."""
    matches = None if record_filter is None else record_filter.matches
    raw = raw and matches is None
    scanned = 0
    deadline = time.monotonic() + spec.wait_ms / 1000
    committed_only = spec.isolation == "read_committed"
    if spec.timestamp is not None:
        offset = await state.broker.local_offset_for_timestamp(topic, partition, spec.timestamp)
    else:
        offset = await _resolve_offset(state, topic, partition, spec.offset, committed_only)
    while True:
        wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
        if committed_only:
            batches, log_start, high_watermark, stable, end = await state.broker.fetch_stable(
                topic, partition, offset, spec.max_bytes, wait_ms
            )
        else:
            batches, log_start, high_watermark = await state.broker.fetch(
                topic, partition, offset, spec.max_bytes, wait_ms
            )
            stable = end = high_watermark
        if raw:
            decoded = codec.select_batches(batches, offset, spec.max_messages)
        else:
            decoded = codec.decode_batches(
                batches, partition, offset, spec.max_messages, spec.max_bytes, matches
            )
        next_offset = decoded.next_offset
        if matches is not None:
            scanned += sum(len(b) for b in batches)
        if committed_only and (not batches or next_offset >= _batch_end(batches[-1])):
            # everything kept was read: skip the aborted and control batches read after it
            next_offset = max(next_offset, end)
        # Batches holding only control records move the offset on: read (and wait) past them.
        caught_up = (next_offset >= stable and wait_ms == 0) or scanned >= FILTER_SCAN_BYTES
        if decoded.messages or next_offset == offset or caught_up:
            answer = {
                "batches" if raw else "messages": decoded.messages,
                "next_offset": next_offset,
                "log_start_offset": log_start,
                "high_watermark": high_watermark,
            }
            if committed_only:
                answer["last_stable_offset"] = stable
            return answer
        offset = next_offset


def _batch_end(batch: codec.Buffer) -> int:
    header = parse_header(batch)
    return int(header.base_offset + header.last_offset_delta + 1)


async def _resolve_offset(
    state: ApiState, topic: str, partition: int, offset: int | str, committed_only: bool = False
) -> int:
    if isinstance(offset, int):
        return offset
    if committed_only and offset == "latest":  # Kafka's: the last stable offset
        try:
            _, _, _, stable, _ = await state.broker.fetch_stable(topic, partition, 0, 1, 0)
        except BrokerError as exc:
            if exc.code != "offset_out_of_range":
                raise
            start = int(exc.extra["log_start_offset"])
            _, _, _, stable, _ = await state.broker.fetch_stable(topic, partition, start, 1, 0)
        return stable
    try:
        _, log_start, high_watermark = await state.broker.fetch(topic, partition, 0, 1, 0)
    except BrokerError as exc:
        if exc.code != "offset_out_of_range":
            raise
        log_start = int(exc.extra["log_start_offset"])
        high_watermark = int(exc.extra["high_watermark"])
    return log_start if offset == "earliest" else high_watermark


async def fetch(request: web.Request) -> web.Response:
    state = _state(request)
    topic = _topic(request)
    partition = validation.partition_index(request.match_info["partition"])
    spec = validation.fetch_request(dict(request.query))
    record_filter = from_query(request.query)
    # Whole stored batches when the client asks for them (it decodes them itself), unless a
    # filter picks records out of them: then JSON, as a forwarded fetch answers.
    raw = record_filter is None and codec.BATCH_CONTENT_TYPE in request.headers.get("Accept", "")

    async def local() -> dict[str, Any]:
        return await _fetch_local(state, topic, partition, spec, raw, record_filter)

    async def remote(leader: str) -> dict[str, Any]:
        params = {
            "offset": str(spec.offset),
            "max_messages": str(spec.max_messages),
            "max_bytes": str(spec.max_bytes),
            "wait_ms": str(spec.wait_ms),
            "isolation": spec.isolation,
        }
        if spec.timestamp is not None:  # the leader looks it up in its time index
            del params["offset"]
            params["timestamp"] = str(spec.timestamp)
        if record_filter is not None:
            params["filter"] = record_filter.source
        return await state.forwarder.fetch(leader, topic, partition, params)

    forwarded = FORWARDED_HEADER in request.headers
    try:
        body = await state.with_leader(local, remote, forwarded=forwarded, repeatable=True)
    except ApiError as exc:
        if forwarded and exc.code == "leader_unavailable":
            exc.extra.setdefault("leader_http", None)
        raise
    if raw and "batches" in body:
        return _batches_response(body)
    if wants_msgpack(request):
        body = codec.binary_headers_inline(body)
    return reply(request, body)  # JSON, also when a forwarded request came back as JSON


def _batches_response(body: dict[str, Any]) -> web.Response:
    """Batches back to back; the positions that a JSON answer carries go in headers."""
    return web.Response(
        body=_back_to_back(body["batches"]),
        content_type=codec.BATCH_CONTENT_TYPE,
        headers={
            "Raftline-Next-Offset": str(body["next_offset"]),
            "Raftline-Log-Start-Offset": str(body["log_start_offset"]),
            "Raftline-High-Watermark": str(body["high_watermark"]),
        },
    )


def _back_to_back(batches: list[codec.Buffer]) -> bytes:
    """The batches as one body; the read they were sliced from when they are all of it, which
    saves copying a large batch that a fetch returns alone."""
    if len(batches) == 1:
        view = batches[0]
        if (
            isinstance(view, memoryview)
            and type(view.obj) is bytes
            and view.nbytes == len(view.obj)
        ):
            return view.obj
    return b"".join(batches)


# ---- test hooks (only routed when the node runs with test_hooks) -----------------------------


async def set_clock_offset(request: web.Request) -> web.Response:
    """`{"offset_ms": n}` shifts this node's wall clock by n ms from real time; 0 restores it."""
    body = await read_body(request)
    clock = _state(request).broker.clock
    try:
        clock.set_offset_ms(body.get("offset_ms") if isinstance(body, dict) else None)
    except ValueError as exc:
        raise invalid(str(exc)) from None
    return reply(request, {"offset_ms": clock.offset_ms, "now_ms": clock.now_ms()})


async def set_network_faults(request: web.Request) -> web.Response:
    """Delay, reorder and duplicate this node's outgoing frames (see LinkFaults); `{}` clears."""
    try:
        faults = LinkFaults.parse(await read_body(request))
    except ValueError as exc:
        raise invalid(str(exc)) from None
    _state(request).broker.runtime.transport.link_faults = faults
    return reply(request, {} if faults is None else faults.describe())


# ---- application ---------------------------------------------------------------------------


def create_app(broker: Broker, *, self_http: str | None = None) -> web.Application:
    """The HTTP app for `broker`; `self_http` is this node's HOST:PORT (never forwarded to)."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[error_middleware])
    state = ApiState(broker, self_http)
    app[STATE_KEY] = state

    async def close_forwarder(_: web.Application) -> None:
        for task in list(state.background):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*state.background, return_exceptions=True)
        await state.forwarder.close()

    app.on_cleanup.append(close_forwarder)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/v1/cluster", cluster)
    app.router.add_post("/v1/topics", create_topic)
    app.router.add_get("/v1/topics", list_topics)
    app.router.add_get("/v1/topics/{topic}", describe_topic)
    app.router.add_delete("/v1/topics/{topic}", delete_topic)
    app.router.add_post("/v1/topics/{topic}/messages", produce)
    app.router.add_get("/v1/topics/{topic}/partitions/{partition}/messages", fetch)
    app.router.add_post("/v1/internal/topics/{topic}/partitions/{partition}/batch", internal_batch)
    from raftline.api import groups  # imported late: it builds on this module

    groups.add_routes(app)
    from raftline.api import producers, queues, restore

    producers.add_routes(app)
    restore.add_routes(app)

    queues.add_routes(app)
    from raftline.api import exchanges, produce_stream, requests, streams

    streams.add_routes(app)
    produce_stream.add_routes(app)
    exchanges.add_routes(app)
    requests.add_routes(app)
    if broker.config.test_hooks:
        app.router.add_post("/v1/admin/clock", set_clock_offset)
        app.router.add_post("/v1/admin/network", set_network_faults)
    return app
