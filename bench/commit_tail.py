"""The RF 3 produce commit at a low fixed rate: the publish ack's tail and the stages it is made of.

Owns the probe of issue #18 item 6's publish ack: three `raftline serve --fsync always` nodes,
one message per request at a fixed rate over the partitions, each request to its partition's
leader on its own (no in-flight limit: a slow ack holds up no later send), acks=all, each ack
timed from the message's intended send time; each write-path stage's p50/p99 from the
nodes' /metrics over the same window, the nodes' CPU time per message and run-queue wait.

With `--one-at-a-time` the requests go one after another instead (each sent when the last
was acknowledged): no two messages ever share a round, a write or a frame, so the nodes' CPU
per message is what one request costs, whatever the machine's load does to the latency (at a
fixed rate a loaded machine batches more and spends less per message). The nodes' CPU over an
idle window of the same length (ticks, heartbeats) is measured first and taken off:
`node_cpu_us_per_msg_net`.

Run: .venv/bin/python -m bench.commit_tail [--rate 500] [--seconds 20] [--partitions 4]
     .venv/bin/python -m bench.commit_tail --one-at-a-time --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.fsync_tail import FORWARDED, CpuWatch, _counters, _stage_buckets, stage_summary
from bench.host_samples import _cpu_and_rss
from bench.node_procs import running_nodes
from raftline.clients.aio import AsyncClient
from raftline.clients.wire import TRANSPORTS

NODES = 3
PORT_BASE = 19700
TOPIC = "commit-tail"
# Counters over the window, summed over the nodes: requests forwarded to a leader (the client's
# was stale), collector passes (node/collector.py: a young one pauses the loop too), log fsyncs,
# and follower rounds fed beside the group's writes in flight (node/runtime.py).
COUNTERS = {
    "forwarded": FORWARDED,
    "gc_young": "raftline_gc_young_collections_total",
    "gc_full": "raftline_gc_full_collections_total",
    "fsyncs": "raftline_raft_fsyncs_total",
    "follower_rounds_beside_writes": "raftline_raft_follower_rounds_beside_writes_total",
}
WARMUP_S = 3.0
IDLE_MAX_S = 10.0  # the idle window: as long as the measured one, at most this


def quantiles_ms(samples: list[float]) -> dict[str, float]:
    """p50 / p99 / p99.9 / max of latencies in seconds, in milliseconds."""
    ordered = sorted(samples)
    if not ordered:
        return {}
    last = len(ordered) - 1
    picks = {name: ordered[min(int(len(ordered) * q), last)] for name, q in _QUANTILES}
    return {name: round(value * 1000, 2) for name, value in {**picks, "max": ordered[-1]}.items()}


_QUANTILES = (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))


async def _publish_at_rate(
    client: AsyncClient,
    leaders: list[str],
    rate: float,
    seconds: float,
    size: int,
    transport: str = "http",
) -> list[float]:
    """Send one message per request at `rate` msg/s to the partitions in turn, each to its
    leader's URL; each ack's latency counted from when its message was due."""
    latencies: list[float] = []
    payload = b"x" * size
    tasks: set[asyncio.Task[None]] = set()

    async def send(partition: int, due: float) -> None:
        url = leaders[partition]
        await client.produce_batch(TOPIC, partition, [payload], "all", url=url, transport=transport)
        latencies.append(time.monotonic() - due)

    start = time.monotonic()
    for i in range(int(rate * seconds)):
        due = start + i / rate
        if (wait := due - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        tasks.add(task := asyncio.create_task(send(i % len(leaders), due)))
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    return latencies


async def _publish_in_turn(
    client: AsyncClient, leaders: list[str], seconds: float, size: int, transport: str = "http"
) -> list[float]:
    """Send one message per request to the partitions in turn for `seconds`, each request once
    the last was acknowledged; each ack's latency counted from its send."""
    latencies: list[float] = []
    payload = b"x" * size
    end = time.monotonic() + seconds
    i = 0
    while (sent := time.monotonic()) < end:
        partition = i % len(leaders)
        url = leaders[partition]
        await client.produce_batch(TOPIC, partition, [payload], "all", url=url, transport=transport)
        latencies.append(time.monotonic() - sent)
        i += 1
    return latencies


