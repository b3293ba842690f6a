"""Command line of the benchmark package: `python -m bench compare [--quick]`, `soak`, peer helpers.

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
from bench.workload import WORKLOAD_DIR, WorkloadError, load_workload, load_workloads

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
    run.add_argument(
        "--clients",
        type=_csv,
        default=["python", "native"],
        help="python (bench/drivers), native (bench/native, built with cargo), or both",
    )
    soak = commands.add_parser(
        "soak", help="sustained runs: max rate, then fixed rates, timelines beside a plain file"
    )
    soak.add_argument("--systems", type=_csv, default=["raftline"], help="comma-separated")
    soak.add_argument("--workload", type=Path, default=None, help="a workload file")
    soak.add_argument("--seconds", type=float, default=300.0, help="max-rate run length")
    soak.add_argument("--max-gb", type=float, default=100.0, help="max-rate run ends there too")
    soak.add_argument("--retention-gib", type=float, default=4.0, help="per partition")
    soak.add_argument("--fractions", type=_csv, default=["0.5", "0.8"], help="of sustained max")
    soak.add_argument("--fixed-seconds", type=float, default=120.0)
    soak.add_argument("--yardstick-seconds", type=float, default=60.0, help="0: no yardstick")
    soak.add_argument("--yardstick-sync-mb", type=float, default=1.0, help="MiB per fdatasync")
    soak.add_argument("--replicas", type=int, default=1)
    soak.add_argument("--client", choices=("native", "python"), default="native")
    soak.add_argument("--out", type=Path, default=None)
    soak.add_argument("--no-install", action="store_true", help="never call apt-get or pip")
    peers = commands.add_parser("peers", help="install the peers, or start/stop each once to check")
    peers.add_argument("action", choices=("install", "check"))
    peers.add_argument("--replicas", type=int, default=1)
    return top


def run_compare(args: argparse.Namespace) -> int:
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        print(f"unknown systems: {sorted(unknown)}; known: {list(SYSTEMS)}", file=sys.stderr)
        return 2
    if set(args.clients) - {"python", "native"} or not args.clients:
        print("--clients takes python, native or both", file=sys.stderr)
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
            clients=args.clients,
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
    return 0 if results["runs"] or results["native_runs"] else 1


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


def run_soak(args: argparse.Namespace) -> int:
    from bench import soak
    from bench.host_samples import YardstickPlan

    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        print(f"unknown systems: {sorted(unknown)}; known: {list(SYSTEMS)}", file=sys.stderr)
        return 2
    if not args.no_install:
        ensure_modules(REPORT_MODULES)
    try:
        workload = load_workload(args.workload) if args.workload else soak.default_workload()
    except WorkloadError as error:
        print(f"bad workload: {error}", file=sys.stderr)
        return 2
    if args.client == "native":
        from bench import native

        native.ensure_built()
    yardstick = None
    if args.yardstick_seconds > 0:
        sync = int(args.yardstick_sync_mb * (1 << 20))
        yardstick = YardstickPlan(seconds=args.yardstick_seconds, sync_bytes=sync)
    started = datetime.now(UTC)
    results = soak.soak(
        soak.SoakOptions(
            systems=args.systems,
            workload=workload,
            seconds=args.seconds,
            max_bytes=int(args.max_gb * soak.GB),
            retention_bytes=int(args.retention_gib * (1 << 30)),
            fractions=[float(f) for f in args.fractions],
            fixed_seconds=args.fixed_seconds,
            replicas=args.replicas,
            yardstick=yardstick,
            install=not args.no_install,
            client=args.client,
        )
    )
    results.update(started=started.strftime("%Y-%m-%d %H:%M UTC"), machine=report.machine())
    out = args.out or RESULTS_DIR / ("soak-" + started.strftime("%Y%m%dT%H%M%SZ"))
    paths = soak.write(results, out)
    print(paths["markdown"].read_text())
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return 0 if results["systems"] else 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    commands = {"compare": run_compare, "soak": run_soak, "peers": run_peers}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
