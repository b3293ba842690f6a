"""Specification of the JSON-lines history format, the recorder and invoke/complete pairing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raftline.chaos.history import HistoryError, Op, Recorder, pair, parse_lines, read_history


def test_recorder_writes_lines_that_read_back_as_the_same_ops(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path / "history.jsonl")
    invoke = recorder.invoke(3, "send", {"key": "t/0", "value": 7}, node="n1")
    recorder.complete(invoke, "ok", {"key": "t/0", "value": 7, "offset": 0})
    recorder.close()
    assert read_history(tmp_path / "history.jsonl") == recorder.ops
    assert [op.index for op in recorder.ops] == [0, 1]
    assert recorder.ops[0].time <= recorder.ops[1].time


def test_uses_jepsen_field_names() -> None:
    line = Op(1, "invoke", "poll", {"key": "t/0"}, time=5, index=0, node="n2").to_json()
    assert set(json.loads(line)) == {"process", "type", "f", "value", "time", "index", "node"}


def test_operation_that_never_returned_pairs_as_indeterminate() -> None:
    ops = parse_lines(['{"process": 1, "type": "invoke", "f": "send", "value": 1}'])
    (only,) = pair(ops)
    assert only.type == "info"
    assert only.end == float("inf")


def test_second_invocation_before_completion_is_rejected() -> None:
    invoke = '{"process": 1, "type": "invoke", "f": "send"}'
    with pytest.raises(HistoryError, match="invoked twice"):
        pair(parse_lines([invoke, invoke]))


def test_unknown_op_type_is_rejected() -> None:
    with pytest.raises(HistoryError, match="unknown op type"):
        parse_lines(['{"process": 1, "type": "maybe", "f": "send"}'])


def test_non_json_line_is_rejected_with_its_number() -> None:
    with pytest.raises(HistoryError, match="line 2"):
        parse_lines(['{"process": 1, "type": "invoke", "f": "x"}', "{oops"])
