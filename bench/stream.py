"""The stream group's tools: clients forced onto plain Exchange, and a count of what the
SDK's stream writers write (bench/run.py's `stream` group, issues 35 and 40).

The SDK writes on ExchangeBatched by default (several requests to a stream message);
within `forcing()`, `plain_exchange()` makes the clients created in its context use plain
Exchange (one request to a stream message), as against a broker that does not serve
ExchangeBatched, so that both ways can run side by side in one process. `WriterCount`
counts, in this process only, the requests the writers write and the stream messages
they make of them, per kind of stream, so that a figure can say how many requests a
message carried and check that it ran on the streams it meant to.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import statistics
from collections.abc import Iterable, Iterator
from typing import Any

from figures import Figure

import sdk._transport.exchange as exchange_module

#: The two ways the group measures, in the order they take turns: figure key part, name.
MODES = (("batched", "ExchangeBatched"), ("plain", "Exchange"))


#: Whether clients made in this context use plain Exchange (see `plain_exchange`).
_PLAIN: contextvars.ContextVar[bool] = contextvars.ContextVar("bench_plain_exchange", default=False)


@contextlib.contextmanager
def forcing() -> Iterator[None]:
    """Let `plain_exchange()` decide, meanwhile, which stream the clients made use."""
    cls = exchange_module.Exchange
    original = cls.__init__

    def init(self: Any, open_stream: Any, target: str, connected: Any = None,
             open_batched: Any = None, *rest: Any) -> None:  # fmt: skip
        original(
            self, open_stream, target, connected, None if _PLAIN.get() else open_batched, *rest
        )

    cls.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__init__ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def plain_exchange() -> Iterator[None]:
    """Clients (BrokerClient, so producers and consumers) made in this context use
    Exchange only: made meanwhile, or later by tasks started meanwhile (a consumer's,
    say: tasks inherit the context), within `forcing()`. Their Exchange is made without
    ExchangeBatched, as the SDK does after a broker answered UNIMPLEMENTED to it."""
    if exchange_module.Exchange.__init__.__module__ != __name__:
        raise RuntimeError("plain_exchange() outside forcing() changes nothing")
    token = _PLAIN.set(True)
    try:
        yield
    finally:
        _PLAIN.reset(token)


#: What `WriterCount.check` lets the other way's idle clients write during a run.
OTHER_WAY_SHARE = 0.01
OTHER_WAY_MOST = 16


@dataclasses.dataclass
class WriterCount:
    """Requests written and stream messages written by this process's Exchange writers.

    `requests[kind]`: requests written on streams of that kind ("batched": ExchangeBatched,
    "plain": Exchange); `messages`: ExchangeBatched messages written (an Exchange stream
    writes one message per request, so its messages are its requests).
    """

    requests: dict[str, int] = dataclasses.field(default_factory=lambda: {"batched": 0, "plain": 0})
    messages: int = 0

    def reset(self) -> None:
        self.requests = {"batched": 0, "plain": 0}
        self.messages = 0

    def per_message(self, mode: str) -> float | None:
        """Requests a stream message carried (None: nothing was written that way)."""
        if mode == "plain":
            return 1.0 if self.requests["plain"] else None
        return self.requests["batched"] / self.messages if self.messages else None

    def check(self, mode: str, what: str) -> None:
        """Raise unless what was counted was written on `mode`'s streams.

        The other way's clients may be up, idle, meanwhile: their few requests (a long
        poll renewed, offsets committed) are let through, OTHER_WAY_SHARE of `mode`'s at
        most; a client of `mode` on the other way's streams writes as many as `mode`'s.
        """
        other = "plain" if mode == "batched" else "batched"
        ours, theirs = self.requests[mode], self.requests[other]
        if not ours or theirs > max(OTHER_WAY_MOST, ours * OTHER_WAY_SHARE):
            raise RuntimeError(
                f"{what}: meant to run on {mode} streams, wrote {self.requests} requests"
            )


@contextlib.contextmanager
def counting() -> Iterator[WriterCount]:
    """Count what every Exchange stream writer of this process writes meanwhile.

    Wraps the writer's `_writable` (true once per request it writes, on either kind of
    stream) and `join_repeated` (once per ExchangeBatched message); a Python call more
    per request on both kinds, so the CPU figures of both ways carry it.
    """
    count = WriterCount()
    stream_cls = exchange_module._Stream
    writable = stream_cls._writable
    join = exchange_module.join_repeated

    def counted_writable(self: Any, envelope: Any) -> bool:
        taken = writable(self, envelope)
        if taken:
            count.requests["batched" if self._batched else "plain"] += 1
        return taken

    def counted_join(serialized: Iterable[bytes]) -> bytes:
        count.messages += 1
        return join(serialized)

    stream_cls._writable = counted_writable  # type: ignore[method-assign]
    exchange_module.join_repeated = counted_join
    try:
        yield count
    finally:
        stream_cls._writable = writable  # type: ignore[method-assign]
        exchange_module.join_repeated = join


def ratios(figures: list[Figure]) -> dict[str, dict[str, float | None]]:
    """Per workload of the stream group, batched over plain of the same run (medians):
    the figure itself, and client and broker CPU per message."""
    summaries = {f.key: f.summary() for f in figures if f.key.startswith("stream.") and f.runs}
    out: dict[str, dict[str, float | None]] = {}
    for key, batched in summaries.items():
        if not key.startswith("stream.batched."):
            continue
        workload = key.removeprefix("stream.batched.")
        plain = summaries.get(f"stream.plain.{workload}")
        if plain is None:
            continue
        out[workload] = {
            "value": _ratio(batched["median"], plain["median"]),
            "client_us_per_msg": _ratio(
                batched["client_cpu_us_per_unit"], plain["client_cpu_us_per_unit"]
            ),
            "broker_us_per_msg": _ratio(
                batched["server_cpu_us_per_unit"], plain["server_cpu_us_per_unit"]
            ),
        }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def comparison(figures: list[Figure], per_message: dict[str, dict[str, float | None]]) -> str:
    """A line setting ExchangeBatched's figures against Exchange's (if the group ran)."""
    medians = {f.key: statistics.median(f.values()) for f in figures if f.values()}
    found = ratios(figures)
    parts = []
    for workload, r in found.items():
        unit = "msg/s" if workload.startswith("callers") else "ms"
        cpu = ""
        if workload.startswith("callers"):
            cpu = (
                f", client CPU/msg {_x(r['client_us_per_msg'])}, "
                f"broker CPU/msg {_x(r['broker_us_per_msg'])}"
            )
        parts.append(
            f"{workload} {_num(medians[f'stream.batched.{workload}'])} vs "
            f"{_num(medians[f'stream.plain.{workload}'])} {unit} ({_x(r['value'])}{cpu})"
        )
    if not parts:
        return ""
    carried = "; ".join(
        f"{what} {_num(modes.get('batched'))}" for what, modes in per_message.items()
    )
    return f"ExchangeBatched vs Exchange (batched/plain): {'; '.join(parts)}" + (
        f"\nrequests per ExchangeBatched message: {carried}" if carried else ""
    )


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"
