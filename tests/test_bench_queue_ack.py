"""The queue-ack benchmark kind: workload validation, and the Raftline queue driver receiving and
acknowledging every published message once against an in-process node over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from inproc_harness import configs, start_all

from bench.drivers.base import Endpoint
from bench.drivers.raftline import RaftlineDriver
from bench.pacing import encode
from bench.workload import WorkloadError, load_workloads, workload_from_dict
from raftline.api.app import create_app

pytestmark = pytest.mark.timeout(60)


def test_kind_is_validated_and_the_queue_workloads_load() -> None:
    with pytest.raises(WorkloadError):
        workload_from_dict({"name": "x", "kind": "stream"})
    kinds = {w.name: w.kind for w in load_workloads()}
    assert {kinds[n] for n in ("queue-ack", "queue-ack-2k", "queue-ack-500")} == {"queue-ack"}
    assert kinds["1-topic-1-partition-1kb"] == "log"


async def test_the_raftline_queue_driver_reports_each_message_on_receipt_and_acks_it_once(
    tmp_path: Path,
) -> None:
    (config,) = configs(tmp_path, 1)
    (broker,) = await start_all([config])
    runner = web.AppRunner(create_app(broker, self_http=config.http))
    await runner.setup()
    host, port = config.http.split(":")
    await web.TCPSite(runner, host, int(port)).start()
    driver = RaftlineDriver(Endpoint(host, {"http": int(port)}, 1))
    try:
        await driver.connect()
        await driver.create_queue("qa", 2)
        sent = [encode(i + 1, b"x" * 64) for i in range(500)]
        for p in range(2):
            await driver.publish("qa", p, sent[p::2], "all")
        got: list[bytes] = []
        received: list[bytes] = []
        ack_sent: list[bytes] = []
        stop = asyncio.Event()

        def on_delivery(payloads: list[bytes]) -> None:
            got.extend(payloads)
            if len(got) >= len(sent):
                stop.set()

        await asyncio.wait_for(
            asyncio.gather(
                *(
                    driver.consume_queue(
                        "qa", 2, on_delivery, stop, received.extend, ack_sent.extend
                    )
                    for _ in range(2)
                )
            ),
            30,
        )
        assert sorted(got) == sorted(sent)
        assert sorted(received) == sorted(sent)  # each reported on receipt too, once
        assert sorted(ack_sent) == sorted(sent)  # and when its ack was sent, once
        described = await driver.client.queue(driver.queue_name("qa")).describe()
        assert described["acknowledged"] == len(sent) and described["locked"] == 0
        await driver.delete_queue("qa", 2)
        await driver.close()
    finally:
        await runner.cleanup()
        await broker.stop()
