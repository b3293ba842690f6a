"""Queue calls go to the queue shard's leader: every queue answer names it (header
Raftline-Queue-Leader), and the client sends its next receive, ack and extend there, whichever
node it was given, so no node forwards them; an address it cannot reach sends it back to the
bootstrap nodes. A streamed receiver opens its stream there too."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from cluster_harness import Cluster, Node, running_cluster
from cluster_harness import call_until_done as call

from raftline.clients.client import Client

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def jobs_queue(cluster: Cluster) -> tuple[Node, Node]:
    """Queue "jobs" over a 2-partition topic "work": its shard leader and another node."""
    cluster.create_topic("work", partitions=2)
    first = cluster.nodes[0]
    call(first, "POST", "/v1/queues", {"name": "jobs", "topic": "work"})
    leader_id = call(first, "GET", "/v1/queues/jobs")["shard"]["leader"]
    elsewhere = next(n for n in cluster.nodes if n.node_id != leader_id)
    return cluster.node(leader_id), elsewhere


def test_queue_answers_name_the_shard_leader_and_the_client_goes_there(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        leader, elsewhere = jobs_queue(cluster)

        request = urllib.request.Request(f"{elsewhere.url}/v1/queues/jobs", method="GET")
        with urllib.request.urlopen(request, timeout=15) as answer:
            assert f"http://{answer.headers['Raftline-Queue-Leader']}" == leader.url

        client = Client(elsewhere.url)
        try:
            client.produce("work", [{"value": f"m{i}", "partition": i % 2} for i in range(4)])
            jobs = client.queue("jobs", max_messages=10, wait_ms=2_000)
            assert jobs.leader_url() is None  # nothing known yet: the bootstrap node forwards
            received = jobs.receive()
            assert jobs.leader_url() == leader.url
            got = list(received)
            while len(got) < 4:
                got += jobs.receive()
            assert all(jobs.ack(got))
            assert jobs.leader_url() == leader.url

            # an address the client cannot reach: the call goes to a bootstrap node instead
            client.metadata.unreachable.add(leader.url)
            assert jobs.leader_url() is None
            assert jobs.receive(wait_ms=0) == []
            assert jobs.describe()["acknowledged"] == 4
        finally:
            client.close()


def open_queue_streams(node: Node) -> int:
    with urllib.request.urlopen(f"{node.url}/metrics", timeout=15) as answer:
        lines = answer.read().decode().splitlines()
    gauge = 'raftline_streams_open{kind="queue"}'
    return int(next(x for x in lines if x.startswith(gauge)).split()[-1])


def test_a_streamed_receiver_opens_its_stream_at_the_shard_leader(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        leader, elsewhere = jobs_queue(cluster)
        client = Client(elsewhere.url)
        try:
            client.produce("work", [{"value": f"m{i}", "partition": i % 2} for i in range(4)])
            jobs = client.queue("jobs", max_messages=10, wait_ms=2_000, stream=True)
            got = list(jobs.receive())
            while len(got) < 4:
                got += jobs.receive()
            assert all(jobs.ack(got))
            assert open_queue_streams(leader) == 1
            assert open_queue_streams(elsewhere) == 0
        finally:
            client.close()
