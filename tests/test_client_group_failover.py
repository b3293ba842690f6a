"""A group consumer on a real 3-node cluster keeps going when the node it talks to is SIGKILLed:
its fetch is not retried (the server may have moved its positions for an answer that was lost),
so it joins again through another node and reads from the committed offsets: every message
acknowledged before or after the kill is delivered at least once (what was consumed but not
committed, again)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cluster_harness import running_cluster

from raftline.clients.client import Client, RetryPolicy

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

PARTITIONS = 3


def test_a_member_survives_the_kill_of_its_node_and_loses_nothing(tmp_path: Path) -> None:
    with running_cluster(tmp_path, size=3) as cluster:
        cluster.create_topic("orders", PARTITIONS)
        first, *others = cluster.nodes
        # The member asks the first node first; the admin client only the others.
        member_urls = ",".join(n.url for n in [first, *others])
        admin = Client(",".join(n.url for n in others), retry=RetryPolicy(retries=20))
        sent: set[str] = set()

        def produce(tag: str) -> None:
            for p in range(PARTITIONS):
                values = [f"{tag}-{p}-{i}" for i in range(40)]
                admin.produce_batch("orders", p, values)
                sent.update(values)

        produce("before")
        got: list[str] = []
        with Client(member_urls, retry=RetryPolicy(retries=20)) as client:
            member = client.consumer(
                "orders",
                group="survivors",
                auto_offset_reset="earliest",
                auto_commit_interval_ms=None,  # the first call after the kill is a fetch
                max_messages=10,
                wait_ms=200,
            )
            deadline = time.monotonic() + 60
            while len(got) < 60:
                assert time.monotonic() < deadline
                got += [m.text or "" for m in member.poll()]
            got += [m.text or "" for m in member.poll()]  # consumed, not committed
            first.kill()
            produce("after")
            while not sent <= set(got):
                assert time.monotonic() < deadline, sorted(sent - set(got))[:5]
                got += [m.text or "" for m in member.poll()]
            assert member._joins >= 2  # it joined again, through another node
            member.commit()
            member.close()
        admin.close()
    assert sent <= set(got)
    print(f"{len(got)} deliveries of {len(sent)} messages ({len(got) - len(set(got))} again)")
