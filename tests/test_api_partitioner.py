"""Keys land on the partition Kafka's default partitioner would pick."""

import warnings

import pytest

from raftline.api.partitioner import murmur2, partition_for_key

with warnings.catch_warnings():  # kafka-python's import warns about importlib.resources
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.partitioner.default import murmur2 as kafka_python_murmur2

# Published in Kafka's UtilsTest.testMurmur2 (signed Java ints).
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS.items())
def test_murmur2_matches_kafkas_published_values(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.parametrize("length", range(12))
def test_murmur2_agrees_with_kafka_python_for_every_tail_length(length: int) -> None:
    key = bytes(range(200, 200 + length))
    assert murmur2(key) & 0xFFFFFFFF == kafka_python_murmur2(key)


def test_partition_is_the_positive_hash_modulo_the_partition_count() -> None:
    # murmur2(b"21") is negative: toPositive masks the sign bit rather than negating.
    assert partition_for_key(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7


def test_same_key_same_partition() -> None:
    assert {partition_for_key(b"user-1", 12) for _ in range(3)} == {
        partition_for_key(b"user-1", 12)
    }
