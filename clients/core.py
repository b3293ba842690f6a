"""The client's calls, written once for both shells: each is an `Op`, a generator that yields
the requests to make (`Call`) and is sent their answers (or thrown their errors).

Owns the client state both shells share (bootstrap nodes, retry policy, body format, metadata),
the leader-directed and metadata steps every producer and consumer uses, and `ClientApi`: the
public admin, produce and fetch methods, each of which hands its Op to the shell's `_run`. The
blocking shell returns the result, the asyncio shell an awaitable of it. No I/O here.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from raftline.clients.metadata import Metadata
from raftline.clients.routing import Nodes, RetryPolicy, Tries
from raftline.clients.streaming import Grant, Open, Receive, Shut
from raftline.clients.wire import (
    Acked,
    Answer,
    BatchAcked,
    FetchedValues,
    FetchResult,
    RaftlineError,
    Request,
    batch_acked,
    batch_acks,
    batch_request,
    checked_wire,
    fetch_answer,
    fetch_request,
    fetched_values,
    group_path,
    json_acks,
    json_request,
    member_path,
    messages_path,
    produce_stream_path,
    streams_batches,
    topic_body,
    topic_path,
    values_request,
)
from raftline.raftlog.records import Record
from raftline.raftlog.speedups import keep_large_buffers

if TYPE_CHECKING:
    from raftline.clients.consuming import ConsumerApi
    from raftline.clients.grouping import GroupConsumerApi
    from raftline.clients.producing import ProducerApi
    from raftline.clients.queueing import QueueApi

_T = TypeVar("_T")
_S = TypeVar("_S")

DEFAULT_URL = "http://127.0.0.1:8080"
NO_RETRY = RetryPolicy(retries=0)


@dataclass(slots=True)
class Call:
    """One request for the shell to make, with the client's retries (unless the request says
    `retry=False`): to `url` first, or to a bootstrap node when it is None. The shell sends the
    Op the Answer or throws it the error. `stream`: a batch POST that may go as a frame on
    this produce stream path of the node instead (clients/produce_streams.py)."""

    method: str
    path: str
    request: Request
    url: str | None = None
    stream: str | None = None


@dataclass(slots=True)
class Pause:
    """Wait `seconds` before the Op goes on (the shell sleeps; the Op is then sent None)."""

    seconds: float


@dataclass(slots=True)
class Hook:
    """An application callback (a group consumer's on_assign or on_revoke) for the shell to
    run between two requests of an Op, in the caller's thread or task: the blocking shell
    calls it, the asyncio shell also awaits what it returns when that is awaitable. The Op is
    sent its result, or thrown its error."""

    function: Callable[..., Any]
    args: tuple[Any, ...] = ()

    def run(self) -> Any:
        return self.function(*self.args)

    async def awaited(self) -> Any:
        result = self.function(*self.args)
        return (await result) if inspect.isawaitable(result) else result


# sent an Answer after a Call, the result after a Hook, None after a Pause; a stream step
# (clients/streaming.py) its handle, frame or None
Op = Generator[Call | Hook | Pause | Open | Receive | Grant | Shut, Any, _T]
# What a public call gives: the value from the blocking Client, an awaitable of it from
# AsyncClient (the same method drives the same Op in either shell).
Returns = _T | Awaitable[_T]


class Step(Generic[_T]):
    """An Op driven one request at a time: `call` is the request to make now, None once the
    Op has ended with `result`. The shell sends it the Answer to each call, or throws it the
    error; an error the Op does not handle leaves `throw`."""

    def __init__(self, op: Op[_T]) -> None:
        self._op = op
        self.call: Call | Hook | None = None
        self.result: _T | None = None
        self._resume(op.send, None)

    def send(self, answer: Answer) -> None:
        self._resume(self._op.send, answer)

    def throw(self, error: BaseException) -> None:
        self._resume(self._op.throw, error)

    def _resume(self, how: Callable[[Any], Call | Hook], arg: Any) -> None:
        try:
            self.call = how(arg)
        except StopIteration as stop:
            self.call = None
            self.result = stop.value


def json_call(
    method: str,
    path: str,
    body: Any = None,
    params: dict[str, str] | None = None,
    url: str | None = None,
) -> Op[Any]:
    answer = yield Call(method, path, json_request(body, params), url)
    return answer.json()


def _then(op: Op[_S], then: Callable[[_S], _T]) -> Op[_T]:
    """`op`, its result passed through `then`."""
    return then((yield from op))


def _exchange(
    method: str, path: str, request: Request, url: str | None, stream: str | None = None
) -> Op[Answer]:
    return (yield Call(method, path, request, url, stream))


def _nothing(_: Any) -> None:
    return None


def removed_members(group: str, member_ids: Sequence[str] | None) -> Op[list[str]]:
    """DELETE each member (every current one when `member_ids` is None); the ids removed. A
    member already gone is no error."""
    if member_ids is None:
        described = yield from json_call("GET", group_path(group))
        member_ids = [m["member_id"] for m in described.get("members", [])]
    removed = []
    for member_id in member_ids:
        try:
            yield from json_call("DELETE", member_path(group, member_id))
        except RaftlineError as error:
            if error.code != "unknown_member":
                raise
        else:
            removed.append(member_id)
    return removed


class ClientCore:
    """The I/O-free state of both clients and the steps their producers and consumers share."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        wire: str = "batch",
    ) -> None:
        """`url` may list several nodes separated by commas (bootstrap order); `timeout` bounds
        each try in seconds; `wire` is "batch" (record batches) or "json"."""
        keep_large_buffers()  # batches of large messages: no fresh pages per buffer
        self.timeout = timeout
        self.metadata = Metadata()
        self.nodes = Nodes(url, self.metadata)
        self.urls = self.nodes.urls
        self.retry = retry or RetryPolicy()
        self.wire = checked_wire(wire)

    def _base_url(self, url: str | None) -> str:
        return self.nodes.base_url(url)

    def _tries(self, url: str | None, request: Request | None = None) -> Tries:
        """The tries of `request`: the client's retry policy, or one try when it says so."""
        policy = NO_RETRY if request is not None and not request.retry else self.retry
        return Tries(policy, self.nodes, url)

    def refreshed(self, topic: str) -> Op[None]:
        """Look the topic's partitions, their leaders and the nodes' addresses up again."""
        description = yield from json_call("GET", topic_path(topic))
        cluster = yield from json_call("GET", "/v1/cluster")
        self.metadata.update(description, cluster)

    def counted(self, topic: str) -> Op[int]:
        """The topic's partition count, looked up when the metadata is stale."""
        if not self.metadata.fresh(topic):
            yield from self.refreshed(topic)
        return self.metadata.partitions[topic]

    def to_leader(self, topic: str, partition: int, call: Callable[[str | None], Op[_T]]) -> Op[_T]:
        """`call` against the partition's leader; a retryable failure drops the metadata so
        that the next call looks the leader up again."""
        if not self.metadata.fresh(topic):
            yield from self.refreshed(topic)
        op = call(self.metadata.leader_url(topic, partition))
        try:
            return (yield from self._learning_leader(op, topic, partition))
        except RaftlineError as error:
            if error.retryable:
                self.metadata.invalidate(topic)
            raise

    def _learning_leader(self, op: Op[_T], topic: str, partition: int) -> Op[_T]:
        """`op` unchanged, but an answer that a node got from the partition's leader for us
        (header Raftline-Leader: its id) points the metadata at that leader: the leader moved,
        and the next call goes to it instead of paying a forward again."""
        answer: Any = None
        error: Exception | None = None
        while True:
            try:
                call = op.throw(error) if error is not None else op.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                answer, error = (yield call), None
            except Exception as thrown:  # the shell's failure of `call`: the op decides
                answer, error = None, thrown
                continue
            if isinstance(answer, Answer) and (leader := answer.headers.get("raftline-leader")):
                self.metadata.leader_moved(topic, partition, int(leader))

    def fetched(
        self,
        topic: str,
        partition: int,
        offset: int | str,
        max_messages: int,
        max_bytes: int,
        wait_ms: int,
        url: str | None,
        values: bool,
        isolation: str = "read_uncommitted",
        record_filter: str | None = None,
    ) -> Op[FetchResult | FetchedValues]:
        """One fetch; with `values`, only the values; with `record_filter` (an expression,
        README "Filters"), only the records it matches."""
        request = fetch_request(self.wire, offset, max_messages, max_bytes, wait_ms, isolation)
        if record_filter is not None:
            assert request.params is not None
            request.params["filter"] = record_filter
        answer = yield Call("GET", messages_path(topic, partition), request, url)
        if values:
            return fetched_values(answer, offset, max_messages)
        return fetch_answer(answer, partition, offset, max_messages)


