"""A short chaos run against the real five-node compose cluster (needs Docker and raftline:local).

This is the run CI should make after scripts/build-image.sh; a longer one is the same command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parent.parent


def test_mixed_faults_leave_no_anomaly(tmp_path: Path, raftline_image: None) -> None:
    argv = [
        sys.executable,
        "-m",
        "raftline.chaos",
        "run",
        "--nodes",
        "5",
        "--time-limit",
        "60",
        "--nemesis",
        "partition,kill,pause",
        "--project",
        "raftline-chaos-ci",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=840, check=False)
    result = json.loads((tmp_path / "result.json").read_text())
    assert done.returncode == 0, done.stdout + done.stderr
    assert result["queue"]["anomaly_types"] == []
    assert result["queue"]["stats"]["acknowledged"] > 0
    assert result["availability"]["faults"], "the run injected no fault"
    logs = sorted(p.name for p in (tmp_path / "node-logs").glob("*.log"))
    assert logs == [f"raftline{i}.log" for i in range(1, 6)]
