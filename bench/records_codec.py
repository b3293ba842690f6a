"""Benchmark of the RecordBatch v2 codec: records/s encoded, decoded and checked, with the C
record loops (raftline.raftlog._speedups) and the pure-Python ones side by side.

Run: .venv/bin/python bench/records_codec.py [--records N ...] [--codecs none lz4 ...]
     [--value-size B] [--seconds S]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable

from raftline.raftlog import records
from raftline.raftlog.records import Codec, Record, build_batch, check_batch, decode_batch


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


def _steps(count: int, value_size: int, codec: Codec) -> dict[str, Callable[[], object]]:
    """What is timed: building a batch from Records (key, timestamp) and from plain bytes
    values, decoding it into records, and checking it as the broker does on produce."""
    values = [((b"%08d" % i) * (value_size // 8 + 1))[:value_size] for i in range(count)]
    keyed = [
        Record(value=value, key=b"key-%d" % i, timestamp=1_700_000_000_000 + i)
        for i, value in enumerate(values)
    ]
    raw = build_batch(keyed, codec=codec)
    return {
        "encode Record": lambda: build_batch(keyed, codec=codec),
        "encode bytes": lambda: build_batch(values, codec=codec, timestamp=1_700_000_000_000),
        "decode": lambda: decode_batch(raw),
        "check": lambda: check_batch(raw),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument(
        "--codecs", nargs="+", default=["none", "lz4"], choices=[c.name.lower() for c in Codec]
    )
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    args = parser.parse_args()
    if not records.SPEEDUPS:
        print("C record loops not in use (not built, or RAFTLINE_PURE_PYTHON=1): C = Python")
    print(f"{args.value_size}-byte values; records/s of the fastest call in {args.seconds} s")
    print(f"{'records':>8} {'codec':6} {'step':14} {'C':>14} {'Python':>14} {'C/Python':>9}")
    for count in args.records:
        for codec in (Codec[name.upper()] for name in args.codecs):
            for step, action in _steps(count, args.value_size, codec).items():
                c_rate = _rate(action, count, args.seconds)
                with records.python_loops():
                    python_rate = _rate(action, count, args.seconds)
                print(
                    f"{count:8,} {codec.name.lower():6} {step:14} {c_rate:14,.0f} "
                    f"{python_rate:14,.0f} {c_rate / python_rate:8.1f}x"
                )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
