"""The node's policy for Python's cyclic garbage collector, and what the collector costs it.

Owns freezing long-lived objects out of the collector's scans and the pause figures on /metrics.

A full collection scans every tracked object not frozen. A node with tens of thousands of Raft
groups keeps allocating objects that live as long as their group (a new leader's progress
trackers, its replicas' state after an election): between two freezes they pile up in the
oldest generation, and every full collection, due each time that generation has grown by a
quarter, scanned them all again: ~48% of the loop's samples at 12-14 k replicas per node
(`py-spy record --native`), loop stalls past the peers' dead-after window. A full collection
that took long is therefore followed by a freeze of its survivors, so the next one scans only
what survived since. A short one is not: a freeze keeps whatever cyclic garbage its frozen
objects become later (until the next reclaim), so a node that is not piling up objects does
not freeze.
"""

from __future__ import annotations

import gc
import time
from typing import Any

OLDEST = 2  # gc.get_threshold() has three generations
# CPU time (this thread's, so that a starved node does not count its waits) of a full
# collection past which its survivors are frozen: ~100 k scanned objects on this VM.
FREEZE_AFTER_S = 0.005


class Collector:
    """Installed once per process (gc.callbacks); counts collections and their pauses."""

    def __init__(self, freeze_after_s: float = FREEZE_AFTER_S) -> None:
        self.freeze_after_s = freeze_after_s
        self.collections = [0, 0, 0]  # per generation
        self.cpu_seconds = [0.0, 0.0, 0.0]  # per generation, of the collecting thread
        self.longest_s = 0.0  # wall time: what a peer waiting for this node's frames sees
        self.freezes = 0
        self._started = 0.0
        self._started_cpu = 0.0

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        generation = info["generation"]
        if phase == "start":
            self._started = time.perf_counter()
            self._started_cpu = time.thread_time()
            return
        cpu = time.thread_time() - self._started_cpu
        self.collections[generation] += 1
        self.cpu_seconds[generation] += cpu
        self.longest_s = max(self.longest_s, time.perf_counter() - self._started)
        if generation == OLDEST and cpu > self.freeze_after_s:
            # The collection is over (phase "stop"): moving its survivors out of the generations
            # touches no list it still walks.
            gc.freeze()
            self.freezes += 1

    def metrics(self) -> dict[str, float]:
        return {
            "raftline_gc_young_collections_total": self.collections[0] + self.collections[1],
            "raftline_gc_full_collections_total": self.collections[OLDEST],
            "raftline_gc_young_cpu_seconds_total": round(sum(self.cpu_seconds[:OLDEST]), 6),
            "raftline_gc_full_cpu_seconds_total": round(self.cpu_seconds[OLDEST], 6),
            "raftline_gc_longest_pause_seconds": round(self.longest_s, 6),
            # (not gc.get_freeze_count(): it walks the frozen objects, 8% of a node's loop
            # when /metrics was read every second at 14 k replicas)
            "raftline_gc_freezes_total": self.freezes,
        }


COLLECTOR = Collector()