def run(
    rate: float,
    seconds: float,
    partitions: int,
    size: int,
    flags: dict[str, str],
    root: Path,
    one_at_a_time: bool = False,
    transport: str = "http",
) -> dict[str, Any]:
    """One run on fresh nodes: warm-up, an idle window, then the measured window."""
    with running_nodes(root, NODES, PORT_BASE, "always", flags) as cluster:
        cluster.create_topic(TOPIC, partitions, NODES)
        leaders = [cluster.leader(TOPIC, p).url for p in range(partitions)]
        client = AsyncClient(cluster.nodes[0].url)
        pids = {f"node-{n.node_id}": n.pid for n in cluster.nodes}

        async def go() -> dict[str, Any]:
            try:
                await _publish_at_rate(client, leaders, rate, WARMUP_S, size, transport)
                idle_s = min(seconds, IDLE_MAX_S)
                idle0, _ = _cpu_and_rss(list(pids.values()))
                await asyncio.sleep(idle_s)
                idle1, _ = _cpu_and_rss(list(pids.values()))
                idle_per_s = sum(idle1[p] - idle0[p] for p in pids.values()) / idle_s
                stages0 = _stage_buckets(cluster)
                counts0 = _counters(cluster, tuple(COUNTERS.values()))
                cpu0, _ = _cpu_and_rss(list(pids.values()))
                watch = CpuWatch({**pids, "probe (client)": os.getpid()}).start()
                began = time.monotonic()
                if one_at_a_time:
                    latencies = await _publish_in_turn(client, leaders, seconds, size, transport)
                else:
                    latencies = await _publish_at_rate(
                        client, leaders, rate, seconds, size, transport
                    )
                window = time.monotonic() - began
                cpu_pct, waits = watch.stop()
                cpu1, _ = _cpu_and_rss(list(pids.values()))
                counts1 = _counters(cluster, tuple(COUNTERS.values()))
                node_cpu = sum(cpu1[p] - cpu0[p] for p in pids.values())
                return {
                    "ack_ms": quantiles_ms(latencies),
                    "messages": len(latencies),
                    "node_cpu_us_per_msg": round(1e6 * node_cpu / len(latencies), 1),
                    "node_cpu_us_per_msg_net": round(
                        1e6 * (node_cpu - idle_per_s * window) / len(latencies), 1
                    ),
                    "idle_node_cpu_pct": round(100 * idle_per_s, 1),
                    "cpu_pct": cpu_pct,
                    "runq_wait_pct": waits,
                    **{
                        name: sum(counts1[metric]) - sum(counts0[metric])
                        for name, metric in COUNTERS.items()
                    },
                    "stages_ms": stage_summary(stages0, _stage_buckets(cluster)),
                }
            finally:
                await client.close()

        result = asyncio.run(go())
    return {
        "rate": "one at a time" if one_at_a_time else rate,
        "transport": transport,
        "flags": flags,
        "load_1m": round(os.getloadavg()[0], 2),
        **result,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.commit_tail", description=__doc__)
    parser.add_argument("--rate", type=float, default=500.0, help="messages per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--size", type=int, default=1024, help="bytes per message")
    parser.add_argument("--flag", action="append", default=[], help="serve flag NAME=VALUE")
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="each request once the last was acknowledged (CPU per request; --rate: warm-up)",
    )
    parser.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="http",
        help="each request a POST, or a frame on a produce stream per leader",
    )
    parser.add_argument("--out", help="append the result as one JSON line here")
    args = parser.parse_args(argv)
    flags = dict(flag.split("=", 1) for flag in args.flag)
    root = Path(tempfile.mkdtemp(prefix="commit-tail-", dir=os.environ.get("BENCH_DIR")))
    try:
        result = run(
            args.rate,
            args.seconds,
            args.partitions,
            args.size,
            flags,
            root,
            args.one_at_a_time,
            args.transport,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "a") as out:
            out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
