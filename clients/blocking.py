"""The blocking shell: drives the client's Ops over http.client from the caller's thread.

Owns keep-alive connections shared by threads, the try-and-sleep loop of one request, and the
producer's sender thread. Every decision (what to send, where, whether to retry, which batch
goes next) comes from the core modules; this file only sends, waits and sleeps.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from raftline.clients import websocket, wire
from raftline.clients.consuming import ConsumerApi
from raftline.clients.core import Call, Hook, Op, Pause, Step
from raftline.clients.exchanging import RoutingClientApi
from raftline.clients.grouping import GroupConsumerApi
from raftline.clients.produce_streams import ProduceStreams
from raftline.clients.producing import Batch, ProducerApi
from raftline.clients.queueing import QueueApi, QueueMessage
from raftline.clients.streaming import Grant, Open, Receive, Shut
from raftline.clients.wire import Message

_T = TypeVar("_T")


class _ConnectionPool:
    """Idle keep-alive http.client connections per host, shared by threads."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def request(
        self,
        url: str,
        method: str,
        path: str,
        body: bytes | bytearray | None,
        headers: dict[str, str],
    ) -> tuple[int, dict[str, str], bytes]:
        host = urllib.parse.urlsplit(url).netloc
        for reused in (True, False):
            connection = self._take(host) if reused else None
            fresh = connection is None
            if connection is None:
                connection = http.client.HTTPConnection(host, timeout=self.timeout)
            try:
                connection.request(method, path, body=body, headers=headers)
                response = connection.getresponse()
                raw = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                connection.close()
                if fresh:
                    raise
                continue  # a stale idle connection the server had closed: once more, fresh
            except BaseException:
                connection.close()
                raise
            if response.will_close:
                connection.close()
            else:
                self._give(host, connection)
            return response.status, dict(response.getheaders()), raw
        raise ConnectionError(f"{url}: no connection")

    def _take(self, host: str) -> http.client.HTTPConnection | None:
        with self._lock:
            idle = self._idle.get(host)
            return idle.pop() if idle else None

    def _give(self, host: str, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.setdefault(host, []).append(connection)

    def close(self) -> None:
        with self._lock:
            for idle in self._idle.values():
                for connection in idle:
                    connection.close()
            self._idle.clear()


class Client(RoutingClientApi):
    """Blocking client. `url` may list several nodes separated by commas (bootstrap order)."""

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)  # url, timeout, retry, wire: see ClientCore
        self._pool = _ConnectionPool(self.timeout)
        self._loop_thread: websocket.LoopThread | None = None  # streams' I/O, made when needed
        self._produce_streams: ProduceStreams | None = None  # on the loop thread

    def close(self) -> None:
        self._pool.close()
        if self._produce_streams is not None and self._loop_thread is not None:
            self._loop_thread.run(self._produce_streams.close())
        if self._loop_thread is not None:
            self._loop_thread.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _once(self, method: str, path: str, request: wire.Request, url: str | None) -> wire.Answer:
        """One try at `url` (None: the bootstrap node asked now)."""
        base = self._base_url(url)
        params = request.params
        target = path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            status, headers, raw = self._pool.request(
                base, method, target, request.payload, request.headers
            )
        except (OSError, http.client.HTTPException) as exc:
            raise wire.connection_error(base, exc) from exc
        return wire.answer(status, headers, raw, base)

    def _run(self, op: Op[_T]) -> _T:
        """`op` to its end: each request it yields is made (with retries) and answered."""
        step = Step(op)
        while (call := step.call) is not None:
            if isinstance(call, Pause):  # a producer waiting before it sends a batch again
                time.sleep(call.seconds)
                step.send(None)  # type: ignore[arg-type]  # a Pause is answered with None
                continue
            try:
                if isinstance(call, Hook):  # an application callback, in this thread
                    result = call.run()
                elif isinstance(call, Open):
                    result = self._opened(call)
                elif isinstance(call, Receive):
                    frame = websocket.receive_frame(call)
                    result = self._streams().run(frame)
                elif isinstance(call, Grant):
                    result = self._streams().run(websocket.send_credit(call))
                elif isinstance(call, Shut):
                    result = self._streams().run(websocket.close_stream(call.stream))
                elif call.stream is not None:  # a batch that may go on a produce stream
                    result = self._streamed(call)
                else:
                    result = self.exchange(call.method, call.path, call.request, call.url)
            except Exception as error:  # the Op decides: a producer fails its batch's futures
                step.throw(error)
            else:
                step.send(result)
        return step.result  # type: ignore[return-value]  # set when the Op returned

    def _streams(self) -> websocket.LoopThread:
        if self._loop_thread is None:
            self._loop_thread = websocket.LoopThread(self.timeout)
        return self._loop_thread

    def _streamed(self, call: Call) -> wire.Answer:
        """A batch POST as a frame on the node's produce stream (on the streams' loop); by
        POST, from this thread, if that fails."""
        assert call.stream is not None
        streams = self._streams()
        if self._produce_streams is None:
            self._produce_streams = ProduceStreams(streams.opened, self.timeout)
        base = self._base_url(call.url)
        answer = streams.run(self._produce_streams.answered(base, call.stream, call.request))
        if answer is None:
            return self.exchange(call.method, call.path, call.request, call.url)
        return answer

    def _opened(self, call: Open) -> Any:
        """A stream opened with the client's retries on retryable failures."""
        tries = self._tries(call.url)
        while True:
            base = self._base_url(tries.url)
            try:
                return self._streams().run(self._streams().opened(base, call.path, call.params))
            except wire.RaftlineError as error:
                time.sleep(tries.failed(error))

    def exchange(
        self, method: str, path: str, request: wire.Request, url: str | None = None
    ) -> wire.Answer:
        """One request of any body format, with retries on retryable errors."""
        tries = self._tries(url, request)
        while True:
            try:
                return self._once(method, path, request, tries.url)
            except wire.RaftlineError as error:
                time.sleep(tries.failed(error))


