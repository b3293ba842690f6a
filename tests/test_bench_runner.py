"""The workload runner charges a publish stall to every message that was due during it."""

import asyncio

from bench.drivers.base import Driver, Endpoint, OnAcked, OnDelivery
from bench.pacing import NS_PER_S, Window
from bench.runner import BatchAcks, WorkloadRun
from bench.tally import Tally
from bench.workload import workload_from_dict

STALL_S = 0.3


class StallingDriver(Driver):
    """Acknowledges at once, except for one publish that hangs for STALL_S."""

    system = "stalling"

    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__(endpoint)
        self.publishes = 0
        self.topics: list[str] = []

    @property
    def durability(self) -> str:
        return "in memory"

    async def connect(self) -> None:
        return None

    async def create_topic(self, topic: str, partitions: int) -> None:
        self.topics.append(topic)

    async def delete_topic(self, topic: str, partitions: int) -> None:
        self.topics.remove(topic)

    async def publish(
        self,
        topic: str,
        partition: int,
        payloads: list[bytes],
        acks: str,
        on_acked: OnAcked | None = None,
    ) -> None:
        self.publishes += 1
        if self.publishes == 5:
            await asyncio.sleep(STALL_S)

    async def consume(
        self, topic: str, partition: int, on_delivery: OnDelivery, stop: asyncio.Event
    ) -> None:
        await stop.wait()

    async def close(self) -> None:
        return None


def _workload() -> object:
    return workload_from_dict(
        {
            "name": "stall",
            "consumers_per_topic": 0,
            "message_size": 64,
            "duration_seconds": 1.0,
            "warmup_seconds": 0.0,
            "batch_size": 10,
            "max_in_flight": 1,
            "linger_ms": 0.0,
        }
    )


async def test_messages_due_during_a_stall_carry_its_latency() -> None:
    driver = StallingDriver(Endpoint("127.0.0.1", {}))
    run = WorkloadRun(driver, _workload(), "t", rate=200.0)  # type: ignore[arg-type]
    result = await run.run(drain_seconds=2.0)
    histogram = run.tally.publish_latency
    # 60 of about 200 messages fell due during the 300 ms stall; measured from their intended
    # send times, the first 40 of them waited at least 100 ms. Timing from the actual send
    # would show a single slow batch instead.
    assert histogram.max >= STALL_S * 1e6
    assert histogram.percentile(85) >= 100_000
    assert result["errors"] == 0


async def test_topics_are_created_and_removed_again() -> None:
    driver = StallingDriver(Endpoint("127.0.0.1", {}))
    run = WorkloadRun(driver, _workload(), "t", rate=200.0)  # type: ignore[arg-type]
    await run.run(drain_seconds=2.0)
    assert driver.topics == []
    assert driver.publishes > 0


class RecordingTally(Tally):
    """A tally that also keeps what each on_acked call was given."""

    def __init__(self) -> None:
        super().__init__(Window(0, NS_PER_S))
        self.calls: list[list[tuple[int, int]]] = []

    def on_acked(self, groups: list[tuple[int, int]], ack_ns: int) -> None:
        self.calls.append(list(groups))
        super().on_acked(groups, ack_ns)


def test_acknowledgements_go_to_the_earliest_stamps_first() -> None:
    tally = RecordingTally()
    acks = BatchAcks(tally, [(10, 2), (20, 3)])
    acks.acked(3)
    acks.acked(acks.unacked)
    assert tally.calls == [[(10, 2), (20, 1)], [(20, 2)]]
    assert tally.acked == 5


def test_acknowledgements_beyond_the_batch_are_ignored() -> None:
    tally = RecordingTally()
    acks = BatchAcks(tally, [(10, 2)])
    acks.acked(3)
    acks.acked(acks.unacked)
    assert tally.calls == [[(10, 2)]]


class HalfAckingDriver(StallingDriver):
    """Acknowledges half of its first batch at once and the rest only after the window."""

    async def publish(
        self,
        topic: str,
        partition: int,
        payloads: list[bytes],
        acks: str,
        on_acked: OnAcked | None = None,
    ) -> None:
        self.publishes += 1
        if self.publishes == 2 and on_acked is not None:  # the first after the primer
            on_acked(len(payloads) // 2)
            await asyncio.sleep(1.5)


async def test_messages_acknowledged_one_by_one_count_when_acknowledged() -> None:
    driver = HalfAckingDriver(Endpoint("127.0.0.1", {}))
    workload = workload_from_dict(
        {
            "name": "half",
            "consumers_per_topic": 0,
            "duration_seconds": 1.0,
            "warmup_seconds": 0.0,
            "batch_size": 10,
            "max_in_flight": 1,
        }
    )
    run = WorkloadRun(driver, workload, "t", rate=0.0)
    await run.run(drain_seconds=3.0)
    # The one batch of the window: 5 acknowledged inside it, 5 after its end.
    assert (run.tally.acked, run.tally.acked_in_window) == (10, 5)
    assert run.tally.publish_latency.total == 10
