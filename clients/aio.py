"""The asyncio shell: drives the client's Ops over one aiohttp session on the running loop.

Owns the session, the try-and-sleep loop of one request, and the producer's timer and send
tasks (one task per batch in flight; the core allows one per partition). Every decision comes
from the core modules; this file only sends, waits and sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import aiohttp

from raftline.api.codec import read_whole_body
from raftline.clients import websocket, wire
from raftline.clients.consuming import ConsumerApi
from raftline.clients.core import Call, Hook, Op, Pause, Step
from raftline.clients.exchanging import RoutingClientApi
from raftline.clients.grouping import GroupConsumerApi
from raftline.clients.produce_streams import ProduceStreams
from raftline.clients.producing import ProducerApi
from raftline.clients.queueing import QueueApi, QueueMessage
from raftline.clients.streaming import Grant, Open, Receive, Shut
from raftline.clients.wire import Message

_T = TypeVar("_T")


class AsyncClient(RoutingClientApi):
    """asyncio client over one aiohttp ClientSession (keep-alive connections are reused).
    Its calls are those of Client, awaited."""

    _session: aiohttp.ClientSession | None = None
    _produce_streams: ProduceStreams | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self.timeout)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def close(self) -> None:
        if self._produce_streams is not None:
            await self._produce_streams.close()
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _once(
        self, method: str, path: str, request: wire.Request, url: str | None
    ) -> wire.Answer:
        """One try at `url` (None: the bootstrap node asked now)."""
        base = self._base_url(url)
        try:
            async with self._http().request(
                method,
                base + path,
                data=request.payload,
                params=request.params,
                headers=request.headers,
            ) as response:
                raw = await read_whole_body(response.content, response.content_length)
                status = response.status
                headers = dict(response.headers.items())
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise wire.connection_error(base, exc) from exc
        return wire.answer(status, headers, raw, base)

    async def _run(self, op: Op[_T]) -> _T:
        """`op` to its end: each request it yields is made (with retries) and answered."""
        step = Step(op)
        while (call := step.call) is not None:
            if isinstance(call, Pause):  # a producer waiting before it sends a batch again
                await asyncio.sleep(call.seconds)
                step.send(None)  # type: ignore[arg-type]  # a Pause is answered with None
                continue
            try:
                if isinstance(call, Hook):  # an application callback, awaited if async
                    result = await call.awaited()
                elif isinstance(call, Open):
                    result = await self._opened(call)
                elif isinstance(call, Receive):
                    result = await websocket.receive_frame(call)
                elif isinstance(call, Grant):
                    result = await websocket.send_credit(call)
                elif isinstance(call, Shut):
                    result = await websocket.close_stream(call.stream)
                elif call.stream is not None:  # a batch that may go on a produce stream
                    result = await self._streamed(call)
                else:
                    result = await self.exchange(call.method, call.path, call.request, call.url)
            except Exception as error:  # the Op decides: a producer fails its batch's futures
                step.throw(error)
            else:
                step.send(result)
        return step.result  # type: ignore[return-value]  # set when the Op returned

    async def _streamed(self, call: Call) -> wire.Answer:
        """A batch POST as a frame on the node's produce stream; by POST if that fails."""
        assert call.stream is not None
        if self._produce_streams is None:
            self._produce_streams = ProduceStreams(self._open_produce_stream, self.timeout)

        base = self._base_url(call.url)
        answer = await self._produce_streams.answered(base, call.stream, call.request)
        if answer is None:
            return await self.exchange(call.method, call.path, call.request, call.url)
        return answer

    async def _open_produce_stream(
        self, base: str, path: str, params: dict[str, str]
    ) -> aiohttp.ClientWebSocketResponse:
        return await websocket.open_stream(self._http(), base, path, params, self.timeout)

    async def _opened(self, call: Open) -> Any:
        """A stream opened with the client's retries on retryable failures."""
        tries = self._tries(call.url)
        while True:
            base = self._base_url(tries.url)
            try:
                return await websocket.open_stream(
                    self._http(), base, call.path, call.params, self.timeout
                )
            except wire.RaftlineError as error:
                await asyncio.sleep(tries.failed(error))

    async def exchange(
        self, method: str, path: str, request: wire.Request, url: str | None = None
    ) -> wire.Answer:
        """One request of any body format, with retries on retryable errors."""
        tries = self._tries(url, request)
        while True:
            try:
                return await self._once(method, path, request, tries.url)
            except wire.RaftlineError as error:
                await asyncio.sleep(tries.failed(error))


