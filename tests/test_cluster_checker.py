"""The acknowledged-message checker of the cluster tests is not vacuous.

It tolerates unacknowledged writes in between and names the copy that lost, doubled or reordered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cluster_harness import Node, check_acked_once_in_order

ACKED = ["m-1", "m-2", "m-3"]


def test_unacknowledged_values_between_acknowledged_ones_are_allowed() -> None:
    check_acked_once_in_order(ACKED, ["m-0", "m-1", "x", "m-2", "m-3", "y"], "node 1")


def test_a_lost_acknowledged_value_fails_naming_the_copy() -> None:
    with pytest.raises(AssertionError, match=r"node 2: 1 of 3 acknowledged messages lost.*m-2"):
        check_acked_once_in_order(ACKED, ["m-1", "m-3"], "node 2")


def test_an_acknowledged_value_stored_twice_fails() -> None:
    with pytest.raises(AssertionError, match=r"m-2 stored twice, at positions 1 and 3"):
        check_acked_once_in_order(ACKED, ["m-1", "m-2", "m-3", "m-2"])


def test_acknowledged_values_out_of_order_fail() -> None:
    with pytest.raises(AssertionError, match=r"out of order.*\('m-1', 'm-2'\)"):
        check_acked_once_in_order(ACKED, ["m-2", "m-1", "m-3"])


def test_a_node_dying_at_import_is_blamed_on_a_tree_edited_mid_test(tmp_path: Path) -> None:
    node = Node(1, tmp_path, "1=127.0.0.1:1")
    node.log_path.write_text("ImportError: cannot import name 'LogConfig'\n")
    node.process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    node.process.wait(30)
    assert "exited (1) loading Raftline's code" in node.exit_cause()
    node.log_path.write_text("a clean log\n")
    assert node.exit_cause() == "exited (1)"
