"""`--switch-interval-us`: how long a node's threads may keep the interpreter lock while another
waits; a serving node sets it process-wide, and values outside 100-100000 us are refused."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftline.clients.cli import build_parser, node_config
from raftline.node.config import NodeConfig
from raftline.node.server import configure_process


def _config(argv: list[str], environ: dict[str, str] | None = None) -> NodeConfig:
    return node_config(build_parser().parse_args(["serve", *argv]), environ or {})


@pytest.fixture
def restored_switch_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_the_flag_and_its_variable_set_the_switch_interval() -> None:
    assert _config(["--switch-interval-us", "2000"]).switch_interval_us == 2000
    assert _config([], {"RAFTLINE_SWITCH_INTERVAL_US": "250"}).switch_interval_us == 250


def test_the_default_is_shorter_than_pythons() -> None:
    assert _config([]).switch_interval_us * 1e-6 < 0.005


@pytest.mark.parametrize("text", ["0", "99", "100001", "-5", "0.5", "fast"])
def test_a_switch_interval_out_of_range_or_not_a_number_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"switch.interval"):
        _config(["--switch-interval-us", text])


def test_a_serving_process_takes_the_configured_switch_interval(
    tmp_path: Path, restored_switch_interval: None
) -> None:
    configure_process(NodeConfig(data_dir=tmp_path, switch_interval_us=300))
    assert sys.getswitchinterval() == pytest.approx(300e-6)
