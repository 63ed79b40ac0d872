"""The fault proxy's pipe (tests/faultproxy.py): forwarding, delay, jitter, rate, blackhole.

A Pipe reads from an asyncio.StreamReader fed by the test and writes to a recording sink,
on a fake clock: no sockets, no sleeping. The proxy's sockets, CONNECT handshake and
resets are tested in tests/component/test_faultproxy.py.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from sdk.testing import FakeClock
from tests.faultproxy import Link, LinkFaults, Pipe


class Sink:
    """Records what the pipe writes, with the fake time of each write."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self.writes: list[tuple[float, bytes]] = []
        self.eof = False

    def write(self, data: bytes) -> None:
        assert not self.eof, "a write after the end"
        self.writes.append((self._clock.now() - START, data))

    async def drain(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    @property
    def data(self) -> bytes:
        return b"".join(d for _, d in self.writes)


START = 1000.0  # small: the sums keep their precision


async def settle() -> None:
    """Let every ready task run until they all wait (on the clock or on data)."""
    for _ in range(20):
        await asyncio.sleep(0)


class Rig:
    """A pipe from a fed reader to a recording sink, over a link, on a fake clock."""

    def __init__(self, faults: LinkFaults | None = None, seed: int = 1) -> None:
        self.clock = FakeClock(START)
        self.reader = asyncio.StreamReader()
        self.sink = Sink(self.clock)
        self.link = Link(faults)
        self.pipe = Pipe(self.reader, self.sink, self.link, self.clock, random.Random(seed))
        self.task = asyncio.create_task(self.pipe.run())

    async def feed(self, *chunks: bytes) -> None:
        """Each chunk as one read: the pipe takes it before the next arrives."""
        for chunk in chunks:
            self.reader.feed_data(chunk)
            await settle()

    async def advance(self, seconds: float, step: float = 0.001) -> None:
        """Move the clock in small steps, letting the pipe act at each."""
        for _ in range(round(seconds / step)):
            self.clock.advance(step)
            await settle()

    async def end(self) -> None:
        self.reader.feed_eof()
        await settle()


def near(seconds: float, step: float = 0.001) -> Any:
    """A time the clock reaches in steps of `step`: at most one step late."""
    return pytest.approx(seconds + step / 2, abs=step / 2 + 1e-9)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def test_it_forwards_the_bytes_in_order_and_then_the_end() -> None:
    async def test() -> None:
        rig = Rig()
        await rig.feed(b"one ", b"two ", b"three")
        assert rig.sink.data == b"one two three"
        assert not rig.sink.eof
        await rig.end()
        await asyncio.wait_for(rig.task, 1)
        assert rig.sink.eof
        assert (rig.pipe.stats.chunks, rig.pipe.stats.bytes) == (3, 13)

    run(test)


def test_it_delays_each_chunk_by_the_links_delay() -> None:
    async def test() -> None:
        rig = Rig(LinkFaults(delay=0.2))
        await rig.feed(b"a")
        await rig.advance(0.1)
        await rig.feed(b"b")
        await rig.advance(0.099)
        assert rig.sink.writes == [], "forwarded before its delay"
        await rig.advance(0.002)
        assert [d for _, d in rig.sink.writes] == [b"a"]
        await rig.advance(0.1)
        assert rig.sink.writes == [(near(0.2), b"a"), (near(0.3), b"b")]
        await rig.end()
        await rig.advance(0.19)
        assert not rig.sink.eof
        await rig.advance(0.02)
        assert rig.sink.eof, "the end comes after the delay too"

    run(test)


def test_jitter_varies_the_delay_but_never_reorders_the_stream() -> None:
    async def test() -> None:
        rig = Rig(LinkFaults(delay=0.05, jitter=0.04), seed=7)
        chunks = [f"{i:03d}".encode() for i in range(100)]
        for chunk in chunks:
            await rig.feed(chunk)
            await rig.advance(0.002)  # chunks 2 ms apart, delays 10..90 ms: they would cross
        await rig.advance(0.1)
        assert [d for _, d in rig.sink.writes] == chunks
        gaps = [b[0] - a[0] for a, b in zip(rig.sink.writes, rig.sink.writes[1:], strict=False)]
        assert min(gaps) >= 0
        assert max(gaps) > 0.01, "the jitter should show as uneven spacing"

    run(test)


def test_the_rate_limit_spaces_chunks_by_their_size() -> None:
    async def test() -> None:
        rig = Rig(LinkFaults(rate=1000.0))
        await rig.feed(b"x" * 100, b"y" * 300, b"z" * 100)
        await rig.advance(0.6, step=0.01)
        times = [t for t, _ in rig.sink.writes]
        assert times == [near(0.1, 0.01), near(0.4, 0.01), near(0.5, 0.01)]

    run(test)


def test_a_blackhole_holds_everything_and_a_heal_forwards_what_waited_in_order() -> None:
    async def test() -> None:
        rig = Rig(LinkFaults(delay=0.01))
        await rig.feed(b"before ")
        rig.link.set(LinkFaults(delay=0.01, blackhole=True))  # the chunk is still on its way
        await rig.feed(b"during ", b"the partition")
        await rig.advance(5.0, step=0.05)
        assert rig.sink.writes == [], "a blackhole forwarded something"
        # The read that was waiting when the blackhole began takes one chunk; no more.
        assert rig.pipe.held == len(b"before during "), "a blackholed pipe kept reading"
        rig.link.set(LinkFaults(delay=0.01))  # heal
        await settle()
        await rig.advance(0.02)
        assert rig.sink.data == b"before during the partition"

    run(test)


def test_a_blackhole_can_start_before_anything_was_sent_and_the_end_waits_too() -> None:
    async def test() -> None:
        rig = Rig(LinkFaults(blackhole=True))
        await rig.feed(b"held")
        await rig.end()
        await rig.advance(1.0, step=0.1)
        assert (rig.sink.writes, rig.sink.eof) == ([], False)
        rig.link.set(LinkFaults())
        await settle()
        assert (rig.sink.data, rig.sink.eof) == (b"held", True)

    run(test)


@pytest.mark.parametrize(
    "faults",
    [
        {"delay": -1.0},
        {"jitter": -0.1},
        {"rate": 0.0},
    ],
)
def test_impossible_faults_are_refused(faults: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        LinkFaults(**faults)
