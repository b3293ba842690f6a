"""What one RF 3 one-message produce costs the brokers, counted where the load cannot move it.

Owns the in-process probe of the Raft write path's cost per message: three brokers on one
event loop (their Raft traffic over loopback TCP, each with its own disk threads; no HTTP),
a topic of one partition at RF 3, then acks=all produces of one message each, one after the
other, on the leader. Nothing is ever batched, so each message takes the whole path once:
`python_calls_per_msg` (the event loop's Python calls, under cProfile) is the same on any
machine load; `cpu_us_per_msg` (the process's CPU, all threads, in a second pass without the
profiler) moves with the load far less than a real-process run's. `bench.commit_tail
--one-at-a-time` is the same measure through HTTP on real processes, and load-sensitive.

Run: .venv/bin/python -m bench.commit_calls [--messages 2000] [--top 30]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import shutil
import tempfile
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from bench.inproc import READY_TIMEOUT_S, configs, free_port_base, leading, start_all
from raftline.node.broker import Broker
from raftline.node.config import NodeConfig
from raftline.node.server import configure_process
from raftline.raftlog.records import Record, build_batch

TOPIC = "commit-calls"
WARMUP_MESSAGES = 300
READY_S = 30.0


async def _leader(brokers: list[Broker]) -> Broker:
    """The partition's leader once it accepts a write."""
    deadline = time.monotonic() + READY_S
    while True:
        for broker in brokers:
            try:
                await broker.produce(TOPIC, 0, build_batch([Record(b"warm")]), "all")
                return broker
            except Exception:  # not the leader (yet): try the next one
                if time.monotonic() > deadline:
                    raise
        await asyncio.sleep(0.05)


async def measure(root: Path, messages: int, size: int, top: int) -> dict[str, Any]:
    brokers = await start_all(configs(root, 3, free_port_base()))
    try:
        await brokers[0].create_topic(TOPIC, 1, 3, {})
        leader = await _leader(brokers)
        batch = build_batch([Record(b"x" * size)])
        for _ in range(WARMUP_MESSAGES):
            await leader.produce(TOPIC, 0, batch, "all")
        cpu0, wall0 = time.process_time(), time.monotonic()
        for _ in range(messages):
            await leader.produce(TOPIC, 0, batch, "all")
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(messages):
            await leader.produce(TOPIC, 0, batch, "all")
        profile.disable()
    finally:
        for broker in brokers:
            await broker.stop()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    calls = sum(row[1] for row in stats.values())
    by_self = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    return {
        "messages": messages,
        "python_calls_per_msg": round(calls / messages, 1),
        "cpu_us_per_msg": round(1e6 * cpu / messages),
        "wall_us_per_msg": round(1e6 * wall / messages),
        "load_1m": round(os.getloadavg()[0], 2),
        "top_self_time": [
            {
                "function": f"{Path(file).name}:{line} {name}",
                "calls_per_msg": round(row[1] / messages, 2),
                "self_us_per_msg_profiled": round(1e6 * row[2] / messages, 1),
            }
            for (file, line, name), row in by_self
        ],
    }


