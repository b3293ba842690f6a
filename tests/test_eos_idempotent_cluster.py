"""Idempotent producers on a real 3-node cluster: a retry after the leader is SIGKILLed.

A producer that resends every failed or unanswered request with the same producer id, epoch
and sequence (to any live node) while the partition leader is killed and restarted: every
message is stored exactly once, in order, at the offset its acknowledgement named, and a
retry of an acknowledged request sent to the new leader answers the original offsets.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import Cluster, http_json, read_partition, running_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(150)]


def _send_until_acked(
    cluster: Cluster, body: dict[str, Any], turn: int, topic: str = "idem"
) -> tuple[Any, int]:
    """Resend `body` unchanged until a node answers 200; returns (answer, attempts)."""
    deadline = time.monotonic() + 60
    attempts = 0
    while time.monotonic() < deadline:
        live = cluster.live()
        node = live[(turn + attempts) % len(live)]
        attempts += 1
        try:
            status, answer = http_json(
                f"{node.url}/v1/topics/{topic}/messages", "POST", body, timeout=10.0
            )
        except OSError:
            time.sleep(0.05)
            continue
        if status == 200:
            return answer, attempts
        assert answer["error"]["retryable"], (status, answer)
        time.sleep(0.05)
    raise AssertionError(f"no node acknowledged {body}")


def test_retries_across_a_leader_kill_store_every_message_once(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("idem")
        leader = cluster.wait_for_leader("idem", 0)
        status, producer = http_json(f"{cluster.nodes[0].url}/v1/producers", "POST", {})
        assert status == 200, producer
        pid, epoch = producer["producer_id"], producer["producer_epoch"]
        acked: dict[int, int] = {}
        retried = 0

        def body(seq: int) -> dict[str, Any]:
            return {
                "producer_id": pid,
                "producer_epoch": epoch,
                "sequence": seq,
                "messages": [{"value": f"v{seq}", "partition": 0}],
            }

        for seq in range(120):
            if seq == 40:
                cluster.node(leader).kill()
                # acknowledged by the old leader; the new one answers a retry from the log it
                # applied: the same offsets, nothing written
                answer, _ = _send_until_acked(cluster, body(39), seq)
                assert answer == {
                    "offsets": [{"partition": 0, "offset": acked[39]}],
                    "duplicate": True,
                }
                assert cluster.wait_for_leader("idem", 0) != leader
            if seq == 80:
                cluster.node(leader).start()
            answer, attempts = _send_until_acked(cluster, body(seq), seq)
            retried += attempts > 1
            acked[seq] = answer["offsets"][0]["offset"]
        for seq in (115, 119):
            answer, _ = _send_until_acked(cluster, body(seq), seq)
            assert answer == {
                "offsets": [{"partition": 0, "offset": acked[seq]}],
                "duplicate": True,
            }
        # older than the last 5 batches: no longer remembered, so out of order, never written
        node = cluster.node(cluster.wait_for_leader("idem", 0))
        status, answer = http_json(
            f"{node.url}/v1/topics/idem/messages", "POST", body(35), timeout=10.0
        )
        assert status == 409 and answer["error"]["code"] == "out_of_order_sequence", answer
        cluster.wait_ready([cluster.node(leader)])
        messages = read_partition(cluster.node(leader), "idem", 0)
        values = [m["value"] for m in messages]
        assert values == [f"v{seq}" for seq in range(120)], f"retried {retried} requests"
        offsets = {m["value"]: m["offset"] for m in messages}
        assert all(offsets[f"v{seq}"] == offset for seq, offset in acked.items())
        print(f"\n{retried} requests needed a retry across the leader kill")


def test_concurrent_producers_across_a_leader_kill_write_every_batch_once(
    tmp_path: Path,
) -> None:
    """Four producers, each sending numbered 3-message requests to any node and resending every
    request that fails or goes unanswered, while the partition leader is SIGKILLed mid-stream
    (some requests are then in flight: written or not, their outcome is unknown) and restarted:
    every message is stored exactly once, in each producer's order, where its answer said."""
    with running_cluster(tmp_path) as cluster:
        cluster.create_topic("idem4")
        leader = cluster.wait_for_leader("idem4", 0)
        producers = []
        for _ in range(4):
            status, producer = http_json(f"{cluster.nodes[0].url}/v1/producers", "POST", {})
            assert status == 200, producer
            producers.append(producer["producer_id"])
        acked: dict[str, int] = {}
        retries = [0]
        duplicates = [0]  # retries of requests the old leader had written
        errors: list[BaseException] = []

        def run(index: int, pid: int) -> None:
            try:
                for n in range(40):
                    values = [f"p{index}-{n}-{i}" for i in range(3)]
                    body = {
                        "producer_id": pid,
                        "producer_epoch": 0,
                        "sequence": 3 * n,
                        "messages": [{"value": v, "partition": 0} for v in values],
                    }
                    answer, attempts = _send_until_acked(cluster, body, index + n, "idem4")
                    retries[0] += attempts - 1
                    duplicates[0] += bool(answer.get("duplicate"))
                    for value, where in zip(values, answer["offsets"], strict=True):
                        acked[value] = where["offset"]
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        import threading

        threads = [threading.Thread(target=run, args=(i, pid)) for i, pid in enumerate(producers)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while len(acked) < 120 and time.monotonic() < deadline:
            time.sleep(0.01)
        cluster.node(leader).kill()
        time.sleep(1.0)
        cluster.node(leader).start()
        for thread in threads:
            thread.join(90)
        assert not errors, errors
        cluster.wait_ready([cluster.node(leader)])
        messages = read_partition(cluster.node(leader), "idem4", 0)
        values = [m["value"] for m in messages]
        assert len(values) == len(set(values)) == 4 * 40 * 3, f"{retries[0]} retries"
        for index in range(4):
            mine = [v for v in values if v.startswith(f"p{index}-")]
            assert mine == [f"p{index}-{n}-{i}" for n in range(40) for i in range(3)]
        assert {m["value"]: m["offset"] for m in messages} == acked
        print(f"\n{retries[0]} retries, {duplicates[0]} answered as duplicates")
