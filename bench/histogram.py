"""Latency histogram with log-linear buckets, in the manner of HdrHistogram.

Owns recording, merging and percentile queries of integer latencies (microseconds) at <1% error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# 128 linear sub-buckets per power of two bound the relative error of a reported value below 1/128.
SUB_BUCKET_BITS = 7
SUB_BUCKETS = 1 << SUB_BUCKET_BITS
# 2**42 us is about 50 days: any larger latency is a measurement bug, not a reading.
MAX_TRACKABLE = 1 << 42


def bucket_index(value: int) -> int:
    """Bucket of a non-negative value; values below SUB_BUCKETS get a bucket each."""
    if value < SUB_BUCKETS:
        return value
    shift = value.bit_length() - SUB_BUCKET_BITS - 1
    return (shift + 1) * SUB_BUCKETS + ((value >> shift) - SUB_BUCKETS)


def bucket_upper(index: int) -> int:
    """Highest value that falls into bucket `index` (what percentiles report, as HdrHistogram)."""
    if index < SUB_BUCKETS:
        return index
    shift = index // SUB_BUCKETS - 1
    mantissa = index % SUB_BUCKETS + SUB_BUCKETS
    return ((mantissa + 1) << shift) - 1


@dataclass
class Histogram:
    """Counts of latencies in microseconds; exact min and max, bucketed everything else."""

    counts: list[int] = field(default_factory=list)
    total: int = 0
    min: int = 0
    max: int = 0
    sum: int = 0

    def record(self, value: int, count: int = 1) -> None:
        """Add `count` observations of `value` microseconds (negative clock skew clamps to 0)."""
        if count <= 0:
            raise ValueError(f"count must be positive, got {count}")
        value = max(0, int(value))
        if value >= MAX_TRACKABLE:
            raise ValueError(f"latency {value} us is beyond the trackable range")
        index = bucket_index(value)
        if index >= len(self.counts):
            self.counts.extend([0] * (index + 1 - len(self.counts)))
        self.counts[index] += count
        self.min = value if self.total == 0 else min(self.min, value)
        self.max = max(self.max, value)
        self.total += count
        self.sum += value * count

    def merge(self, other: Histogram) -> None:
        """Fold another histogram's observations into this one."""
        if other.total == 0:
            return
        if len(other.counts) > len(self.counts):
            self.counts.extend([0] * (len(other.counts) - len(self.counts)))
        for index, count in enumerate(other.counts):
            self.counts[index] += count
        self.min = other.min if self.total == 0 else min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.total += other.total
        self.sum += other.sum

    def percentile(self, percent: float) -> int:
        """Smallest recorded bucket value at or below which `percent` % of observations lie."""
        if not 0.0 <= percent <= 100.0:
            raise ValueError(f"percentile must be within [0, 100], got {percent}")
        if self.total == 0:
            raise ValueError("percentile of an empty histogram")
        # 1-based rank of the observation the percentile names; the epsilon absorbs float error
        # such as 1000 * 99.9 / 100 = 999.0000000000001.
        rank = max(1, math.ceil(self.total * percent / 100 - 1e-9))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return max(self.min, min(bucket_upper(index), self.max))
        return self.max

    def mean(self) -> float:
        """Arithmetic mean of the observations."""
        if self.total == 0:
            raise ValueError("mean of an empty histogram")
        return self.sum / self.total

    def summary_ms(self) -> dict[str, float] | None:
        """p50, p99, p99.9 and max in milliseconds (None when nothing was recorded)."""
        if self.total == 0:
            return None
        return {
            "p50": self.percentile(50) / 1000,
            "p99": self.percentile(99) / 1000,
            "p99.9": self.percentile(99.9) / 1000,
            "max": self.max / 1000,
            "mean": round(self.mean() / 1000, 3),
            "count": self.total,
        }
