"""Reads from uploaded segment objects cut exactly the batches a local read returns (same first
batch, same max_bytes and upto rules), through the chunk cache, from a real SeaweedFS."""

from __future__ import annotations

import random
from pathlib import Path

from seaweedfs import SeaweedServer

from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Record, build_batch, build_control_batch
from raftline.raftlog.txnindex import AbortedTxn, TxnIndex
from raftline.tiered import layout, reader
from raftline.tiered.manifest import SegmentMeta
from raftline.tiered.store import ObjectStore, S3Config


def filled_log(path: Path, rng: random.Random) -> PartitionLog:
    log = PartitionLog(path, LogConfig(segment_bytes=6000, fsync="never"))
    for i in range(300):
        if i % 17 == 0:
            log.append(build_control_batch(100, b""), term=1 + i // 100)
            continue
        values = [rng.randbytes(rng.randint(0, 300)) for _ in range(rng.randint(1, 4))]
        log.append(build_batch([Record(v, key=b"k") for v in values]), term=1 + i // 100)
    return log


async def upload(log: PartitionLog, store: ObjectStore) -> list[SegmentMeta]:
    metas = []
    for segment in log.sealed_segments():
        data = log.read(segment.base_offset, segment.size, upto=segment.next_offset)
        objects = layout.build_segment(
            lambda base, last: f"r/{base:020d}-{last:020d}", data, segment.next_offset, (), 512
        )
        for key, body in ((objects.meta.object, objects.log), (objects.meta.index, objects.index)):
            await store.put(key, body)
        metas.append(objects.meta)
    return metas


async def test_a_remote_read_equals_the_local_read_for_any_offset_and_size(
    tmp_path: Path, seaweed: SeaweedServer, bucket: str
) -> None:
    rng = random.Random(16)
    log = filled_log(tmp_path / "log", rng)
    store = ObjectStore(
        S3Config(
            seaweed.endpoint,
            bucket,
            prefix="reader",
            access_key_id=seaweed.env()["AWS_ACCESS_KEY_ID"],
            secret_access_key=seaweed.env()["AWS_SECRET_ACCESS_KEY"],
        )
    )
    metas = await upload(log, store)
    assert len(metas) >= 5 and any(len(m.terms) > 1 for m in metas)
    cache = reader.ChunkCache(store, limit_bytes=64 << 10)  # small: evictions happen too
    end = metas[-1].last_offset + 1
    for _ in range(400):
        offset = rng.randrange(0, end)
        max_bytes = rng.choice([1, rng.randint(1, 3000), 1 << 20])
        upto = rng.choice([end, rng.randint(offset + 1, end)])
        meta = next(m for m in metas if m.base_offset <= offset <= m.last_offset)
        local = log.read(offset, max_bytes, upto=upto)
        remote = await reader.read_segment(cache, meta, offset, max_bytes, upto)
        assert remote.data == local, (offset, max_bytes, upto)
    log.close()


def test_segment_description_comes_from_the_batch_headers(tmp_path: Path) -> None:
    log = filled_log(tmp_path / "log", random.Random(3))
    [first, *_] = log.sealed_segments()
    data = log.read(first.base_offset, first.size, upto=first.next_offset)
    objects = layout.build_segment(lambda b, last: f"s/{b}-{last}", data, 10_000)
    meta = objects.meta
    assert (meta.base_offset, meta.last_offset) == (first.base_offset, first.next_offset - 1)
    assert (
        meta.size_bytes == first.size
        and meta.object == f"s/{meta.base_offset}-{meta.last_offset}.log"
    )
    assert meta.max_timestamp == first.max_timestamp
    # The index points at batch starts holding the offsets it names.
    for relative, position in layout.OFFSET_ENTRY.iter_unpack(objects.index):
        base = int.from_bytes(data[position : position + 8], "big")
        assert base <= meta.base_offset + relative
    log.close()


def test_the_transaction_index_lists_aborts_touching_the_segment() -> None:
    data = build_batch([Record(b"x")], base_offset=10) + build_batch([Record(b"y")], base_offset=11)
    aborted = [
        layout.AbortedRange(7, 0, 5),  # wholly before
        layout.AbortedRange(8, 3, 10),  # ends inside
        layout.AbortedRange(9, 11, 40),  # starts inside
        layout.AbortedRange(4, 12, 20),  # wholly after
    ]
    objects = layout.build_segment(lambda b, last: "t", data, 12, aborted)
    assert objects.txn_index is not None
    assert layout.read_txn_index(objects.txn_index) == aborted[1:3]
    assert objects.meta.aborted_transactions == 2 and objects.meta.txn_index == "t.txnindex"


def test_the_transaction_index_object_carries_the_local_index_entries_as_they_are(
    tmp_path: Path,
) -> None:
    """The bucket's .txnindex holds the local log's entries byte for byte, the last stable
    offset after each abort included (FORMAT.md section 6), not the marker's offset."""
    index = TxnIndex(tmp_path / "0.txnindex")
    index.append(AbortedTxn(8, 3, 10, 11))
    index.append(AbortedTxn(9, 11, 40, 12))
    local = list(index.entries)
    data = build_batch([Record(b"x")], base_offset=10) + build_batch([Record(b"y")], base_offset=11)
    objects = layout.build_segment(lambda b, last: "t", data, 12, layout.aborted_ranges(local))
    assert objects.txn_index == (tmp_path / "0.txnindex").read_bytes()
    assert layout.read_txn_index(objects.txn_index) == local
