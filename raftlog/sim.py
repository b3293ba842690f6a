"""Command line for the Raft simulator: run many seeds, summarise, print failing seeds.

Owns `python -m raftline.raftlog.sim --seeds N [--start S] [--nodes K] [--jobs J]`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

from raftline.raftlog.simchaos import SeedResult, run_seed


def _run_chunk(args: tuple[int, int, int | None, int | None]) -> list[SeedResult]:
    start, count, nodes, steps = args
    results = []
    for seed in range(start, start + count):
        result = run_seed(seed, nodes, steps)
        if result.violation is not None:
            result = run_seed(seed, nodes, steps, trace=40)  # replay, this time recording
        results.append(result)
    return results


def _results(
    start: int, seeds: int, nodes: int | None, steps: int | None, jobs: int
) -> Iterator[SeedResult]:
    chunk = max(1, min(50, seeds // (jobs * 8) or 1))
    work = [
        (s, min(chunk, start + seeds - s), nodes, steps) for s in range(start, start + seeds, chunk)
    ]
    if jobs <= 1:
        for item in work:
            yield from _run_chunk(item)
        return
    with ProcessPoolExecutor(jobs) as pool:
        for results in pool.map(_run_chunk, work):
            yield from results


def _progress(done: int, total: int, failures: int, started: float) -> None:
    width = 30
    filled = width * done // total
    rate = done / max(time.monotonic() - started, 1e-9)
    sys.stderr.write(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} seeds "
        f"{rate:,.0f}/s failures {failures}"
    )
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m raftline.raftlog.sim", description="Run the Raft simulator over seeds."
    )
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--nodes", type=int, default=None, help="cluster size (default: per seed)")
    parser.add_argument("--steps", type=int, default=None, help="chaos steps per seed")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1 or (args.nodes is not None and args.nodes < 1):
        parser.error("--seeds, --jobs and --nodes must be positive")
    started = time.monotonic()
    totals = Counter[str]()
    failures: list[SeedResult] = []
    slowest_recovery = 0.0
    for done, result in enumerate(
        _results(args.start, args.seeds, args.nodes, args.steps, args.jobs), 1
    ):
        totals["steps"] += result.steps
        totals["elections"] += result.elections
        totals["commits"] += result.commits
        slowest_recovery = max(slowest_recovery, result.recovery)
        if result.violation is not None:
            failures.append(result)
        if not args.quiet and (done % 20 == 0 or done == args.seeds):
            _progress(done, args.seeds, len(failures), started)
    if not args.quiet:
        sys.stderr.write("\n")
    elapsed = time.monotonic() - started
    print(
        f"seeds {args.seeds} (from {args.start})  steps {totals['steps']}  "
        f"elections {totals['elections']}  commits {totals['commits']}  "
        f"violations {len(failures)}  in {elapsed:.1f}s  "
        f"(slowest recovery after healing: {slowest_recovery:.1f} election timeouts)"
    )
    for failure in failures[:5]:
        nodes_flag = f" --nodes {args.nodes}" if args.nodes is not None else ""
        steps_flag = f" --steps {args.steps}" if args.steps is not None else ""
        print(f"\nseed {failure.seed} ({failure.nodes} nodes): {failure.violation}")
        print(
            f"replay: python -m raftline.raftlog.sim --seeds 1 --start {failure.seed}"
            f"{nodes_flag}{steps_flag}"
        )
        for line in failure.trace:
            print(f"  {line}")
    if len(failures) > 5:
        print(f"... and {len(failures) - 5} more failing seeds: {[f.seed for f in failures[5:]]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
