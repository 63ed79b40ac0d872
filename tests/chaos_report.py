"""The fault suite's summary table: one row per fault test, printed after every run.

A fault test takes the `chaos_report` fixture (tests/conftest.py) and records what it drove
and what it found: `chaos_report.record(rounds=..., acked=..., lost=..., ...)`. After the
run, pytest prints the rows as a table (`make test` and `make chaos` both do), and writes
them as JSON to the path in ORDERMQ_CHAOS_REPORT when that is set (docs/reliability.md
quotes such a file).

ORDERMQ_CHAOS=long selects the long form: `scaled(short, long)` gives each test its number
of rounds, iterations or seconds for the form in use.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: `make chaos` sets it; `make test` runs the short, bounded form.
LONG = os.environ.get("ORDERMQ_CHAOS", "") == "long"
REPORT_PATH_ENV = "ORDERMQ_CHAOS_REPORT"


def scaled(short: int, long: int) -> int:
    """`long` under `make chaos`, `short` otherwise."""
    return long if LONG else short


@dataclass
class ChaosRow:
    """What one fault test drove and found."""

    test: str
    fault: str
    rounds: int
    acked: int
    lost: int
    order_violations: int
    duplicates: int
    note: str = ""


@dataclass
class ChaosReport:
    """The rows of one pytest run."""

    rows: list[ChaosRow] = field(default_factory=list)

    def table(self) -> str:
        """The rows as an aligned text table."""
        head = ("test", "fault", "rounds", "acked", "lost", "order viol.", "dups", "note")
        cells = [head] + [
            (
                r.test,
                r.fault,
                str(r.rounds),
                str(r.acked),
                str(r.lost),
                str(r.order_violations),
                str(r.duplicates),
                r.note,
            )
            for r in self.rows
        ]
        widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def write(self, path: Path) -> None:
        """Save the rows as JSON (a list of objects)."""
        path.write_text(json.dumps([asdict(r) for r in self.rows], indent=2) + "\n")


class ChaosRecorder:
    """What a fault test gets from the `chaos_report` fixture: its own row to record."""

    def __init__(self, report: ChaosReport, test: str) -> None:
        self._report = report
        self._test = test

    def record(
        self,
        *,
        fault: str,
        rounds: int,
        acked: int,
        lost: int,
        order_violations: int,
        duplicates: int,
        note: str = "",
    ) -> None:
        """Add this test's row (a test may add several, one per fault it drove)."""
        self._report.rows.append(
            ChaosRow(self._test, fault, rounds, acked, lost, order_violations, duplicates, note)
        )
