"""Assignors: every subscribed partition to exactly one subscriber; sticky keeps balance and moves
no more partitions than any balanced assignment must."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftline.node.coordinator.assign import all_partitions, range_assign, sticky_assign

TOPICS = ["a", "b", "c"]
member_ids = st.sampled_from([f"m{i}" for i in range(7)])
counts = st.fixed_dictionaries({t: st.integers(0, 9) for t in TOPICS})
subscriptions = st.dictionaries(
    member_ids, st.lists(st.sampled_from(TOPICS), min_size=1, max_size=3, unique=True), max_size=6
)


def check_complete(members, partitions, out) -> None:
    assert set(out) == set(members)
    owners: dict = {}
    for member, held in out.items():
        for tp in held:
            assert tp not in owners, f"{tp} held by {owners[tp]} and {member}"
            assert tp[0] in members[member]
            owners[tp] = member
    assert set(owners) == set(all_partitions(members, partitions))


@given(subscriptions, counts)
def test_range_assigns_every_partition_once(members, partitions) -> None:
    check_complete(members, partitions, range_assign(members, partitions))


@given(subscriptions, counts, st.data())
def test_sticky_assigns_every_partition_once_and_is_locally_balanced(members, partitions, data):
    previous = data.draw(
        st.dictionaries(
            member_ids, st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 10)), max_size=8)
        )
    )
    out = sticky_assign(members, partitions, previous)
    check_complete(members, partitions, out)
    for giver, held in out.items():
        for taker, theirs in out.items():
            if len(theirs) + 2 <= len(held):
                assert not any(t in members[taker] for t, _ in held), (giver, taker, out)


@settings(max_examples=300)
@given(
    st.lists(st.text("mnopq", min_size=1, max_size=2), min_size=1, max_size=6, unique=True),
    st.integers(0, 30),
    st.data(),
)
def test_sticky_moves_least_with_identical_subscriptions(members_list, count, data) -> None:
    members = {m: ["a"] for m in members_list}
    partitions = {"a": count}
    # A previous assignment by members that may have left, with some partitions unowned.
    former = [*members_list, "gone1", "gone2"]
    previous: dict = {}
    for p in range(count):
        owner = data.draw(st.sampled_from([*former, None]))
        if owner is not None:
            previous.setdefault(owner, []).append(("a", p))
    out = sticky_assign(members, partitions, previous)
    check_complete(members, partitions, out)
    sizes = [len(v) for v in out.values()]
    assert max(sizes) - min(sizes) <= 1
    held = sorted((len(previous.get(m, [])) for m in members), reverse=True)
    share, extra = divmod(count, len(members))
    quotas = [share + 1] * extra + [share] * (len(members) - extra)
    least_moves = sum(max(0, h - q) for h, q in zip(held, quotas, strict=True))
    moved = sum(1 for m in members for tp in previous.get(m, []) if tp not in out[m])
    assert moved == least_moves, (previous, out)


def test_sticky_keeps_everything_when_a_member_leaves_except_its_partitions() -> None:
    before = sticky_assign({"x": ["a"], "y": ["a"], "z": ["a"]}, {"a": 6}, {})
    after = sticky_assign({"x": ["a"], "y": ["a"]}, {"a": 6}, before)
    for member in ("x", "y"):
        assert set(before[member]) <= set(after[member])
    assert sorted(after["x"] + after["y"]) == [("a", p) for p in range(6)]
