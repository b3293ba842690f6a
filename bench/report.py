"""Writes a comparison's results as JSON, a Markdown table with Raftline/peer ratios, and PNGs.

Owns the machine description, table layout and chart drawing (matplotlib, from the bench extra).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PERCENTILES = ("p50", "p99", "p99.9", "max")
PEER_ORDER = (
    "raftline",
    "raftline-idempotent",
    "raftline-post",
    "raftline-nofsync",
    "nats",
    "rabbitmq-quorum",
    "rabbitmq-stream",
    "redis",
)

# Durability classes: whether an acknowledged message was fsynced first (by the server that
# acknowledged it, or by a quorum), as bench/peers.py starts each system.
FSYNCED = "fsync before ack"
PAGE_CACHE = "no fsync before ack"
DURABILITY_CLASS = {
    "raftline": FSYNCED,  # --fsync always
    "raftline-idempotent": FSYNCED,  # the same nodes, the client's idempotent producer
    "raftline-post": FSYNCED,  # the same nodes, the queue workloads' producer by POST
    "raftline-nofsync": PAGE_CACHE,  # --fsync never
    "nats": PAGE_CACHE,  # nats-server 2.9: fsync on a 2-minute timer
    "rabbitmq-quorum": FSYNCED,  # Ra WAL fsync before the confirm
    "rabbitmq-stream": PAGE_CACHE,  # confirm after the write, never fsynced
    "redis": FSYNCED,  # appendfsync always (on the primary)
}
# Raftline with the client's default, idempotent producer (on raftline's nodes).
IDEMPOTENT = "raftline-idempotent"
# A queue run's end-to-end latencies: to receipt, to the ack sent, to the ack as counted.
QUEUE_LATENCIES = ("received_latency_ms", "ack_sent_latency_ms", "e2e_latency_ms")
NATIVE_DESCRIPTION = (
    "native load generator (bench/native, Rust, std sockets only): publish only, one "
    "connection per batch in flight, each sending its batch and waiting for all its "
    "acknowledgements; Raftline gets one Kafka v2 record batch per HTTP request"
)
# The Raftline system each peer is compared with at like-for-like durability.
RAFTLINE_OF_CLASS = {FSYNCED: "raftline", PAGE_CACHE: "raftline-nofsync"}


def machine() -> dict[str, Any]:
    """CPU model, core count, memory, kernel and Python of the host the run happened on."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = 0
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        # Other work on the host skews every number; the load average says how much there was.
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def _ms(summary: dict[str, float] | None) -> str:
    if not summary:
        return "n/a"
    return " / ".join(_num(summary[p]) for p in PERCENTILES)


