"""Which bucket objects no manifest will ever name: the rules of the sweeps (FORMAT.md §8).

Owns deciding, from a listing and the replicated state only, which segment objects of a
partition are unrecorded uploads that can never be recorded, and which topic objects belong to
topics the cluster deleted. Pure: the node lists, deletes and decides when (node/tiered_gc.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .manifest import ManifestState

# {base:020d}-{last:020d}.{kind}: every object of a segment (tiered/FORMAT.md §1)
_SEGMENT_NAME = re.compile(r"(\d{20})-(\d{20})\.(?:log|index|timeindex|txnindex)")
_TOPIC_KEY = re.compile(r"topics/([^/]+)/(\d+)/topic\.json")


def unrecorded(state: ManifestState, keys: Iterable[str]) -> list[str]:
    """Segment objects among `keys` (one partition's folder) that no manifest can ever name.

    After a partition's first upload every add must start at `next_offset` (ManifestState), so
    an object whose range starts below it and that the state does not name was never recorded
    and never will be: an upload of a deposed leader, or one cut short before its add. Objects
    the state names, garbage it still tracks (its own collection deletes it once no durable
    manifest names it) and anything that is not a segment object stay. An object starting at
    or past `next_offset` stays too: the leader may yet record it (uploads are put-if-absent,
    so the next leader's upload of the same range reuses it). Holds for a state that is behind
    as well: its segments are a prefix of the committed ones."""
    if not state.revision:  # nothing recorded yet: the first add may start anywhere
        return []
    named = {key for segment in state.segments for key in segment.keys}
    named.update(key for _, key in state.garbage)
    out = []
    for key in keys:
        match = _SEGMENT_NAME.fullmatch(key.rpartition("/")[2])
        if match and key not in named and int(match[1]) < state.next_offset:
            out.append(key)
    return out


def deleted_topics(
    keys: Iterable[str], live: Iterable[tuple[str, int]], next_topic_id: int
) -> list[tuple[str, int]]:
    """(name, topic_id) of the topic objects among `keys` whose topic the cluster deleted.

    Topic ids are unique per creation and allocated in increasing order, so an id below the
    metadata's next one that no live topic has belongs to a deleted topic, for good. An id at or
    past it is a topic this (possibly lagging) metadata does not know yet: it stays. The caller
    still checks the object's cluster_id: another cluster's topics (a shared bucket, or one
    waiting to be restored) are never this cluster's to delete."""
    alive = set(live)
    out = []
    for key in keys:
        match = _TOPIC_KEY.fullmatch(key)
        if match is None:
            continue
        name, topic_id = match[1], int(match[2])
        if topic_id < next_topic_id and (name, topic_id) not in alive:
            out.append((name, topic_id))
    return out
