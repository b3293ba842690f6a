"""`python -m raftline.chaos`: run a chaos test against the compose cluster, or re-check a history.

Owns the command line; exit 0 = no anomaly, 1 = anomalies found, 2 = the run could not be made.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from raftline.chaos import report
from raftline.chaos.cluster import ClusterError
from raftline.chaos.history import HistoryError, read_history
from raftline.chaos.runner import RunConfig, run


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m raftline.chaos")
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run", help="drive the docker compose cluster under faults")
    go.add_argument("--nodes", type=int, default=5)
    go.add_argument("--time-limit", type=float, default=120.0, help="seconds of workload")
    go.add_argument(
        "--recovery", type=float, default=20.0, help="seconds of workload after the last heal"
    )
    go.add_argument(
        "--nemesis",
        default="partition,kill,pause",
        help="comma list of partition,kill,pause,loss,slow,delay,clock,s3,none (none: a placebo "
        "window, measured but not judged; empty: no faults)",
    )
    go.add_argument("--out", type=Path, default=Path("chaos-results"))
    go.add_argument("--compose-file", type=Path, default=Path("docker-compose.yml"))
    go.add_argument("--project", default="raftline-chaos", help="compose project name")
    go.add_argument(
        "--urls",
        default="",
        help="comma list of running nodes' HTTP URLs instead of"
        " the compose cluster (workload only; use with --nemesis '')",
    )
    go.add_argument("--partitions", type=int, default=4)
    go.add_argument("--producers", type=int, default=8)
    go.add_argument("--consumers", type=int, default=4)
    go.add_argument("--seed", type=int, default=0)
    go.add_argument(
        "--workload",
        choices=("queue", "group", "share", "route", "idempotent", "transactions"),
        default="queue",
        help="queue: producers, partition consumers and metadata ops (default);"
        " group: producers and the members of one consumer group;"
        " share: producers and the receivers of one queue (share group) with dead letters;"
        " route: publishers through a fanout exchange to several topics (transactions);"
        " idempotent: idempotent producers retrying every ambiguous failure;"
        " transactions: transactional producers and read_committed readers (--consumers)",
    )
    go.add_argument("--receivers", type=int, default=4, help="queue receivers (--workload share)")
    go.add_argument(
        "--lock-ms", type=int, default=1000, help="the queue's lock_ms (--workload share)"
    )
    go.add_argument("--max-deliveries", type=int, default=3, help="the queue's (--workload share)")
    go.add_argument("--members", type=int, default=4, help="group members (--workload group)")
    go.add_argument(
        "--destinations", type=int, default=3, help="topics of the exchange (--workload route)"
    )
    go.add_argument(
        "--session-timeout-ms",
        type=int,
        default=6000,
        help="the group members' session timeout (--workload group)",
    )
    go.add_argument(
        "--tiered",
        action="store_true",
        help="the topic in object storage (remote.storage.enable, tiny local retention) with"
        " --rereaders clients reading partitions from offset 0 over and over (queue workload)",
    )
    go.add_argument("--rereaders", type=int, default=2, help="(--tiered) readers from offset 0")
    go.add_argument(
        "--streamers",
        type=int,
        default=2,
        help="push consumers following partitions over WebSocket topic streams (queue workload)",
    )
    go.add_argument("--no-up", action="store_true", help="use an already running cluster")
    go.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    check = commands.add_parser("check", help="check a recorded history.jsonl again")
    check.add_argument("history", type=Path)
    check.add_argument("--out", type=Path, help="where to write result, summary and plot")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "check":
            ops = read_history(args.history)
            result = report.analyse(ops)
            report.write_outputs(args.out or args.history.parent, ops, result)
        else:
            if (
                args.time_limit <= 0
                or args.recovery < 0
                or args.partitions < 1
                or args.producers < 1
                or args.members < 1
                or args.receivers < 1
                or args.streamers < 0
            ):
                raise ValueError(
                    "--time-limit, --partitions, --producers, --members, --receivers must be"
                    " positive; --recovery and --streamers >= 0"
                )
            config = RunConfig(
                nodes=args.nodes,
                time_limit_s=args.time_limit,
                recovery_s=args.recovery,
                nemesis=[n for n in args.nemesis.split(",") if n.strip()],
                out_dir=args.out,
                compose_file=args.compose_file,
                project=args.project,
                urls=[u.strip() for u in args.urls.split(",") if u.strip()],
                partitions=args.partitions,
                producers=args.producers,
                consumers=args.consumers,
                seed=args.seed,
                workload=args.workload,
                members=args.members,
                session_timeout_ms=args.session_timeout_ms,
                receivers=args.receivers,
                lock_ms=args.lock_ms,
                max_deliveries=args.max_deliveries,
                tiered=args.tiered,
                rereaders=args.rereaders,
                streamers=args.streamers,
                destinations=args.destinations,
                bring_up=not args.no_up,
                tear_down=not args.keep,
            )
            result = run(config)
    except (ClusterError, HistoryError, ValueError, OSError) as failure:
        print(f"chaos: {failure}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the cluster was already healed and torn down on the way out
        print("chaos: interrupted", file=sys.stderr)
        return 130
    print(report.summary_text(result), end="")
    return 0 if result["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
