"""The outcome of a chaos run: every checker over one history, and the files a person reads.

Owns result.json, summary.txt and timeline.png (throughput and latency, fault windows shaded).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raftline.chaos import (
    availability,
    eos_checker,
    group_checker,
    linearizability,
    queue_checker,
    route_checker,
    share_checker,
)
from raftline.chaos.history import Op


def analyse(ops: list[Op], allowed: tuple[str, ...] = ()) -> dict[str, Any]:
    """Runs the queue, linearizability and availability checks; `valid` only if both safety
    checks pass (an "unknown" linearizability verdict, a search timeout, is not a pass).

    A history with consumer-group ops is also checked by the group checker (which must pass
    too), and the queue checker then reads the group fetches as its polls. A history with
    queue (share group) receives and settles is judged by the share checker instead of the
    log checker: any share anomaly fails the verdict."""
    if eos_checker.has_idempotent_ops(ops) or eos_checker.has_txn_ops(ops):
        idempotent = eos_checker.has_idempotent_ops(ops)
        key = "idempotent" if idempotent else "transactions"
        checked = (
            eos_checker.check_idempotent(ops) if idempotent else eos_checker.check_transactions(ops)
        )
        metadata = linearizability.check_topics(ops)
        fs = ("send", "poll") if idempotent else ("txn-send", "txn-end", "txn-poll")
        return {
            "valid": checked["valid"] and metadata["valid"],
            key: checked,
            "metadata_linearizability": metadata,
            "availability": availability.availability(ops, fs=fs, recovery_fs=fs[:1]),
        }
    if route_checker.has_route_ops(ops):
        route = route_checker.verdict(ops)
        metadata = linearizability.check_topics(ops)
        return {
            "valid": route["valid"] and metadata["valid"],
            "route": route,
            "metadata_linearizability": metadata,
            "availability": availability.availability(
                ops, fs=("publish",), recovery_fs=("publish",)
            ),
        }
    if share_checker.has_share_ops(ops):
        share = share_checker.verdict(ops)
        metadata = linearizability.check_topics(ops)
        return {
            "valid": share["valid"] and metadata["valid"],
            "share": share,
            "metadata_linearizability": metadata,
            "availability": availability.availability(ops, fs=("send", "receive", "settle")),
        }
    if group_checker.has_group_ops(ops):
        group = group_checker.check(ops, [a for a in allowed if a in group_checker.ANOMALY_TYPES])
        queue_allowed = tuple(a for a in allowed if a in queue_checker.ANOMALY_TYPES)
        queue = queue_checker.check(group_checker.queue_view(ops), queue_allowed)
        metadata = linearizability.check_topics(ops)
        return {
            "valid": queue["valid"] and metadata["valid"] and group["valid"],
            "queue": queue,
            "group": group,
            "metadata_linearizability": metadata,
            "availability": availability.availability(
                ops, fs=("send", "group-fetch", "group-commit", "group-heartbeat", "group-join")
            ),
        }
    queue = queue_checker.check(ops, allowed)
    metadata = linearizability.check_topics(ops)
    return {
        "valid": queue["valid"] and metadata["valid"],
        "queue": queue,
        "metadata_linearizability": metadata,
        "availability": availability.availability(ops),
    }


def _anomaly_lines(title: str, checked: dict[str, Any]) -> list[str]:
    if not checked["anomaly_types"]:
        return [f"{title}: none"]
    return [f"{title}:"] + [f"  {kind}: {n}" for kind, n in checked["anomaly_counts"].items()]


def _queue_headline(checked: dict[str, Any]) -> str:
    stats = checked["stats"]
    return (
        f"queue: {stats['acknowledged']} acknowledged of {stats['sends']} sends,"
        f" {stats['values_read']} values read in {stats['polls']} polls"
    )


def _share_headline(checked: dict[str, Any]) -> str:
    stats = checked["stats"]
    return (
        f"share queue: {stats['sent']} acknowledged sends; {stats['acknowledged']} accepted,"
        f" {stats['dead_lettered']} dead-lettered, {stats['deliveries']} deliveries"
        f" (max_deliveries {checked['max_deliveries']})"
    )


def _stats_headline(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda checked: f"{key}: " + ", ".join(f"{k} {v}" for k, v in checked["stats"].items())


def _route_headline(checked: dict[str, Any]) -> str:
    stats = checked["stats"]
    return (
        f"routing: {stats['acknowledged']} acknowledged of {stats['published']} publishes"
        f" ({stats.get('failed', 0)} refused) to {stats.get('destinations', 0)} topics,"
        f" {stats.get('values_read', 0)} values read"
    )


def _group_headline(checked: dict[str, Any]) -> str:
    stats = checked["stats"]
    return (
        f"groups: {stats['acknowledged']} acknowledged, {stats['consumed']} values fetched by"
        f" {stats['members']} members over {stats['generations']} generations;"
        f" {stats['commits_ok']} commits ok, {stats['commits_refused']} refused"
    )


# Each workload checker's result key, the title of its anomaly lines and its headline.
_CHECKED_SECTIONS: tuple[tuple[str, str, Callable[[dict[str, Any]], str]], ...] = (
    ("queue", "anomalies", _queue_headline),
    ("share", "share anomalies", _share_headline),
    ("idempotent", "idempotent anomalies", _stats_headline("idempotent")),
    ("transactions", "transactions anomalies", _stats_headline("transactions")),
    ("route", "routing anomalies", _route_headline),
    ("group", "group anomalies", _group_headline),
)


def summary_text(result: dict[str, Any]) -> str:
    meta, avail = result["metadata_linearizability"], result["availability"]
    lines = [f"verdict: {'VALID' if result['valid'] else 'INVALID'}"]
    for key, title, headline in _CHECKED_SECTIONS:
        checked = result.get(key)
        if checked is not None:
            lines.append(headline(checked))
            lines += _anomaly_lines(title, checked)
    lines.append(f"metadata linearizability: {meta['verdict']} over {meta['keys']} topics")
    for failure in meta["failures"]:
        lines.append(
            f"  topic {failure['key']}: {failure['verdict']}, stuck on ops {failure['stuck_on']}"
        )
    for part in ("overall", "during_faults", "after_faults"):
        share = avail[part]
        lines.append(f"availability {part}: {share['ok']}/{share['ops']} ok ({share['ok_share']})")
    for fault, count in avail["not_injected"].items():
        lines.append(f"  {fault}: {count} injections failed (see nemesis ops in the history)")
    lines.append(
        "acknowledged writes/s from 2 s after each fault to its heal, against before it (the"
        f" quiet time of the {availability.BASELINE_S:.0f} s before it)"
        f" (target >= 0.7 where a majority stayed connected): "
        f"{'met' if avail['throughput_target_met'] else 'MISSED'}, "
        f"lowest {avail['throughput_ratio_min']}"
    )
    if avail["control_ratio_min"] is not None:
        lines.append(
            "  the same ratio over placebo windows (nemesis none: no fault; the machine's noise):"
            f" lowest {avail['control_ratio_min']}, median {avail['control_ratio_median']}"
        )
    for row in avail["throughput_ratios"]:
        judged = "" if row["majority_connected"] else " (no connected majority: not judged)"
        if row["control"]:
            judged = " (placebo: not judged)"
        lines.append(
            f"  {row['fault']} at {row['start_s']}s: {row['during_per_s']}/s over"
            f" {row['judged_s']} s against {row['before_per_s']}/s over {row['baseline_s']} s,"
            f" ratio {row['ratio']}{judged}"
        )
        if row["meets_target"] is False:
            lines.append(
                "    per partition, before -> during (/s): "
                + ", ".join(f"{k} {b} -> {d}" for k, (b, d) in row["by_partition_per_s"].items())
            )
    for fault in avail["faults"]:
        lines.append(
            f"  {fault['fault']}: {fault['start_s']}s..{fault['end_s'] or 'end'}s, "
            + (
                "not every partition recovered"
                if fault["recovery_s"] is None
                else f"every partition writable {fault['recovery_s']}s after heal"
            )
        )
    return "\n".join(lines) + "\n"


def plot(ops: list[Op], path: Path) -> bool:
    """Plots throughput and latency per second, faults shaded; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return False
    rows = availability.timeline(ops)
    windows = availability.fault_windows(ops)
    end_s = max((r["t"] + 1 for r in rows), default=1.0)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(11, 6))
    t = [r["t"] for r in rows]
    for outcome, colour in (("ok", "tab:green"), ("info", "tab:orange"), ("fail", "tab:red")):
        top.plot(t, [r[outcome] for r in rows], label=outcome, color=colour, linewidth=1)
    top.plot(t, [r["writes_ok"] for r in rows], label="writes acked", color="black", linewidth=1)
    top.set_ylabel("ops/s")
    top.legend(loc="upper right")
    for q in ("p50_ms", "p99_ms"):
        points = [(r["t"], r[q]) for r in rows if r[q] is not None]
        bottom.plot([p[0] for p in points], [p[1] for p in points], label=q[:3], linewidth=1)
    bottom.set_yscale("log")
    bottom.set_ylabel("ok latency (ms)")
    bottom.set_xlabel("seconds since start")
    bottom.legend(loc="upper right")
    colours = {
        "partition": "tab:blue",
        "kill": "tab:red",
        "pause": "tab:purple",
        "loss": "tab:olive",
        "slow": "tab:cyan",
        "clock": "tab:brown",
        "none": "tab:pink",
    }
    for w in windows:
        end = end_s if w.end is None else w.end / availability.NS
        for axis in (top, bottom):
            axis.axvspan(
                w.start / availability.NS, end, alpha=0.15, color=colours.get(w.fault, "tab:gray")
            )
    # Each window's throughput ratio (acked writes/s after the grace period against before it).
    for row in availability.throughput_ratios(ops):
        if row["ratio"] is not None:
            mark = "" if row["majority_connected"] and not row["control"] else "*"
            top.annotate(
                f"{row['ratio']:.2f}{mark}",
                (row["start_s"], 1.0),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                va="top",
                color="tab:red" if row["meets_target"] is False else "black",
            )
    # One band per fault kind in a key of its own, so long runs with many faults stay legible.
    kinds = sorted({w.fault for w in windows})
    if kinds:
        bands = [Patch(color=colours.get(k, "tab:gray"), alpha=0.3, label=k) for k in kinds]
        fig.legend(handles=bands, loc="upper center", ncol=len(bands), fontsize=8, title="faults")
        fig.tight_layout(rect=(0, 0, 1, 0.92))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_outputs(out_dir: Path, ops: list[Op], result: dict[str, Any]) -> dict[str, str]:
    """Writes result.json, summary.txt and timeline.png next to the history; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"result": out_dir / "result.json", "summary": out_dir / "summary.txt"}
    plotted = plot(ops, out_dir / "timeline.png")
    if plotted:
        files["plot"] = out_dir / "timeline.png"
    result = {**result, "files": {k: str(v) for k, v in files.items()}}
    files["result"].write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    files["summary"].write_text(summary_text(result), encoding="utf-8")
    return {k: str(v) for k, v in files.items()}