class Producer(ProducerApi):
    """Batches messages per partition (linger_ms, batch_bytes) and sends each batch to the
    partition leader from a background thread. send() returns a Future of Acked.
    `compression` ("none", "gzip", "snappy", "lz4", "zstd") compresses the batches it builds."""

    client: Client

    def __init__(self, client: Client, topic: str, **options: Any) -> None:
        super().__init__(client, topic, **options)
        if self._core.needs_identity:
            client._run(self._core.identified())
        self._wake = threading.Condition()
        self._closed = False
        self._flush_requested = False
        self._thread = threading.Thread(
            target=self._send_all, name="raftline-producer", daemon=True
        )
        self._thread.start()

    def _queued(self, add: Callable[[int, Any], bool]) -> concurrent.futures.Future[Any]:
        partitions = self.client.partition_count(self.topic)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._wake:
            if self._closed:
                raise RuntimeError("producer is closed")
            add(partitions, future)
            self._wake.notify()
        return future

    def begin(self) -> None:
        """Start a transaction (one opens implicitly with the first message; for symmetry)."""

    def send_offsets_to_transaction(
        self,
        offsets: dict[tuple[str, int], int],
        group: str,
        member: tuple[str, int] | None = None,
    ) -> None:
        """Consumer offsets that `group` commits if and only if the transaction commits.
        `member`: the consumer's (member id, generation), which fences the offsets by the
        group's generation as Kafka's KIP-447 does (409 stale_generation once the partitions
        moved on)."""
        self.client._run(self._core.offsets_sent(group, offsets, member))

    def commit(self) -> None:
        """Send everything queued, then commit the transaction (all or nothing)."""
        self.flush()
        self.client._run(self._core.ended(commit=True))

    def abort(self) -> None:
        """Send everything queued, then abort the transaction: read_committed never sees it."""
        self.flush()
        self.client._run(self._core.ended(commit=False))

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued and wait for the answers."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._wake:
            self._flush_requested = True
            self._wake.notify()
            while not self._core.idle():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError("flush timed out")
                self._wake.wait(remaining)

    def close(self) -> None:
        self.flush()
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_batches(self) -> list[Batch]:
        """Waits until batches are due; none once the producer is closed and idle."""
        with self._wake:
            while True:
                batches = self._core.ready(self._flush_requested or self._closed)
                self._flush_requested = False
                if batches or (self._closed and self._core.idle()):
                    return batches
                deadline = self._core.next_deadline()
                self._wake.wait(None if deadline is None else deadline - time.monotonic())

    def _send_all(self) -> None:
        """The sender thread: every batch as it becomes due, one after the other."""
        while batches := self._next_batches():
            for batch in batches:
                self.client._run(self._core.sending(batch))
            with self._wake:
                self._wake.notify_all()


class Consumer(ConsumerApi):
    """Reads partitions of a topic by offset; iterating long-polls forever."""

    client: Client

    def __init__(self, client: Client, topic: str, **options: Any) -> None:
        super().__init__(client, topic, **options)
        client._run(self.positioned())  # the partition count is looked up now

    def __iter__(self) -> Iterator[Message]:
        while True:
            yield from self.poll()  # type: ignore[misc]  # a list from the blocking client


class Queue(QueueApi):
    """A queue's receiver and admin; `for message in queue` long-polls forever, and `with
    message:` acknowledges it when the block ends normally, releases it when it raises."""

    client: Client

    def __iter__(self) -> Iterator[QueueMessage]:
        while True:
            yield from self.receive()  # type: ignore[misc]  # a list here


class GroupConsumer(GroupConsumerApi):
    """A member of a consumer group (options as GroupConsumerCore); iterating long-polls
    forever. A background thread heartbeats while the application is busy between polls;
    callbacks run in the polling thread."""

    client: Client

    def __init__(self, client: Client, topic: str | list[str], **options: Any) -> None:
        super().__init__(client, topic, **options)
        self._stop = threading.Event()
        self._heart = threading.Thread(target=self._beat, name="raftline-heartbeat", daemon=True)
        self._heart.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_delay()):
            self.client._run(self.heartbeated())

    def __iter__(self) -> Iterator[Message]:
        while True:
            yield self.client._run(self.next_message())

    def close(self) -> None:
        """Commit (with auto-commit), call on_revoke, leave the group."""
        self._stop.set()
        self._heart.join(self.client.timeout)
        self.client._run(self.leaving())

    def __enter__(self) -> GroupConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Client.producer_class = Producer
Client.queue_class = Queue
Client.consumer_class = Consumer
Client.group_consumer_class = GroupConsumer
