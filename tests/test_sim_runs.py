"""Seeded simulator runs: a seed replays exactly, a sweep of seeds finds no violation, and the
command line summarises, exits non-zero on a violation and prints how to replay it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_planted_bugs import AcksBeforeSync

from raftline.raftlog import sim, simcluster
from raftline.raftlog.simchaos import make_plan, run_seed


def test_a_seed_replays_exactly() -> None:
    first, second = run_seed(7), run_seed(7)
    assert (first.steps, first.elections, first.commits) == (
        second.steps,
        second.elections,
        second.commits,
    )
    assert first.commits > 0


def test_different_seeds_draw_different_fault_plans() -> None:
    plans = {repr(make_plan(seed)) for seed in range(20)}
    assert len(plans) == 20


def test_a_fixed_cluster_size_is_honoured() -> None:
    assert {make_plan(seed, nodes=5).nodes for seed in range(10)} == {5}


@pytest.mark.parametrize("nodes", [None, 1, 3, 5, 7])
def test_a_sweep_of_seeds_finds_no_violation(nodes: int | None) -> None:
    seeds = 300 if nodes is None else 40
    results = [run_seed(seed, nodes) for seed in range(seeds)]
    assert [(r.seed, r.violation) for r in results if r.violation is not None] == []


@pytest.mark.slow
def test_many_seeds_find_no_violation() -> None:
    assert sim.main(["--seeds", "5000", "--start", "100000", "--jobs", "2", "--quiet"]) == 0


def test_cli_prints_a_summary_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["--seeds", "5", "--nodes", "3"]) == 0
    out = capsys.readouterr()
    assert "seeds 5" in out.out and "violations 0" in out.out
    assert "5/5 seeds" in out.err  # the progress bar


def test_cli_exits_non_zero_with_the_seed_and_a_trace_on_a_violation(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(simcluster, "RaftNode", AcksBeforeSync)
    assert sim.main(["--seeds", "3", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "append acknowledged before it was durable" in out
    assert "replay: python -m raftline.raftlog.sim --seeds 1 --start" in out
    assert "deliver APPEND" in out  # the trace of the last steps


def test_cli_refuses_nonsense_arguments() -> None:
    with pytest.raises(SystemExit):
        sim.main(["--seeds", "0"])


def test_cli_spreads_seeds_over_worker_processes(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["--seeds", "8", "--start", "40", "--jobs", "2", "--quiet"]) == 0
    assert "seeds 8 (from 40)" in capsys.readouterr().out


def test_a_seed_replays_exactly_in_another_process_with_another_hash_seed() -> None:
    def summary(hash_seed: str) -> str:
        command = [sys.executable, "-m", "raftline.raftlog.sim", "--seeds", "5", "--quiet"]
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
        return out.split(" in ")[0]  # everything before the wall-clock time

    assert summary("1") == summary("2")
