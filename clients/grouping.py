"""The group consumer's decisions, written once for both shells: join, fetch, heartbeat, move to
a new generation, commit, leave.

Owns one member's view of its consumer group (member id, generation, assignment), what the
application has consumed (per partition, the offset after the last message handed to it), when a
heartbeat and an auto-commit are due, what each answer means (a new generation: commit, revoke,
assign; 404 unknown_member: join again with the same member id; 409 stale_generation: ask for the
current generation and commit again with it) and the order of the application's callbacks. The
server keeps the member's fetch positions; the client never picks offsets. No I/O and no threads
here: every step is an Op the shell drives, and callbacks go out as Hooks to run in the caller's
thread or task.

Invariants:
- A commit names only offsets of messages handed to the application (by poll or iteration),
  so nothing is committed that was not returned: at-least-once.
- Before a rebalance takes partitions from this member the group says so (rebalancing: true in
  its current generation); the next poll then auto-commits what was handed out (when on), while
  that generation's commits still count (API.md fences commits by generation), and only then
  answers again, which lets the rebalance go ahead.
- on_revoke(partitions) runs before any of them is given up (their buffered messages dropped)
  and before the new generation is taken.
- A member that lost its membership (404, 409) commits nothing more of what it held: its
  partitions are revoked as lost (on_revoke runs, commits in it do nothing) before it joins again.
- Consumed and committed offsets of a partition only move forward while it is held.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from raftline.clients.core import Call, ClientApi, ClientCore, Hook, Op, Returns, json_call
from raftline.clients.streaming import StreamCursor
from raftline.clients.wire import (
    Message,
    RaftlineError,
    group_path,
    json_message,
    json_request,
    member_path,
)

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Callback = Callable[[list[TopicPartition]], Any]

# Group fetches long-poll under a second: the server's keep-alive watch of a long-poll first
# fires at 1 s, and a fetch that ends just as it fires can hang until the client's timeout
# (Python 3.11's wait_for can lose the watch's cancellation). Rebalances are still seen at once:
# an empty long-poll makes the next poll heartbeat first.
DEFAULT_WAIT_MS = 900
GONE = ("unknown_member", "unknown_group")  # the member is no longer one: it joins again
AUTO_OFFSET_RESETS = ("earliest", "latest")
HEARTBEATS_PER_SESSION = 3  # a heartbeat goes out after a third of the session without contact


def _partitions(items: Iterable[dict[str, Any]]) -> list[TopicPartition]:
    return sorted((str(item["topic"]), int(item["partition"])) for item in items)


class GroupConsumerCore:
    """A member of consumer group `group` reading `topics` (a name or a list of names).

    `auto_commit_interval_ms`: commit what was consumed this often (checked at each poll), before
    each revocation and at close; None: only `commit()` commits. `on_assign` / `on_revoke` are
    called with the sorted (topic, partition) pairs gained / about to be given up (in the
    asyncio shell they may be coroutine functions). `member_id` names the member (static
    membership: a restart with the same id takes its place); by default a random one.
    `session_timeout_ms`: the server drops a member silent this long. `auto_offset_reset`: where
    partitions without a committed offset start. `wait_ms`, `max_messages`, `max_bytes`: of each
    group fetch. `max_poll_interval_ms`: heartbeats stop when the application has not polled
    for this long, so an abandoned consumer's partitions go to the others. `filter`: only the
    records this expression matches (README "Filters"); positions and commits still pass the
    others. `stream=True`: the group's node pushes each group fetch answer over a WebSocket,
    at most `prefetch` (default max_messages) messages ahead of what was handed out; where the
    upgrade is refused, the member long-polls."""

    def __init__(
        self,
        client: ClientCore,
        topics: str | Sequence[str],
        *,
        group: str,
        auto_commit_interval_ms: int | None = 5000,
        on_assign: Callback | None = None,
        on_revoke: Callback | None = None,
        member_id: str | None = None,
        session_timeout_ms: int = 10_000,
        auto_offset_reset: str = "latest",
        wait_ms: int = DEFAULT_WAIT_MS,
        max_messages: int = 500,
        max_bytes: int = 1 << 20,
        max_poll_interval_ms: int = 300_000,
        clock: Callable[[], float] = time.monotonic,
        filter: str | None = None,
        stream: bool = False,
        prefetch: int | None = None,
    ) -> None:
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics or not all(isinstance(t, str) and t for t in self.topics):
            raise ValueError("a group consumer needs one or more topic names")
        if not isinstance(group, str) or not group:
            raise ValueError("group must be a non-empty name")
        if auto_offset_reset not in AUTO_OFFSET_RESETS:
            raise ValueError(f"auto_offset_reset must be earliest or latest: {auto_offset_reset!r}")
        if auto_commit_interval_ms is not None and auto_commit_interval_ms <= 0:
            raise ValueError("auto_commit_interval_ms must be positive, or None for manual commits")
        if session_timeout_ms <= 0:
            raise ValueError("session_timeout_ms must be positive")
        self.client = client
        self.group = group
        self.member_id = member_id or f"raftline-{uuid.uuid4().hex}"
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self.session_timeout_ms = session_timeout_ms
        self.auto_offset_reset = auto_offset_reset
        self.wait_ms = wait_ms
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.max_poll_interval_s = max_poll_interval_ms / 1000
        self.heartbeat_s = session_timeout_ms / 1000 / HEARTBEATS_PER_SESSION
        self.clock = clock
        self.record_filter = filter
        self.stream = StreamCursor(stream, prefetch or max_messages, client.nodes, clock)

        self.generation: int | None = None  # None: not a member (yet, or any more)
        self.assignment: list[TopicPartition] = []
        self.consumed: dict[TopicPartition, int] = {}  # next offset after what was handed out
        self.committed: dict[TopicPartition, int] = {}  # what this member committed last
        # Fetched, not yet handed out: (message, its partition, consumed offset once handed).
        self._buffer: deque[tuple[Message, TopicPartition, int]] = deque()
        self._rejoin = True  # the next poll joins (first, or after the membership was lost)
        self._resync = False  # the next poll joins again, still a member (see joined)
        self._lost = False  # while partitions are revoked as lost: commits do nothing
        self._noticed: tuple[int, list[TopicPartition]] | None = None  # a heartbeat's news
        # Heartbeat before the next fetch: the last one said the group is rebalancing, or
        # long-polled in vain (a generation that started meanwhile would otherwise be learnt
        # only from the next fetch's answer, after its whole long-poll on the old assignment).
        # An idle member thus asks twice per wait_ms; a busy one never.
        self._ask = False
        # The group said it is about to move partitions away (rebalancing in this generation):
        # the next poll auto-commits what was handed out before it answers again, while this
        # generation's commits still count.
        self._settle = False
        self._joins = 0  # so that a heartbeat's 404 from before a join is not taken as news
        self._fetching = 0  # group fetches in flight (each one heartbeats for the member)
        now = clock()
        self.last_contact = now
        self.last_poll = now
        self.next_commit_at = now + (auto_commit_interval_ms or 0) / 1000
        self.closed = False

    @property
    def _who(self) -> tuple[str, str]:
        return self.group, self.member_id

    # ---- membership -------------------------------------------------------------------------

    def joined(self) -> Op[None]:
        """Join (again). After the membership was lost (`_rejoin`), whatever was held is
        revoked as lost first. A member that only may have lost a fetch's answer (`_resync`)
        stays what it was: the join makes the server read its partitions from the committed
        offsets again, so the auto-commit goes first and nothing handed out comes twice."""
        yield from self.stream.shut()  # a stream reads for the membership being replaced
        if self._rejoin and self.generation is not None:
            yield from self._revoked(list(self.assignment), lost=True, errors=[])
            self.generation = None
        elif self._resync and self.auto_commit_interval_ms is not None:
            yield from self.committing(raise_errors=False)
            if self._rejoin:  # the commit found the membership lost
                yield from self.joined()
                return
        body = {
            "topics": self.topics,
            "member_id": self.member_id,
            "session_timeout_ms": self.session_timeout_ms,
            "auto_offset_reset": self.auto_offset_reset,
        }
        answer = yield from json_call("POST", group_path(self.group, "members"), body)
        self._joins += 1
        self._rejoin = self._resync = False
        self._noticed = None
        self.member_id = answer["member_id"]
        self.last_contact = self.clock()
        yield from self._adopted(int(answer["generation"]), _partitions(answer["assignment"]))

    def _adopted(self, generation: int, assignment: list[TopicPartition]) -> Op[None]:
        """Move to a new generation: revoke what moved away (see _revoked), then take the new
        generation and tell on_assign what was gained. A callback's error is raised after."""
        errors: list[Exception] = []
        kept = set(assignment)
        yield from self._revoked([tp for tp in self.assignment if tp not in kept], False, errors)
        gained = [tp for tp in assignment if tp not in set(self.assignment)]
        self.generation = generation
        self.assignment = list(assignment)
        if gained and self.on_assign is not None:
            try:
                yield Hook(self.on_assign, (gained,))
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]

    def _revoked(
        self, revoked: list[TopicPartition], lost: bool, errors: list[Exception]
    ) -> Op[None]:
        """Give partitions up: call on_revoke, then drop their buffered messages and offsets.
        What was consumed of them was committed when the group announced the rebalance; a
        commit now would carry a generation that is no longer current."""
        if not revoked:
            return
        self._lost = lost
        try:
            if self.on_revoke is not None:
                yield Hook(self.on_revoke, (revoked,))
        except Exception as error:
            errors.append(error)
        finally:
            self._lost = False
        gone = set(revoked)
        self.assignment = [tp for tp in self.assignment if tp not in gone]
        buffered = len(self._buffer)
        self._buffer = deque(item for item in self._buffer if item[1] not in gone)
        self.stream.consumed(buffered - len(self._buffer))  # never handed: their credit back
        for tp in gone:
            self.consumed.pop(tp, None)
            self.committed.pop(tp, None)

    def _news(self, generation: int, assignment: list[TopicPartition]) -> Op[None]:
        """An answer named `generation`: move to it if it is newer than ours."""
        if self.generation is None or generation > self.generation:
            yield from self._adopted(generation, assignment)

    def leaving(self) -> Op[None]:
        """Close: auto-commit, on_revoke for everything held, then leave the group."""
        if self.closed:
            return
        errors: list[Exception] = []
        yield from self.stream.shut()
        try:
            if self.generation is not None:  # lost already when it must join again
                if not self._rejoin and self.auto_commit_interval_ms is not None:
                    yield from self.committing(raise_errors=False)  # still its generation
                yield from self._revoked(list(self.assignment), self._rejoin, errors)
            if self._joins:
                try:
                    yield from json_call("DELETE", member_path(self.group, self.member_id))
                except RaftlineError as error:
                    if error.code not in GONE:
                        raise
        finally:
            self.closed = True
            self.generation = None
            self.assignment = []
            self._buffer.clear()
        if errors:
            raise errors[0]

    # ---- polling ----------------------------------------------------------------------------

    def _housekeeping(self) -> Op[None]:
        """What is due before handing anything out: a join, a generation a heartbeat brought
        news of, an auto-commit."""
        if self.closed:
            raise RuntimeError("the group consumer is closed")
        self.last_poll = self.clock()
        if self._settle and not self._rejoin:
            self._settle = False
            if self.auto_commit_interval_ms is not None:
                yield from self.committing(raise_errors=False)
        if self._ask and not self._rejoin:
            self._ask = False
            yield from self._heartbeat()  # its news is taken below
        if self._rejoin or self._resync:
            yield from self.joined()
        noticed, self._noticed = self._noticed, None
        if noticed is not None:
            yield from self._news(*noticed)
        if self.auto_commit_interval_ms is not None and self.clock() >= self.next_commit_at:
            yield from self.committing(raise_errors=False)

    def _fetched(self) -> Op[None]:
        """One group fetch into the buffer (only partitions held after its answer). It is not
        tried again: the server moves the member's positions on as it answers, so after a failure
        whose answer may have been lost (a retryable one) the member joins again, which reads
        from the committed offsets (at-least-once; the next try goes to another node)."""
        params = {
            "max_messages": str(self.max_messages),
            "max_bytes": str(self.max_bytes),
            "wait_ms": str(self.wait_ms),
        }
        if self.record_filter is not None:
            params["filter"] = self.record_filter
        if self.stream.active():
            streamed = yield from self._streamed(params)
            if streamed:
                return
        path = member_path(self.group, self.member_id, "messages")
        self._fetching += 1
        try:
            request = json_request(None, params)
            request.retry = False
            answer = yield Call("GET", path, request)
        except RaftlineError as error:
            self._failed(error)
            return
        finally:
            self._fetching -= 1
        yield from self._took(answer.json())

    def _failed(self, error: RaftlineError) -> None:
        """A group fetch (or the stream) failed: join again (404), or resynchronise from the
        committed offsets after a failure whose answer may have been lost (see _fetched)."""
        if error.code in GONE:
            self._rejoin = True
        elif error.retryable:
            self._resync = True
            log.info("group %s: fetch of %s failed, joining again: %s", *self._who, error)
        else:
            raise error

    def _streamed(self, params: dict[str, str]) -> Op[bool]:
        """The stream's next frame into the buffer, as a group fetch answer; False when the
        upgrade was refused (then long-poll). A lost stream is a failed fetch: the member
        joins again from the committed offsets, and a new stream starts after that join."""
        del params["wait_ms"]
        path = member_path(self.group, self.member_id, "stream")
        try:
            if not (yield from self.stream.opened(path, params)):
                return False
            self._fetching += 1  # the stream's rounds heartbeat for the member meanwhile
            try:
                frame = yield from self.stream.frame(self.wait_ms / 1000)
            finally:
                self._fetching -= 1
        except RaftlineError as error:
            self._failed(error)
            return True
        if frame is not None:
            kept = yield from self._took(frame)
            self.stream.consumed(len(frame.get("messages", ())) - kept)  # dropped: credit back
        return True

    def _took(self, body: dict[str, Any]) -> Op[int]:
        """A group fetch answer (or stream frame) into the buffer; how many messages it kept.
        A message below what was handed out of its partition is dropped (a position the
        server kept may trail it)."""
        self.last_contact = self.clock()
        positions = body.get("positions", [])
        assignment = _partitions(body.get("assignment", positions))
        generation = int(body["generation"])
        messages = [json_message(m) for m in body.get("messages", [])]
        idle = not messages and self.wait_ms > 0
        rebalancing = bool(body.get("rebalancing")) and generation == self.generation
        self._ask = (idle and generation == self.generation) or rebalancing
        self._settle = self._settle or rebalancing
        yield from self._news(generation, assignment)
        held = set(self.assignment)
        buffered = len(self._buffer)
        last = {(m.topic, m.partition): i for i, m in enumerate(messages)}
        ends = {
            (str(p["topic"]), int(p["partition"])): int(p["offset"])
            for p in positions
            if p.get("offset") is not None
        }
        for i, message in enumerate(messages):
            tp = (str(message.topic), message.partition)
            if tp in held and message.offset >= self.consumed.get(tp, -1):
                mark = message.offset + 1
                if last[tp] == i:  # the partition's last one: on to its position (gaps too)
                    mark = max(mark, ends.get(tp, mark))
                self._buffer.append((message, tp, mark))
        for tp, end in ends.items():
            if tp in held and tp not in last:  # nothing came: the position is what was handed
                self._consume(tp, end)
        return len(self._buffer) - buffered

    def _consume(self, tp: TopicPartition, offset: int) -> None:
        if offset > self.consumed.get(tp, -1):
            self.consumed[tp] = offset

    def _handed(self, count: int) -> list[Message]:
        out = []
        for _ in range(count):
            message, tp, mark = self._buffer.popleft()
            self._consume(tp, mark)
            out.append(message)
        self.stream.consumed(count)
        return out

    def polled(self) -> Op[list[Message]]:
        """What was fetched and not yet handed out, else one group fetch (long-polling up to
        wait_ms); all of it counts as consumed."""
        yield from self._housekeeping()
        if not self._buffer:
            yield from self._fetched()
        return self._handed(len(self._buffer))

    def next_message(self) -> Op[Message]:
        """The next message, fetching (and doing what is due) until there is one; it counts as
        consumed when handed out (an iterating application commits up to it)."""
        while True:
            yield from self._housekeeping()
            if self._buffer:
                return self._handed(1)[0]
            yield from self._fetched()

    # ---- commits and heartbeats -------------------------------------------------------------

    def committing(self, raise_errors: bool) -> Op[None]:
        """Commit the consumed offsets that moved since the last commit, with this generation.
        404 or 409 stale_generation: the member joins again at the next poll (and the error is
        raised when `raise_errors`; an auto-commit logs it)."""
        if self.auto_commit_interval_ms is not None:
            self.next_commit_at = self.clock() + self.auto_commit_interval_ms / 1000
        due = [(tp, o) for tp, o in sorted(self.consumed.items()) if o > self.committed.get(tp, -1)]
        if not due or self.generation is None or self._lost:
            return
        body = {
            "member_id": self.member_id,
            "generation": self.generation,
            "offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in due],
        }
        try:
            yield from json_call("POST", group_path(self.group, "offsets"), body)
        except RaftlineError as error:
            if error.code in GONE:
                self._rejoin = True
            elif error.code == "stale_generation":
                # A newer generation started: the next poll asks for it first, and what this
                # member still holds is committed again with it.
                self._ask = True
            if raise_errors:
                raise
            log.info("group %s: commit by %s failed: %s", *self._who, error)
            return
        self.last_contact = self.clock()
        self.committed.update(due)

    def heartbeat_delay(self) -> float:
        """Seconds until heartbeated() may have something to do."""
        if self.generation is None:
            return self.heartbeat_s
        return min(self.heartbeat_s, max(0.01, self.last_contact + self.heartbeat_s - self.clock()))

    def heartbeated(self) -> Op[None]:
        """A heartbeat, when one is due: the member is joined, no group fetch is in flight (that
        heartbeats), the group has not heard from it for a third of the session, and the
        application polled within max_poll_interval. A new generation in the answer is noted for
        the next poll (which revokes and assigns in the application's thread); a 404 makes the
        next poll join again. Errors are left to the next beat."""
        now = self.clock()
        if (
            self.closed
            or self.generation is None
            or self._rejoin
            or self._fetching
            or self._settle  # the application's next poll commits first, then answers
            or now < self.last_contact + self.heartbeat_s
            or now - self.last_poll > self.max_poll_interval_s
        ):
            return
        yield from self._heartbeat()

    def _heartbeat(self) -> Op[None]:
        """One heartbeat; a newer generation it names is noted in `_noticed`."""
        joins = self._joins
        try:
            path = member_path(self.group, self.member_id, "heartbeat")
            answer = yield from json_call("POST", path)
        except RaftlineError as error:
            if error.code in GONE and joins == self._joins:
                self._rejoin = True
            log.debug("group %s: heartbeat of %s: %s", *self._who, error)
            return
        self.last_contact = self.clock()
        generation = int(answer["generation"])
        if self.generation is not None and generation > self.generation:
            self._noticed = (generation, _partitions(answer["assignment"]))
        elif generation == self.generation and answer.get("rebalancing"):
            self._settle = self._ask = True


class GroupConsumerApi(GroupConsumerCore):
    """The calls of GroupConsumer and AsyncGroupConsumer, written once (see ClientApi)."""

    client: ClientApi

    def poll(self) -> Returns[list[Message]]:
        """The next messages of the partitions this member holds (long-polls up to wait_ms
        when there are none); joins, heartbeats, rebalances and auto-commits as due first."""
        return self.client._run(self.polled())

    def commit(self) -> Returns[None]:
        """Commit the offsets of everything handed out so far. Raises RaftlineError when the
        group refuses it (stale_generation, unknown_member: the member then joins again and
        what it had not committed is delivered again)."""
        return self.client._run(self.committing(raise_errors=True))
