"""The benchmark's latency histogram reports percentiles within its stated precision."""

import random

import pytest

from bench.histogram import SUB_BUCKETS, Histogram, bucket_index, bucket_upper


def test_small_values_are_recorded_exactly() -> None:
    histogram = Histogram()
    for value in range(1, 101):
        histogram.record(value)
    assert histogram.percentile(50) == 50
    assert histogram.percentile(99) == 99
    assert histogram.percentile(100) == 100


def test_large_values_keep_relative_error_below_one_bucket_width() -> None:
    rng = random.Random(7)
    values = sorted(rng.randrange(1, 10_000_000) for _ in range(5000))
    histogram = Histogram()
    for value in values:
        histogram.record(value)
    for percent in (50, 90, 99, 99.9):
        exact = values[max(0, -(-len(values) * int(percent * 10) // 1000) - 1)]
        assert abs(histogram.percentile(percent) - exact) <= exact / SUB_BUCKETS + 1


def test_every_value_lies_within_its_bucket() -> None:
    for value in (0, 1, 127, 128, 255, 256, 1000, 123_456, 2**30 + 5):
        index = bucket_index(value)
        assert bucket_upper(index - 1) < value <= bucket_upper(index) if index else value == 0


def test_max_and_min_are_exact() -> None:
    histogram = Histogram()
    histogram.record(1_000_003)
    histogram.record(17)
    assert histogram.max == 1_000_003
    assert histogram.min == 17
    assert histogram.percentile(100) == 1_000_003


def test_a_count_weights_one_value() -> None:
    histogram = Histogram()
    histogram.record(10, count=99)
    histogram.record(5000)
    assert histogram.total == 100
    assert histogram.percentile(99) == 10
    assert histogram.percentile(99.9) == 5000


def test_merge_equals_recording_into_one() -> None:
    left, right, both = Histogram(), Histogram(), Histogram()
    for value in range(0, 5000, 7):
        (left if value % 2 else right).record(value)
        both.record(value)
    left.merge(right)
    assert left == both


def test_p999_of_a_thousand_values_names_the_999th() -> None:
    histogram = Histogram()
    for value in range(1, 1001):
        histogram.record(value)
    # 999.0000000000001 in floating point must not round up to the 1000th observation.
    assert histogram.percentile(99.9) == bucket_upper(bucket_index(999))


def test_empty_histogram_has_no_percentile_and_no_summary() -> None:
    with pytest.raises(ValueError, match="empty"):
        Histogram().percentile(50)
    assert Histogram().summary_ms() is None


def test_bad_input_is_refused() -> None:
    histogram = Histogram()
    with pytest.raises(ValueError):
        histogram.record(5, count=0)
    with pytest.raises(ValueError):
        histogram.record(2**50)
    histogram.record(1)
    with pytest.raises(ValueError):
        histogram.percentile(101)


def test_summary_is_in_milliseconds() -> None:
    histogram = Histogram()
    histogram.record(2500)
    summary = histogram.summary_ms()
    assert summary is not None
    assert summary["max"] == 2.5
    assert summary["count"] == 1
