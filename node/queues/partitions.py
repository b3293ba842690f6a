"""What a queue shard's leader asks of data partitions, run on each partition's leader: record
reads (plain lists that travel in node-to-node calls) and dead-letter appends (acks=all); and
the dead-letter record: the source record with headers naming where it came from and why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raftline.node.errors import BrokerError, NotLeader
from raftline.raftlog.batch import parse_header
from raftline.raftlog.records import Record, build_batch, decode_batch

if TYPE_CHECKING:
    from raftline.node.broker import Broker

READ_BYTES = 1 << 20  # one read of a data partition
RawRecord = list[Any]  # [offset, timestamp, key, value, [[name, value], ...]]
# Headers of a dead-lettered record (beside its own).
SOURCE_TOPIC = "x-raftline-source-topic"
SOURCE_PARTITION = "x-raftline-source-partition"
SOURCE_OFFSET = "x-raftline-source-offset"
DELIVERY_COUNT = "x-raftline-delivery-count"
DEATH_REASON = "x-raftline-death-reason"  # rejected | max_deliveries


async def read(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    """Records of a local partition this node leads, from `offset` on (RawRecord lists), at
    most about `max_bytes` (at least one batch); control batches are passed over (next_offset
    goes past them). An offset below the log start answers no records and the log start
    (retention removed them)."""
    topic, partition = str(args["topic"]), int(args["partition"])
    offset, limit = int(args["offset"]), int(args["max_messages"])
    try:
        replica = await broker._replica(topic, partition)
        max_bytes = min(max(int(args.get("max_bytes", READ_BYTES)), 1), READ_BYTES)
        batches, log_start, high = await replica.fetch(
            offset, max_bytes, int(args.get("wait_ms", 0))
        )
    except NotLeader as exc:  # nothing done: Router.on_leader_of looks for the leader again
        raise BrokerError("not_leader", exc.message) from None
    except BrokerError as exc:
        if exc.code != "offset_out_of_range":
            raise
        log_start = int(exc.extra["log_start_offset"])
        high = int(exc.extra["high_watermark"])
        return {
            "records": [],
            "next_offset": offset,
            "log_start": log_start,
            "high_watermark": high,
        }
    records: list[RawRecord] = []
    next_offset = offset
    for raw in batches:
        header = parse_header(raw)
        if header.last_offset < offset:
            continue
        if len(records) >= limit:
            break
        if not header.is_control:
            for record in decode_batch(bytes(raw)).records:
                if record.offset >= offset:
                    headers = [list(h) for h in record.headers]
                    records.append(
                        [record.offset, record.timestamp, record.key, record.value, headers]
                    )
        next_offset = header.last_offset + 1
    return {
        "records": records,
        "next_offset": next_offset,
        "log_start": log_start,
        "high_watermark": high,
    }


async def append(broker: Broker, args: dict[str, Any]) -> int:
    """Append a dead-letter batch with acks=all; its base offset."""
    try:
        return await broker.produce(
            str(args["topic"]), int(args["partition"]), bytes(args["batch"]), "all"
        )
    except NotLeader as exc:
        raise BrokerError("not_leader", exc.message) from None


def dead_letter_batch(
    record: RawRecord, topic: str, partition: int, count: int, reason: str
) -> bytes:
    """The dead-letter copy of `record`: its key, value, timestamp and own headers, plus
    headers naming its source and why it died (earlier x-raftline- headers are replaced)."""
    offset, timestamp, key, value, headers = record
    extra = [
        (SOURCE_TOPIC, topic.encode()),
        (SOURCE_PARTITION, str(partition).encode()),
        (SOURCE_OFFSET, str(offset).encode()),
        (DELIVERY_COUNT, str(count).encode()),
        (DEATH_REASON, reason.encode()),
    ]
    own = [(str(h), v) for h, v in headers if not str(h).startswith("x-raftline-")]
    return build_batch([Record(value, key, tuple(own + extra), int(timestamp))])
