"""ordermq against its peers and against the gRPC floor, with the targets of issue 7.

Reads what `make bench` (bench/results/latest.json) and `make bench-peers`
(bench/results/peers.json) wrote, prints one table and writes
bench/results/comparison.json, and bench/results/comparison.png (ordermq's ratio to each
peer, one group of bars per metric) when matplotlib can be imported. Nothing is measured
here; bench/peers/run.py runs this at its end.

    python bench/compare.py
    python bench/compare.py --ordermq bench/results/latest.json --ordermq /tmp/only-pull.json
    python bench/compare.py --no-chart

A ratio is ordermq / peer (or / floor): above 1 ordermq is faster, except for peak RSS,
where lower is better and a ratio below 1 means ordermq uses less memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
#: The backlogs the issue's memory targets are about (make bench; make bench-backlog).
TARGET_BACKLOG = 200_000
BIG_BACKLOG = 10_000_000
#: Peers in table and chart order, with a short label.
PEERS = {
    "redis-everysec": "Redis everysec",
    "redis-always": "Redis always",
    "rabbitmq": "RabbitMQ",
    "nats": "NATS JetStream",
}


@dataclass(frozen=True)
class Metric:
    """One row: an ordermq figure, the peers' figure it reads against, its gRPC floor."""

    label: str
    key: str  # ordermq figure key in latest.json
    peer_key: str | None  # key in each peer's "median" (None: no peer figure)
    floor_key: str | None = None  # floor figure in the same ordermq run
    floor_messages: int = 0  # messages per floor payload
    unit: str = "msg/s"
    higher_is_better: bool = True


METRICS = [
    Metric("produce async, batch 100 mixed keys, 1 in flight", "produce.async.mixed.inflight1",
           "produce", "floor.send.inflight1", 100),
    Metric("produce sync, batch 100 mixed keys, 1 in flight", "produce.sync.mixed.inflight1",
           "produce", "floor.send.inflight1", 100),
    Metric("send() from 8 callers, async, mixed keys", "produce.async.mixed.callers8",
           "produce", "floor.send.inflight1", 100),
    Metric("produce async, batch 100, 1 in flight", "produce.async.inflight1", "produce",
           "floor.send.inflight1", 100),
    Metric("produce sync, batch 100, 1 in flight", "produce.sync.inflight1", "produce",
           "floor.send.inflight1", 100),
    Metric("produce async, batch 100, 4 in flight", "produce.async.inflight4", "produce",
           "floor.send.inflight4", 100),
    Metric("produce sync, batch 100, 4 in flight", "produce.sync.inflight4", "produce",
           "floor.send.inflight4", 100),
    Metric("consume orderly, async, batch 32", "consume.orderly.async.batch32", "consume",
           "floor.pull.inflight8", 1000),
    Metric("consume orderly, async, batch 1", "consume.orderly.async.batch1", "consume",
           "floor.pull.inflight8", 1000),
    Metric("consume orderly, async, batch 32, push delivery", "consume.orderly.async.batch32.push",
           "consume", "floor.pull.inflight8", 1000),
    Metric("consume orderly, async, batch 1, push delivery", "consume.orderly.async.batch1.push",
           "consume", "floor.pull.inflight8", 1000),
    Metric("poll loop, aio LitePullConsumer", "poll.aio", "consume",
           "floor.pull.inflight8", 1000),
    Metric("pull, 1 in flight (no ack)", "pull.sequential", "read_noack",
           "floor.pull.inflight1", 1000),
    Metric("pull, 8 prefetched (no ack)", "pull.prefetch", "read_noack",
           "floor.pull.inflight8", 1000),
    Metric("broker peak RSS, backlog", "broker.rss.backlog", "rss_mb", unit="MB",
           higher_is_better=False),
    Metric("e2e p50 at 2 000 msg/s, blocking consumer", "latency.e2e.blocking.rate2000.p50",
           "e2e_p50_ms", unit="ms", higher_is_better=False),
    Metric("e2e p99 at 2 000 msg/s, blocking consumer", "latency.e2e.blocking.rate2000.p99",
           "e2e_p99_ms", unit="ms", higher_is_better=False),
]  # fmt: skip


