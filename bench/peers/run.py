"""`make bench-peers`: the workload of `make bench` run on peer systems, for comparison.

Peers: Redis Streams (AOF, appendfsync everysec and always), RabbitMQ (classic durable
queues, publisher confirms), NATS JetStream (defaults). Same workload everywhere: 100-byte
bodies, 1 000 keys, 8 queues (the key's queue by ordermq's mmh3 formula), batches of 100.
Figures per peer and setting: produce msgs/s, ordered consume msgs/s from the backlog, the
broker's peak RSS, and optionally end-to-end latency at a paced rate. Redis also reports
produce_callers: msgs/s of single XADDs from 8 concurrent callers, each awaiting its reply
before its next (the shape of ordermq's 8-caller figure). See bench/peers/README.md.

What a peer needs (its server from Debian, its client from PyPI) is installed when missing;
a peer whose packages cannot be had is skipped with the reason. Each run starts the server
afresh on 127.0.0.1 with its data in a temporary directory and stops it afterwards (only
the processes it started). Every figure is the median of --runs runs.

    python bench/peers/run.py                      # full: 200 000 messages, 3 runs
    python bench/peers/run.py --quick              # smoke: 20 000 messages, 1 run
    python bench/peers/run.py --only redis-everysec nats --runs 5

At the end it runs bench/compare.py (ordermq against these figures; --no-compare skips it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import install
import servers
import workload as wl

RESULTS = Path(__file__).resolve().parent.parent / "results"
COMPARE = Path(__file__).resolve().parent.parent / "compare.py"

#: Figures measured before on this kind of machine (one Python producer, one consumer,
#: median of 3), shown beside ours: msgs/s and MB.
REFERENCE: dict[str, dict[str, float]] = {
    "redis-everysec": {"produce": 105_000, "consume": 169_000, "rss_mb": 42},
    "redis-always": {"produce": 83_000, "consume": 148_000},
    "rabbitmq": {"produce": 10_500, "consume": 37_000, "rss_mb": 739},
    "nats": {"produce": 27_700, "consume": 27_500},
}

REDIS = install.Needs(
    debs={"redis-server": "redis-server"},
    pips={"redis": "redis"},
    optional_pips={"hiredis": "hiredis"},
)
RABBITMQ = install.Needs(
    debs={"rabbitmq-server": servers.RABBITMQ_SERVER},
    pips={"pika": "pika"},
    optional_pips={},
)
NATS = install.Needs(
    debs={"nats-server": "nats-server"},
    pips={"nats-py": "nats"},
    optional_pips={},
)


RunOnce = Callable[[Path, list[wl.Batch], argparse.Namespace], dict[str, float]]


@dataclass
class Peer:
    name: str
    system: str
    setting: str
    needs: install.Needs
    run_once: RunOnce
    runs: list[dict[str, float]] = field(default_factory=list)
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)

    def median(self) -> dict[str, float]:
        keys = sorted({k for r in self.runs for k in r})
        return {k: statistics.median(r[k] for r in self.runs if k in r) for k in keys}


# ---------------------------------------------------------------------- one run per peer
def _redis(appendfsync: str) -> RunOnce:
    def run_once(tmp: Path, batches: list[wl.Batch], args: argparse.Namespace) -> dict[str, float]:
        import redis_streams as rs

        expected = wl.total(batches)
        server, port = servers.start_redis(tmp, appendfsync)
        try:
            client = rs.connect(port)
            rs.prepare(client)
            out = {"produce": expected / rs.produce(client, batches)}
            out["consume"] = expected / rs.consume_group(client, expected)
            out["read_noack"] = expected / rs.consume_xread(client, expected)
            rs.prepare(client)  # the callers write into empty streams, as produce did
            singles = wl.arrivals(min(expected, wl.CALLERS_MESSAGES))
            out["produce_callers"] = len(singles) / rs.produce_callers(port, singles)
            if args.latency:
                out.update(rs.latency(client, port, args.latency_rate, args.latency_seconds))
            out["rss_mb"] = server.peak_rss_mb()
            client.close()
            return out
        finally:
            server.stop()

    return run_once


def _rabbitmq(tmp: Path, batches: list[wl.Batch], args: argparse.Namespace) -> dict[str, float]:
    import rabbitmq as rq

    expected = wl.total(batches)
    server, port = servers.start_rabbitmq(tmp)
    try:
        rq.prepare(port)
        out = {"produce": expected / rq.produce(port, batches)}
        out["consume"] = expected / rq.consume(port, expected)
        if args.latency:
            out.update(rq.latency(port, args.latency_rate, args.latency_seconds))
        out["rss_mb"] = server.peak_rss_mb()
        return out
    finally:
        server.stop()


def _nats(tmp: Path, batches: list[wl.Batch], args: argparse.Namespace) -> dict[str, float]:
    import nats_js as nj

    expected = wl.total(batches)
    server, port = servers.start_nats(tmp)
    try:
        nj.prepare(port)
        out = {"produce": expected / nj.produce(port, batches)}
        out["consume"] = expected / nj.consume(port, expected)
        if args.latency:
            out.update(nj.latency(port, args.latency_rate, args.latency_seconds))
        out["rss_mb"] = server.peak_rss_mb()
        return out
    finally:
        server.stop()


def peers() -> list[Peer]:
    return [
        Peer("redis-everysec", "Redis Streams", "AOF everysec", REDIS, _redis("everysec")),
        Peer("redis-always", "Redis Streams", "AOF always", REDIS, _redis("always")),
        Peer("rabbitmq", "RabbitMQ", "classic durable, confirms", RABBITMQ, _rabbitmq),
        Peer("nats", "NATS JetStream", "file stream, defaults", NATS, _nats),
    ]


# ---------------------------------------------------------------------- others' CPU
def _cpu_marks() -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, CPU seconds of this process and reaped
    children: the servers, once stopped, and what they started)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(f) for f in fields]
    busy = sum(ticks[:8]) - ticks[3] - ticks[4]  # all but idle and iowait (guest is in user)
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    return busy / os.sysconf("SC_CLK_TCK"), own


def others_cores(before: tuple[float, float], after: tuple[float, float], wall: float) -> float:
    """Cores' worth of CPU that processes other than ours used between two marks."""
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others / wall) if wall > 0 else 0.0


