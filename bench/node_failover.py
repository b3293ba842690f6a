"""Time from losing a partition leader to the first acks=all write accepted by its successor.

Runs three in-process brokers on loopback (one event loop), stops the partition leader and
retries produce on the survivors. Usage: .venv/bin/python -m bench.node_failover [rounds]
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench import positionals
from bench.inproc import configs, leading, start_all
from bench.positionals import Positional, positive_int
from raftline.node.broker import Broker, BrokerError
from raftline.node.config import NodeConfig
from raftline.raftlog.records import Record, build_batch

PORT_BASE = 19100  # Raft ports 19151..; nothing else binds in this range


async def one_round(root: Path) -> float:
    cfgs: list[NodeConfig] = configs(root, 3, PORT_BASE)
    brokers = await start_all(cfgs)
    await brokers[0].create_topic("f", 1, 3, {})
    batch = build_batch([Record(b"x" * 100)])
    while (leader := leading(brokers, "f")) is None:
        await asyncio.sleep(0.01)
    await leader.produce("f", 0, batch, "all")
    await asyncio.sleep(1.0)  # let the group go quiet first: the harder case
    survivors: list[Broker] = [b for b in brokers if b is not leader]
    start = time.monotonic()
    await leader.stop()
    done = False
    while not done:
        for broker in survivors:
            try:
                await broker.produce("f", 0, batch, "all")
                done = True
                break
            except BrokerError:
                pass
        await asyncio.sleep(0.005)
    elapsed = time.monotonic() - start
    for broker in survivors:
        await broker.stop()
    return elapsed


async def main(rounds: int) -> None:
    times = []
    for i in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            times.append(await one_round(Path(tmp)))
        print(f"round {i}: {times[-1] * 1000:.0f} ms", flush=True)
    print(
        f"leader loss -> first acks=all write on the new leader: median "
        f"{statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms "
        f"over {rounds} rounds (tick 50 ms, election 10-20 ticks)"
    )


if __name__ == "__main__":
    rounds = Positional("rounds", positive_int, 5)
    args = positionals.parse("bench.node_failover", __doc__, [rounds])
    asyncio.run(main(args.rounds))
