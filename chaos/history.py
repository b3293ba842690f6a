"""Operation histories in Jepsen's JSON-lines shape, and the recorder that writes them.

Owns the `Op` record, reading and writing history files, and pairing invocations with completions.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Literal

OpType = Literal["invoke", "ok", "fail", "info"]
OP_TYPES: frozenset[str] = frozenset({"invoke", "ok", "fail", "info"})
# The fault injector records its own operations under this process name, as Jepsen does.
NEMESIS = "nemesis"


class HistoryError(ValueError):
    """A history line or sequence that does not follow the format."""


@dataclass(frozen=True)
class Op:
    """One history event: the invocation or completion of an operation by one process.

    `time` is nanoseconds since the start of the test (monotonic), `index` the position in the
    history. `value` for a completion carries the result; `error` the error code when it failed.
    """

    process: int | str
    type: OpType
    f: str
    value: Any = None
    time: int = 0
    index: int = -1
    node: str | None = None
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, sort_keys=True)

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> Op:
        try:
            op_type = raw["type"]
            if op_type not in OP_TYPES:
                raise HistoryError(f"unknown op type {op_type!r}")
            return Op(
                process=raw["process"],
                type=op_type,
                f=str(raw["f"]),
                value=raw.get("value"),
                time=int(raw.get("time", 0)),
                index=int(raw.get("index", -1)),
                node=raw.get("node"),
                error=raw.get("error"),
            )
        except KeyError as missing:
            raise HistoryError(f"history op lacks field {missing}") from None
        except (TypeError, ValueError) as bad:
            raise HistoryError(f"malformed history op {raw!r}: {bad}") from None


@dataclass(frozen=True)
class Completed:
    """An invocation paired with its completion; `complete` is None when it never returned."""

    invoke: Op
    complete: Op | None

    @property
    def type(self) -> OpType:
        # An operation that never returned is indeterminate, exactly like an `info` completion.
        return "info" if self.complete is None else self.complete.type

    @property
    def value(self) -> Any:
        return self.invoke.value if self.complete is None else self.complete.value

    @property
    def start(self) -> int:
        return self.invoke.time

    @property
    def end(self) -> float:
        return math.inf if self.complete is None else self.complete.time


def parse_lines(lines: Iterable[str]) -> list[Op]:
    ops = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as bad:
            raise HistoryError(f"line {number}: not JSON: {bad}") from None
        if not isinstance(raw, dict):
            raise HistoryError(f"line {number}: expected an object")
        ops.append(Op.from_dict(raw))
    return index_ops(ops)


def read_history(path: str | Path) -> list[Op]:
    with open(path, encoding="utf-8") as lines:
        return parse_lines(lines)


def write_history(path: str | Path, ops: Iterable[Op]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for op in ops:
            out.write(op.to_json() + "\n")


def index_ops(ops: Iterable[Op]) -> list[Op]:
    """Give every op its position as `index` (hand-made histories need not number themselves)."""
    return [op if op.index == i else replace(op, index=i) for i, op in enumerate(ops)]


def pair(ops: Iterable[Op]) -> list[Completed]:
    """Pair each invocation with its process's next completion, in invocation order.

    A process runs one operation at a time (Jepsen's rule); a completion without an open
    invocation, or a second invocation while one is open, is a malformed history.
    """
    open_ops: dict[int | str, Op] = {}
    pairs: dict[int, Completed] = {}
    for op in ops:
        if op.type == "invoke":
            if op.process in open_ops:
                raise HistoryError(f"process {op.process} invoked twice without completing")
            open_ops[op.process] = op
            continue
        invoke = open_ops.pop(op.process, None)
        if invoke is None:
            raise HistoryError(f"completion without invocation: {op}")
        if invoke.f != op.f:
            raise HistoryError(f"process {op.process} completed {op.f} but invoked {invoke.f}")
        pairs[invoke.index] = Completed(invoke, op)
    for invoke in open_ops.values():
        pairs[invoke.index] = Completed(invoke, None)
    return [pairs[i] for i in sorted(pairs)]


def client_ops(ops: Iterable[Op]) -> Iterator[Op]:
    return (op for op in ops if op.process != NEMESIS)


@dataclass
class Recorder:
    """Appends ops to a JSON-lines file as they happen; safe to share between threads.

    Times are monotonic nanoseconds since the recorder was made, so they survive wall-clock skew
    injected by the nemesis.
    """

    path: Path
    _out: IO[str] = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _ops: list[Op] = field(default_factory=list, init=False)
    _origin: int = field(default_factory=time.monotonic_ns, init=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self._out = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def now(self) -> int:
        return time.monotonic_ns() - self._origin

    def _append(self, op: Op) -> Op:
        with self._lock:
            op = replace(op, index=len(self._ops), time=self.now())
            self._ops.append(op)
            self._out.write(op.to_json() + "\n")
            self._out.flush()
        return op

    def invoke(self, process: int | str, f: str, value: Any = None, node: str | None = None) -> Op:
        return self._append(Op(process=process, type="invoke", f=f, value=value, node=node))

    def complete(
        self, invoke: Op, op_type: OpType, value: Any = None, error: str | None = None
    ) -> Op:
        if op_type == "invoke":
            raise HistoryError("a completion cannot have type invoke")
        done = Op(invoke.process, op_type, invoke.f, value, node=invoke.node, error=error)
        return self._append(done)

    @property
    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def close(self) -> None:
        with self._lock:
            self._out.close()
