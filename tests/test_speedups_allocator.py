"""keep_large_buffers: nodes and clients set glibc's malloc to keep freed large buffers, once per
process, unless the user opted out or configured malloc through its own environment variables.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from raftline.raftlog import speedups

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc mallopt only")


def _kept_in_fresh_process(**environment: str) -> bool:
    code = "from raftline.raftlog.speedups import keep_large_buffers; print(keep_large_buffers())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop(speedups.OPT_OUT_VARIABLE, None)
    out = subprocess.run(
        [sys.executable, "-c", code], env={**env, **environment}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "True"


def test_a_fresh_process_keeps_large_buffers() -> None:
    assert _kept_in_fresh_process()


def test_the_first_outcome_holds_for_later_calls() -> None:
    assert speedups.keep_large_buffers() == speedups.keep_large_buffers()


def test_the_opt_out_variable_leaves_malloc_alone() -> None:
    assert not _kept_in_fresh_process(RAFTLINE_MALLOC_DEFAULTS="1")


def test_glibc_environment_variables_take_precedence() -> None:
    assert not _kept_in_fresh_process(
        MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072"
    )