class _NodeThread:
    """One broker on a thread of its own with its own event loop; coroutines and calls are
    handed to that loop, and a profiler switched on there counts only this broker's loop."""

    def __init__(self, config: NodeConfig) -> None:
        self.loop = _loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.broker = Broker(config)
        self.profile = cProfile.Profile()
        self._cpu0 = 0.0
        self.cpu_s = 0.0

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def call(self, fn: Any, *args: Any) -> Any:
        async def on_loop() -> Any:
            return fn(*args)

        return self.run(on_loop())

    def begin(self) -> None:
        def on() -> None:
            self._cpu0 = time.thread_time()
            self.profile.enable()

        self.call(on)

    def end(self) -> None:
        def off() -> None:
            self.profile.disable()
            self.cpu_s = time.thread_time() - self._cpu0

        self.call(off)

    def close(self) -> None:
        self.run(self.broker.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _calls(profile: cProfile.Profile) -> tuple[int, dict[Any, Any]]:
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return sum(row[1] for row in stats.values()), stats


def measure_per_node(root: Path, messages: int, size: int, top: int) -> dict[str, Any]:
    """As `measure`, each broker on its own loop thread: calls and loop-thread CPU per
    message of the leader and of each follower, and the leader's costliest functions."""
    nodes = [_NodeThread(c) for c in configs(root, 3, free_port_base())]
    try:
        for node in nodes:
            node.run(node.broker.start())
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(node.call(node.broker.ready) for node in nodes):
            if time.monotonic() > deadline:
                raise TimeoutError("brokers did not become ready")
            time.sleep(0.02)
        nodes[0].run(nodes[0].broker.create_topic(TOPIC, 1, 3, {}))
        leader = _leader_node(nodes)
        batch = build_batch([Record(b"x" * size)])

        async def produce(count: int) -> None:
            for _ in range(count):
                await leader.broker.produce(TOPIC, 0, batch, "all")

        leader.run(produce(WARMUP_MESSAGES))
        for node in nodes:
            node.begin()
        leader.run(produce(messages))
        for node in nodes:
            node.end()
    finally:
        for node in nodes:
            node.close()
    followers = [node for node in nodes if node is not leader]
    leader_calls, stats = _calls(leader.profile)
    by_self = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    return {
        "messages": messages,
        "leader_calls_per_msg": round(leader_calls / messages, 1),
        "follower_calls_per_msg": [round(_calls(f.profile)[0] / messages, 1) for f in followers],
        # Driver rounds run per message: the calls move with them, and they with the timing
        # of the acknowledgements (two coming together share a round).
        "leader_rounds_per_msg": round(_driver_rounds(stats) / messages, 2),
        "leader_loop_cpu_us_per_msg": round(1e6 * leader.cpu_s / messages),
        "follower_loop_cpu_us_per_msg": [round(1e6 * f.cpu_s / messages) for f in followers],
        "load_1m": round(os.getloadavg()[0], 2),
        "leader_top_by_calls": [
            {
                "function": f"{Path(file).name}:{line} {name}",
                "calls_per_msg": round(row[1] / messages, 2),
            }
            for (file, line, name), row in sorted(stats.items(), key=lambda i: -i[1][1])[:top]
        ],
        "leader_top_self_time": [
            {
                "function": f"{Path(file).name}:{line} {name}",
                "calls_per_msg": round(row[1] / messages, 2),
                "self_us_per_msg_profiled": round(1e6 * row[2] / messages, 1),
            }
            for (file, line, name), row in by_self
        ],
    }


def _driver_rounds(stats: dict[Any, Any]) -> int:
    """How many times the runtime's driver (a coroutine: a call per resumption) ran a round."""
    return sum(
        row[1]
        for (file, _, name), row in stats.items()
        if name == "_drive" and file.endswith("runtime.py")
    )


def _leader_node(nodes: list[_NodeThread]) -> _NodeThread:
    """The node whose replica leads the partition once its preferred replica (the first)
    does: the controller moves leadership there, and a move during the count fails it."""
    deadline = time.monotonic() + READY_S
    brokers = [node.broker for node in nodes]
    preferred = nodes[0].call(lambda: brokers[0].meta.state.topics[TOPIC].replicas[0][0])
    while True:
        broker = nodes[0].call(leading, brokers, TOPIC)
        if broker is not None and broker.config.node_id == preferred:
            return next(node for node in nodes if node.broker is broker)
        if time.monotonic() > deadline:
            raise TimeoutError("the preferred replica does not lead the partition")
        time.sleep(0.05)


def _loop() -> asyncio.AbstractEventLoop:
    """The nodes' own event loop (node/server.py): uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.commit_calls", description=__doc__)
    parser.add_argument("--messages", type=int, default=2000, help="per pass (two passes)")
    parser.add_argument("--size", type=int, default=1024, help="bytes per message")
    parser.add_argument("--top", type=int, default=30, help="functions listed by self time")
    parser.add_argument(
        "--per-node", action="store_true", help="each broker on its own loop thread, counted apart"
    )
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="commit-calls-", dir=os.environ.get("BENCH_DIR")))
    try:
        configure_process(NodeConfig(node_id=1, data_dir=root))  # as `raftline serve` does
        if args.per_node:
            result = measure_per_node(root, args.messages, args.size, args.top)
        else:
            with asyncio.Runner(loop_factory=_loop) as runner:
                result = runner.run(measure(root, args.messages, args.size, args.top))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