class AsyncProducer(ProducerApi):
    """asyncio twin of Producer: `await send(...)` queues and returns a Future of Acked."""

    client: AsyncClient

    def __init__(self, client: AsyncClient, topic: str, **options: Any) -> None:
        super().__init__(client, topic, **options)
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._identifying: asyncio.Task[None] | None = None

    async def _queued(self, add: Callable[[int, Any], bool]) -> asyncio.Future[Any]:
        if self._core.needs_identity:  # an idempotent producer's id, asked for once
            if self._identifying is None or self._identifying.done():
                self._identifying = asyncio.ensure_future(self.client._run(self._core.identified()))
            await asyncio.shield(self._identifying)
        metadata = self.client.metadata
        if metadata.fresh(self.topic):  # skips a coroutine per message on the common path
            partitions = metadata.partitions[self.topic]
        else:
            partitions = await self.client.partition_count(self.topic)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if add(partitions, future):
            self._dispatch(everything=False)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self._core.linger_s, self._dispatch, False
            )
        return future

    def _dispatch(self, everything: bool) -> None:
        """Start a task for every batch the core lets go now; wake again when one is due."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for batch in self._core.ready(everything):
            task = asyncio.ensure_future(self.client._run(self._core.sending(batch)))
            self._in_flight.add(task)
            task.add_done_callback(self._sent)
        deadline = self._core.next_deadline()
        if deadline is not None:
            self._timer = asyncio.get_running_loop().call_later(
                max(0.0, deadline - time.monotonic()), self._dispatch, False
            )

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._dispatch(everything=False)  # the partition's next batch may go now

    def begin(self) -> None:
        """Start a transaction (one opens implicitly with the first message; for symmetry)."""

    async def send_offsets_to_transaction(
        self,
        offsets: dict[tuple[str, int], int],
        group: str,
        member: tuple[str, int] | None = None,
    ) -> None:
        """See the blocking Producer's."""
        await self.client._run(self._core.offsets_sent(group, offsets, member))

    async def commit(self) -> None:
        await self.flush()
        await self.client._run(self._core.ended(commit=True))

    async def abort(self) -> None:
        await self.flush()
        await self.client._run(self._core.ended(commit=False))

    async def flush(self) -> None:
        self._dispatch(everything=True)
        while self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)

    async def close(self) -> None:
        await self.flush()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncConsumer(ConsumerApi):
    """asyncio twin of Consumer; `async for message in consumer` long-polls forever."""

    client: AsyncClient

    async def __aiter__(self) -> AsyncIterator[Message]:
        while True:
            for message in await self.poll():  # type: ignore[misc]  # awaitable here
                yield message


class AsyncQueue(QueueApi):
    """asyncio twin of Queue: `async for message in queue`, `async with message:`."""

    client: AsyncClient

    async def __aiter__(self) -> AsyncIterator[QueueMessage]:
        while True:
            for message in await self.receive():  # type: ignore[misc]  # awaitable here
                yield message


class AsyncGroupConsumer(GroupConsumerApi):
    """asyncio twin of GroupConsumer: `await poll()`, `async for`, `await commit()`; a task
    heartbeats while the application is busy between polls. Callbacks may be coroutines."""

    client: AsyncClient
    _heart: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_delay())
            await self.client._run(self.heartbeated())

    def _beating(self) -> None:
        if self._heart is None:
            self._heart = asyncio.ensure_future(self._beat())

    async def poll(self) -> list[Message]:  # type: ignore[override]  # awaitable here
        self._beating()
        return await self.client._run(self.polled())

    async def __aiter__(self) -> AsyncIterator[Message]:
        self._beating()
        while True:
            yield await self.client._run(self.next_message())

    async def close(self) -> None:
        """Commit (with auto-commit), call on_revoke, leave the group."""
        if self._heart is not None:
            self._heart.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heart
        await self.client._run(self.leaving())

    async def __aenter__(self) -> AsyncGroupConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


AsyncClient.producer_class = AsyncProducer
AsyncClient.queue_class = AsyncQueue
AsyncClient.consumer_class = AsyncConsumer
AsyncClient.group_consumer_class = AsyncGroupConsumer
