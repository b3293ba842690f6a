"""How long each stage of the replicated write path takes on this node, as Prometheus histograms.

Owns the stage names, their buckets and the /metrics text; the runtime records into one
StageTimes per node (`Runtime.stage_times`), the partitions and the tick timer add theirs.

Stages (seconds):
- `produce`: leader, an acks=all produce of a checked batch -> acknowledged (about
  propose_wait + commit + ack_wait);
- `propose_wait`: leader, a proposal queued -> fed to its Raft group (waits for the group's
  write in flight to have written its entries, and for the driver's next round);
- `disk_queue`: a disk write (of one or more groups' rounds) submitted -> a disk thread
  took it;
- `fsync_call`: one log's fsync, on the thread that ran it: the fdatasync, then taking the
  interpreter lock back;
- `fsync_start`: a log's fsync handed to the fsync pool -> a pool thread started it (thread
  wake-up and the interpreter lock);
- `fsync_join`: a write's last fsync returned -> its disk thread had every result (a write of
  several logs: the disk thread's wake-up and the interpreter lock);
- `disk_return`: a disk thread done with a write -> the loop took it up (the hand-off to the
  loop, its wake-up, and whatever the loop was doing);
- `leader_write` / `leader_fsync`: leader, a round fed -> its entries written to the log file
  / its fsync returned (disk pool queueing included);
- `commit`: leader, a round fed -> its last entry committed and applied (a quorum's copies
  durable: the followers' round trip when they are slower than the leader's own fsync);
- `ack_wait`: leader, an acks=all produce's entry applied -> its request resumed;
- `follower_wait`: follower, an APPEND received -> fed to its group (waits for the group's
  write in flight: group commit);
- `follower_persist`: follower, a round with entries fed -> written, fsynced and acknowledged;
- `fetch_wait`: a long-polling fetch, the high watermark moved past its offset -> it resumed;
- `loop_lag`: how late the node's tick timer fired (event loop stalls: garbage collection,
  long synchronous steps, or no CPU for the process).
"""

from __future__ import annotations

import bisect

STAGES = (
    "produce",
    "propose_wait",
    "disk_queue",
    "fsync_call",
    "fsync_start",
    "fsync_join",
    "disk_return",
    "leader_write",
    "leader_fsync",
    "commit",
    "ack_wait",
    "follower_wait",
    "follower_persist",
    "fetch_wait",
    "loop_lag",
)
# Upper bounds in seconds: sub-millisecond for one commit at a low rate (a hand-off, a page-cache
# write, an idle disk's fdatasync), fine around the 20 ms target, coarse in the tail.
BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.0,
    5.0,
)
METRIC = "raftline_write_stage_seconds"


class LatencyHistogram:
    """Counts per bucket (not cumulative until rendered), their sum and count."""

    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS_S, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def cumulative(self) -> list[int]:
        running, out = 0, []
        for count in self.counts:
            running += count
            out.append(running)
        return out


class StageTimes:
    """One histogram per stage of STAGES. The write path observes `histograms[stage]` itself:
    a dozen observations per message, each one call fewer than through `observe`."""

    def __init__(self) -> None:
        self.histograms = {stage: LatencyHistogram() for stage in STAGES}

    def observe(self, stage: str, seconds: float) -> None:
        self.histograms[stage].observe(seconds)

    def metrics_lines(self, node_id: int) -> list[str]:
        lines = [
            f"# HELP {METRIC} Time spent in each stage of the replicated write path.",
            f"# TYPE {METRIC} histogram",
        ]
        bounds = [*(repr(b) for b in BUCKETS_S), "+Inf"]
        for stage, histogram in self.histograms.items():
            labels = f'node="{node_id}",stage="{stage}"'
            for bound, count in zip(bounds, histogram.cumulative(), strict=True):
                lines.append(f'{METRIC}_bucket{{{labels},le="{bound}"}} {count}')
            lines.append(f"{METRIC}_sum{{{labels}}} {histogram.sum:.6f}")
            lines.append(f"{METRIC}_count{{{labels}}} {histogram.count}")
        return lines
