"""A transactions workload with a checker, on a real in-process node (a small Jepsen-style run).

Four transactional producers write unique values to three partitions, each transaction to one
to three of them, committing or aborting at random (seeded), while a read_committed reader
polls every partition. The checker finds: aborted reads (a value of an aborted transaction
seen), uncommitted reads (a value seen whose transaction's commit had not been asked for),
duplicates, lost committed writes, torn transactions (part of a committed one missing at the
end) and per-producer order broken within a partition. A planted bug (read_committed passing
aborted batches) must make it fail.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from inproc_harness import serving

pytestmark = pytest.mark.timeout(120)
PARTITIONS = 3


async def _post(api: TestClient, path: str, body: Any) -> Any:
    for _ in range(50):
        response = await api.post(path, json=body)
        answer = await response.json()
        if response.status < 300:
            return answer
        if not answer["error"]["retryable"]:
            raise AssertionError(f"{path}: {response.status} {answer}")
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path}: no answer")


async def _run(api: TestClient, seed: int) -> list[str]:
    """The workload and its checker: the anomalies found."""
    rng = random.Random(seed)
    await _post(api, "/v1/topics", {"name": "w", "partitions": PARTITIONS})
    fate: dict[str, str] = {}  # value -> "committed" | "aborted" | "open"
    txn_of: dict[str, tuple[int, int]] = {}
    members: dict[tuple[int, int], list[str]] = {}
    committing: set[tuple[int, int]] = set()  # commit asked for (maybe not yet answered)
    seen: list[str] = []
    done = asyncio.Event()

    async def producer(index: int) -> None:
        tid = f"w-{index}"
        answer = await _post(api, "/v1/producers", {"transactional_id": tid})
        pid, epoch = answer["producer_id"], answer["producer_epoch"]
        for n in range(12):
            sequences = dict.fromkeys(range(PARTITIONS), 0)
            values = []
            for i in range(rng.randint(1, 4)):
                partition = rng.randrange(PARTITIONS)
                value = f"p{index}-t{n}-{i}"
                fate[value], txn_of[value] = "open", (index, n)
                values.append(value)
                body = {
                    "transactional": True,
                    "transactional_id": tid,
                    "producer_id": pid,
                    "producer_epoch": epoch,
                    "sequence": sequences[partition],
                    "messages": [{"value": value, "partition": partition}],
                }
                await _post(api, "/v1/topics/w/messages", body)
                sequences[partition] += 1
            members[(index, n)] = values
            commit = rng.random() < 0.6
            if commit:
                committing.add((index, n))
            action = "commit" if commit else "abort"
            answer = await _post(
                api,
                f"/v1/transactions/{tid}/{action}",
                {"producer_id": pid, "producer_epoch": epoch},
            )
            epoch = answer["producer_epoch"]
            for value in values:
                fate[value] = "committed" if commit else "aborted"

    async def reader() -> None:
        positions = dict.fromkeys(range(PARTITIONS), 0)
        while True:
            finished = done.is_set()
            for partition in range(PARTITIONS):
                response = await api.get(
                    f"/v1/topics/w/partitions/{partition}/messages"
                    f"?offset={positions[partition]}&isolation=read_committed"
                )
                if response.status != 200:
                    continue
                body = await response.json()
                for message in body["messages"]:
                    value = message["value"]
                    seen.append(value)
                    txn = txn_of.get(value)
                    if txn is None or txn not in committing:
                        anomalies.append(f"uncommitted read of {value}")
                positions[partition] = body["next_offset"]
            if finished:
                return
            await asyncio.sleep(0.02)

    anomalies: list[str] = []
    reading = asyncio.ensure_future(reader())
    await asyncio.gather(*(producer(i) for i in range(4)))
    await asyncio.sleep(0.1)
    done.set()
    await reading
    counts: dict[str, int] = {}
    for value in seen:
        counts[value] = counts.get(value, 0) + 1
    for value, count in counts.items():
        if fate.get(value) == "aborted":
            anomalies.append(f"aborted read of {value}")
        if count > 1:
            anomalies.append(f"{value} read {count} times")
    for txn, values in members.items():
        if fate[values[0]] != "committed":
            continue
        missing = [v for v in values if v not in counts]
        if missing:
            anomalies.append(f"committed transaction {txn} lost or torn: {missing} missing")
    # within a partition, a producer's transactions appear in the order they were committed
    for partition in range(PARTITIONS):
        response = await api.get(
            f"/v1/topics/w/partitions/{partition}/messages?offset=0&isolation=read_committed"
        )
        values = [m["value"] for m in (await response.json())["messages"]]
        for index in range(4):
            mine = [txn_of[v] for v in values if txn_of[v][0] == index]
            if mine != sorted(mine):
                anomalies.append(f"producer {index} out of order on partition {partition}")
    if sum(fate[v[0]] == "committed" for v in members.values()) == 0:
        anomalies.append("vacuous: nothing committed")
    return anomalies


@pytest.mark.parametrize("seed", [1, 2])
async def test_the_transactions_workload_finds_no_anomaly(tmp_path: Path, seed: int) -> None:
    async with serving(tmp_path / "d") as (api, _):
        assert await _run(api, seed) == []


@pytest.mark.parametrize("bug", ["aborted batches kept", "LSO ignores open transactions"])
async def test_planted_bugs_are_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bug: str
) -> None:
    from raftline.node import partition as partition_module
    from raftline.node.eos.producer_state import ProducerStateMachine

    if bug == "aborted batches kept":

        def everything(batches: Any, aborted: Any) -> Any:
            return (payload for _, meta, payload in batches if not meta.is_control)

        monkeypatch.setattr(partition_module, "read_committed", everything)
        expected = "aborted read"
    else:

        def high_watermark(self: Any, high_watermark: int) -> int:
            return min(high_watermark, self.next_offset)

        monkeypatch.setattr(ProducerStateMachine, "last_stable_offset", high_watermark)
        expected = "uncommitted read"
    async with serving(tmp_path / "d") as (api, _):
        anomalies = await _run(api, 1)
    assert any(expected in a for a in anomalies), anomalies
