"""Safety checker for consumer-group histories (API.md "Consumer groups").

Owns the group anomalies and the queue view of a group history (group fetches as polls).

Invariants of a correct broker, each checked here and named when broken:
- lost: every acknowledged send to a topic a group subscribes to is returned by some successful
  fetch of that group (across rebalances, the final phase counted).
- offset-regression: the committed offset of a (group, partition) never moves backwards across
  successful commits and offset reads, except by an explicit reset. A read must show at least
  what any successful commit or read that finished before it started showed. A commit is only a
  lower bound, because a commit below the committed offset may succeed and change nothing.
- double-assignment: no two members hold one partition in one generation (from the answers to
  joins, heartbeats and fetches).
- commit-by-non-owner: a successful commit is made by a member that some answer shows holding
  that partition in the commit's generation.
- generation-regression: the generations one member sees never go backwards over time.

- stale-commit: a successful commit whose generation is older than one that some answer to a
  member of the group returned before the commit was sent (API.md: a stale generation gets 409;
  generations never go back, so the group's generation was newer when the commit arrived).

History shape (keys are "topic/partition", as in the queue checker; every group op names its
"group"; "member" is the client-chosen member id):
- group-join: invoke {"group", "member", "topics"}; ok adds "generation", "assignment": [keys].
- group-heartbeat: invoke {"group", "member"}; ok adds "generation", "assignment",
  "rebalancing".
- group-fetch: invoke {"group", "member", "final"}; ok adds "generation", "messages":
  [[key, offset, value], ...] and "positions": {key: next offset}.
- group-commit: invoke and ok {"group", "member", "generation", "offsets": {key: offset}}.
- group-offsets: invoke {"group", "final"}; ok adds "offsets": {key: offset or null}.
- group-reset: invoke {"group", "topic", "to"}; ok adds "offsets". It excuses a step back.
- group-leave and group-crash (a member stops calling): {"group", "member"}; not judged.
Order in time is (time, index): hand-made histories may leave `time` at 0.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from raftline.chaos.history import Completed, HistoryError, Op, client_ops, index_ops, pair
from raftline.chaos.queue_checker import Anomalies

ANOMALY_TYPES: tuple[str, ...] = (
    "lost",
    "offset-regression",
    "double-assignment",
    "commit-by-non-owner",
    "generation-regression",
    "stale-commit",
)
GROUP_FS: frozenset[str] = frozenset(
    {
        "group-join",
        "group-heartbeat",
        "group-fetch",
        "group-commit",
        "group-offsets",
        "group-reset",
        "group-leave",
        "group-crash",
    }
)
# Ops whose answer says which partitions a member holds in which generation.
ANSWER_FS: frozenset[str] = frozenset({"group-join", "group-heartbeat", "group-fetch"})
NEVER = (math.inf, math.inf)

Moment = tuple[float, float]


def has_group_ops(ops: Iterable[Op]) -> bool:
    return any(op.f in GROUP_FS for op in ops)


def topic_of(key: str) -> str:
    return key.rsplit("/", 1)[0]


def _start(op: Completed) -> Moment:
    return (op.invoke.time, op.invoke.index)


def _end(op: Completed) -> Moment:
    return NEVER if op.complete is None else (op.complete.time, op.complete.index)


def _field(op: Completed, name: str, value: Any = None) -> Any:
    value = op.value if value is None else value
    if not isinstance(value, dict) or name not in value:
        raise HistoryError(f"{op.invoke.f} op {op.invoke.index} lacks {name!r}: {value!r}")
    return value[name]


def _offsets(op: Completed, value: Any = None) -> dict[str, int | None]:
    offsets = _field(op, "offsets", value)
    if not isinstance(offsets, dict):
        raise HistoryError(f"{op.invoke.f} op {op.invoke.index}: offsets must be {{key: offset}}")
    return {str(k): (None if v is None else int(v)) for k, v in offsets.items()}


def _messages(op: Completed) -> list[tuple[str, int, Hashable]]:
    messages = _field(op, "messages")
    try:
        return [
            (str(k), int(o), v if not isinstance(v, list) else tuple(v)) for k, o, v in messages
        ]
    except (TypeError, ValueError):
        raise HistoryError(
            f"group-fetch {op.invoke.index}: messages must be [key, offset, value] triples"
        ) from None


@dataclass(frozen=True)
class Answer:
    """What one join, heartbeat or fetch answer says a member holds in a generation."""

    op: Completed
    group: str
    member: str
    generation: int
    keys: frozenset[str]


def _answer(op: Completed) -> Answer:
    group, member = str(_field(op, "group")), str(_field(op, "member"))
    generation = int(_field(op, "generation"))
    if op.invoke.f == "group-fetch":
        positions = _field(op, "positions")
        if not isinstance(positions, dict):
            raise HistoryError(f"group-fetch {op.invoke.index}: positions must be {{key: offset}}")
        keys = set(map(str, positions)) | {k for k, _, _ in _messages(op)}
        keys |= set(map(str, op.value.get("assignment", ())))
    else:
        keys = set(map(str, _field(op, "assignment")))
    return Answer(op, group, member, generation, frozenset(keys))


@dataclass
class _Index:
    sends: list[Completed] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    fetches: list[Completed] = field(default_factory=list)
    commits: list[Completed] = field(default_factory=list)
    reads: list[Completed] = field(default_factory=list)
    resets: list[Completed] = field(default_factory=list)
    topics: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    @staticmethod
    def build(pairs: Iterable[Completed]) -> _Index:
        index = _Index()
        for op in pairs:
            f = op.invoke.f
            if f == "send":
                index.sends.append(op)
            elif f == "group-join":
                index.topics[str(_field(op, "group", op.invoke.value))].update(
                    map(str, _field(op, "topics", op.invoke.value))
                )
            if op.type != "ok" and f not in ("group-commit", "group-reset"):
                continue
            if f in ANSWER_FS:
                index.answers.append(_answer(op))
            if f == "group-fetch":
                index.fetches.append(op)
            elif f == "group-commit":
                index.commits.append(op)
            elif f == "group-offsets":
                index.reads.append(op)
            elif f == "group-reset" and op.type != "fail":
                index.resets.append(op)
        return index

    def holders(self) -> dict[tuple[str, int, str], dict[str, int]]:
        """(group, generation, key) -> member -> index of the first answer showing it held."""
        held: dict[tuple[str, int, str], dict[str, int]] = defaultdict(dict)
        for a in self.answers:
            for key in a.keys:
                held[(a.group, a.generation, key)].setdefault(a.member, a.op.invoke.index)
        return held


def _check_lost(index: _Index, out: Anomalies) -> dict[str, int]:
    consumed: dict[str, set[tuple[str, Hashable]]] = defaultdict(set)
    for op in index.fetches:
        group = str(_field(op, "group"))
        consumed[group].update((key, value) for key, _, value in _messages(op))
    acknowledged = 0
    for op in index.sends:
        if op.type != "ok":
            continue
        acknowledged += 1
        key = str(_field(op, "key"))
        value = _field(op, "value")
        for group, topics in sorted(index.topics.items()):
            if topic_of(key) in topics and (key, value) not in consumed[group]:
                out.add(
                    "lost",
                    group=group,
                    key=key,
                    value=value,
                    offset=op.value.get("offset"),
                    writer=op.invoke.index,
                )
    return {"acknowledged": acknowledged, "consumed": sum(len(v) for v in consumed.values())}


@dataclass(frozen=True)
class _Observation:
    start: Moment
    end: Moment
    offset: int  # -1: no committed offset
    index: int
    f: str


def _observations(index: _Index) -> dict[tuple[str, str], list[_Observation]]:
    """Successful commits and offset reads per (group, key). A read counts for a key only once
    some commit or reset of it was sent before the read returned: before that, what a read shows
    for the key is not a committed offset (a broker may report its reset position there)."""
    obs: dict[tuple[str, str], list[_Observation]] = defaultdict(list)
    first_write: dict[tuple[str, str], Moment] = {}
    for op in index.commits:
        if op.type == "fail":
            continue
        group = str(_field(op, "group", op.invoke.value))
        for key, offset in _offsets(op, op.invoke.value).items():
            first_write[(group, key)] = min(first_write.get((group, key), NEVER), _start(op))
            if op.type == "ok" and offset is not None:
                obs[(group, key)].append(
                    _Observation(_start(op), _end(op), offset, op.invoke.index, op.invoke.f)
                )
    first_reset: dict[tuple[str, str], Moment] = {}
    for op in index.resets:
        group_topic = (str(_field(op, "group", op.invoke.value)), str(op.invoke.value.get("topic")))
        first_reset[group_topic] = min(first_reset.get(group_topic, NEVER), _start(op))
    for op in index.reads:
        group = str(_field(op, "group", op.invoke.value))
        shown = _offsets(op)
        keys = {k for g, k in first_write if g == group} | set(shown)
        for key in sorted(keys):
            written = min(
                first_write.get((group, key), NEVER),
                first_reset.get((group, topic_of(key)), NEVER),
            )
            if written < _end(op):
                offset = shown.get(key)
                seen = -1 if offset is None else offset
                obs[(group, key)].append(
                    _Observation(_start(op), _end(op), seen, op.invoke.index, op.invoke.f)
                )
    return obs


def _check_offset_regression(index: _Index, out: Anomalies) -> None:
    resets: dict[tuple[str, str], list[tuple[Moment, Moment]]] = defaultdict(list)
    for op in index.resets:
        topic = str(op.invoke.value.get("topic"))
        resets[(str(op.invoke.value.get("group")), topic)].append((_start(op), _end(op)))
    for (group, key), observed in sorted(_observations(index).items()):
        windows = resets.get((group, topic_of(key)), [])

        def excused_before(end: Moment, windows: list[tuple[Moment, Moment]] = windows) -> Moment:
            # An observation A is excused against B if a reset could have applied between them:
            # one sent before B returned that had not returned when A was sent.
            return max((e for s, e in windows if s < end), default=(-math.inf, -math.inf))

        by_cut: dict[Moment, list[_Observation]] = defaultdict(list)
        for b in observed:
            by_cut[excused_before(b.end)].append(b)
        for cut, later in by_cut.items():
            earlier = sorted((a for a in observed if a.start >= cut), key=lambda a: a.end)
            ends = [a.end for a in earlier]
            best: list[_Observation] = []
            for a in earlier:
                best.append(a if not best or a.offset > best[-1].offset else best[-1])
            for b in later:
                if b.f != "group-offsets":
                    continue  # a commit is a lower bound: one below the offset may change nothing
                i = bisect.bisect_left(ends, b.start)
                if i and best[i - 1].offset > b.offset:
                    a = best[i - 1]
                    out.add(
                        "offset-regression",
                        group=group,
                        key=key,
                        earlier={"op": a.index, "f": a.f, "offset": a.offset},
                        later={
                            "op": b.index,
                            "f": b.f,
                            "offset": None if b.offset < 0 else b.offset,
                        },
                    )


def _check_assignments(index: _Index, out: Anomalies) -> None:
    held = index.holders()
    for (group, generation, key), members in sorted(held.items()):
        if len(members) > 1:
            out.add(
                "double-assignment",
                group=group,
                generation=generation,
                key=key,
                members=sorted(members),
                answers=sorted(members.values()),
            )
    for op in index.commits:
        if op.type != "ok":
            continue
        group, member = str(_field(op, "group")), str(_field(op, "member"))
        generation = int(_field(op, "generation"))
        for key in _offsets(op):
            if member not in held.get((group, generation, key), {}):
                out.add(
                    "commit-by-non-owner",
                    group=group,
                    member=member,
                    generation=generation,
                    key=key,
                    commit=op.invoke.index,
                    holders=sorted(held.get((group, generation, key), {})),
                )


def _check_stale_commits(index: _Index, out: Anomalies) -> None:
    """A successful commit older than a generation the group had already answered with."""
    answered: dict[str, tuple[list[Moment], list[int]]] = defaultdict(lambda: ([], []))
    for a in sorted(index.answers, key=lambda a: _end(a.op)):
        ends, tops = answered[a.group]
        ends.append(_end(a.op))
        tops.append(max(tops[-1] if tops else -1, a.generation))
    for op in index.commits:
        if op.type != "ok":
            continue
        group, generation = str(_field(op, "group")), int(_field(op, "generation"))
        ends, tops = answered.get(group, ([], []))
        i = bisect.bisect_left(ends, _start(op))
        newer = tops[i - 1] if i else -1
        if newer > generation:
            out.add(
                "stale-commit",
                group=group,
                member=str(_field(op, "member")),
                generation=generation,
                commit=op.invoke.index,
                answered_generation=newer,
            )


def _check_generations(index: _Index, out: Anomalies) -> None:
    by_member: dict[tuple[str, str], list[Answer]] = defaultdict(list)
    for a in index.answers:
        by_member[(a.group, a.member)].append(a)
    for (group, member), answers in sorted(by_member.items()):
        done = sorted(answers, key=lambda a: _end(a.op))
        highest: Answer | None = None
        i = 0
        for b in sorted(answers, key=lambda a: _start(a.op)):
            while i < len(done) and _end(done[i].op) < _start(b.op):
                if highest is None or done[i].generation > highest.generation:
                    highest = done[i]
                i += 1
            if highest is not None and b.generation < highest.generation:
                out.add(
                    "generation-regression",
                    group=group,
                    member=member,
                    earlier={"op": highest.op.invoke.index, "generation": highest.generation},
                    later={"op": b.op.invoke.index, "generation": b.generation},
                )


def check(ops: Iterable[Op], allowed: Iterable[str] = ()) -> dict[str, Any]:
    """Checks a consumer-group history; `valid` is False if any anomaly not allowed occurs."""
    allowed_types = frozenset(allowed)
    unknown = allowed_types - set(ANOMALY_TYPES)
    if unknown:
        raise ValueError(f"unknown anomaly types {sorted(unknown)}")
    pairs = [p for p in pair(client_ops(ops)) if p.invoke.f in GROUP_FS or p.invoke.f == "send"]
    index = _Index.build(pairs)
    out = Anomalies()
    consumption = _check_lost(index, out)
    _check_offset_regression(index, out)
    _check_assignments(index, out)
    _check_generations(index, out)
    _check_stale_commits(index, out)
    found = sorted(out.found)
    return {
        "valid": not set(found) - allowed_types,
        "anomaly_types": found,
        "anomaly_counts": dict(sorted(out.counts.items())),
        "anomalies": {kind: out.found[kind] for kind in found},
        "stats": {
            **consumption,
            "groups": sorted(index.topics),
            "answers": len(index.answers),
            "fetches": len(index.fetches),
            "commits_ok": sum(op.type == "ok" for op in index.commits),
            "commits_refused": sum(op.type == "fail" for op in index.commits),
            "offset_reads": len(index.reads),
            "generations": len({(a.group, a.generation) for a in index.answers}),
            "members": len({(a.group, a.member) for a in index.answers}),
            "final_fetches": sum(bool(op.invoke.value.get("final")) for op in index.fetches),
        },
    }


def queue_view(ops: Iterable[Op]) -> list[Op]:
    """The history as the queue checker reads it: sends as they are, and each successful group
    fetch as one poll per partition it returned, at the fetch's completion. A poll's offset is
    "group" (symbolic), so polls never count as continuing each other; reader indexes in the
    queue checker's evidence refer to this view, whose polls carry the fetch's index as "fetch"."""
    return index_ops(_queue_ops(client_ops(ops)))


def _queue_ops(ops: Iterable[Op]) -> Iterator[Op]:
    open_fetch: dict[int | str, Op] = {}
    for op in ops:
        if op.f == "send":
            yield op
        elif op.f == "group-fetch" and op.type == "invoke":
            open_fetch[op.process] = op
        elif op.f == "group-fetch":
            invoke = open_fetch.pop(op.process, None)
            if op.type != "ok" or invoke is None:
                continue
            by_key: dict[str, list[list[Any]]] = defaultdict(list)
            for key, offset, value in _messages(Completed(invoke, op)):
                by_key[key].append([offset, value])
            final = bool((invoke.value or {}).get("final"))
            for key, messages in sorted(by_key.items()):
                request = {"key": key, "offset": "group", "final": final, "fetch": invoke.index}
                result = {**request, "messages": messages, "next_offset": messages[-1][0] + 1}
                yield replace(invoke, f="poll", value=request, index=-1)
                yield replace(op, f="poll", value=result, index=-1)
