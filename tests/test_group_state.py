"""The group state machine against a few lines of reference: generations, fencing, offsets,
idempotent joins, snapshots (hypothesis stateful model test plus transcripts)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from raftline.node.coordinator.state import CoordinatorState, GroupError

TOPICS = ["a", "b"]
MEMBERS = ["m1", "m2", "m3", "m4"]


def join(member: str, topics: list[str], counts: dict[str, int], **extra: object) -> dict:
    return {
        "op": "join",
        "group": "g",
        "member_id": member,
        "topics": topics,
        "partitions": {t: counts[t] for t in topics},
        "session_timeout_ms": 10_000,
        **extra,
    }


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = CoordinatorState()
        self.counts = {"a": 4, "b": 3}
        self.offsets: dict = {}  # reference committed offsets
        self.last_generation = 0

    @property
    def group(self):
        return self.state.groups.get("g")

    def run(self, command: dict) -> dict | None:
        before = copy.deepcopy(self.state.snapshot())
        try:
            result = self.state.apply(command)
        except GroupError:
            assert self.state.snapshot() == before, "a failed command changed the state"
            return None
        return result

    @rule(
        member=st.sampled_from(MEMBERS),
        topics=st.lists(st.sampled_from(TOPICS), min_size=1, unique=True),
    )
    def join(self, member, topics) -> None:
        group = self.group
        before = (group.generation, len(group.members)) if group else None
        same = (
            group is not None
            and member in group.members
            and group.members[member].topics == tuple(sorted(topics))
        )
        result = self.run(join(member, topics, self.counts))
        assert result is not None
        if same:  # I7: a retry changes nothing
            assert (self.group.generation, len(self.group.members)) == before
        assert result["generation"] == self.group.generation
        assert sorted(map(tuple, result["assignment"])) == sorted(self.group.assignment[member])

    @rule(member=st.sampled_from(MEMBERS))
    def leave(self, member) -> None:
        present = self.group is not None and member in self.group.members
        result = self.run({"op": "leave", "group": "g", "member_id": member})
        assert (result is not None) == present

    @rule(member=st.sampled_from(MEMBERS))
    def expire(self, member) -> None:
        self.run({"op": "expire", "group": "g", "member_id": member})

    @rule(topic=st.sampled_from(TOPICS), count=st.integers(0, 6))
    def repartition(self, topic, count) -> None:
        self.counts[topic] = count
        if self.group is not None:
            self.run({"op": "partitions", "group": "g", "partitions": {topic: count}})

    @rule(
        member=st.sampled_from(MEMBERS),
        back=st.integers(-1, 3),
        picks=st.lists(
            st.tuples(st.sampled_from(TOPICS), st.integers(0, 5), st.integers(0, 50)),
            max_size=3,
            unique_by=lambda x: x[:2],
        ),
    )
    def commit(self, member, back, picks) -> None:
        group = self.group
        if group is None:
            return
        # Mostly partitions the member holds now, so that fencing by age gets exercised.
        held = group.assignment.get(member, [])
        if held and len(picks) > 1:
            picks = [(*held[len(picks) % len(held)], picks[0][2])]
        generation = group.generation - back
        accepted = (
            member in group.members
            and generation == group.generation
            and all((t, p) in held for t, p, _ in picks)
        )
        result = self.run(
            {
                "op": "commit",
                "group": "g",
                "member_id": member,
                "generation": generation,
                "offsets": [list(x) for x in picks],
            }
        )
        assert (result is not None) == accepted, (member, generation, picks)
        if accepted:
            for t, p, o in picks:
                self.offsets[(t, p)] = max(self.offsets.get((t, p), -1), o)

    @rule(
        picks=st.lists(
            st.tuples(st.sampled_from(TOPICS), st.integers(0, 5), st.integers(0, 9)),
            max_size=3,
            unique_by=lambda x: x[:2],
        )
    )
    def reset(self, picks) -> None:
        empty = self.group is None or not self.group.members
        result = self.run({"op": "reset", "group": "g", "offsets": [list(x) for x in picks]})
        assert (result is not None) == empty
        if empty:
            for t, p, o in picks:
                self.offsets[(t, p)] = o

    @rule()
    def checkpoint(self) -> None:
        snap = self.state.snapshot()
        assert CoordinatorState.restore(snap) == self.state
        replica = CoordinatorState()
        replica.apply({"op": "checkpoint", "snapshot": snap})
        assert replica == self.state

    @invariant()
    def generation_monotonic_and_offsets_as_reference(self) -> None:
        group = self.group
        if group is None:
            return
        assert group.generation >= self.last_generation
        self.last_generation = group.generation
        assert group.offsets == self.offsets

    @invariant()
    def assignment_complete_and_exclusive(self) -> None:
        group = self.group
        if group is None:
            return
        owners = {}
        for member, held in group.assignment.items():
            for tp in held:
                assert tp not in owners
                owners[tp] = member
        wanted = {
            (t, p) for m in group.members.values() for t in m.topics for p in range(self.counts[t])
        }
        assert set(owners) == wanted


GroupMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_group_machine = GroupMachine.TestCase


def test_join_retry_is_idempotent_and_a_change_rebalances() -> None:
    state = CoordinatorState()
    first = state.apply(join("x", ["a"], {"a": 4}))
    assert state.apply(join("x", ["a"], {"a": 4})) == first
    assert first["generation"] == 1 and len(first["assignment"]) == 4
    second = state.apply(join("y", ["a"], {"a": 4}))
    assert second["generation"] == 2 and len(second["assignment"]) == 2
    assert state.apply(join("y", ["a"], {"a": 4}))["generation"] == 2


def commit(member: str, generation: int, *offsets: list) -> dict:
    return {
        "op": "commit",
        "group": "g",
        "member_id": member,
        "generation": generation,
        "offsets": list(offsets),
    }


def test_commit_is_fenced_and_all_or_nothing() -> None:
    state = CoordinatorState()
    state.apply(join("x", ["a"], {"a": 2}))
    state.apply(commit("x", 1, ["a", 0, 5], ["a", 1, 7]))
    state.apply(join("y", ["a"], {"a": 2}))  # generation 2: x keeps one, y takes the other
    [kept] = state.groups["g"].assignment["x"]
    [moved] = state.groups["g"].assignment["y"]
    # x holds only `kept` in generation 2: all or nothing.
    with pytest.raises(GroupError) as err:
        state.apply(commit("x", 2, [*kept, 9], [*moved, 9]))
    assert err.value.code == "stale_generation"
    assert state.groups["g"].offsets == {("a", 0): 5, ("a", 1): 7}
    # Generation 1 is stale, also for the partition x still holds (API.md).
    with pytest.raises(GroupError) as err:
        state.apply(commit("x", 1, [*kept, 9]))
    assert err.value.code == "stale_generation"
    state.apply(commit("x", 2, [*kept, 9]))
    state.apply(commit("y", 2, [*moved, 10]))
    # Commits never go backwards.
    state.apply(commit("x", 2, [*kept, 3]))
    assert state.groups["g"].offsets == {kept: 9, moved: 10}


def test_reset_needs_an_empty_group_and_may_go_backwards() -> None:
    state = CoordinatorState()
    state.apply(join("x", ["a"], {"a": 1}))
    state.apply(
        {"op": "commit", "group": "g", "member_id": "x", "generation": 1, "offsets": [["a", 0, 5]]}
    )
    with pytest.raises(GroupError) as err:
        state.apply({"op": "reset", "group": "g", "offsets": [["a", 0, 0]]})
    assert err.value.code == "group_not_empty"
    state.apply({"op": "leave", "group": "g", "member_id": "x"})
    state.apply({"op": "reset", "group": "g", "offsets": [["a", 0, 0]]})
    assert state.groups["g"].offsets == {("a", 0): 0}
    assert state.groups["g"].generation == 2


def test_expire_ignores_a_member_that_joined_again() -> None:
    state = CoordinatorState()
    state.apply(join("x", ["a"], {"a": 1}, at_ms=100))
    assert (
        state.apply({"op": "expire", "group": "g", "member_id": "x", "joined_ms": 99})["expired"]
        is False
    )
    assert (
        state.apply({"op": "expire", "group": "g", "member_id": "x", "joined_ms": 100})["expired"]
        is True
    )
    assert state.groups["g"].members == {}
