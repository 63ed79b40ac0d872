"""What bench/run.py measures: runs, figures, and the table they print as."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
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
