"""The `raftline exchange` commands (create, list, describe, delete, bind, unbind, publish)
and `raftline request`.

Owns their arguments and output; everything else comes from the client
(clients/exchanging.py) and the shared CLI helpers (clients/cli.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from raftline.clients.cli import table
from raftline.clients.client import Client, encode_message
from raftline.clients.exchanging import KINDS


def _headers(pairs: list[str]) -> dict[str, str | bytes]:
    headers: dict[str, str | bytes] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"a header is NAME=VALUE, got {pair!r}")
        headers[name] = value
    return headers


def _destination(args: argparse.Namespace) -> str:
    return f"queue {args.queue}" if args.queue else f"topic {args.topic}"


def cmd_exchange_create(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    created = client.create_exchange(
        args.name,
        args.kind,
        alternate_topic=args.alternate_topic,
        alternate_queue=args.alternate_queue,
    )
    out.write(f"created {created['kind']} exchange {created['name']}\n")
    return 0


def cmd_exchange_list(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    rows = [(x["name"], x["kind"], x["bindings"]) for x in client.list_exchanges()]
    table(rows, ("EXCHANGE", "KIND", "BINDINGS"), out)
    return 0


def cmd_exchange_describe(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    described = client.describe_exchange(args.name)
    alternate = described["alternate"]
    where = "-" if alternate is None else alternate.get("queue") or alternate["topic"]
    out.write(f"exchange: {described['name']}  kind: {described['kind']}  alternate: {where}\n")
    rows = [(b["key"] or '""', b.get("queue"), b["topic"]) for b in described["bindings"]]
    table(rows, ("KEY", "QUEUE", "TOPIC"), out)
    return 0


def cmd_exchange_delete(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    client.delete_exchange(args.name)
    out.write(f"deleted exchange {args.name}\n")
    return 0


def cmd_exchange_bind(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    client.bind(args.name, args.key, topic=args.topic, queue=args.queue)
    out.write(f"bound {_destination(args)} to {args.name} with key {args.key!r}\n")
    return 0


def cmd_exchange_unbind(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    client.unbind(args.name, args.key, topic=args.topic, queue=args.queue)
    out.write(f"unbound {_destination(args)} from {args.name} (key {args.key!r})\n")
    return 0


def _values(args: argparse.Namespace) -> Iterator[str]:
    if args.value != "-":
        yield args.value
        return
    for line in sys.stdin:
        yield line.rstrip("\n")


def cmd_exchange_publish(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    """Publish VALUE, or each line of stdin for "-", with the routing key; print where each
    message went."""
    headers = _headers(args.header)
    messages = [
        {"routing_key": args.routing_key, **encode_message(v, args.key, headers=headers)}
        for v in _values(args)
    ]
    if not messages:
        return 0
    answer = client.publish_many(args.name, messages)
    for result in answer["results"]:
        if result.get("dropped"):
            out.write("dropped (no binding matched)\n")
            continue
        places = ", ".join(f"{r['topic']}/{r['partition']}@{r['offset']}" for r in result["routed"])
        out.write(("alternate " if result.get("alternate") else "") + places + "\n")
    return 0


def cmd_request(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    reply = client.request(
        args.value,
        topic=args.topic,
        exchange=args.exchange,
        routing_key=args.routing_key,
        key=args.key,
        headers=_headers(args.header),
        timeout_ms=args.timeout_ms,
        keep_reply_topic=False,  # one request per process: its reply topic goes with it
    )
    if args.format == "json":
        message = reply.message
        out.write(
            json.dumps(
                {
                    "correlation_id": reply.correlation_id,
                    "value": reply.text,
                    "headers": {
                        k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v
                        for k, v in message.headers.items()
                    },
                }
            )
            + "\n"
        )
    else:
        out.write((reply.text or "") + "\n")
    return 0


def add_exchange_commands(
    commands: Any, client_command: Callable[..., argparse.ArgumentParser]
) -> None:
    exchange = commands.add_parser(
        "exchange", help="create, bind, publish through, inspect or delete exchanges"
    )
    actions = exchange.add_subparsers(dest="exchange_command", metavar="ACTION", required=True)
    create = client_command("create", "create an exchange", actions)
    create.add_argument("name")
    create.add_argument("--kind", choices=KINDS, required=True)
    alternate = create.add_mutually_exclusive_group()
    alternate.add_argument("--alternate-topic", help="where messages matching nothing go")
    alternate.add_argument("--alternate-queue", help="where messages matching nothing go")
    create.set_defaults(handler=cmd_exchange_create)
    client_command("list", "list exchanges", actions).set_defaults(handler=cmd_exchange_list)
    describe = client_command("describe", "an exchange's kind, alternate and bindings", actions)
    describe.add_argument("name")
    describe.set_defaults(handler=cmd_exchange_describe)
    delete = client_command("delete", "delete an exchange (its topics stay)", actions)
    delete.add_argument("name")
    delete.set_defaults(handler=cmd_exchange_delete)
    for verb, text, handler in (
        ("bind", "bind a topic or a queue to an exchange", cmd_exchange_bind),
        ("unbind", "remove a binding", cmd_exchange_unbind),
    ):
        sub = client_command(verb, text, actions)
        sub.add_argument("name")
        sub.add_argument(
            "-k", "--key", default="", help="routing key (direct) or pattern (topic: * and #)"
        )
        target = sub.add_mutually_exclusive_group(required=True)
        target.add_argument("-t", "--topic")
        target.add_argument("-q", "--queue")
        sub.set_defaults(handler=handler)
    publish = client_command("publish", "publish VALUE (-: each line of stdin)", actions)
    publish.add_argument("name")
    publish.add_argument("value", help='the message value; "-" publishes each line of stdin')
    publish.add_argument("-r", "--routing-key", default="", help="the message's routing key")
    publish.add_argument("-k", "--key", help="the message key (chooses the partition)")
    publish.add_argument(
        "-H", "--header", action="append", default=[], metavar="NAME=VALUE", help="repeatable"
    )
    publish.set_defaults(handler=cmd_exchange_publish)

    request = client_command("request", "send a request and print its reply")
    request.add_argument("value")
    target = request.add_mutually_exclusive_group(required=True)
    target.add_argument("-t", "--topic", help="publish the request to this topic")
    target.add_argument("-x", "--exchange", help="publish the request through this exchange")
    request.add_argument("-r", "--routing-key", default="", help="with --exchange")
    request.add_argument("-k", "--key", help="the message key")
    request.add_argument(
        "-H", "--header", action="append", default=[], metavar="NAME=VALUE", help="repeatable"
    )
    request.add_argument("--timeout-ms", type=int, default=5_000, help="wait this long (504)")
    request.add_argument("--format", choices=("value", "json"), default="value")
    request.set_defaults(handler=cmd_request)
