"""The tiered manifest state machine against a few lines of reference code (hypothesis).

Commands come as two racing leaders would send them: uploads continuing from the state's end,
stale uploads of overlapping ranges with other names, durable marks of any revision, retention
truncations and garbage collections, some of them replayed.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from raftline.tiered.manifest import ManifestState, SegmentMeta


def segment(base: int, last: int, name: str) -> SegmentMeta:
    stem = f"h/t/1/0/{base:020d}-{last:020d}{name}"
    return SegmentMeta(
        base_offset=base,
        last_offset=last,
        committed_offset=last + 1,
        terms=((1, base),),
        size_bytes=(last - base + 1) * 10,
        batch_count=last - base + 1,
        base_timestamp=base,
        max_timestamp=last,
        object=f"{stem}.log",
        index=f"{stem}.index",
        time_index=f"{stem}.timeindex",
        txn_index=None,
        aborted_transactions=0,
    )


# A step is an abstract choice turned into a command against the current state.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("next"), st.integers(1, 20), st.sampled_from(["", "-x"])),
        st.tuples(st.just("stale"), st.integers(-30, 30), st.integers(0, 20)),
        st.tuples(st.just("durable"), st.integers(-3, 3), st.just(0)),
        st.tuples(st.just("truncate"), st.integers(-10, 40), st.just(0)),
        st.tuples(st.just("collect"), st.integers(0, 5), st.just(0)),
        st.tuples(st.just("replay"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


def command_of(state: ManifestState, step: tuple[str, int, Any]) -> dict[str, Any] | None:
    kind, a, b = step
    if kind == "next":
        return {
            "op": "add",
            "segment": segment(state.next_offset, state.next_offset + a - 1, b).to_json(),
        }
    if kind == "stale":
        base = max(0, state.next_offset + a)
        return {"op": "add", "segment": segment(base, base + b, "-stale").to_json()}
    if kind == "durable":
        return {"op": "durable", "revision": state.revision + a, "next_offset": state.next_offset}
    if kind == "truncate":
        return {"op": "truncate", "start_offset": state.start_offset + a}
    if kind == "collect":
        return {"op": "collected", "keys": [key for _, key in state.garbage][:a]}
    return None


@settings(max_examples=300, deadline=None)
@given(steps)
def test_manifest_matches_the_reference(script: list[tuple[str, int, Any]]) -> None:
    state = ManifestState()
    owner: dict[int, str] = {}  # offset -> object first recorded for it (reference)
    removed: set[int] = set()  # offsets retention removed
    deleted: set[str] = set()  # keys collected
    index = 0
    last_command: dict[str, Any] | None = None
    for step in script:
        command = command_of(state, step)
        if command is None:  # a replay of the last command at its old index: ignored
            if last_command is not None:
                before = state.snapshot()
                assert not state.apply(index, last_command).accepted
                assert state.snapshot() == before
            continue
        index += 1
        durable_before = state.durable_revision
        garbage_before = {key: rev for rev, key in state.garbage}
        effect = state.apply(index, command)
        last_command = command
        state.check()
        if command["op"] == "add" and effect.accepted:
            seg = SegmentMeta.from_json(command["segment"])
            for offset in range(seg.base_offset, seg.last_offset + 1):
                assert offset not in removed
                owner.setdefault(offset, seg.object)
        if command["op"] == "truncate" and effect.accepted:
            removed.update(o for o in owner if o < state.start_offset)
        if command["op"] == "collected" and effect.accepted:
            for key in command["keys"]:
                assert garbage_before[key] <= durable_before  # only once no manifest names it
            deleted.update(command["keys"])
        # Every offset the state holds is held by the object first recorded for it.
        for seg in state.segments:
            for offset in (seg.base_offset, seg.last_offset):
                assert owner[offset] == seg.object
            assert seg.object not in deleted
        assert all(owner.get(o) for s in state.segments for o in (s.base_offset,))
        # Snapshots restore the same state.
        assert ManifestState.restore(state.snapshot()) == state


def test_an_add_of_another_object_for_a_held_range_is_refused() -> None:
    state = ManifestState()
    assert state.apply(1, {"op": "add", "segment": segment(0, 9, "").to_json()}).accepted
    effect = state.apply(2, {"op": "add", "segment": segment(0, 4, "-other").to_json()})
    assert not effect.accepted
    assert "already held" in effect.reason
    assert [s.object for s in state.segments] == [segment(0, 9, "").object]


def test_the_same_add_twice_is_a_no_op() -> None:
    state = ManifestState()
    command = {"op": "add", "segment": segment(0, 9, "").to_json()}
    assert state.apply(1, command).accepted
    assert not state.apply(2, command).accepted
    assert len(state.segments) == 1 and state.revision == 1


def test_garbage_is_collectable_only_after_a_durable_manifest_without_it() -> None:
    state = ManifestState()
    state.apply(1, {"op": "add", "segment": segment(0, 9, "").to_json()})
    state.apply(2, {"op": "add", "segment": segment(10, 19, "").to_json()})
    state.apply(3, {"op": "truncate", "start_offset": 10})
    assert state.collectable() == []
    keys = [key for _, key in state.garbage]
    assert not state.apply(4, {"op": "collected", "keys": keys}).accepted
    state.apply(5, {"op": "durable", "revision": state.revision, "next_offset": 20})
    assert sorted(state.collectable()) == sorted(keys)
    assert state.apply(6, {"op": "collected", "keys": keys}).accepted
    assert state.garbage == []


def test_local_trim_bound_follows_the_durable_manifest_only() -> None:
    state = ManifestState()
    state.apply(1, {"op": "add", "segment": segment(0, 9, "").to_json()})
    assert state.durable_next == 0
    state.apply(2, {"op": "durable", "revision": 1, "next_offset": 10})
    state.apply(3, {"op": "add", "segment": segment(10, 19, "").to_json()})
    assert state.durable_next == 10  # the second segment's manifest is not in the bucket yet


def test_bucket_document_round_trips_to_the_same_segments() -> None:
    state = ManifestState()
    state.apply(1, {"op": "add", "segment": segment(5, 9, "").to_json()})
    document = state.document("t", 1, 0)
    again = ManifestState.from_document(document)
    assert again.segments == state.segments
    assert (again.start_offset, again.next_offset) == (5, 10)


def test_after_retention_emptied_the_state_an_upload_must_continue_at_its_end() -> None:
    """Only the first upload may start anywhere: a later one past next_offset means the state
    missed commands (a replica that installed the leader's trim point) and must not jump."""
    state = ManifestState()
    assert state.apply(1, {"op": "add", "segment": segment(5, 9, "").to_json()}).accepted
    assert state.apply(2, {"op": "truncate", "start_offset": 10}).accepted
    assert state.segments == [] and state.next_offset == 10
    effect = state.apply(3, {"op": "add", "segment": segment(20, 29, "").to_json()})
    assert not effect.accepted and "gap" in effect.reason
    assert state.start_offset == 10
    assert state.apply(4, {"op": "add", "segment": segment(10, 19, "").to_json()}).accepted