# ---------------------------------------------------------------------- reading
def load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def ordermq_figures(
    paths: list[Path],
) -> tuple[dict[str, dict[str, Any]], list[str], set[int]]:
    """Figures by key from the ordermq results files: a later file only adds the figures
    the earlier ones lack (e.g. one measured later with `--only`). Also the sources and
    their message counts (--messages)."""
    figures: dict[str, dict[str, Any]] = {}
    sources = []
    sizes = set()
    for path in paths:
        data = load(path)
        if data is None:
            continue
        sources.append(f"{path} ({data.get('timestamp', '?')})")
        if (data.get("options") or {}).get("messages"):
            sizes.add(data["options"]["messages"])
        for f in data.get("figures", []):
            if f.get("median") is not None and f["key"] not in figures:
                figures[f["key"]] = f
    return figures, sources, sizes


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# ---------------------------------------------------------------------- comparing
def compare(figures: dict[str, dict[str, Any]], peers: dict[str, Any]) -> dict[str, Any]:
    """Rows (one per metric) and targets, as plain data."""
    medians = {name: (p.get("median") or {}) for name, p in peers.items() if not p.get("skipped")}
    rows = []
    for m in METRICS:
        fig = figures.get(m.key)
        value = fig["median"] if fig else None
        floor = None
        if m.floor_key and m.floor_key in figures:
            floor_msgs = figures[m.floor_key]["median"] * m.floor_messages
            floor = {
                "key": m.floor_key,
                "msg_per_s": floor_msgs,
                "ratio": _ratio(value, floor_msgs),
            }
        row_peers = {}
        for name in PEERS:
            peer_value = medians.get(name, {}).get(m.peer_key) if m.peer_key else None
            row_peers[name] = {"value": peer_value, "ratio": _ratio(value, peer_value)}
        rows.append(
            {
                "metric": m.label,
                "key": m.key,
                "title": fig["title"] if fig else None,
                "unit": m.unit,
                "higher_is_better": m.higher_is_better,
                "ordermq": value,
                "peer_figure": m.peer_key,
                "peers": row_peers,
                "floor": floor,
            }
        )
    return {"rows": rows, "targets": targets(figures, medians)}


