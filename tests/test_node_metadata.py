"""The metadata state machine's rules and replica placement, applied as pure functions."""

from __future__ import annotations

from collections import Counter

import pytest

from raftline.node.controller import decode_command, encode_command, leadership_moves
from raftline.node.metadata import MetadataError, MetadataState, place_replicas


def registered(*nodes: tuple[int, str | None]) -> MetadataState:
    state = MetadataState()
    for node_id, rack in nodes:
        state.apply(
            {
                "op": "register_node",
                "node": {
                    "id": node_id,
                    "raft": f"h:{node_id}",
                    "http": f"w:{node_id}",
                    "rack": rack,
                },
            }
        )
    return state


def create(state: MetadataState, name: str, replicas: list[list[int]], **config: str) -> None:
    state.apply({"op": "create_topic", "name": name, "config": config, "replicas": replicas})


def test_bootstrap_sets_the_cluster_id_once() -> None:
    state = MetadataState()
    state.apply({"op": "bootstrap", "cluster_id": "first"})
    state.apply({"op": "bootstrap", "cluster_id": "second"})
    assert state.cluster_id == "first"


def test_registering_a_node_again_updates_its_addresses() -> None:
    state = registered((1, None))
    state.apply({"op": "register_node", "node": {"id": 1, "raft": "r", "http": "new", "rack": "a"}})
    assert (state.nodes[1].http, state.nodes[1].rack) == ("new", "a")


def test_creating_an_existing_topic_is_topic_exists_and_changes_nothing() -> None:
    state = registered((1, None))
    create(state, "t", [[1]])
    with pytest.raises(MetadataError) as caught:
        create(state, "t", [[1], [1]])
    assert caught.value.code == "topic_exists"
    assert len(state.topics["t"].replicas) == 1


@pytest.mark.parametrize("name", ["", "has space", "a/b", "x" * 250, "tilde~"])
def test_bad_topic_names_are_invalid_requests(name: str) -> None:
    state = registered((1, None))
    with pytest.raises(MetadataError) as caught:
        create(state, name, [[1]])
    assert caught.value.code == "invalid_request"
    assert state.topics == {}


@pytest.mark.parametrize(
    "config",
    [
        {"retention.ms": "soon"},
        {"cleanup.policy": "shred"},
        {"no.such.key": "1"},
        {"max.message.bytes": str(11 * 1024 * 1024)},
    ],
)
def test_bad_topic_configs_are_invalid_requests(config: dict[str, str]) -> None:
    state = registered((1, None))
    with pytest.raises(MetadataError) as caught:
        create(state, "t", [[1]], **config)
    assert caught.value.code == "invalid_request"


@pytest.mark.parametrize("replicas", [[[1, 1]], [[1], [1, 2]], [[9]], [], [[]]])
def test_replica_sets_must_be_distinct_registered_nodes_of_one_size(
    replicas: list[list[int]],
) -> None:
    state = registered((1, None), (2, None))
    with pytest.raises(MetadataError):
        create(state, "t", replicas)


def test_deleting_a_topic_removes_its_groups_and_a_recreated_topic_gets_new_groups() -> None:
    state = registered((1, None))
    create(state, "t", [[1]])
    old_groups = set(state.groups_of(1))
    state.apply({"op": "delete_topic", "name": "t"})
    assert state.groups_of(1) == {}
    create(state, "t", [[1]])
    assert set(state.groups_of(1)).isdisjoint(old_groups)


def test_deleting_an_unknown_topic_is_unknown_topic() -> None:
    with pytest.raises(MetadataError) as caught:
        MetadataState().apply({"op": "delete_topic", "name": "ghost"})
    assert caught.value.code == "unknown_topic"


def test_unknown_commands_are_rejected() -> None:
    with pytest.raises(MetadataError):
        MetadataState().apply({"op": "format_disk"})


def test_commands_survive_their_batch_encoding() -> None:
    command = {"op": "create_topic", "name": "t", "config": {}, "replicas": [[1, 2]]}
    assert decode_command(encode_command(command)) == command


def test_placement_spreads_replicas_and_preferred_leaders_evenly() -> None:
    state = registered((1, None), (2, None), (3, None))
    placement = place_replicas(state, 6, 2)
    assert Counter(r[0] for r in placement) == {1: 2, 2: 2, 3: 2}
    assert Counter(n for r in placement for n in r) == {1: 4, 2: 4, 3: 4}


def test_placement_counts_the_load_of_existing_topics() -> None:
    state = registered((1, None), (2, None), (3, None))
    create(state, "busy", [[1], [1], [2]])
    assert place_replicas(state, 1, 1) == [[3]]


def test_placement_puts_replicas_of_a_partition_on_different_racks() -> None:
    state = registered((1, "a"), (2, "a"), (3, "b"), (4, "b"))
    for replicas in place_replicas(state, 8, 2):
        assert {state.nodes[n].rack for n in replicas} == {"a", "b"}


def test_placement_refuses_more_replicas_than_nodes() -> None:
    with pytest.raises(MetadataError) as caught:
        place_replicas(registered((1, None)), 1, 3)
    assert caught.value.code == "not_enough_replicas"


def test_leadership_moves_back_to_a_live_preferred_replica_after_settling() -> None:
    state = registered((1, None), (2, None))
    create(state, "t", [[1, 2]])
    group = state.topics["t"].group(0)
    args = (state, lambda g: 2, lambda n: True)
    assert leadership_moves(*args, {group: 0.0}, now=100.0, settle_s=10) == [(group, 2, 1)]
    assert leadership_moves(*args, {group: 95.0}, now=100.0, settle_s=10) == []
    dead_preferred = (state, lambda g: 2, lambda n: n != 1)
    assert leadership_moves(*dead_preferred, {}, now=100.0, settle_s=10) == []
