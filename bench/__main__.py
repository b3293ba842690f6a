"""Command line of the benchmark package: `python -m bench compare [--quick]` and peer helpers.

Owns argument parsing and where results land (bench/results/<UTC time>/ unless --out).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import report
from bench.compare import SYSTEMS, CompareOptions, compare
from bench.peers import PEERS, ensure_installed, ensure_modules
from bench.workload import WORKLOAD_DIR, WorkloadError, load_workloads

RESULTS_DIR = Path(__file__).parent / "results"
REPORT_MODULES = {"yaml": "pyyaml", "matplotlib": "matplotlib"}


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser("compare", help="run the workloads against every system")
    run.add_argument("--quick", action="store_true", help="short runs; about 5 minutes in all")
    run.add_argument("--systems", type=_csv, default=list(SYSTEMS), help="comma-separated")
    run.add_argument(
        "--workloads", type=_csv, default=[], help="names; default: all (quick: in_quick)"
    )
    run.add_argument("--workload-dir", type=Path, default=WORKLOAD_DIR)
    run.add_argument(
        "--replicas", type=_csv, default=None, help="e.g. 1,3 (default: quick 1, full 1,3)"
    )
    run.add_argument("--out", type=Path, default=None)
    run.add_argument("--no-install", action="store_true", help="never call apt-get or pip")
    peers = commands.add_parser("peers", help="install the peers, or start/stop each once to check")
    peers.add_argument("action", choices=("install", "check"))
    peers.add_argument("--replicas", type=int, default=1)
    return top


def run_compare(args: argparse.Namespace) -> int:
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        print(f"unknown systems: {sorted(unknown)}; known: {list(SYSTEMS)}", file=sys.stderr)
        return 2
    if not args.no_install:
        ensure_modules(REPORT_MODULES)
    try:
        workloads = load_workloads(args.workload_dir)
    except WorkloadError as error:
        print(f"bad workload: {error}", file=sys.stderr)
        return 2
    if args.workloads:
        workloads = [w for w in workloads if w.name in args.workloads]
    elif args.quick:
        workloads = [w for w in workloads if w.in_quick]
    replicas = [int(r) for r in args.replicas] if args.replicas else ([1] if args.quick else [1, 3])
    started = datetime.now(UTC)
    began = time.monotonic()
    load_at_start = report.machine()["load_avg_1m"]
    results = compare(
        CompareOptions(
            workloads=workloads,
            systems=args.systems,
            replicas=replicas,
            quick=args.quick,
            install=not args.no_install,
        )
    )
    results.update(
        started=started.strftime("%Y-%m-%d %H:%M UTC"),
        quick=args.quick,
        machine={**report.machine(), "load_avg_at_start": load_at_start},
        wall_seconds=round(time.monotonic() - began, 1),
    )
    out = args.out or RESULTS_DIR / started.strftime("%Y%m%dT%H%M%SZ")
    paths = report.write(results, out)
    print(paths["markdown"].read_text())
    written = ", ".join(str(p) for p in paths.values())
    print(f"wall time {results['wall_seconds']} s; written: {written}")
    return 0 if results["runs"] else 1


def run_peers(args: argparse.Namespace) -> int:
    for name, peer_class in PEERS.items():
        ensure_installed(peer_class.system)
        if args.action == "check":
            peer = peer_class(args.replicas)
            began = time.monotonic()
            try:
                endpoint = peer.start()
                print(
                    f"{name}: ready in {time.monotonic() - began:.1f} s at {endpoint.ports} "
                    f"({peer.version})"
                )
            except Exception as error:  # report every peer, not just the first failure
                print(f"{name}: FAILED: {error}")
            finally:
                peer.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_compare(args) if args.command == "compare" else run_peers(args)


if __name__ == "__main__":
    sys.exit(main())