def targets(figures: dict[str, dict[str, Any]], medians: dict[str, dict[str, float]]) -> list:
    """The targets of issue 7: value, threshold, the value as a share of it, met or not."""

    def med(key: str) -> float | None:
        return figures[key]["median"] if key in figures else None

    def floor(key: str, per: int) -> float | None:
        v = med(key)
        return v * per if v is not None else None

    def peer(name: str, key: str) -> float | None:
        return medians.get(name, {}).get(key)

    def rss_at(key: str, backlog: int) -> float | None:
        if key not in figures or figures[key]["params"].get("backlog_messages") != backlog:
            return None  # each RSS target is for one backlog size
        return med(key)

    rss = rss_at("broker.rss.backlog", TARGET_BACKLOG)
    big = max(
        (v for k in ("broker.rss.bigbacklog.fill", "broker.rss.bigbacklog")
         if (v := rss_at(k, BIG_BACKLOG)) is not None),
        default=None,
    )  # fmt: skip
    consume = med("consume.orderly.async.batch32")
    produce = med("produce.async.inflight1")
    items = [
        # (target, measured, threshold, higher is better, unit)
        ("produce async >= Redis everysec (1 batch of 100 in flight)",
         produce, peer("redis-everysec", "produce"), True, "msg/s"),
        ("produce sync >= Redis always (1 batch of 100 in flight)",
         med("produce.sync.inflight1"), peer("redis-always", "produce"), True, "msg/s"),
        ("ordered consume (batch 32) >= 0.5x Redis everysec",
         consume, _scaled(peer("redis-everysec", "consume"), 0.5), True, "msg/s"),
        ("ordered consume (batch 32) >= 1x Redis everysec (later)",
         consume, peer("redis-everysec", "consume"), True, "msg/s"),
        ("produce async >= 0.8x gRPC floor (send-shaped, 1 in flight, x100)",
         produce, _scaled(floor("floor.send.inflight1", 100), 0.8), True, "msg/s"),
        ("ordered consume >= 0.8x gRPC floor (pull-shaped, 8 in flight, x1000)",
         consume, _scaled(floor("floor.pull.inflight8", 1000), 0.8), True, "msg/s"),
        ("e2e p99 <= 2 ms at 2 000 msg/s (blocking consumer)",
         med("latency.e2e.blocking.rate2000.p99"), 2.0, False, "ms"),
        ("broker peak RSS <= 100 MB, " + f"{TARGET_BACKLOG:,}".replace(",", " ")
         + "-message backlog",
         rss, 100.0, False, "MB"),
        ("broker peak RSS <= 300 MB, " + f"{BIG_BACKLOG:,}".replace(",", " ")
         + "-message backlog (make bench-backlog)",
         big, 300.0, False, "MB"),
    ]  # fmt: skip
    out = []
    for name, value, threshold, higher, unit in items:
        met = None
        if value is not None and threshold is not None:
            met = value >= threshold if higher else value <= threshold
        out.append(
            {
                "target": name,
                "value": value,
                "threshold": threshold,
                "unit": unit,
                "of_threshold": _ratio(value, threshold),
                "met": met,
            }
        )
    return out


def _scaled(value: float | None, factor: float) -> float | None:
    return value * factor if value is not None else None


# ---------------------------------------------------------------------- output
def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "MB":
        return f"{value:.1f}"
    if unit == "ms":
        return f"{value:.2f}"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _grid(rows: list[list[str]], left: int = 1) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        pairs = enumerate(zip(r, widths, strict=True))
        cells = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in pairs]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render(result: dict[str, Any]) -> str:
    head = ["metric", "unit", "ordermq"]
    for label in PEERS.values():
        head += [label, "ratio"]
    head += ["gRPC floor", "ratio"]
    rows = [head]
    for r in result["rows"]:
        row = [r["metric"], r["unit"], _num(r["ordermq"], r["unit"])]
        for name in PEERS:
            p = r["peers"][name]
            row += [_num(p["value"], r["unit"]), _x(p["ratio"])]
        floor = r["floor"] or {}
        row += [_num(floor.get("msg_per_s")), _x(floor.get("ratio"))]
        rows.append(row)
    out = [
        "ordermq against peers (ratio = ordermq / peer; peak RSS: lower is better) and the "
        "gRPC floor of the same ordermq run (floor payloads/s x messages per payload)",
        "peers' produce is 1 batch of 100 in flight: the 4-in-flight rows read against the "
        "same figure; pull rows read against Redis' plain XREAD (no group, no ack)",
        "",
        _grid(rows),
        "",
        "targets (issue 7)",
        "",
    ]
    trows = [["target", "measured", "threshold", "of threshold", "status"]]
    for t in result["targets"]:
        status = {True: "met", False: "NOT MET", None: "n/a (not measured)"}[t["met"]]
        trows.append(
            [
                t["target"],
                _num(t["value"], t["unit"]) + f" {t['unit']}" * (t["value"] is not None),
                _num(t["threshold"], t["unit"]) + f" {t['unit']}" * (t["threshold"] is not None),
                _x(t["of_threshold"]),
                status,
            ]
        )
    out.append(_grid(trows))
    return "\n".join(out)