def _num(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _rate(run: dict[str, Any]) -> str:
    return f"{run['publish_msgs_per_s']:,.0f}"


def markdown(results: dict[str, Any]) -> str:
    """The results as Markdown: machine, durability per system, one table, ratios, skips."""
    m = results["machine"]
    lines = [
        f"Run {results['started']} ({'quick' if results['quick'] else 'full'}); "
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, kernel {m['kernel']}, "
        f"Python {m['python']}. Brokers and the Python client processes share these cores; "
        f"1-minute load average {m.get('load_avg_at_start', 'n/a')} at the start, "
        f"{m.get('load_avg_1m', 'n/a')} at the end.",
        "",
        "Durability per system:",
        "",
    ]
    lines += [f"- **{key}**: {text}" for key, text in sorted(results["durability"].items())]
    if results["peers"]:
        versions = ", ".join(f"{k}: {v}" for k, v in sorted(results["peers"].items()))
        lines += ["", f"Versions: {versions}."]
    native = results.get("native_runs") or []
    if results["runs"] or not native:
        lines += [
            "",
            "### Python-client drivers (bench/drivers: a Python producer process, a Python "
            "consumer process)",
            "",
            *_table_lines(results["runs"]),
            "",
            *ratio_lines(results),
        ]
    if native:
        lines += [
            "",
            f"### Native clients: the {NATIVE_DESCRIPTION}",
            "",
            *_table_lines(native),
            "",
            *ratio_lines({**results, "runs": native}),
        ]
    if results["skipped"]:
        lines += ["", "Skipped:", ""]
        lines += [
            f"- {s['system']} (RF {s['replicas']}): {s['reason']}" for s in results["skipped"]
        ]
    return "\n".join(lines) + "\n"


def _table_lines(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| workload | system | RF | target msg/s | publish msg/s | publish MB/s | consume msg/s "
        "| publish-ack ms p50 / p99 / p99.9 / max "
        "| end-to-end ms p50 / p99 / p99.9 / max | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in _ordered(runs):
        notes = []
        if run["errors"]:
            notes.append(f"{run['errors']} errors: {run['first_error'][:80]}")
        if run["received"] < run["acked"]:
            notes.append(f"{run['acked'] - run['received']} acked not consumed by the drain end")
        target = f"{run['target_rate']:,}" if run["target_rate"] else "max"
        consume = "-" if run.get("client") == "native" else f"{run['consume_msgs_per_s']:,.0f}"
        lines.append(
            f"| {run['workload']} | {run['system']} | {run['replicas']} | {target} | {_rate(run)} "
            f"| {run['publish_mb_per_s']:.1f} | {consume} "
            f"| {_ms(run['publish_latency_ms'])} | {_ms(run['e2e_latency_ms'])} "
            f"| {'; '.join(notes).replace('|', '/')} |"
        )
    return lines


def _is_raftline(system: str) -> bool:
    return system in RAFTLINE_OF_CLASS.values() or system == IDEMPOTENT


def idempotence_costs(results: dict[str, Any]) -> list[dict[str, Any]]:
    """raftline-idempotent over raftline (plain produce, the same nodes) per workload and RF:
    what idempotence, the client's default, costs in publish msg/s."""
    by_key = {(r["system"], r["workload"], r["replicas"]): r for r in results["runs"]}
    out = []
    for (system, workload, replicas), run in sorted(by_key.items()):
        plain = by_key.get(("raftline", workload, replicas))
        if system != IDEMPOTENT or plain is None or run.get("kind") == "queue-ack":
            continue
        rate, base = run["publish_msgs_per_s"], plain["publish_msgs_per_s"]
        out.append(
            {
                "workload": workload,
                "replicas": replicas,
                "plain_msgs_per_s": base,
                "idempotent_msgs_per_s": rate,
                "ratio": rate / base if base else None,
            }
        )
    return out


def idempotence_lines(results: dict[str, Any]) -> list[str]:
    entries = idempotence_costs(results)
    if not entries:
        return []
    lines = [
        "",
        "Idempotent produce (the client's default) against plain produce, same nodes "
        "(target: at least 0.90):",
        "",
        "| workload | RF | plain msg/s | idempotent msg/s | idempotent/plain |",
        "|---|---|---|---|---|",
    ]
    for e in entries:
        ratio = "n/a" if e["ratio"] is None else f"{e['ratio']:.2f}"
        lines.append(
            f"| {e['workload']} | {e['replicas']} | {_num(e['plain_msgs_per_s'])} "
            f"| {_num(e['idempotent_msgs_per_s'])} | {ratio} |"
        )
    return lines


def _peer_runs(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The peers' runs (no Raftline system), by workload, replication factor and system name."""
    runs = [r for r in results["runs"] if not _is_raftline(r["system"])]
    return sorted(runs, key=lambda r: (r["system"], r["workload"], r["replicas"]))


def _ratio(own: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """A Raftline run over a peer's: publish msg/s and e2e p99 (None where either is missing)."""
    entry: dict[str, Any] = {
        "workload": run["workload"],
        "peer": run["system"],
        "replicas": run["replicas"],
    }
    peer_rate = run["publish_msgs_per_s"]
    entry["publish_ratio"] = own["publish_msgs_per_s"] / peer_rate if peer_rate else None
    if run.get("kind") == "queue-ack":  # there the acknowledged (consumed) rate is the figure
        peer_acked = run["consume_msgs_per_s"]
        entry["kind"] = "queue-ack"
        entry["acked_ratio"] = own["consume_msgs_per_s"] / peer_acked if peer_acked else None
        # Latency to receipt (the receiver has the message) and to the ack sent, the
        # like-for-like figures, and to the acknowledgement as each system counts it (see
        # queue_ack_lines).
        for name in QUEUE_LATENCIES:
            entry[name] = (own.get(name), run.get(name))
    if own["e2e_latency_ms"] and run["e2e_latency_ms"] and run["e2e_latency_ms"]["p99"]:
        entry["e2e_p99_ratio"] = own["e2e_latency_ms"]["p99"] / run["e2e_latency_ms"]["p99"]
    else:
        entry["e2e_p99_ratio"] = None
    return entry


def _pairs(
    results: dict[str, Any], raftline_for: Callable[[str], str | None]
) -> Iterator[tuple[dict[str, Any], dict[str, Any], str]]:
    """(Raftline run, peer run, Raftline system) for each peer run whose Raftline system (as
    `raftline_for` names it for the peer) ran the same workload at the same factor."""
    by_key = {(r["system"], r["workload"], r["replicas"]): r for r in results["runs"]}
    for run in _peer_runs(results):
        system = raftline_for(run["system"])
        own = by_key.get((system, run["workload"], run["replicas"])) if system else None
        if system is not None and own is not None:
            yield own, run, system


def ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Raftline (fsync always) over each peer, per workload and replication factor."""
    return [_ratio(own, run) for own, run, _ in _pairs(results, lambda _: "raftline")]


def like_for_like_ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each peer over the Raftline system of its durability class (RAFTLINE_OF_CLASS)."""
    out = []
    for own, run, raftline in _pairs(results, _raftline_of_class):
        entry = _ratio(own, run)
        entry.update(durability_class=DURABILITY_CLASS[run["system"]], raftline=raftline)
        out.append(entry)
    return out


def _raftline_of_class(peer: str) -> str | None:
    durability_class = DURABILITY_CLASS.get(peer)
    return RAFTLINE_OF_CLASS.get(durability_class) if durability_class else None


def _ratio_cells(entry: dict[str, Any]) -> tuple[str, str]:
    pub, e2e = entry["publish_ratio"], entry["e2e_p99_ratio"]
    return (
        f"{pub:.2f}" if pub is not None else "n/a",
        f"{e2e:.2f}" if e2e is not None else "n/a",
    )


def ratio_lines(results: dict[str, Any]) -> list[str]:
    """Both ratio tables: Raftline fsync-always over every peer, then like for like."""
    entries = ratios(results)
    if not entries:
        measured = any(r["system"] == "raftline" for r in results["runs"])
        why = "no peer ran the same workloads" if measured else "Raftline was not measured"
        lines = [f"Raftline/peer ratios: none, {why} in this run."]
    else:
        lines = [
            "Raftline/peer ratios (publish msg/s: above 1 means Raftline is faster; "
            "end-to-end p99: below 1 means Raftline is lower):",
            "",
            "| workload | RF | peer | publish msg/s ratio | e2e p99 ratio |",
            "|---|---|---|---|---|",
        ]
        for e in entries:
            pub, e2e = _ratio_cells(e)
            lines.append(f"| {e['workload']} | {e['replicas']} | {e['peer']} | {pub} | {e2e} |")
    return [
        *lines,
        "",
        *like_for_like_lines(results),
        *queue_ack_lines(entries),
        *idempotence_lines(results),
    ]


def queue_ack_lines(entries: list[dict[str, Any]]) -> list[str]:
    """For queue-ack workloads the receive-and-ack rate is what counts: its ratio, if any."""
    queued = [e for e in entries if e.get("kind") == "queue-ack"]
    if not queued:
        return []
    lines = [
        "",
        "Queue workloads (kind queue-ack): acknowledged msg/s ratio (above 1 means Raftline's"
        " receivers acknowledged more per second), and end-to-end latency in ms (p50 / p99)"
        " three ways: to receipt (the receiver has the message) and to the ack sent (the"
        " receiver sent its acknowledgement), both like for like, and to the acknowledgement"
        " as each system counts it (Raftline: the ack's answer, after the settle committed on"
        " a majority; RabbitMQ: the ack frame sent, never confirmed):",
        "",
        "| workload | RF | peer | acknowledged msg/s ratio | to receipt: Raftline | peer "
        "| ack sent: Raftline | peer | to acknowledgement: Raftline (confirmed) | peer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in queued:
        ratio = "n/a" if e["acked_ratio"] is None else f"{e['acked_ratio']:.2f}"
        cells = [_p50_p99(s) for name in QUEUE_LATENCIES for s in e[name]]
        lines.append(
            f"| {e['workload']} | {e['replicas']} | {e['peer']} | {ratio} | {' | '.join(cells)} |"
        )
    return lines


def _p50_p99(summary: dict[str, float] | None) -> str:
    return f"{_num(summary['p50'])} / {_num(summary['p99'])}" if summary else "n/a"


def like_for_like_lines(results: dict[str, Any]) -> list[str]:
    entries = like_for_like_ratios(results)
    if not entries:
        return [
            "Raftline/peer ratios at like-for-like durability: none, no peer ran the same "
            "workloads as the Raftline system of its durability class in this run."
        ]
    lines = [
        "Raftline/peer ratios at like-for-like durability: each peer against the Raftline "
        f"system of its class (`{FSYNCED}`: raftline, `--fsync always`; `{PAGE_CACHE}`: "
        "raftline-nofsync, `--fsync never`):",
        "",
        "| workload | RF | peer | peer durability class | Raftline system "
        "| publish msg/s ratio | e2e p99 ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        pub, e2e = _ratio_cells(e)
        lines.append(
            f"| {e['workload']} | {e['replicas']} | {e['peer']} | {e['durability_class']} "
            f"| {e['raftline']} | {pub} | {e2e} |"
        )
    return lines


def _ordered(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(run: dict[str, Any]) -> tuple[Any, ...]:
        system = run["system"]
        rank = PEER_ORDER.index(system) if system in PEER_ORDER else len(PEER_ORDER)
        return (run["replicas"], run["workload"], rank)

    return sorted(runs, key=key)


def charts(results: dict[str, Any], out: Path) -> list[Path]:
    """Throughput bars per workload and latency-percentile lines; [] without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written: list[Path] = []
    for replicas in sorted({r["replicas"] for r in results["runs"]}):
        runs = [r for r in _ordered(results["runs"]) if r["replicas"] == replicas]
        workloads = list(dict.fromkeys(r["workload"] for r in runs))
        systems = list(dict.fromkeys(r["system"] for r in runs))
        fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(workloads)), 5))
        width = 0.8 / max(1, len(systems))
        for i, system in enumerate(systems):
            values = [
                next(
                    (
                        r["publish_msgs_per_s"]
                        for r in runs
                        if r["system"] == system and r["workload"] == w
                    ),
                    0,
                )
                for w in workloads
            ]
            ax.bar([x + i * width for x in range(len(workloads))], values, width, label=system)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(workloads))])
        ax.set_xticklabels(workloads, rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("publish msgs/s (log)")
        ax.set_title(f"Publish throughput, replication factor {replicas}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"throughput-rf{replicas}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
        for workload in workloads:
            written.append(_latency_chart(plt, runs, workload, replicas, out))
    return written


def _latency_chart(
    plt: Any, runs: list[dict[str, Any]], workload: str, replicas: int, out: Path
) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, field, title in zip(
        axes, ("publish_latency_ms", "e2e_latency_ms"), ("publish ack", "end to end"), strict=True
    ):
        for run in runs:
            if run["workload"] == workload and run[field]:
                values = [max(run[field][p], 0.001) for p in PERCENTILES]
                ax.plot(PERCENTILES, values, marker="o", label=run["system"])
        ax.set_yscale("log")
        ax.set_title(f"{title} latency")
        ax.set_xlabel("percentile")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ms (log)")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"{workload}, replication factor {replicas}")
    fig.tight_layout()
    path = out / f"latency-{workload}-rf{replicas}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write(results: dict[str, Any], out: Path) -> dict[str, Path]:
    """results.json, results.md and the charts into `out`; returns what was written."""
    out.mkdir(parents=True, exist_ok=True)
    results = {
        **results,
        "ratios": ratios(results),
        "like_for_like_ratios": like_for_like_ratios(results),
        "native_ratios": ratios({**results, "runs": results.get("native_runs") or []}),
        "native_like_for_like_ratios": like_for_like_ratios(
            {**results, "runs": results.get("native_runs") or []}
        ),
    }
    paths = {"json": out / "results.json", "markdown": out / "results.md"}
    paths["json"].write_text(json.dumps(results, indent=2) + "\n")
    paths["markdown"].write_text(markdown(results))
    for i, chart in enumerate(charts(results, out)):
        paths[f"chart{i}"] = chart
    return paths
