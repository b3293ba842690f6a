"""Benchmark of the RecordBatch v2 codec: records/s encoded and decoded per codec.

Run: .venv/bin/python bench/records_codec.py [--records N] [--value-size B] [--seconds S]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from raftline.raftlog.records import Codec, Record, build_batch, decode_batch


def _rate(action: Callable[[], object], records_per_call: int, seconds: float) -> float:
    """Records/s of the fastest call seen in `seconds`: on a shared CPU the fastest call is
    the closest to the codec's own cost."""
    fastest = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        action()
        fastest = min(fastest, time.perf_counter() - start)
    return records_per_call / fastest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1000, help="records per batch")
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    args = parser.parse_args()
    records = [
        Record(
            value=((b"%08d" % i) * (args.value_size // 8 + 1))[: args.value_size],
            key=b"key-%d" % i,
            timestamp=1_700_000_000_000 + i,
        )
        for i in range(args.records)
    ]
    print(f"{args.records} records/batch, {args.value_size}-byte values")
    print(f"{'codec':8} {'encode rec/s':>14} {'decode rec/s':>14} {'batch bytes':>12}")
    for codec in Codec:
        raw = build_batch(records, codec=codec)
        encode = _rate(lambda c=codec: build_batch(records, codec=c), len(records), args.seconds)
        decode = _rate(lambda r=raw: decode_batch(r), len(records), args.seconds)
        print(f"{codec.name:8} {encode:14,.0f} {decode:14,.0f} {len(raw):12,}")


if __name__ == "__main__":
    main()
