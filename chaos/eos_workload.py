"""The exactly-once workloads: idempotent producers, and transactions with read_committed readers,
recorded op by op over the HTTP API (API.md "Idempotent and transactional producers") for
chaos/eos_checker.py.

Owns both workloads' clients and their final reads.
- idempotent: each producer gets a producer id and sends numbered batches (1-3 values) to
  random partitions; every ambiguous failure (timeout, 5xx, dropped connection, a node given up)
  is retried with the same producer id, epoch and sequence, to whichever node the client picks,
  until acknowledged; only then does the partition's sequence move on. A refusal (409: the
  broker lost the producer's sequence, which must not happen) starts a new producer id.
- transactions: each producer owns a transactional id and runs transactions of 1-4 batches over
  random partitions, each produce retried like the idempotent ones, then commits (60%) or
  aborts; a produce that cannot be settled aborts the transaction; an end that cannot be
  settled re-initialises the id (which fences and aborts whatever was open). Readers follow
  every partition with read_committed polls.
The final reads (after the faults healed) read every partition whole: read_uncommitted for the
idempotent workload, read_committed for the transactions one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from raftline.chaos.history import Op
from raftline.chaos.workload import Outcome, Workload

RETRY_GRACE_S = 30.0  # an operation under way at the end keeps retrying this much longer
RETRY_PAUSE_S = 0.1
TXN_TIMEOUT_MS = 10_000  # so a transaction left open by a lost producer ends soon
COMMIT_SHARE = 0.6


def _refused(outcome: Outcome) -> bool:
    """A 4xx answer: the request certainly had no effect (API.md)."""
    return outcome.status is not None and 400 <= outcome.status < 500


@dataclass
class EosWorkload:
    """Both exactly-once workloads over `work` (its nodes, topic, recorder and rng)."""

    work: Workload
    readers: int = 2

    @property
    def rng(self) -> Any:
        return self.work.rng

    async def _settled(
        self,
        http: aiohttp.ClientSession,
        process: int,
        f: str,
        path: str,
        body: Any,
        value: dict[str, Any],
        scope: Any,
        deadline: float,
        expect: tuple[str, ...] = (),
    ) -> tuple[str, Any]:
        """Send `body` until it is answered (the same request every time); each attempt is an
        op. Returns ("ok", answer), ("refused", error code) or ("unknown", None) at the
        deadline."""
        attempt = 0
        while time.monotonic() < deadline:
            attempt += 1
            endpoint = self.work.nodes.pick(scope)
            invoke = self.work.recorder.invoke(
                process, f, {**value, "attempt": attempt}, endpoint.name
            )
            outcome = await self.work.request(
                http, endpoint, "POST", path, body, expect=expect, scope=scope
            )
            if outcome.type == "ok":
                self.work.recorder.complete(invoke, "ok", {**value, **outcome.body})
                return "ok", outcome.body
            if _refused(outcome):
                self.work.recorder.complete(invoke, "fail", value, outcome.error)
                return "refused", outcome.error
            self.work.recorder.complete(invoke, "info", value, outcome.error)
            await asyncio.sleep(RETRY_PAUSE_S)
        return "unknown", None

    async def _send_batch(
        self,
        http: aiohttp.ClientSession,
        process: int,
        f: str,
        partition: int,
        values: list[str],
        numbers: tuple[int, int, int],  # producer id, epoch, sequence
        deadline: float,
        tid: str | None = None,
        txn: str | None = None,
    ) -> tuple[str, Any]:
        """One produce request of `values` to `partition` with the producer's numbers (and,
        in transaction `txn`, its transactional id), settled as _settled does."""
        pid, epoch, sequence = numbers
        fields = {"producer_id": pid, "producer_epoch": epoch, "sequence": sequence}
        body: dict[str, Any] = {
            "acks": "all",
            **fields,
            "messages": [{"partition": partition, "value": v} for v in values],
        }
        value: dict[str, Any] = {"key": self.work.key(partition), "values": values, **fields}
        if tid is not None:
            body.update(transactional=True, transactional_id=tid)
            value["txn"] = txn
        path = f"/v1/topics/{self.work.topic}/messages"
        return await self._settled(
            http, process, f, path, body, value, partition, deadline, ("offsets",)
        )

    # ------------------------------------------------------------------ idempotent producers

    async def _new_producer(
        self, http: aiohttp.ClientSession, process: int, deadline: float
    ) -> tuple[int, int] | None:
        status, answer = await self._settled(
            http,
            process,
            "producer-init",
            "/v1/producers",
            {},
            {},
            None,
            deadline,
            ("producer_id", "producer_epoch"),
        )
        return (answer["producer_id"], answer["producer_epoch"]) if status == "ok" else None

    async def idempotent_producer(
        self, http: aiohttp.ClientSession, process: int, until: float
    ) -> None:
        deadline = until + RETRY_GRACE_S
        producer = await self._new_producer(http, process, until)
        sequences: dict[int, int] = {}
        n = 0
        while producer is not None and time.monotonic() < until:
            partition = self.work.pick_partition()
            values = [f"i{process}-{n + k}" for k in range(self.rng.randint(1, 3))]
            n += len(values)
            sequence = sequences.get(partition, 0)
            status, answer = await self._send_batch(
                http, process, "send", partition, values, (*producer, sequence), deadline
            )
            if status == "ok":
                sequences[partition] = sequence + len(values)
                offsets = [o["offset"] for o in answer["offsets"]]
                self.work.max_acked[partition] = max(
                    self.work.max_acked.get(partition, -1), *offsets
                )
            elif status == "refused":
                producer, sequences = await self._new_producer(http, process, until), {}
            else:
                return  # unsettled at the deadline: nothing more may follow on its partition

    # ------------------------------------------------------------------ transactions

    async def _init_transactional(
        self, http: aiohttp.ClientSession, process: int, tid: str, deadline: float
    ) -> tuple[int, int] | None:
        body = {"transactional_id": tid, "transaction_timeout_ms": TXN_TIMEOUT_MS}
        while time.monotonic() < deadline:
            status, answer = await self._settled(
                http,
                process,
                "txn-init",
                "/v1/producers",
                body,
                {"transactional_id": tid},
                None,
                deadline,
                ("producer_id", "producer_epoch"),
            )
            if status == "ok":
                return answer["producer_id"], answer["producer_epoch"]
            await asyncio.sleep(RETRY_PAUSE_S)  # refused (e.g. a decision being written)
        return None

    async def txn_producer(self, http: aiohttp.ClientSession, process: int, until: float) -> None:
        tid = f"chaos-tx-{process}"
        deadline = until + RETRY_GRACE_S
        producer = await self._init_transactional(http, process, tid, until)
        n = 0
        while producer is not None and time.monotonic() < until:
            pid, epoch = producer
            txn = f"{process}-{n}"
            n += 1
            sequences: dict[int, int] = {}
            written = True
            for k in range(self.rng.randint(1, 4)):
                partition = self.work.pick_partition()
                values = [f"t{txn}-{k}-{j}" for j in range(self.rng.randint(1, 2))]
                sequence = sequences.get(partition, 0)
                numbers = (pid, epoch, sequence)
                status, _ = await self._send_batch(
                    http, process, "txn-send", partition, values, numbers, deadline, tid, txn
                )
                if status != "ok":
                    written = False
                    break
                sequences[partition] = sequence + len(values)
            commit = written and self.rng.random() < COMMIT_SHARE
            status, answer = await self._settled(
                http,
                process,
                "txn-end",
                f"/v1/transactions/{tid}/{'commit' if commit else 'abort'}",
                {"producer_id": pid, "producer_epoch": epoch},
                {"txn": txn, "commit": commit, "producer_id": pid, "producer_epoch": epoch},
                None,
                deadline,
                ("producer_id", "producer_epoch"),
            )
            if status == "ok":
                producer = answer["producer_id"], answer["producer_epoch"]
            else:  # fence whatever is open and start a new session
                producer = await self._init_transactional(http, process, tid, deadline)

    async def _committed_poll(
        self,
        http: aiohttp.ClientSession,
        process: int,
        partition: int,
        offset: int,
        final: bool,
        wait_ms: int,
    ) -> Op:
        endpoint = self.work.nodes.pick(partition)
        request = {"key": self.work.key(partition), "offset": offset, "final": final}
        invoke = self.work.recorder.invoke(process, "txn-poll", request, endpoint.name)
        outcome = await self.work.request(
            http,
            endpoint,
            "GET",
            f"/v1/topics/{self.work.topic}/partitions/{partition}/messages"
            f"?offset={offset}&max_messages=1000&wait_ms={wait_ms}&isolation=read_committed",
            expect=("messages", "next_offset"),
            scope=partition,
        )
        if outcome.type != "ok":
            return self.work.recorder.complete(invoke, "fail", request, outcome.error)
        body = outcome.body
        result = {
            **request,
            "messages": [[m["offset"], m.get("value")] for m in body["messages"]],
            "next_offset": body["next_offset"],
            "high_watermark": body.get("high_watermark"),
            "last_stable_offset": body.get("last_stable_offset"),
        }
        return self.work.recorder.complete(invoke, "ok", result)

    async def reader(self, http: aiohttp.ClientSession, process: int, until: float) -> None:
        """Follows every partition in turn with read_committed polls."""
        positions = dict.fromkeys(range(self.work.partitions), 0)
        while time.monotonic() < until:
            for partition in positions:
                done = await self._committed_poll(
                    http, process, partition, positions[partition], False, 100
                )
                if done.type == "ok":
                    positions[partition] = done.value["next_offset"]
                else:
                    await asyncio.sleep(0.2)

    async def final_committed_reads(
        self, http: aiohttp.ClientSession, process: int, deadline: float
    ) -> dict[int, bool]:
        """Reads every partition whole with read_committed, up to its high watermark (every
        transaction ended by then, so the last stable offset reaches it)."""
        complete: dict[int, bool] = {}
        for partition in range(self.work.partitions):
            offset, complete[partition] = 0, False
            while time.monotonic() < deadline:
                done = await self._committed_poll(http, process, partition, offset, True, 0)
                if done.type != "ok":
                    await asyncio.sleep(0.5)
                    continue
                offset = done.value["next_offset"]
                if not done.value["messages"] and offset >= (done.value["high_watermark"] or 0):
                    complete[partition] = True
                    break
                if not done.value["messages"]:
                    await asyncio.sleep(0.5)  # a transaction still open holds the LSO
        return complete
