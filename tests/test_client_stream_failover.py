"""A streamed group consumer on a real 3-node cluster across the SIGKILL of a partition leader,
while a producer keeps writing: its committed view (the messages handed to the application, up
to the offsets it committed) is every record of each partition's log exactly once, in order.
Once with the stream on a node that survives (the stream's reads move to the new leader), once
with the stream on the node killed (the member joins again from its commits and streams anew)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest
from cluster_harness import running_cluster

from raftline.clients.client import Client, RaftlineError, RetryPolicy

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

TOPIC = "orders"
PARTITIONS = 2


def log_offsets(admin: Client, partition: int) -> list[int]:
    """Offsets of the records of a partition's log, read to its high watermark."""
    offsets: list[int] = []
    offset: int | str = "earliest"
    while True:
        result = admin.fetch(TOPIC, partition, offset, max_messages=1000)
        offsets += [m.offset for m in result.messages]
        offset = result.next_offset
        if result.next_offset >= result.high_watermark:
            return offsets


def produce_until(admin: Client, stop: threading.Event, counts: list[int]) -> None:
    n = 0
    while not stop.is_set():
        for partition in range(PARTITIONS):
            try:
                admin.produce_batch(TOPIC, partition, [f"{partition}-{n}"])
                counts[partition] += 1
            except RaftlineError:
                pass  # the log is the truth: an ambiguous write is judged from it
        n += 1
        time.sleep(0.01)


@pytest.mark.parametrize("stream_on_victim", [False, True], ids=["survivor", "victim"])
def test_a_streamed_member_keeps_an_exact_committed_view_across_a_leader_kill(
    tmp_path: Path, stream_on_victim: bool
) -> None:
    with running_cluster(tmp_path, size=3) as cluster:
        cluster.create_topic(TOPIC, PARTITIONS)
        victim = cluster.node(cluster.wait_for_leader(TOPIC, 0))
        others = [n for n in cluster.nodes if n is not victim]
        first = victim if stream_on_victim else others[0]
        rest = [n for n in cluster.nodes if n is not first]
        member_urls = ",".join(n.url for n in [first, *rest])
        admin = Client(",".join(n.url for n in others), retry=RetryPolicy(retries=30))
        stop = threading.Event()
        counts = [0] * PARTITIONS
        producer = threading.Thread(target=produce_until, args=(admin, stop, counts))
        producer.start()
        handed: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        try:
            with Client(member_urls, retry=RetryPolicy(retries=30)) as client:
                member = client.consumer(
                    TOPIC,
                    group="streamed",
                    auto_offset_reset="earliest",
                    auto_commit_interval_ms=None,
                    stream=True,
                    prefetch=20,
                    max_messages=10,
                    wait_ms=300,
                )

                def consume_for(seconds: float) -> None:
                    until = time.monotonic() + seconds
                    while time.monotonic() < until:
                        for message in member.poll():
                            handed[message.partition].append(message.offset)
                        with contextlib.suppress(RaftlineError):  # the next commit carries it
                            member.commit()

                consume_for(3)
                assert member.stream.handle is not None, "the member should be streaming"
                cluster.timeline.note(f"killing node {victim.node_id}, leader of {TOPIC}/0")
                victim.kill()
                consume_for(8)
                stop.set()
                producer.join()
                ends = {p: log_offsets(admin, p) for p in range(PARTITIONS)}
                deadline = time.monotonic() + 40
                while any(
                    member.consumed.get((TOPIC, p), 0) < (ends[p][-1] + 1 if ends[p] else 0)
                    for p in range(PARTITIONS)
                ):
                    assert time.monotonic() < deadline, (member.consumed, counts)
                    consume_for(0.5)
                member.commit()
                committed = {o["partition"]: o["offset"] for o in admin.group_offsets("streamed")}
                member.close()
        finally:
            stop.set()
            producer.join()
            admin.close()
    for partition in range(PARTITIONS):
        view = [o for o in handed[partition] if o < committed[partition]]
        assert view == ends[partition], f"partition {partition}: committed view != log"
    assert all(c > 0 for c in counts)
    print(f"records per partition {[len(e) for e in ends.values()]}, acked {counts}")
