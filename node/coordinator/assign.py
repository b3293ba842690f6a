"""Partition assignors of consumer groups: range, and sticky (members keep what they had).

Owns the pure functions that map (members and their topics, partition counts, the previous
assignment) to the next assignment. No state, no I/O: the group state machine calls them inside
`apply`, so every replica computes the same answer from the same inputs.

Both guarantee, for every call:
- each partition of a topic that some member subscribes to goes to exactly one member that
  subscribes to it; partitions of topics nobody subscribes to go to nobody;
- the result depends only on the arguments (members are visited in sorted order).
Sticky also guarantees:
- balance: no member holds two partitions more than another member that could take one of them
  (with identical subscriptions: counts differ by at most one);
- a partition moves only if its owner left, unsubscribed, or holds more than its share; when all
  members subscribe to the same topics, the number of partitions taken from members that stay is
  the least any balanced assignment needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

TopicPartition = tuple[str, int]
Assignment = dict[str, list[TopicPartition]]

ASSIGNORS = ("sticky", "range")


def all_partitions(
    members: Mapping[str, Sequence[str]], partitions: Mapping[str, int]
) -> list[TopicPartition]:
    """Every partition of every topic some member subscribes to (topics of unknown size: none)."""
    topics = sorted({t for subscribed in members.values() for t in subscribed})
    return [(t, p) for t in topics for p in range(partitions.get(t, 0))]


def range_assign(members: Mapping[str, Sequence[str]], partitions: Mapping[str, int]) -> Assignment:
    """Kafka's range assignor: per topic, consecutive ranges to the subscribers in id order; the
    first `count % subscribers` of them take one more."""
    out: Assignment = {m: [] for m in sorted(members)}
    topics = sorted({t for subscribed in members.values() for t in subscribed})
    for topic in topics:
        subscribers = sorted(m for m, subscribed in members.items() if topic in subscribed)
        count = partitions.get(topic, 0)
        share, extra = divmod(count, len(subscribers))
        start = 0
        for i, member in enumerate(subscribers):
            size = share + (1 if i < extra else 0)
            out[member].extend((topic, p) for p in range(start, start + size))
            start += size
    return out


def sticky_assign(
    members: Mapping[str, Sequence[str]],
    partitions: Mapping[str, int],
    previous: Mapping[str, Sequence[TopicPartition]],
) -> Assignment:
    """Keep every valid previous ownership, hand unowned partitions to the least loaded eligible
    member, then move partitions one at a time from the most loaded member to the least loaded
    one that can take one of them, until no such pair differs by two or more.

    A member that receives a partition is at the minimum load, which never decreases, so it never
    gives one away later: each partition moves at most once, and only from members above their
    share (see the module header)."""
    wanted = all_partitions(members, partitions)
    wanted_set = set(wanted)
    owner: dict[TopicPartition, str] = {}
    held: dict[str, set[TopicPartition]] = {m: set() for m in members}
    for member in sorted(previous):
        if member not in members:
            continue
        subscribed = set(members[member])
        for tp in previous[member]:
            tp = (tp[0], int(tp[1]))
            if tp in wanted_set and tp[0] in subscribed and tp not in owner:
                owner[tp] = member
                held[member].add(tp)
    subscribers = {
        topic: sorted(m for m, subscribed in members.items() if topic in subscribed)
        for topic in {t for t, _ in wanted}
    }
    for tp in wanted:
        if tp not in owner:
            member = min(subscribers[tp[0]], key=lambda m: (len(held[m]), m))
            owner[tp] = member
            held[member].add(tp)
    while True:
        move = _best_move(held, members)
        if move is None:
            break
        tp, giver, taker = move
        held[giver].discard(tp)
        held[taker].add(tp)
    return {m: sorted(held[m]) for m in sorted(members)}


def _best_move(
    held: Mapping[str, set[TopicPartition]], members: Mapping[str, Sequence[str]]
) -> tuple[TopicPartition, str, str] | None:
    """The partition to move from the most loaded member to the least loaded member able to take
    one of its partitions with a load gap of two or more; None when balanced."""
    by_load = sorted(held, key=lambda m: (-len(held[m]), m))
    for giver in by_load:
        takers = sorted(
            (m for m in held if len(held[m]) + 2 <= len(held[giver])),
            key=lambda m: (len(held[m]), m),
        )
        for taker in takers:
            subscribed = set(members[taker])
            movable = sorted(tp for tp in held[giver] if tp[0] in subscribed)
            if movable:
                return movable[-1], giver, taker
    return None


def assign(
    assignor: str,
    members: Mapping[str, Sequence[str]],
    partitions: Mapping[str, int],
    previous: Mapping[str, Sequence[TopicPartition]],
) -> Assignment:
    if assignor == "range":
        return range_assign(members, partitions)
    return sticky_assign(members, partitions, previous)
