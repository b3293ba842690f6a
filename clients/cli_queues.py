"""The `raftline queue` commands: create, receive, stats, list and delete.

Owns their arguments and output; everything else comes from the queue client
(clients/queueing.py) and the shared CLI helpers (clients/cli.py).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, TextIO

from raftline.clients.cli import add_filter_and_stream, table
from raftline.clients.client import Client, QueueMessage

SETTLE = ("ack", "release", "reject", "none")


def cmd_queue_create(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    created = client.queue(args.name).create(
        args.topic,
        lock_ms=args.lock_ms,
        max_deliveries=args.max_deliveries,
        dead_letter_topic=args.dead_letter_topic,
    )
    out.write(f"created queue {created['name']} over {created['topic']}\n")
    return 0


def _format(message: QueueMessage, style: str) -> str:
    if style == "json":
        return json.dumps(
            {
                "topic": message.topic,
                "partition": message.partition,
                "offset": message.offset,
                "delivery_count": message.delivery_count,
                "key": None if message.key is None else message.key.decode("utf-8", "replace"),
                "value": message.text,
                "headers": {
                    k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v
                    for k, v in message.headers.items()
                },
                "receipt": message.receipt,
            }
        )
    return message.text or ""


def cmd_queue_receive(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    """Print received messages, then settle each as --settle says (default: ack)."""
    queue = client.queue(
        args.name,
        max_messages=min(args.max_messages or 100, 1000),
        filter=args.filter,
        stream=args.stream,
    )
    printed = 0
    while True:
        wait_ms = args.wait_ms if not args.follow else max(args.wait_ms, 1000)
        messages = queue.receive(wait_ms=wait_ms)
        if args.max_messages:
            messages = messages[: args.max_messages - printed]  # the rest: released below
        for message in messages:
            out.write(_format(message, args.format) + "\n")
        out.flush()
        settle: dict[str, Callable[[list[QueueMessage]], Any]] = {
            "ack": queue.ack,
            "release": queue.release,
            "reject": queue.reject,
        }
        if args.settle in settle and messages:
            settle[args.settle](messages)
        printed += len(messages)
        done = args.max_messages and printed >= args.max_messages
        if done or (not messages and not args.follow):
            queue.close()
            return 0


def cmd_queue_stats(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    d = client.queue(args.name).describe()
    out.write(
        f"queue: {d['name']}  topic: {d['topic']}  lock_ms: {d['lock_ms']}  "
        f"max_deliveries: {d['max_deliveries']}  dead_letter_topic: {d['dead_letter_topic']}\n"
    )
    rows = [(d["available"], d["locked"], d["acknowledged"], d["dead_lettered"], d["dropped"])]
    table(rows, ("AVAILABLE", "LOCKED", "ACKNOWLEDGED", "DEAD_LETTERED", "DROPPED"), out)
    return 0


def cmd_queue_list(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    queues = client.call("GET", "/v1/queues")["queues"]
    rows = [(q["name"], q["topic"], q["lock_ms"], q["max_deliveries"]) for q in queues]
    table(rows, ("QUEUE", "TOPIC", "LOCK_MS", "MAX_DELIVERIES"), out)
    return 0


def cmd_queue_delete(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    client.queue(args.name).delete()
    out.write(f"deleted queue {args.name}\n")
    return 0


def add_queue_commands(
    commands: Any, client_command: Callable[..., argparse.ArgumentParser]
) -> None:
    queue = commands.add_parser("queue", help="create, receive from, inspect or delete queues")
    actions = queue.add_subparsers(dest="queue_command", metavar="ACTION", required=True)
    create = client_command("create", "create a queue over a topic", actions)
    create.add_argument("name")
    create.add_argument("-t", "--topic", required=True, help="the topic the queue shares")
    create.add_argument("--lock-ms", type=int, default=30_000)
    create.add_argument("--max-deliveries", type=int, default=5)
    create.add_argument("--dead-letter-topic", default=None)
    create.set_defaults(handler=cmd_queue_create)

    receive = client_command("receive", "print messages of a queue and settle them", actions)
    receive.add_argument("name")
    receive.add_argument("-n", "--max-messages", type=int, default=0, help="stop after N")
    receive.add_argument("--wait-ms", type=int, default=0, help="long-poll this long")
    receive.add_argument(
        "-F", "--follow", action="store_true", help="keep waiting for messages (Ctrl-C stops)"
    )
    receive.add_argument(
        "--settle",
        choices=SETTLE,
        default="ack",
        help="after printing: ack (default), release, reject, or none (locks expire)",
    )
    receive.add_argument("--format", choices=("value", "json"), default="value")
    add_filter_and_stream(receive, "with --follow")
    receive.set_defaults(handler=cmd_queue_receive)

    stats = client_command("stats", "a queue's config and counts", actions)
    stats.add_argument("name")
    stats.set_defaults(handler=cmd_queue_stats)
    client_command("list", "list queues", actions).set_defaults(handler=cmd_queue_list)
    delete = client_command("delete", "delete a queue (the topic stays)", actions)
    delete.add_argument("name")
    delete.set_defaults(handler=cmd_queue_delete)