def chart(result: dict[str, Any], path: Path) -> str | None:
    """Grouped bars of ordermq / peer per metric, log scale; None or why it was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, NullLocator
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no chart"
    rows = [r for r in result["rows"] if any(p["ratio"] for p in r["peers"].values())]
    if not rows:
        return "no metric has both an ordermq and a peer figure: no chart"
    names = list(PEERS)
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(8.0, 1.25 * len(rows) + 2), 5.5))
    colors = ["#c0392b", "#e67e22", "#8e44ad", "#2980b9"]
    for i, name in enumerate(names):
        xs, ys = [], []
        for n, r in enumerate(rows):
            ratio = r["peers"][name]["ratio"]
            if ratio:
                xs.append(n - 0.4 + width * (i + 0.5))
                ys.append(ratio)
        bars = ax.bar(xs, ys, width, label=PEERS[name], color=colors[i % len(colors)])
        ax.bar_label(bars, labels=[f"{y:.2g}" for y in ys], fontsize=7, padding=1)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_yscale("log")
    ticks = [0.05, 0.1, 0.25, 0.5, 1, 2, 4, 10, 20, 50]
    lo = min(p["ratio"] for r in rows for p in r["peers"].values() if p["ratio"])
    hi = max(p["ratio"] for r in rows for p in r["peers"].values() if p["ratio"])
    ax.set_ylim(min(0.5, lo / 1.5), max(2.0, hi * 1.6))
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_yticklabels([f"{t:g}x" for t in ticks])
    ax.set_xticks(range(len(rows)))
    labels = [
        r["metric"].replace(", ", "\n", 1) + ("\n(lower is better)" if not r["higher_is_better"]
                                               else "")
        for r in rows
    ]  # fmt: skip
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("ordermq / peer (log scale)")
    ax.set_title("ordermq relative to each peer (1x = same as the peer)")
    ax.legend(fontsize=8, loc="upper left", ncols=len(names))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


# ---------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--ordermq",
        type=Path,
        action="append",
        help="ordermq results (default bench/results/latest.json, then backlog.json if it "
        "exists); repeatable: a later file only adds figures the earlier ones lack",
    )
    ap.add_argument("--peers", type=Path, default=RESULTS / "peers.json", help="peer results")
    ap.add_argument("--out", type=Path, default=RESULTS / "comparison.json", help="JSON file")
    ap.add_argument("--chart", type=Path, help="PNG file (default: --out with .png)")
    ap.add_argument("--no-chart", action="store_true", help="do not draw the chart")
    args = ap.parse_args(argv)
    if not args.ordermq:
        args.ordermq = [RESULTS / "latest.json"]
        if (RESULTS / "backlog.json").exists():
            args.ordermq.append(RESULTS / "backlog.json")
    args.chart = args.chart or args.out.with_suffix(".png")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    figures, sources, sizes = ordermq_figures(args.ordermq)
    peers_data = load(args.peers)
    missing = []
    if not figures:
        missing.append(f"no ordermq results in {', '.join(map(str, args.ordermq))} (make bench)")
    if peers_data is None:
        missing.append(f"no peer results in {args.peers} (make bench-peers)")
    if missing:
        print("comparison skipped: " + "; ".join(missing), file=sys.stderr)
        return 1
    assert peers_data is not None
    result = compare(figures, peers_data.get("peers", {}))
    result = {
        "sources": {"ordermq": sources, "peers": f"{args.peers} ({peers_data.get('when', '?')})"},
        **result,
        "chart": None,
    }
    print(render(result))
    peer_size = (peers_data.get("workload") or {}).get("messages")
    if peer_size and sizes - {peer_size}:
        sizes_text = ", ".join(f"{n:,}" for n in sorted(sizes))
        result["warning"] = (
            f"ordermq ran with {sizes_text} messages, the peers with {peer_size:,}: "
            "the figures are not of the same workload"
        )
        print(f"warning: {result['warning']}")
    for name, p in peers_data.get("peers", {}).items():
        if p.get("skipped"):
            print(f"note: {name} was skipped: {p['skipped']}")
    if not args.no_chart:
        why = chart(result, args.chart)
        if why is None:
            result["chart"] = str(args.chart)
            print(f"chart: {args.chart}")
        else:
            print(f"chart skipped: {why}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
