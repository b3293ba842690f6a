"""The report of sustained runs: a Markdown table of quick against sustained figures, and one
PNG per system with throughput, publish latency and the host's page cache over time.

Owns the soak Markdown and charts; bench.soak owns the numbers.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

MB = 1_000_000


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _first_and_half(series: list[float]) -> str:
    if not series:
        return "n/a"
    return f"{_mean(series[:3]):.0f} -> {_mean(series[len(series) // 2 :]):.0f}"


def server_cpu(run: dict[str, Any], host: list[dict[str, Any]]) -> tuple[float, float] | None:
    """The servers' mean CPU (% of one core) over the run's second half, and CPU ms per MB
    acknowledged then: a system can be behind because it gets fewer cores on a shared machine
    while doing less work per MB, and only the two together say which."""
    half, end = run["started_s"] + run["duration_s"] / 2, run["started_s"] + run["duration_s"]
    cpu = [s["server_cpu_pct"] for s in host if "server_cpu_pct" in s and half <= s["t"] <= end]
    mb_per_s = run["sustained_msgs_per_s"] * run["message_size"] / MB
    if not cpu or not mb_per_s:
        return None
    pct = _mean(cpu)
    return pct, pct * 10 / mb_per_s


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Sustained runs (`python -m bench soak`)",
        "",
        f"Started {results.get('started', '?')}; machine: {results.get('machine', {})}.",
        "`quick` is the rate of seconds 1-3 (what a quick run's window sees on a fresh node); "
        "`sustained` is the mean over the second half of the run. The yardsticks are a plain "
        "file written in the same run just before the system's runs (1 MiB writes, fdatasync "
        "per `sync_bytes`, 1 GiB files, oldest deleted beyond four), first keeping every page "
        "cached, then dropping pages 64 MiB behind its end as Raftline's log does.",
        "",
        "| system | run | GB | seconds | quick MB/s | sustained MB/s | sustained msg/s "
        "| ack p50 / p99 ms | server CPU % / ms per MB | plain file: cached / dropped behind, "
        "first 3 s -> second half MB/s | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for system, out in results["systems"].items():
        yard_text = " / ".join(
            _first_and_half((out.get(name) or {}).get("mb_per_s", []))
            for name in ("yardstick", "yardstick_drop")
        )
        for run in out["runs"]:
            size = run["message_size"]
            latency = run["publish_latency_ms"] or {}
            p50, p99 = latency.get("p50", float("nan")), latency.get("p99", float("nan"))
            cpu = server_cpu(run, out.get("host", []))
            cpu_text = "n/a" if cpu is None else f"{cpu[0]:.0f} / {cpu[1]:.2f}"
            lines.append(
                f"| {system} | {run['label']} | {run['acked_gb']} | {run['duration_s']:.0f} "
                f"| {run['quick_msgs_per_s'] * size / MB:.0f} "
                f"| {run['sustained_msgs_per_s'] * size / MB:.0f} "
                f"| {run['sustained_msgs_per_s']:,.0f} "
                f"| {p50:.1f} / {p99:.1f} | {cpu_text} "
                f"| {yard_text} | {run['errors']} |"
            )
    for skipped in results.get("skipped", []):
        lines.append(f"\nSkipped {skipped['system']}: {skipped['reason']}")
    host = [s for out in results["systems"].values() for s in out.get("host", [])]
    if host:
        loads = [s["load_1m"] for s in host]
        lines.append(f"\nLoad average (1 min) during the runs: {min(loads):.1f}-{max(loads):.1f}.")
    return "\n".join(lines) + "\n"


def charts(results: dict[str, Any], out: Path) -> list[Path]:
    """soak-<system>.png per system; [] without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for system, data in results["systems"].items():
        fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
        for name, style, label in (
            ("yardstick", "-", "plain file, every page cached"),
            ("yardstick_drop", "--", "plain file, pages dropped 64 MiB behind"),
        ):
            yard = data.get(name)
            if yard:
                xs = [yard["started_s"] + i for i in range(len(yard["mb_per_s"]))]
                top.plot(xs, yard["mb_per_s"], color="grey", linestyle=style, label=label)
        for run in data["runs"]:
            t0 = run["started_s"]
            points = run["timeline"]
            xs = [t0 + p["t"] for p in points]
            top.plot(xs, [p["mb_per_s"] for p in points], label=f"{system}: {run['label']}")
            timed = [p for p in points if "p99_ms" in p]
            xs = [t0 + p["t"] for p in timed]
            line = middle.plot(xs, [p["p99_ms"] for p in timed], label=f"p99, {run['label']}")
            middle.plot(
                xs,
                [p["p50_ms"] for p in timed],
                linestyle=":",
                color=line[0].get_color(),
                label=f"p50, {run['label']}",
            )
        host = data.get("host", [])
        if host:
            xs = [s["t"] for s in host]
            for key in ("Dirty", "Writeback", "server_rss_mb"):
                bottom.plot(xs, [s.get(key, 0.0) for s in host], label=key)
            cpu = [(s["t"], s["server_cpu_pct"]) for s in host if "server_cpu_pct" in s]
            twin = bottom.twinx()
            twin.plot([c[0] for c in cpu], [c[1] for c in cpu], color="black", alpha=0.3)
            twin.set_ylabel("server CPU % (grey)")
        top.set_ylabel("acknowledged MB/s")
        top.set_title(f"{system}: sustained runs")
        middle.set_ylabel("publish ack latency, ms (log)")
        middle.set_yscale("log")
        bottom.set_ylabel("MB")
        bottom.set_xlabel("seconds since the system started")
        for ax in (top, middle, bottom):
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="upper right")
        fig.tight_layout()
        path = out / f"soak-{system}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written
