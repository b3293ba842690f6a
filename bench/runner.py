"""Runs one workload against one connected driver and measures it.

Owns the producer loop, the warm-up and measurement window, and the drain of the consumers.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from bench.consumers import Consumer, ConsumerProcess, merge_into
from bench.drivers.base import Driver
from bench.pacing import FixedRateSchedule, StampGroup, Window, encode, payloads
from bench.tally import Tally
from bench.workload import Workload

MB = 1_000_000
START_DELAY_NS = 200_000_000  # the consumer process learns the window before the first send


class WorkloadRun:
    """One run of a workload: topics created, consumers and producers started, then drained."""

    def __init__(self, driver: Driver, workload: Workload, run_id: str, rate: float) -> None:
        self.driver = driver
        self.workload = workload
        self.rate = rate  # total msgs/s over all producers; 0 = as fast as acks allow
        self.topics = [f"bench-{run_id}-{workload.name}-{t}" for t in range(workload.topics)]
        self.padding = os.urandom(workload.message_size)
        self.start_ns = 0
        self.tally = Tally(Window(0, 0))
        self.primed = 0
        self.consumer_pid: int | None = None  # the consumer process, once started

    def _set_window(self) -> None:
        w = self.workload
        self.start_ns = time.monotonic_ns() + START_DELAY_NS
        measure_from = self.start_ns + int(w.warmup_seconds * 1e9)
        self.tally.window = Window(measure_from, measure_from + int(w.duration_seconds * 1e9))

    async def run(self, drain_seconds: float) -> dict[str, Any]:
        w = self.workload
        queue = w.kind == "queue-ack"
        for topic in self.topics:
            if queue:
                await self.driver.create_queue(topic, w.partitions_per_topic)
            else:
                await self.driver.create_topic(topic, w.partitions_per_topic)
        consumer = None
        try:
            if w.consumers_per_topic > 0:
                consumer = await self._start_consumer(queue)
                self.consumer_pid = consumer.pid
            await self._prime()
            self._set_window()
            if consumer is not None:
                consumer.send_window(self.tally.window)
            await asyncio.gather(
                *(
                    self._produce(topic, drain_seconds)
                    for topic in self.topics
                    for _ in range(w.producers_per_topic)
                )
            )
            if consumer is not None:
                await consumer.drain(self.tally.acked + self.primed, drain_seconds)
        finally:
            if consumer is not None:
                try:
                    merge_into(self.tally, await consumer.stop())
                except RuntimeError as error:
                    self.tally.on_error(error)
            for topic in self.topics:
                delete = self.driver.delete_queue if queue else self.driver.delete_topic
                try:
                    await asyncio.wait_for(delete(topic, w.partitions_per_topic), 30)
                except Exception as error:  # cleanup failure must not hide the measurement
                    self.tally.on_error(error)
        return self.result()

    async def _start_consumer(self, queue: bool) -> Consumer:
        """The consumer process, started and subscribed to every topic."""
        w = self.workload
        consumer = ConsumerProcess(
            self.driver.system,
            self.driver.endpoint,
            self.topics,
            w.partitions_per_topic,
            receivers=w.consumers_per_topic if queue else 0,
        )
        await consumer.start()
        return consumer

    async def _prime(self) -> None:
        """One message per partition before the clock starts, as OMB creates its producers first.

        Clients open per-partition publishers, leader lookups and connections lazily; without
        this the first measured seconds pay for that setup. Primers carry intended time 0, so
        no latency counts them; only the received total does, which result() corrects.
        """
        primer = encode(0, self.padding)
        w = self.workload
        await asyncio.gather(
            *(
                self.driver.publish(topic, p, [primer], w.acks)
                for topic in self.topics
                for p in range(w.partitions_per_topic)
            )
        )
        self.primed = len(self.topics) * w.partitions_per_topic

    async def _produce(self, topic: str, drain_seconds: float) -> None:
        w = self.workload
        per_producer = self.rate / (w.topics * w.producers_per_topic)
        schedule = FixedRateSchedule(self.start_ns, per_producer) if per_producer > 0 else None
        linger_ns = int(w.linger_ms * 1e6)
        slots = asyncio.Semaphore(w.max_in_flight)
        in_flight: set[asyncio.Task[None]] = set()
        sequence = 0  # messages of this producer so far: the schedule's next index
        partition = 0
        while time.monotonic_ns() < self.start_ns:
            await asyncio.sleep((self.start_ns - time.monotonic_ns()) / 1e9)
        while True:
            await slots.acquire()
            now = time.monotonic_ns()
            if now >= self.tally.window.end_ns:
                slots.release()
                break
            if schedule is None:
                # At max rate a batch is due the moment a send slot frees up: one stamp.
                groups: list[StampGroup] = [(now, w.batch_size)]
                count = w.batch_size
            else:
                count = min(schedule.due(now) - sequence, w.batch_size)
                # Send a full batch at once, a partial one when its oldest message has lingered.
                send_by = schedule.intended_ns(sequence) + linger_ns
                if count <= 0 or (count < w.batch_size and now < send_by):
                    slots.release()
                    full_at = schedule.intended_ns(sequence + w.batch_size - 1)
                    await asyncio.sleep((min(send_by, full_at) - now) / 1e9)
                    continue
                groups = schedule.stamp_groups(sequence, count)
            sequence += count
            self.tally.sent += count
            batch = payloads(groups, self.padding)
            task = asyncio.create_task(self._send(topic, partition, batch, groups, slots))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            partition = (partition + 1) % w.partitions_per_topic
        await _settle(list(in_flight), timeout=drain_seconds)

    async def _send(
        self,
        topic: str,
        partition: int,
        batch: list[bytes],
        groups: list[StampGroup],
        slots: asyncio.Semaphore,
    ) -> None:
        acks = BatchAcks(self.tally, groups)
        try:
            await self.driver.publish(topic, partition, batch, self.workload.acks, acks.acked)
            acks.acked(acks.unacked)
        except Exception as error:
            self.tally.on_error(error)
        finally:
            slots.release()

    def result(self) -> dict[str, Any]:
        w, tally = self.workload, self.tally
        seconds = tally.window.seconds or 1.0
        publish_rate = tally.acked_in_window / seconds
        consume_rate = tally.received_in_window / seconds
        return {
            "workload": w.name,
            "kind": w.kind,
            "topics": w.topics,
            "partitions": w.partitions_per_topic,
            "message_size": w.message_size,
            "producers": w.producers_per_topic * w.topics,
            "target_rate": round(self.rate),
            "acks": w.acks,
            "duration_s": seconds,
            "publish_msgs_per_s": round(publish_rate, 1),
            "publish_mb_per_s": round(publish_rate * w.message_size / MB, 3),
            "consume_msgs_per_s": round(consume_rate, 1),
            "consume_mb_per_s": round(consume_rate * w.message_size / MB, 3),
            "publish_latency_ms": tally.publish_latency.summary_ms(),
            "e2e_latency_ms": tally.e2e_latency.summary_ms(),
            "received_latency_ms": tally.received_latency.summary_ms(),
            "ack_sent_latency_ms": tally.ack_sent_latency.summary_ms(),
            "sent": tally.sent,
            "acked": tally.acked,
            "received": max(0, tally.received - self.primed),
            "errors": tally.errors,
            "first_error": tally.first_error,
        }


class BatchAcks:
    """Acknowledgements of one batch as they arrive, given to its messages in send order.

    Should a system acknowledge out of order, the earlier stamps get the earlier acks: that
    can only make latencies look longer, never shorter.
    """

    def __init__(self, tally: Tally, groups: list[StampGroup]) -> None:
        self.tally = tally
        self.groups = groups
        self.group = 0  # index of the first group with unacknowledged messages
        self.taken = 0  # messages of that group already acknowledged
        self.unacked = sum(count for _, count in groups)

    def acked(self, count: int) -> None:
        """`count` more messages of the batch were acknowledged just now."""
        count = min(count, self.unacked)
        if count <= 0:
            return
        self.unacked -= count
        done: list[StampGroup] = []
        while count:
            stamp, size = self.groups[self.group]
            take = min(count, size - self.taken)
            done.append((stamp, take))
            count -= take
            self.taken += take
            if self.taken == size:
                self.group, self.taken = self.group + 1, 0
        self.tally.on_acked(done, time.monotonic_ns())


async def _settle(tasks: list[asyncio.Task[None]], timeout: float) -> None:
    """Wait a bounded time for tasks to end, then cancel whatever is left."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=2.0)
