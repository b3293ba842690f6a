"""The C twins of the segment log's per-batch append steps (raftline.raftlog._speedups) behave
exactly as the pure-Python ones: the same header fields or refusal, the same buffered bytes.
"""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftline.raftlog import log, segment
from raftline.raftlog.batch import CorruptBatchError
from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Record, build_batch

if os.environ.get("RAFTLINE_PURE_PYTHON") == "1":
    pytest.skip("RAFTLINE_PURE_PYTHON=1: only the Python append steps run", allow_module_level=True)
# CI must not quietly lose the fast path: an unbuilt extension fails this module (make install).
from raftline.raftlog import _speedups

BATCH = build_batch([Record(b"v" * 100, key=b"k")], timestamp=1_700_000_000_000)


def mutations() -> st.SearchStrategy[bytes]:
    """A real batch with a few bytes of its header overwritten and maybe cut or extended."""
    return st.tuples(
        st.lists(st.tuples(st.integers(0, 60), st.integers(0, 255)), max_size=4),
        st.integers(-len(BATCH), 8),
    ).map(_mutate)


def _mutate(spec: tuple[list[tuple[int, int]], int]) -> bytes:
    edits, resize = spec
    data = bytearray(BATCH)
    for at, value in edits:
        data[at] = value
    return bytes(data[: len(data) + resize] if resize < 0 else data + b"\0" * resize)


@settings(max_examples=300, deadline=None)
@given(mutations() | st.binary(max_size=80))
def test_append_fields_match_the_python_check(data: bytes) -> None:
    assert _speedups.append_fields(data) == log._py_append_fields(data)


def test_append_fields_of_a_real_batch_are_its_length_last_delta_and_max_timestamp() -> None:
    length, last_delta, max_timestamp = _speedups.append_fields(bytearray(BATCH))
    assert (length, last_delta, max_timestamp) == (len(BATCH) - 12, 0, 1_700_000_000_000)


@settings(max_examples=100, deadline=None)
@given(
    st.binary(max_size=40),
    st.integers(0, 2**63 - 1),
    st.integers(-(2**31), 2**31 - 1),
)
def test_buffer_batch_matches_the_python_copy_and_stamp(
    before: bytes, offset: int, term: int
) -> None:
    by_c, by_python = bytearray(before), bytearray(before)
    _speedups.buffer_batch(by_c, BATCH, offset, len(BATCH) - 12, term)
    segment._py_buffer_batch(by_python, BATCH, offset, len(BATCH) - 12, term)
    assert by_c == by_python
    assert struct.unpack_from(">qii", by_c, len(before)) == (offset, len(BATCH) - 12, term)


def test_buffer_batch_refuses_a_term_beyond_int32_and_leaves_the_buffer_alone() -> None:
    pending = bytearray(b"abc")
    with pytest.raises(OverflowError):
        _speedups.buffer_batch(pending, BATCH, 0, len(BATCH) - 12, 2**31)
    assert pending == b"abc"


def test_a_log_refuses_a_bad_batch_naming_the_problem(tmp_path: os.PathLike[str]) -> None:
    partition = PartitionLog(tmp_path, LogConfig())
    with pytest.raises(CorruptBatchError, match="declares"):
        partition.append(BATCH + b"\0", term=1)
    with pytest.raises(CorruptBatchError):
        partition.append_many([(BATCH, 1), (BATCH[:30], 1)])
    assert partition.next_offset == 0  # nothing of a refused call was written
    partition.close()