class ClientApi(ClientCore):
    """The public calls of Client and AsyncClient, written once. A shell supplies `_run` and
    the classes of its producers and consumers."""

    producer_class: type[ProducerApi]
    consumer_class: type[ConsumerApi]
    queue_class: type[QueueApi]
    group_consumer_class: type[GroupConsumerApi]

    def _run(self, op: Op[_T]) -> Returns[_T]:
        raise NotImplementedError

    def producer(self, topic: str, **options: Any) -> Any:
        """A producer of `topic` (Producer or AsyncProducer); options as ProducerApi."""
        return self.producer_class(self, topic, **options)

    def consumer(self, topic: str | Sequence[str], **options: Any) -> Any:
        """A consumer of `topic` (Consumer or AsyncConsumer; options as ConsumerCore), or with
        `group=`, a member of that consumer group reading the topic (or list of topics) from
        the group's committed offsets (GroupConsumer or AsyncGroupConsumer; options as
        GroupConsumerCore)."""
        if options.get("group") is not None:
            return self.group_consumer_class(self, topic, **options)
        if not isinstance(topic, str):
            raise ValueError("a consumer without a group reads one topic")
        return self.consumer_class(self, topic, **options)

    def queue(self, name: str, **options: Any) -> Any:
        """A queue (Queue or AsyncQueue): receive messages and ack, release or reject each;
        options as QueueCore."""
        return self.queue_class(self, name, **options)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        url: str | None = None,
    ) -> Returns[Any]:
        """One JSON request with retries on retryable errors; raises RaftlineError."""
        return self._run(json_call(method, path, body, params, url))

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> Returns[dict[str, Any]]:
        body = topic_body(name, partitions, replication_factor, config)
        return self._run(json_call("POST", "/v1/topics", body))

    def list_topics(self) -> Returns[list[dict[str, Any]]]:
        return self._run(_then(json_call("GET", "/v1/topics"), itemgetter("topics")))

    def describe_topic(self, name: str) -> Returns[dict[str, Any]]:
        return self._run(json_call("GET", topic_path(name)))

    def delete_topic(self, name: str) -> Returns[None]:
        return self._run(_then(json_call("DELETE", topic_path(name)), _nothing))

    def cluster(self) -> Returns[dict[str, Any]]:
        return self._run(json_call("GET", "/v1/cluster"))

    def restore(self, topics: list[str] | None = None) -> Returns[list[dict[str, Any]]]:
        """Rebuild topics from the cluster's object storage (every topic of the bucket when
        `topics` is None); topics that exist are left alone. See API.md "Object storage"."""
        body = {} if topics is None else {"topics": topics}
        return self._run(_then(json_call("POST", "/v1/restore", body), itemgetter("topics")))

    def produce(
        self, topic: str, messages: list[dict[str, Any]], acks: str = "all", url: str | None = None
    ) -> Returns[list[Acked]]:
        """Send already-encoded messages (see encode_message) in one request."""
        body = {"acks": acks, "messages": messages}
        op = json_call("POST", messages_path(topic), body, url=url)
        return self._run(_then(op, json_acks))

    def produce_records(
        self,
        topic: str,
        partition: int,
        records: list[Record],
        acks: str = "all",
        url: str | None = None,
    ) -> Returns[list[Acked]]:
        """Send records (see encode_record) to one partition as one batch built here."""
        request = batch_request(partition, records, acks)
        op = _exchange("POST", messages_path(topic), request, url)
        return self._run(_then(op, lambda answer: batch_acks(answer.json())))

    def produce_batch(
        self,
        topic: str,
        partition: int,
        values: Sequence[bytes | str | None],
        acks: str = "all",
        *,
        key: bytes | str | None = None,
        url: str | None = None,
        transport: str = "http",
    ) -> Returns[BatchAcked]:
        """Send values (all with `key`) to one partition as one record batch (whatever the
        wire); one answer for all. `transport="stream"`: as a frame on the node's produce
        stream (by POST if that fails), as a producer with that option sends."""
        request = values_request(partition, values, key, acks)
        stream = produce_stream_path(topic) if streams_batches(transport, "batch", acks) else None
        op = _exchange("POST", messages_path(topic), request, url, stream)
        return self._run(_then(op, lambda a: batch_acked(a.json(), partition, len(values))))

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int | str = "earliest",
        *,
        max_messages: int = 500,
        max_bytes: int = 1 << 20,
        wait_ms: int = 0,
        url: str | None = None,
        filter: str | None = None,
    ) -> Returns[FetchResult]:
        """One fetch; `filter`: only the records this expression matches (README "Filters");
        `next_offset` still passes the others."""
        return self._run(
            self.fetched(
                topic,
                partition,
                offset,
                max_messages,
                max_bytes,
                wait_ms,
                url,
                False,
                record_filter=filter,
            )
        )

    def fetch_values(
        self,
        topic: str,
        partition: int,
        offset: int | str = "earliest",
        *,
        max_messages: int = 500,
        max_bytes: int = 1 << 20,
        wait_ms: int = 0,
        url: str | None = None,
    ) -> Returns[FetchedValues]:
        """As fetch, but only the values: no Message per record. `url` names the node to ask
        (consumers give the partition leader: a forwarded fetch comes back as JSON)."""
        return self._run(
            self.fetched(topic, partition, offset, max_messages, max_bytes, wait_ms, url, True)
        )

    def fetch_batches(
        self,
        topic: str,
        partition: int,
        offset: int | str,
        *,
        max_bytes: int = 1 << 20,
        isolation: str = "read_uncommitted",
    ) -> Returns[Answer]:
        """One fetch of whole stored batches from the partition's leader, answered as it came
        (for readers that decode batches themselves): `raw` holds the batches back to back and
        `headers` the raftline-next-offset position; a JSON body if a node forwarded it."""
        request = fetch_request("batch", offset, 100_000, max_bytes, 0, isolation)  # API max

        def fetch(url: str | None) -> Op[Answer]:
            return (yield Call("GET", messages_path(topic, partition), request, url))

        return self._run(self.to_leader(topic, partition, fetch))

    # ---- consumer groups (admin) --------------------------------------------------------------

    def list_groups(self) -> Returns[list[dict[str, Any]]]:
        """Every group: `{"group", "state", "members"}`."""
        return self._run(_then(json_call("GET", "/v1/groups"), itemgetter("groups")))

    def describe_group(self, group: str) -> Returns[dict[str, Any]]:
        """State, generation, members with their assignments, and committed offsets with lag."""
        return self._run(json_call("GET", group_path(group)))

    def group_offsets(self, group: str) -> Returns[list[dict[str, Any]]]:
        """Committed offsets: `{"topic", "partition", "offset", "high_watermark", "lag"}`."""
        op = json_call("GET", group_path(group, "offsets"))
        return self._run(_then(op, itemgetter("offsets")))

    def reset_group_offsets(
        self, group: str, topic: str, to: str | dict[str, int]
    ) -> Returns[list[dict[str, Any]]]:
        """Move the group's committed offsets of `topic` to "earliest", "latest",
        {"timestamp": ms} or {"offset": n}; only while the group has no members (else
        RaftlineError group_not_empty). Returns the new offsets."""
        op = json_call("POST", group_path(group, "offsets", "reset"), {"topic": topic, "to": to})
        return self._run(_then(op, itemgetter("offsets")))

    def remove_group_members(
        self, group: str, member_ids: Sequence[str] | None = None
    ) -> Returns[list[str]]:
        """Remove members (every member when `member_ids` is None), as if they had left: their
        partitions go to the others. Returns the ids removed."""
        return self._run(removed_members(group, member_ids))

    def delete_group(self, group: str) -> Returns[None]:
        """Forget a group without members, committed offsets included."""
        return self._run(_then(json_call("DELETE", group_path(group)), _nothing))

    def refresh_metadata(self, topic: str) -> Returns[None]:
        return self._run(self.refreshed(topic))

    def partition_count(self, topic: str) -> Returns[int]:
        return self._run(self.counted(topic))