#: Other processes using this much of a core during a run get a note.
OTHERS_NOTICEABLE = 0.25


# ---------------------------------------------------------------------- output
def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _vs(value: float | None, ref: float | None) -> str:
    if value is None or not ref:
        return ""
    return f" ({value / ref - 1:+.0%})"


def table(chosen: list[Peer], latency: bool) -> str:
    head = ["peer", "setting", "produce/s", f"{wl.CALLERS} callers/s", "consume/s",
            "no-ack read/s", "peak RSS MB"]  # fmt: skip
    if latency:
        head += ["e2e p50 ms", "e2e p99 ms"]
    rows = [head]
    for p in chosen:
        if p.skipped:
            rows.append([p.name, f"skipped: {p.skipped}"])
            continue
        m = p.median()
        ref = REFERENCE.get(p.name, {})
        rss = f"{m['rss_mb']:.0f}" + _vs(m["rss_mb"], ref.get("rss_mb")) if "rss_mb" in m else "-"
        row = [
            p.name,
            p.setting,
            _rate(m.get("produce")) + _vs(m.get("produce"), ref.get("produce")),
            _rate(m.get("produce_callers")),
            _rate(m.get("consume")) + _vs(m.get("consume"), ref.get("consume")),
            _rate(m.get("read_noack")),
            rss,
        ]
        if latency:
            row += [
                f"{m['e2e_p50_ms']:.2f}" if "e2e_p50_ms" in m else "-",
                f"{m['e2e_p99_ms']:.2f}" if "e2e_p99_ms" in m else "-",
            ]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows if i < len(r) and len(r) > 2) for i in range(len(head))]
    lines = []
    for r in rows:
        if len(r) == 2:
            lines.append(f"{r[0]:<{widths[0]}}  {r[1]}")
            continue
        cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])]
        cells += [c.rjust(w) for c, w in zip(r[2:], widths[2:], strict=True)]
        lines.append("  ".join(cells))
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


# ---------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    names = [p.name for p in peers()]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, help="messages per run (default 200 000)")
    ap.add_argument("--runs", type=int, help="runs per figure, median reported (default 3)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 20 000 messages, 1 run")
    ap.add_argument("--only", nargs="+", choices=names, metavar="PEER", help=f"of {names}")
    ap.add_argument("--no-install", action="store_true", help="skip peers that are missing")
    ap.add_argument(
        "--no-latency",
        dest="latency",
        action="store_false",
        help="skip the end-to-end latency runs at --latency-rate",
    )
    ap.add_argument("--latency-rate", type=float, default=2000.0, help="msg/s (default 2000)")
    ap.add_argument("--latency-seconds", type=float, help="seconds per run (default 5; quick 1)")
    ap.add_argument("--out", type=Path, help="JSON file (default bench/results/peers.json)")
    ap.add_argument(
        "--no-compare", action="store_true", help="do not run bench/compare.py at the end"
    )
    args = ap.parse_args(argv)
    args.messages = args.messages or (20_000 if args.quick else 200_000)
    args.runs = args.runs or (1 if args.quick else 3)
    args.latency_seconds = args.latency_seconds or (1.0 if args.quick else 5.0)
    if args.out is None:
        args.out = RESULTS / ("peers-quick.json" if args.quick else "peers.json")
    return args


