"""What bench/run.py measures: runs, figures, and the table they print as."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Run:
    """One timed run: `units` done in `seconds`; CPU as fractions of one core.

    `rate` is units per second when `value` is not (latency figures); `detail` holds
    what else a run measured (e.g. the maximum latency).
    """

    value: float
    seconds: float
    units: int
    client_cpu: float | None = None
    server_cpu: float | None = None
    rate: float | None = None
    detail: dict[str, float] | None = None
    other_cpu: float | None = None  # what other processes used meanwhile (cores)


@dataclass
class Timing:
    """What _timed measured: units, seconds, CPU shares (client, server, everything else)."""

    units: int
    seconds: float
    client_cpu: float
    server_cpu: float | None
    other_cpu: float | None

    def run(
        self, value: float, rate: float | None = None, detail: dict[str, float] | None = None
    ) -> Run:
        return Run(
            value,
            self.seconds,
            self.units,
            self.client_cpu,
            self.server_cpu,
            rate,
            detail,
            self.other_cpu,
        )

    def cpu_text(self) -> str:
        return (
            f"client CPU {_pct(self.client_cpu)}, server CPU {_pct(self.server_cpu)}, "
            f"other processes {_pct(self.other_cpu)}"
        )


@dataclass
class Figure:
    """One line of the table: the runs of one workload and their summary."""

    key: str
    title: str
    unit: str
    params: dict[str, Any]
    higher_is_better: bool = True
    runs: list[Run] = field(default_factory=list)
    per: str = ""  # what CPU time is counted per (default: "msg" for "msg/s" or "us/msg")

    @property
    def per_label(self) -> str:
        if self.per:
            return self.per
        if self.unit.endswith("/s"):
            return self.unit.removesuffix("/s").removesuffix("s")  # "msg/s" -> "msg"
        return self.unit.split("/")[-1]

    def values(self) -> list[float]:
        return [r.value for r in self.runs]

    def summary(self) -> dict[str, Any]:
        values = self.values()
        out: dict[str, Any] = {
            "key": self.key,
            "title": self.title,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "params": self.params,
            "cpu_per": self.per_label,
            "runs": [asdict(r) for r in self.runs],
        }
        if values:
            out.update(median=statistics.median(values), min=min(values), max=max(values))
            other = [r.other_cpu for r in self.runs if r.other_cpu is not None]
            out["other_cpu_median"] = statistics.median(other) if other else None
            for side in ("client_cpu", "server_cpu"):
                cpu = [getattr(r, side) for r in self.runs if getattr(r, side) is not None]
                out[f"{side}_median"] = statistics.median(cpu) if cpu else None
                # CPU seconds per unit, in microseconds: steadier than throughput under noise.
                per = [
                    getattr(r, side) / (r.rate or r.value) * 1e6
                    for r in self.runs
                    if getattr(r, side) is not None and (r.rate or r.value)
                ]
                out[f"{side}_us_per_unit"] = statistics.median(per) if per else None
        return out


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _cpu(share: float | None, per_unit: float | None, per: str) -> str:
    if share is None or per_unit is None:
        return "-"
    return f"{share * 100:.0f}% {fmt(per_unit)} us/{per}"


def table(figures: list[Figure]) -> str:
    """The results as a fixed-width text table (medians, min and max of the runs)."""
    header = ("figure", "median", "min", "max", "unit", "client CPU", "server CPU", "others")
    rows = [header]
    for f in figures:
        s = f.summary()
        if "median" not in s:
            rows.append((f.title, "failed", "", "", f.unit, "", "", ""))
            continue
        rows.append(
            (
                f.title,
                fmt(s["median"]),
                fmt(s["min"]),
                fmt(s["max"]),
                f.unit,
                _cpu(s.get("client_cpu_median"), s.get("client_cpu_us_per_unit"), f.per_label),
                _cpu(s.get("server_cpu_median"), s.get("server_cpu_us_per_unit"), f.per_label),
                _pct(s.get("other_cpu_median")),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            cell.ljust(widths[i]) if i in (0, 4) else cell.rjust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---------------------------------------------------------------------- the keyed workload
#: The keyed workload of issue 35, the report's first table: figure keys in row order
#: (batches of 100 mixed keys in arrival order, 1 in flight; single sends from 8 callers:
#: asyncio tasks, and threads on the blocking producer).
KEYED_KEYS = (
    "produce.async.mixed.inflight1",
    "produce.sync.mixed.inflight1",
    "produce.async.mixed.callers8",
    "produce.sync.mixed.callers8",
    "produce.async.mixed.threads8",
    "produce.sync.mixed.threads8",
)
#: The one-queue batch each keyed batch figure reads against (mixed >= one-queue is a goal).
ONE_QUEUE_OF = {
    "produce.async.mixed.inflight1": "produce.async.inflight1",
    "produce.sync.mixed.inflight1": "produce.sync.inflight1",
}
#: The gRPC floor of the same run the keyed figures read against: send-shaped payloads
#: (a real 100-message SendRequest's bytes), one in flight; messages per payload.
FLOOR_KEY = "floor.send.inflight1"
FLOOR_MESSAGES = 100
#: The peer and peer figure the keyed figures read against (bench/peers, make bench-peers).
REDIS_PEER = "redis-everysec"
REDIS_MISSING = "- (make bench-peers)"


#: The keyed figures of single sends from concurrent callers: they also read against the
#: peer's figure of the same shape (PeerFigure.callers), not only its pipelined batches.
CALLERS_KEYS = (
    "produce.async.mixed.callers8",
    "produce.sync.mixed.callers8",
    "produce.async.mixed.threads8",
    "produce.sync.mixed.threads8",
)


@dataclass(frozen=True)
class PeerFigure:
    """A peer's produce rates in msg/s (medians), and where they were measured.

    `value`: batches of 100 pipelined (bench/peers' `produce`); `callers`: single sends
    from 8 concurrent callers, each awaiting its reply (`produce_callers`); `consume`: one
    group member reading the backlog and acknowledging each batch (`consume`); None when
    the peer's results do not have it.
    """

    name: str
    value: float
    source: str
    callers: float | None = None
    consume: float | None = None


def peer_produce(path: Path, peer: str = REDIS_PEER) -> PeerFigure | None:
    """`peer`'s produce medians from a bench/peers results file (make bench-peers), or None
    when the file is missing or unreadable, or the peer was skipped or not measured."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    entry = (data.get("peers") or {}).get(peer) or {}
    median = entry.get("median") or {}
    value = median.get("produce")
    if entry.get("skipped") or not value:
        return None
    callers = median.get("produce_callers")
    consume = median.get("consume")
    when = data.get("when") or data.get("timestamp") or "no timestamp"
    return PeerFigure(
        peer,
        float(value),
        f"{path.name} ({when})",
        float(callers) if callers else None,
        float(consume) if consume else None,
    )


#: The consume figures (issue 40) read against the peer's group read: orderly push
#: consumers (pull and push delivery) and poll loops over the same backlog.
CONSUME_KEYS = (
    "consume.orderly.async.batch1",
    "consume.orderly.threads.batch1",
    "consume.orderly.async.batch32",
    "consume.orderly.async.batch1.push",
    "consume.orderly.threads.batch1.push",
    "consume.orderly.async.batch32.push",
    "poll.aio",
    "poll.blocking",
    "poll.aio.pull",
    "poll.blocking.pull",
    "poll.blocking.listener",
)


def consume_ratios(figures: list[Figure], redis: PeerFigure | None) -> dict[str, float]:
    """Each consume figure measured, as a ratio to Redis Streams' group read (`consume`);
    empty without that figure."""
    if redis is None or not redis.consume:
        return {}
    medians = _medians(figures)
    return {k: round(medians[k] / redis.consume, 3) for k in CONSUME_KEYS if k in medians}


def consume_line(figures: list[Figure], redis: PeerFigure | None) -> str:
    """One line of the consume figures against Redis Streams' group read; empty when
    neither side was measured."""
    ratios = consume_ratios(figures, redis)
    if not ratios or redis is None or redis.consume is None:
        return ""
    titles = {f.key: f.title for f in figures}
    parts = ", ".join(f"{titles[k]} {r:.2f}x" for k, r in ratios.items())
    return (
        f"consume vs Redis Streams' group read (XREADGROUP + XACK, one reader, "
        f"{fmt(redis.consume)} msg/s, {redis.source}): {parts}"
    )


def _medians(figures: list[Figure]) -> dict[str, float]:
    return {f.key: statistics.median(f.values()) for f in figures if f.values()}


def keyed_ratios(figures: list[Figure], redis: PeerFigure | None) -> dict[str, dict[str, Any]]:
    """Per keyed figure measured: its median, broker CPU per message (us), and its ratios
    to the gRPC floor of the same run, to Redis Streams' pipelined batches (`vs_redis`),
    to Redis Streams' 8 concurrent callers (`vs_redis_callers`, the callers figures only)
    and (batches) to the one-queue batch of the same run; a ratio is None when its
    reference is missing."""
    medians = _medians(figures)
    floor = medians.get(FLOOR_KEY)
    floor_msgs = floor * FLOOR_MESSAGES if floor else None
    out: dict[str, dict[str, Any]] = {}
    for f in figures:
        if f.key not in KEYED_KEYS or f.key not in medians:
            continue
        value = medians[f.key]
        one_queue = medians.get(ONE_QUEUE_OF.get(f.key, ""))
        callers = redis.callers if redis and f.key in CALLERS_KEYS else None
        out[f.key] = {
            "median": value,
            "server_cpu_us_per_msg": f.summary().get("server_cpu_us_per_unit"),
            "vs_floor": round(value / floor_msgs, 3) if floor_msgs else None,
            "vs_redis": round(value / redis.value, 3) if redis else None,
            "vs_redis_callers": round(value / callers, 3) if callers else None,
            "vs_one_queue": round(value / one_queue, 3) if one_queue else None,
        }
    return out


def keyed_table(figures: list[Figure], redis: PeerFigure | None) -> str:
    """The keyed workload's table (issue 35), the report's first: each keyed figure's
    median, min, max, broker CPU per message and its ratios to the gRPC floor of the same
    run and to Redis Streams (AOF everysec): to its pipelined batches, and (the 8-caller
    rows) to its 8 concurrent callers, the same shape; with a note on where each reference
    comes from. Empty when no keyed figure ran."""
    ratios = keyed_ratios(figures, redis)
    if not ratios:
        return ""
    medians = _medians(figures)
    by_key = {f.key: f for f in figures}
    header = ("keyed workload", "median", "min", "max", "unit", "broker CPU",
              "vs gRPC floor", "vs Redis pipelined", "vs Redis 8 callers",
              "vs one-queue batch")  # fmt: skip
    rows = [header]
    for key in KEYED_KEYS:
        if key not in ratios:
            continue
        f, r = by_key[key], ratios[key]
        values = f.values()
        cpu = r["server_cpu_us_per_msg"]
        same_shape = ""  # a batch has no Redis figure of its shape beyond the pipelined one
        if key in CALLERS_KEYS:
            same_shape = (
                REDIS_MISSING if r["vs_redis_callers"] is None else f"{r['vs_redis_callers']:.2f}x"
            )
        rows.append(
            (
                f.title,
                fmt(r["median"]),
                fmt(min(values)),
                fmt(max(values)),
                f.unit,
                "-" if cpu is None else f"{fmt(cpu)} us/msg",
                "-" if r["vs_floor"] is None else f"{r['vs_floor']:.2f}x",
                REDIS_MISSING if r["vs_redis"] is None else f"{r['vs_redis']:.2f}x",
                same_shape,
                "" if r["vs_one_queue"] is None else f"{r['vs_one_queue']:.2f}x",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            c.ljust(widths[i]) if i in (0, 4) else c.rjust(widths[i]) for i, c in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    floor = medians.get(FLOOR_KEY)
    lines.append(
        f"gRPC floor (same run): bare grpc.aio, send-shaped {FLOOR_MESSAGES}-message payloads, "
        f"1 in flight: {fmt(floor * FLOOR_MESSAGES)} msg/s"
        if floor
        else "gRPC floor: not measured in this run (the floor group did not run)"
    )
    lines.append(redis_note(redis))
    return "\n".join(lines)


def redis_note(redis: PeerFigure | None) -> str:
    """The keyed table's line on the Redis Streams figures it reads against."""
    if redis is None:
        return (
            "Redis Streams: not measured (Redis is not installed here and there is no "
            "bench/results/peers.json): `make bench-peers` installs and measures it"
        )
    callers = (
        f"{fmt(redis.callers)} msg/s"
        if redis.callers
        else "not in those results (measured since: `make bench-peers`)"
    )
    return (
        f"Redis Streams (AOF everysec), from {redis.source}: pipelines of {FLOOR_MESSAGES} "
        f"XADD {fmt(redis.value)} msg/s; 8 callers (redis.asyncio, one process, each "
        f"XADD awaiting its reply before the caller's next) {callers}"
    )
