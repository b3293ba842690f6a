"""The plain fsync probe of bench.fsync_tail replays a node's write pattern."""

from __future__ import annotations

from pathlib import Path

from bench.fsync_tail import WritePattern, _probe_writer


def test_bytes_per_fsync_is_bytes_appended_over_fsyncs() -> None:
    assert WritePattern(fsyncs_per_s=100, bytes_per_s=50_000_000).bytes_per_fsync == 500_000


def test_probe_syncs_at_the_given_rate_and_leaves_no_files(tmp_path: Path) -> None:
    sync_us, late_us = _probe_writer(str(tmp_path), 4, 200.0, 4096, 0.5)
    assert 80 <= len(sync_us) <= 110  # 200 fsyncs/s for 0.5 s, spread over 4 threads
    assert len(late_us) == len(sync_us)
    # from the intended start is never shorter than the fdatasync alone
    assert sum(late_us) >= sum(sync_us)
    assert list(tmp_path.iterdir()) == []
