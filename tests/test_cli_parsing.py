"""`raftline serve` flags and RAFTLINE_* variables, and the CLI's table output."""

import io
from pathlib import Path

import pytest

from raftline.clients.cli import Progress, build_parser, node_config, table


def _config(argv: list[str], environ: dict[str, str]) -> object:
    return node_config(build_parser().parse_args(["serve", *argv]), environ)


def test_no_flags_gives_the_single_node_defaults() -> None:
    config = _config([], {})
    assert config.node_id == 1
    assert config.data_dir == Path("./raftline-data")
    assert config.peers == {}


def test_flags_fill_the_node_config() -> None:
    config = _config(
        [
            "--node-id",
            "2",
            "--data-dir",
            "/tmp/d2",
            "--http",
            "127.0.0.1:8082",
            "--raft",
            "127.0.0.1:9092",
            "--peers",
            "1=127.0.0.1:9091,2=127.0.0.1:9092",
        ],
        {},
    )
    assert config.node_id == 2
    assert config.data_dir == Path("/tmp/d2")
    assert (config.http, config.raft) == ("127.0.0.1:8082", "127.0.0.1:9092")
    assert config.peers == {1: "127.0.0.1:9091", 2: "127.0.0.1:9092"}


def test_environment_variables_fill_missing_flags() -> None:
    config = _config([], {"RAFTLINE_NODE_ID": "3", "RAFTLINE_HTTP": "0.0.0.0:8083"})
    assert (config.node_id, config.http) == (3, "0.0.0.0:8083")


def test_a_flag_wins_over_its_environment_variable() -> None:
    config = _config(["--node-id", "5"], {"RAFTLINE_NODE_ID": "3"})
    assert config.node_id == 5


@pytest.mark.parametrize(
    "argv", [["--node-id", "x"], ["--http", "nohost"], ["--peers", "1=a"], ["--peers", "x=1:2"]]
)
def test_bad_serve_values_are_rejected(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        _config(argv, {})


def test_serve_exits_with_a_usage_error_on_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    from raftline.clients.cli import main

    assert main(["serve", "--node-id", "nope"]) == 2
    assert "node id" in capsys.readouterr().err


def test_tables_align_columns_and_show_missing_cells_as_dashes() -> None:
    out = io.StringIO()
    table([("orders", 3, None), ("a", 12, 1)], ("TOPIC", "PARTITIONS", "LEADER"), out)
    assert out.getvalue().splitlines() == [
        "TOPIC   PARTITIONS  LEADER",
        "orders  3           -",
        "a       12          1",
    ]


def test_progress_bar_stays_silent_when_stderr_is_not_a_terminal() -> None:
    stream = io.StringIO()
    progress = Progress("produced", 10, stream)
    progress.advance(10)
    progress.finish()
    assert stream.getvalue() == ""
