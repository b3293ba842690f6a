"""Objects no manifest will ever name leave the bucket: unrecorded uploads (a deposed leader's)
by the partition leader's sweep, deleted topics' objects by the controller's sweep even when the
partition's leader was not there to remove them; everything else stays (tiered/FORMAT.md §8)."""

from __future__ import annotations

import asyncio
import json

from inproc_harness import wait_for
from seaweedfs import SeaweedServer
from test_tiered_node import (
    TIERED,
    fetch_all,
    node,
    prefix,
    produce,
    s3_env,
    store_of,
    tiered_topic,
)

from raftline.node.broker import Broker
from raftline.tiered import layout
from raftline.tiered.garbage import deleted_topics, unrecorded
from raftline.tiered.manifest import ManifestState
from raftline.tiered.store import ObjectStore

__all__ = ["node", "prefix", "s3_env"]  # fixtures


def _add(state: ManifestState, index: int, base: int, last: int) -> list[str]:
    stem = f"h/t/1/0/{base:020d}-{last:020d}"
    segment = {
        "base_offset": base,
        "last_offset": last,
        "committed_offset": last + 1,
        "terms": [[1, base]],
        "size_bytes": 10,
        "batch_count": 1,
        "base_timestamp": 0,
        "max_timestamp": 0,
        "object": f"{stem}.log",
        "index": f"{stem}.index",
        "time_index": f"{stem}.timeindex",
        "txn_index": None,
        "aborted_transactions": 0,
    }
    assert state.apply(index, {"op": "add", "segment": segment}).accepted
    return [f"{stem}.log", f"{stem}.index", f"{stem}.timeindex"]


def test_only_unnamed_segment_objects_below_the_manifest_end_are_unrecorded() -> None:
    state = ManifestState()
    first = _add(state, 1, 0, 9)
    second = _add(state, 2, 10, 19)
    assert state.apply(3, {"op": "truncate", "start_offset": 10}).accepted  # first: garbage
    overlapping = "h/t/1/0/00000000000000000010-00000000000000000014.log"  # a deposed leader's
    beyond = "h/t/1/0/00000000000000000020-00000000000000000029.log"  # may yet be recorded
    other = ["h/t/1/0/manifest.json", "h/t/1/0/notes.txt"]
    keys = [*first, *second, overlapping, beyond, *other]
    assert unrecorded(state, keys) == [overlapping]


def test_before_the_first_upload_is_recorded_nothing_is_unrecorded() -> None:
    key = "h/t/1/0/00000000000000000000-00000000000000000009.log"
    assert unrecorded(ManifestState(), [key]) == []


def test_only_topic_ids_the_metadata_allocated_and_deleted_are_deleted_topics() -> None:
    keys = [
        "topics/kept/1/topic.json",
        "topics/gone/2/topic.json",
        "topics/kept/3/topic.json",  # a newer incarnation than this metadata knows
        "topics/gone/2/other.json",
    ]
    assert deleted_topics(keys, [("kept", 1)], next_topic_id=3) == [("gone", 2)]


async def _keys(store: ObjectStore, folder: str) -> set[str]:
    return {info.key for info in await store.list(folder)}


async def test_a_deposed_leaders_unrecorded_upload_is_swept_and_the_rest_stays(
    node: Broker, s3_env: SeaweedServer, bucket: str, prefix: str
) -> None:
    values, _, tiering = await tiered_topic(node, "swept", 80)
    await wait_for(lambda: len(tiering.state.segments) >= 3, timeout=30)
    await wait_for(lambda: tiering.state.durable_revision == tiering.state.revision, timeout=30)
    store = store_of(s3_env, bucket, prefix)
    folder = layout.partition_path("swept", node.meta.state.topics["swept"].topic_id, 0)
    first = tiering.state.segments[0]
    stem = f"{folder}/{first.base_offset:020d}-{first.last_offset + 1:020d}"
    dead = [f"{stem}.log", f"{stem}.index", f"{stem}.timeindex"]  # another range's objects
    ahead = f"{folder}/{tiering.state.next_offset + 1000:020d}-{999_999:020d}.log"
    unknown = f"{folder}/operator-notes.txt"
    for key in [*dead, ahead, unknown]:
        await store.put(key, b"not recorded")
    before = await _keys(store, folder + "/")
    node.tiering.sweep_partition_s = 0.0  # type: ignore[union-attr]
    deadline = asyncio.get_running_loop().time() + 30
    while set(dead) & await _keys(store, folder + "/"):
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.2)
    after = await _keys(store, folder + "/")
    named = {key for segment in tiering.state.segments for key in segment.keys}
    assert named <= after and {ahead, unknown} <= after
    assert before - after == set(dead)  # nothing else went (no retention.* here)
    assert node.tiering.swept_objects >= len(dead)  # type: ignore[union-attr]
    assert [v for _, v in await fetch_all(node, "swept")] == values


async def test_a_deleted_topic_the_leader_did_not_remove_is_swept_by_the_controller(
    node: Broker, s3_env: SeaweedServer, bucket: str, prefix: str
) -> None:
    await node.create_topic("left", 1, 1, TIERED)
    await node.create_topic("alive", 1, 1, TIERED)
    for topic in ("left", "alive"):
        await produce(node, topic, 40)
    tierings = {
        r.topic: node.tiering.partitions[r.group]  # type: ignore[union-attr]
        for r in node.partitions.values()
    }
    for tiering in tierings.values():
        await wait_for(lambda t=tiering: t.state.durable_revision > 0, timeout=30)
    store = store_of(s3_env, bucket, prefix)
    ids = {name: node.meta.state.topics[name].topic_id for name in ("left", "alive")}
    folders = {name: layout.partition_path(name, ids[name], 0) + "/" for name in ids}
    # Another cluster's deleted-looking topic in the same bucket: never this cluster's to delete.
    foreign = layout.topic_key("foreign", 1)
    document = json.loads(await store.get(layout.topic_key("left", ids["left"])))
    await store.put(foreign, json.dumps({**document, "cluster_id": "another"}).encode())
    # The partition's leader is gone when the topic is deleted: nobody removes its objects then.
    left = tierings["left"]
    node.tiering.partitions.pop(left.group)  # type: ignore[union-attr]
    left.stop()
    await node.delete_topic("left")
    await asyncio.sleep(1.0)
    assert await _keys(store, folders["left"])  # still there
    node.tiering.sweep_topics_s = 0.2  # type: ignore[union-attr]
    deadline = asyncio.get_running_loop().time() + 30
    while await _keys(store, folders["left"]) or await _keys(store, f"topics/left/{ids['left']}/"):
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.2)
    assert await _keys(store, folders["alive"])
    assert await _keys(store, f"topics/alive/{ids['alive']}/")
    assert await _keys(store, "topics/foreign/")
    assert node.tiering.swept_topics == 1  # type: ignore[union-attr]