def _check(peer: Peer, no_install: bool) -> None:
    if no_install:
        missing = [d for d, exe in peer.needs.debs.items() if not install.have_executable(exe)]
        missing += [p for p, mod in peer.needs.pips.items() if not install.have_module(mod)]
        if missing:
            peer.skipped = "missing " + ", ".join(missing) + " (--no-install)"
        return
    reason, notes = install.ensure(peer.needs)
    peer.skipped = reason
    peer.notes += notes


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    chosen = [p for p in peers() if not args.only or p.name in args.only]
    for peer in chosen:
        _check(peer, args.no_install)
        if peer.skipped:
            print(f"[peers] skipping {peer.name}: {peer.skipped}", file=sys.stderr, flush=True)
    batches = wl.build(args.messages)
    started = time.time()
    for peer in chosen:
        if peer.skipped:
            continue
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix=f"peers-{peer.name}-") as tmp:
                t0 = time.perf_counter()
                marks = _cpu_marks()
                try:
                    result = peer.run_once(Path(tmp), batches, args)
                except Exception as exc:  # one peer failing must not lose the others
                    peer.notes.append(f"run {i + 1} failed: {type(exc).__name__}: {exc}")
                    print(f"[peers] {peer.name} run {i + 1} failed: {exc}", file=sys.stderr)
                    continue
                result["others_cores"] = others_cores(marks, _cpu_marks(), time.perf_counter() - t0)
                peer.runs.append(result)
                shown = ", ".join(f"{k} {v:,.1f}" for k, v in result.items())
                print(
                    f"[peers] {peer.name} run {i + 1}/{args.runs} "
                    f"({time.perf_counter() - t0:.0f} s): {shown}",
                    file=sys.stderr,
                    flush=True,
                )
        if not peer.runs:
            peer.skipped = "every run failed: " + "; ".join(peer.notes[-1:])
    print(
        f"\n{wl.total(batches):,} messages of {wl.BODY_BYTES} B, {wl.KEYS} keys, "
        f"{wl.QUEUES} queues, batches of {wl.BATCH}; {wl.CALLERS} callers/s: "
        f"{min(wl.total(batches), wl.CALLERS_MESSAGES):,} single sends from {wl.CALLERS} "
        f"concurrent callers, each awaiting its reply (Redis only); median of {args.runs} "
        "run(s); (+x%) against the reference figures\n"
    )
    print(table(chosen, args.latency))
    for peer in chosen:
        busy = max((r.get("others_cores", 0.0) for r in peer.runs), default=0.0)
        if busy >= OTHERS_NOTICEABLE:
            peer.notes.append(
                f"other processes used up to {busy:.2f} of a core during its runs "
                f"(of {os.cpu_count()}): its figures may be low"
            )
        for note in peer.notes:
            print(f"note: {peer.name}: {note}")
    report: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 1),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "workload": {
            "messages": wl.total(batches),
            "body_bytes": wl.BODY_BYTES,
            "keys": wl.KEYS,
            "queues": wl.QUEUES,
            "batch": wl.BATCH,
            "callers": wl.CALLERS,
            "callers_messages": min(wl.total(batches), wl.CALLERS_MESSAGES),
            "runs": args.runs,
        },
        "peers": {
            p.name: {
                "system": p.system,
                "setting": p.setting,
                "skipped": p.skipped,
                "median": p.median() if p.runs else {},
                "runs": p.runs,
                "reference": REFERENCE.get(p.name),
                "notes": p.notes,
            }
            for p in chosen
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    if not args.no_compare:
        compare_with_ordermq(args)
    return 0 if any(p.runs for p in chosen) else 1


def compare_with_ordermq(args: argparse.Namespace) -> None:
    """Run bench/compare.py on these results and ordermq's (`make bench`) of the same kind
    (quick.json for --quick); a missing or failing comparison does not fail the run."""
    ordermq = RESULTS / ("quick.json" if args.quick else "latest.json")
    out = RESULTS / ("comparison-quick.json" if args.quick else "comparison.json")
    cmd = [sys.executable, str(COMPARE), "--ordermq", str(ordermq), "--peers", str(args.out)]
    print(f"\n$ bench/compare.py --ordermq {ordermq.name} --peers {args.out.name}", flush=True)
    try:
        subprocess.run([*cmd, "--out", str(out)], check=False, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"comparison failed: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
