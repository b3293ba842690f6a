"""The `raftline` command line: `serve` (flags and RAFTLINE_* env into NodeConfig) and the clients.

Owns argument parsing, the topic/produce/consume/group commands, their tables and progress bars.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from raftline.clients.client import DEFAULT_URL, Client, Message, RaftlineError, RetryPolicy

# serve flag -> help; its env var is RAFTLINE_<FLAG> and the flag wins over it.
SERVE_FLAGS: dict[str, str] = {
    "node-id": "node N's id (integer)",
    "data-dir": "directory for the node's data (default ./raftline-data)",
    "http": "HOST:PORT the HTTP API listens on (default 127.0.0.1:8080)",
    "raft": "HOST:PORT for node-to-node traffic (default 127.0.0.1:9090)",
    "peers": "initial members' Raft addresses, this node included: 1=HOST:PORT,2=HOST:PORT",
    "fsync": "always | interval | never (default always)",
    "producer-expiry-ms": "idle idempotent producers are forgotten after this much committed "
    "message time (default 86400000 = 24 h)",
    "queue-cache-bytes": "bytes of records a queue shard's leader keeps read ahead and "
    "unsettled, over all its queues; reading pauses at this bound (default 67108864 = 64 MiB)",
    "test-hooks": "1 serves the fault-injection endpoints under /v1/admin (tests only; default 0)",
    "s3-endpoint": "URL of the S3-compatible object store for tiered storage (credentials from "
    "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)",
    "s3-bucket": "bucket for tiered segments (with --s3-endpoint)",
    "s3-region": "region of the bucket (default us-east-1)",
    "s3-prefix": "key prefix inside the bucket (default none)",
    "switch-interval-us": "how long (us) a thread of the node may hold Python's interpreter lock "
    "while another waits for it: a disk thread back from fsync waits up to this long before "
    "the write is acknowledged (100-100000, default 500)",
    "tiered-cache-bytes": "bytes of remote segment chunks a node keeps in memory for fetches "
    "below the local log start (with --s3-endpoint; at least 4194304, default 67108864 = 64 MiB)",
}


def env_name(flag: str) -> str:
    return "RAFTLINE_" + flag.upper().replace("-", "_")


def node_config(args: argparse.Namespace, environ: dict[str, str]) -> Any:
    """Build the NodeConfig from flags, falling back to RAFTLINE_* environment variables."""
    from raftline.node.config import NodeConfig, parse_peers

    values: dict[str, Any] = {}
    for flag in SERVE_FLAGS:
        attribute = flag.replace("-", "_")
        text = getattr(args, attribute)
        if text is None:
            text = environ.get(env_name(flag))
        if text is None or text == "":
            continue
        if flag == "node-id":
            if not text.strip().isdigit():
                raise ValueError(f"node id must be a non-negative integer, got {text!r}")
            values[attribute] = int(text)
        elif flag == "peers":
            values[attribute] = parse_peers(text)
        elif flag == "data-dir":
            values[attribute] = Path(text)
        elif flag in (
            "producer-expiry-ms",
            "queue-cache-bytes",
            "tiered-cache-bytes",
            "switch-interval-us",
        ):
            if not text.strip().isdigit() or int(text) < 1:
                raise ValueError(f"--{flag} must be a positive integer, got {text!r}")
            values[attribute] = int(text)
        elif flag == "test-hooks":
            if text.strip() not in ("0", "1"):
                raise ValueError(f"test hooks must be 0 or 1, got {text!r}")
            values[attribute] = text.strip() == "1"
        else:
            values[attribute] = text.strip()
    return NodeConfig(**values)


# ---- output helpers ------------------------------------------------------------------------


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO) -> None:
    """Left-aligned columns sized to their widest cell."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        out.write(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            + "\n"
        )


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    WIDTH = 30

    def __init__(self, label: str, total: int | None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.label = label
        self.total = total
        self.done = 0
        self.started = time.monotonic()
        self._drawn = 0.0

    def advance(self, amount: int = 1) -> None:
        self.done += amount
        now = time.monotonic()
        if self.enabled and now - self._drawn >= 0.1:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.done / max(now - self.started, 1e-6)
        if self.total:
            filled = min(self.WIDTH, self.WIDTH * self.done // self.total)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            text = f"{self.label} [{bar}] {self.done}/{self.total}"
        else:
            text = f"{self.label} {self.done}"
        self.stream.write(f"\r{text} ({rate:,.0f}/s)\x1b[K")
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()


# ---- commands ------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        config = node_config(args, dict(os.environ))
    except (ValueError, TypeError) as exc:
        print(f"raftline serve: {exc}", file=sys.stderr)
        return 2
    from raftline.node.server import serve

    serve(config)
    return 0


def _parse_config(items: Iterable[str]) -> dict[str, str]:
    config: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE for --config, got {item!r}")
        config[key.strip()] = value.strip()
    return config


def cmd_topic_create(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    description = client.create_topic(
        args.name, args.partitions, args.replication_factor, _parse_config(args.config)
    )
    out.write(f"created topic {description.get('name', args.name)}\n")
    return 0


def cmd_topic_list(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    topics = client.list_topics()
    rows = [(t["name"], t["partitions"], t["replication_factor"]) for t in topics]
    table(rows, ("TOPIC", "PARTITIONS", "REPLICATION"), out)
    return 0


def cmd_topic_describe(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    description = client.describe_topic(args.name)
    out.write(f"topic: {description['name']}\n")
    config = description.get("config") or {}
    if config:
        out.write("config: " + ", ".join(f"{k}={v}" for k, v in sorted(config.items())) + "\n")
    rows = [
        (
            p["partition"],
            p.get("leader"),
            ",".join(map(str, p.get("replicas", []))),
            ",".join(map(str, p.get("in_sync", []))),
            p.get("log_start_offset"),
            p.get("high_watermark"),
        )
        for p in description.get("partitions", [])
    ]
    table(rows, ("PARTITION", "LEADER", "REPLICAS", "IN_SYNC", "LOG_START", "HIGH_WATERMARK"), out)
    return 0


def cmd_topic_delete(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    client.delete_topic(args.name)
    out.write(f"deleted topic {args.name}\n")
    return 0


def cmd_cluster(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    info = client.cluster()
    out.write(f"cluster: {info.get('cluster_id')}  controller: {info.get('controller')}\n")
    rows = [
        (n["id"], n.get("http"), n.get("raft"), "yes" if n.get("alive") else "no")
        for n in info.get("nodes", [])
    ]
    table(rows, ("NODE", "HTTP", "RAFT", "ALIVE"), out)
    return 0


def cmd_restore(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    rows = []
    for topic in client.restore(args.topic or None):
        partitions = topic.get("partitions", [])
        rows.append(
            (
                topic["name"],
                len(partitions),
                ",".join(str(p["next_offset"]) for p in partitions),
                sum(p["size_bytes"] for p in partitions),
                "restored" if topic.get("restored") else topic.get("reason", "skipped"),
            )
        )
    table(rows, ("TOPIC", "PARTITIONS", "LOG_STARTS_AT", "BUCKET_BYTES", "STATUS"), out)
    return 0


def _lines(source: TextIO) -> Iterator[str]:
    for line in source:
        yield line.rstrip("\r\n")


def cmd_produce(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    total = None
    if args.file and args.file != "-":
        source: TextIO = open(args.file, encoding="utf-8")  # noqa: SIM115 (closed below)
        total = sum(1 for _ in source)
        source.seek(0)
    else:
        source = sys.stdin
    progress = Progress("produced", total)
    failures: list[BaseException] = []
    sent = 0

    def settled(future: Any) -> None:
        if future.exception() is not None:
            failures.append(future.exception())
        progress.advance()

    try:
        with client.producer(
            args.topic, acks=args.acks, linger_ms=args.linger_ms, transport=args.transport
        ) as producer:
            for line in _lines(source):
                if not line and args.skip_empty:
                    continue
                future = producer.send(line, key=args.key, partition=args.partition)
                future.add_done_callback(settled)
                sent += 1
    finally:
        if source is not sys.stdin:
            source.close()
    progress.finish()
    if failures:
        print(
            f"raftline produce: {len(failures)} of {sent} messages failed: {failures[0]}",
            file=sys.stderr,
        )
        return 1
    if args.verbose:
        print(f"produced {sent} messages to {args.topic}", file=sys.stderr)
    return 0


def _format(message: Message, style: str) -> str:
    if style == "json":
        record: dict[str, Any] = {
            "partition": message.partition,
            "offset": message.offset,
            "timestamp": message.timestamp,
            "key": None if message.key is None else message.key.decode("utf-8", "replace"),
            "value": message.text,
            "headers": {
                name: value.decode("utf-8", "replace") if isinstance(value, bytes) else value
                for name, value in message.headers.items()
            },
        }
        return json.dumps(record)
    if style == "kv":
        key = "" if message.key is None else message.key.decode("utf-8", "replace")
        return f"{key}\t{message.text or ''}"
    return message.text or ""


def add_filter_and_stream(command: argparse.ArgumentParser, stream_note: str) -> None:
    command.add_argument(
        "--filter",
        metavar="EXPR",
        help="only records this expression matches, skipped on the node, e.g. "
        "'headers.region == \"eu\" and timestamp >= 1700000000000' (README: Filters)",
    )
    command.add_argument(
        "--stream",
        action="store_true",
        help=f"the node pushes messages over a WebSocket as they come ({stream_note}); "
        "long-polls where the upgrade is refused",
    )


def cmd_consume(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    if args.group is not None:
        return _consume_group(args, client, out)
    partitions = (
        [args.partition]
        if args.partition is not None
        else list(range(client.partition_count(args.topic)))
    )
    offset: int | str = int(args.offset) if args.offset.isdigit() else args.offset
    emit: Callable[[Message], None] = lambda m: out.write(_format(m, args.format) + "\n")  # noqa: E731
    if args.follow or args.stream:
        consumer = client.consumer(
            args.topic,
            partitions=partitions,
            offset=offset,
            wait_ms=1000,
            filter=args.filter,
            stream=args.stream,
        )
        try:
            for count, message in enumerate(consumer, start=1):
                emit(message)
                out.flush()
                if args.max_messages and count >= args.max_messages:
                    break
        except KeyboardInterrupt:
            pass
        finally:
            consumer.close()
        return 0
    return _consume_to_end(args, client, partitions, offset, emit)


def _consume_group(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    """Join the group and print what it hands this member until Ctrl-C (or -n): what was
    printed is committed every second and when leaving, which happens on the way out."""
    consumer = client.consumer(
        args.topic,
        group=args.group,
        auto_offset_reset=args.offset,
        member_id=args.member_id,
        session_timeout_ms=args.session_timeout_ms,
        auto_commit_interval_ms=1000,
        filter=args.filter,
        stream=args.stream,
    )
    try:
        for count, message in enumerate(consumer, start=1):
            out.write(_format(message, args.format) + "\n")
            out.flush()
            if args.max_messages and count >= args.max_messages:
                break
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    return 0


def _consume_to_end(
    args: argparse.Namespace,
    client: Client,
    partitions: list[int],
    offset: int | str,
    emit: Callable[[Message], None],
) -> int:
    """Read each partition from `offset` up to the high watermark seen when starting."""
    printed = 0
    for partition in partitions:
        first = client.fetch(args.topic, partition, offset, max_messages=1, filter=args.filter)
        end = first.high_watermark
        position = (
            offset
            if isinstance(offset, int)
            else (first.log_start_offset if offset == "earliest" else end)
        )
        progress = Progress(f"partition {partition}", max(0, end - int(position)))
        while int(position) < end:
            result = client.fetch(
                args.topic, partition, position, max_messages=1000, filter=args.filter
            )
            for message in result.messages:
                if message.offset >= end:
                    break
                emit(message)
                printed += 1
                if args.max_messages and printed >= args.max_messages:
                    progress.finish()
                    return 0
            progress.advance(result.next_offset - int(position))
            if result.next_offset <= int(position):
                break
            position = result.next_offset
        progress.finish()
    return 0


def cmd_group_list(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    groups = sorted(client.list_groups(), key=lambda g: g["group"])
    table([(g["group"], g.get("state"), g.get("members")) for g in groups],
          ("GROUP", "STATE", "MEMBERS"), out)  # fmt: skip
    return 0


def _partition_names(items: Iterable[dict[str, Any]]) -> str:
    return ",".join(f"{a['topic']}/{a['partition']}" for a in items) or "-"


def cmd_group_describe(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    info = client.describe_group(args.group)
    out.write(
        f"group: {info.get('group', args.group)}  state: {info.get('state')}  "
        f"generation: {info.get('generation')}  assignor: {info.get('assignor', '-')}\n\n"
    )
    members = info.get("members", [])
    owner = {(a["topic"], a["partition"]): m["member_id"] for m in members for a in m["assignment"]}
    rows = [
        (m["member_id"], m.get("client"), m.get("session_timeout_ms"),
         _partition_names(m.get("assignment", [])))
        for m in members
    ]  # fmt: skip
    table(rows, ("MEMBER", "CLIENT", "SESSION_MS", "PARTITIONS"), out)
    out.write("\n")
    offsets = {(o["topic"], o["partition"]): o for o in info.get("offsets", [])}
    lines = []
    for tp in sorted(set(offsets) | set(owner)):
        o = offsets.get(tp, {})
        lines.append(
            (tp[0], tp[1], owner.get(tp), o.get("offset"), o.get("high_watermark"), o.get("lag"))
        )
    table(lines, ("TOPIC", "PARTITION", "MEMBER", "OFFSET", "HIGH_WATERMARK", "LAG"), out)
    total = sum(o["lag"] for o in offsets.values() if o.get("lag") is not None)
    out.write(f"\ntotal lag: {total}\n")
    return 0


def cmd_group_reset_offsets(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    to: str | dict[str, int]
    if args.to_earliest:
        to = "earliest"
    elif args.to_latest:
        to = "latest"
    elif args.to_timestamp is not None:
        to = {"timestamp": args.to_timestamp}
    else:
        to = {"offset": args.to_offset}
    offsets = client.reset_group_offsets(args.group, args.topic, to)
    rows = [(o["topic"], o["partition"], o["offset"]) for o in offsets]
    table(rows, ("TOPIC", "PARTITION", "OFFSET"), out)
    return 0


def cmd_group_remove_members(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    removed = client.remove_group_members(args.group, args.member or None)
    for member_id in removed:
        out.write(f"removed {member_id}\n")
    return 0


def non_negative(text: str) -> int:
    """An argparse type: a non-negative integer (else argparse's usage error)."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return int(text)


# ---- parser --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftline", description="Raftline: a Raft-per-partition message broker."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser(
        "serve",
        help="run a broker node",
        description="Run a broker node. Each flag may also come from RAFTLINE_<FLAG> "
        "(e.g. RAFTLINE_NODE_ID, RAFTLINE_PEERS); the flag wins.",
    )
    for flag, text in SERVE_FLAGS.items():
        serve.add_argument(f"--{flag}", default=None, help=f"{text} [env {env_name(flag)}]")
    serve.set_defaults(handler=None)

    def client_command(
        name: str, help_text: str, parent: Any = commands
    ) -> argparse.ArgumentParser:
        sub = parent.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "--url",
            default=os.environ.get("RAFTLINE_URL", DEFAULT_URL),
            help=f"broker URL(s), comma separated (default {DEFAULT_URL}; env RAFTLINE_URL)",
        )
        return sub

    topic = commands.add_parser("topic", help="create, list, describe or delete topics")
    topics = topic.add_subparsers(dest="topic_command", metavar="ACTION", required=True)
    create = client_command("create", "create a topic", topics)
    create.add_argument("name")
    create.add_argument("-p", "--partitions", type=int, default=1)
    create.add_argument(
        "-r",
        "--replication-factor",
        type=int,
        default=None,
        help="replicas per partition (default: min(3, cluster size))",
    )
    create.add_argument(
        "-c",
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="topic config, e.g. retention.ms=60000 (repeatable)",
    )
    create.set_defaults(handler=cmd_topic_create)
    client_command("list", "list topics", topics).set_defaults(handler=cmd_topic_list)
    describe = client_command("describe", "show a topic's partitions and config", topics)
    describe.add_argument("name")
    describe.set_defaults(handler=cmd_topic_describe)
    delete = client_command("delete", "delete a topic", topics)
    delete.add_argument("name")
    delete.set_defaults(handler=cmd_topic_delete)

    client_command("cluster", "show the cluster's nodes").set_defaults(handler=cmd_cluster)
    restore = client_command(
        "restore",
        "rebuild topics from the cluster's object storage after every node lost its disk: each "
        "partition's log starts where its uploaded data ends (older records are read from the "
        "bucket, new ones follow them)",
    )
    restore.add_argument(
        "--topic", action="append", help="restore this topic (repeatable; default: every topic)"
    )
    restore.set_defaults(handler=cmd_restore)

    produce = client_command("produce", "send lines (stdin or a file) as messages")
    produce.add_argument("topic")
    produce.add_argument("-f", "--file", help="read lines from this file (default stdin)")
    produce.add_argument("-k", "--key", help="key for every message (same key, same partition)")
    produce.add_argument("-p", "--partition", type=int, help="send every message here")
    produce.add_argument("--acks", choices=("all", "leader", "none"), default="all")
    produce.add_argument("--linger-ms", type=float, default=5.0, help="batching delay")
    produce.add_argument(
        "--transport",
        choices=("http", "stream"),
        default="http",
        help="a POST per batch, or frames on one produce stream per node (acks all or leader)",
    )
    produce.add_argument("--skip-empty", action="store_true", help="ignore empty lines")
    produce.add_argument("-v", "--verbose", action="store_true", help="print a summary")
    produce.set_defaults(handler=cmd_produce)

    consume = client_command("consume", "print messages of a topic")
    consume.add_argument("topic")
    consume.add_argument("-p", "--partition", type=int, help="only this partition (default all)")
    consume.add_argument(
        "-o", "--offset", default="earliest", help="earliest (default), latest or an offset"
    )
    consume.add_argument(
        "-F", "--follow", action="store_true", help="keep waiting for new messages (Ctrl-C stops)"
    )
    consume.add_argument("-n", "--max-messages", type=int, default=0, help="stop after N")
    consume.add_argument(
        "-g",
        "--group",
        help="read as a member of this consumer group: its share of the partitions, from the "
        "group's committed offsets (--offset: where partitions without one start); prints until "
        "Ctrl-C, committing what it printed, then leaves",
    )
    consume.add_argument("--member-id", help="with --group: a stable member id (default random)")
    add_filter_and_stream(consume, "implies --follow")
    consume.add_argument(
        "--session-timeout-ms",
        type=non_negative,
        default=10_000,
        help="with --group: the member is dropped after this long without contact",
    )
    consume.add_argument(
        "--format",
        choices=("value", "kv", "json"),
        default="value",
        help="value only, key<TAB>value, or JSON lines",
    )
    consume.set_defaults(handler=cmd_consume)
    from raftline.clients.cli_queues import add_queue_commands  # it builds on this module

    add_queue_commands(commands, client_command)
    from raftline.clients.cli_exchanges import add_exchange_commands

    add_exchange_commands(commands, client_command)

    group = commands.add_parser("group", help="list, describe or reset consumer groups")
    groups = group.add_subparsers(dest="group_command", metavar="ACTION", required=True)
    client_command("list", "list consumer groups", groups).set_defaults(handler=cmd_group_list)
    describe_group = client_command(
        "describe", "show a group's members, their partitions, committed offsets and lag", groups
    )
    describe_group.add_argument("group")
    describe_group.set_defaults(handler=cmd_group_describe)
    reset = client_command(
        "reset-offsets",
        "move a group's committed offsets of a topic (group without members)",
        groups,
    )
    reset.add_argument("group")
    reset.add_argument("--topic", "-t", required=True)
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the log start")
    target.add_argument("--to-latest", action="store_true", help="the high watermark")
    target.add_argument(
        "--to-timestamp", type=non_negative, metavar="MS",
        help="the first message at or after MS (ms since the epoch)",
    )  # fmt: skip
    target.add_argument("--to-offset", type=non_negative, metavar="N", help="offset N")
    reset.set_defaults(handler=cmd_group_reset_offsets)
    remove = client_command(
        "remove-members", "remove members as if they had left (all when none is named)", groups
    )
    remove.add_argument("group")
    remove.add_argument("member", nargs="*", help="member ids (default: every member)")
    remove.set_defaults(handler=cmd_group_remove_members)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "serve":
        return cmd_serve(args)
    if args.command == "consume" and not (
        args.offset in ("earliest", "latest") or args.offset.isdigit()
    ):
        parser.error("--offset must be earliest, latest or a non-negative integer")
    if args.command == "consume" and args.group is not None:
        if args.offset not in ("earliest", "latest"):
            parser.error("with --group, --offset must be earliest or latest")
        if args.partition is not None:
            parser.error("--partition and --group do not go together: the group assigns them")
    client = Client(args.url, retry=RetryPolicy(retries=5))
    try:
        return args.handler(args, client, sys.stdout)
    except RaftlineError as error:
        print(f"raftline {args.command}: {error.code}: {error.message}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as error:
        print(f"raftline {args.command}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        client.close()
