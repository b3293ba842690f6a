"""The exactly-once chaos workloads and their checkers on a real in-process node.

The chaos harness's clients (chaos/eos_workload.py) run for a few seconds against one node,
with answers lost at random after the node acted on them (so producers retry ambiguous
failures with the same producer fields), then chaos/eos_checker.py judges the history. A
correct node passes; planted bugs in the node (a retry written again, aborted batches passed
to read_committed readers, a last stable offset that ignores open transactions) make the
checker fail with the anomaly they cause.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import serving

from raftline.chaos import eos_checker
from raftline.chaos import workload as workload_module
from raftline.chaos.eos_workload import EosWorkload
from raftline.chaos.history import Recorder
from raftline.chaos.workload import Outcome, Workload, session

pytestmark = pytest.mark.timeout(120)
PARTITIONS = 3
RUN_S = 4.0


def lose_answers(monkeypatch: pytest.MonkeyPatch, rng: random.Random, share: float) -> None:
    """Answers of produce and end requests are lost after the node acted on them."""
    real = workload_module.call

    async def lossy(session: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Outcome:
        outcome = await real(session, method, url, *args, **kwargs)
        if method == "POST" and outcome.type == "ok" and rng.random() < share:
            return Outcome("info", None, None, "answer_lost")
        return outcome

    monkeypatch.setattr(workload_module, "call", lossy)


async def run_workload(tmp_path: Path, kind: str, seed: int) -> dict[str, Any]:
    """Run `kind` ("idempotent" or "transactions") for RUN_S seconds; the checker's verdict."""
    async with serving(tmp_path / "node") as (api, _):
        url = str(api.make_url("")).rstrip("/")
        recorder = Recorder(tmp_path / "history.jsonl")
        work = Workload(recorder, [url], "w", PARTITIONS, random.Random(seed), 1)
        eos = EosWorkload(work)
        async with session() as http:
            assert await work.create_topic(http, time.monotonic() + 10)
            until = time.monotonic() + RUN_S
            if kind == "idempotent":
                clients = [eos.idempotent_producer(http, p, until) for p in range(4)]
            else:
                clients = [eos.txn_producer(http, p, until) for p in range(4)]
                clients += [eos.reader(http, 4 + r, until) for r in range(2)]
            await asyncio.gather(*clients)
            deadline = time.monotonic() + 30
            if kind == "idempotent":
                complete = await work.final_reads(http, 9, deadline)
            else:
                complete = await eos.final_committed_reads(http, 9, deadline)
        recorder.close()
        assert all(complete.values()), complete
        ops = recorder.ops
        if kind == "idempotent":
            return eos_checker.check_idempotent(ops)
        return eos_checker.check_transactions(ops)


@pytest.mark.parametrize("seed", [1, 2])
async def test_idempotent_producers_retrying_lost_answers_store_each_value_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    lose_answers(monkeypatch, random.Random(seed), 0.2)
    verdict = await run_workload(tmp_path, "idempotent", seed)
    assert verdict["valid"], verdict["anomalies"]
    stats = verdict["stats"]
    assert stats["acked_after_retry"] > 0 and stats["duplicate_answers"] > 0, stats


@pytest.mark.parametrize("seed", [1, 2])
async def test_the_transactions_workload_finds_no_anomaly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    lose_answers(monkeypatch, random.Random(seed), 0.1)
    verdict = await run_workload(tmp_path, "transactions", seed)
    assert verdict["valid"], verdict["anomalies"]
    stats = verdict["stats"]
    assert stats["committed"] > 0 and stats["aborted"] > 0, stats
    assert stats["multi_partition_committed"] > 0, stats


async def test_planted_bug_a_retry_written_again_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raftline.node.eos.producer_state import NEW, Outcome, ProducerStateMachine

    real = ProducerStateMachine.check

    def forgetful(self: Any, meta: Any, *, verified: bool = False) -> Any:
        verdict = real(self, meta, verified=verified)
        return NEW if verdict.outcome in (Outcome.DUPLICATE, Outcome.IN_FLIGHT) else verdict

    monkeypatch.setattr(ProducerStateMachine, "check", forgetful)
    lose_answers(monkeypatch, random.Random(1), 0.2)
    verdict = await run_workload(tmp_path, "idempotent", 1)
    assert "duplicate" in verdict["anomaly_types"], verdict["anomaly_counts"]


@pytest.mark.parametrize("bug", ["aborted batches kept", "LSO ignores open transactions"])
async def test_planted_transaction_bugs_are_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bug: str
) -> None:
    from raftline.node import partition as partition_module
    from raftline.node.eos.producer_state import ProducerStateMachine

    if bug == "aborted batches kept":

        def everything(batches: Any, aborted: Any) -> Any:
            return (payload for _, meta, payload in batches if not meta.is_control)

        monkeypatch.setattr(partition_module, "read_committed", everything)
        expected = "aborted-read"
    else:

        def high_watermark(self: Any, high_watermark: int) -> int:
            return min(high_watermark, self.next_offset)

        monkeypatch.setattr(ProducerStateMachine, "last_stable_offset", high_watermark)
        expected = "uncommitted-read"
    verdict = await run_workload(tmp_path, "transactions", 1)
    assert expected in verdict["anomaly_types"], verdict["anomaly_counts"]
