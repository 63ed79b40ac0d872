"""bench/run.py's stream group: clients forced onto Exchange, the count of what the
stream writers write, and the batched/plain ratios (bench/stream.py)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig
from mockbroker.embedded import EmbeddedBroker
from sdk import Message, ProducerConfig
from sdk._transport.broker_client import BrokerClient
from sdk.aio import Producer
from tests.support import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import stream as st
from figures import Figure, Run

TOPIC = "stream-bench"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """Without the Exchange port, as the stream group's: both ways are gRPC's."""
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "broker", exchange_port=None)) as b:
        yield b


async def _send(address: str, sends: int) -> None:
    """`sends` concurrent single sends on a producer without an accumulator."""
    async with Producer(address, config=ProducerConfig(accumulator=None)) as producer:
        await producer.send(Message(TOPIC, b"warm"))
        await asyncio.gather(*(producer.send(Message(TOPIC, b"x")) for _ in range(sends)))


def test_clients_made_in_plain_exchange_s_context_write_on_exchange_the_others_batched(
    broker: EmbeddedBroker,
) -> None:
    async def main() -> tuple[st.WriterCount, st.WriterCount]:
        admin = BrokerClient(broker.address)
        await admin.create_topic(TOPIC, 4)
        await admin.close()
        with st.counting() as written, st.forcing():
            with st.plain_exchange():
                await _send(broker.address, 8)
            plain = st.WriterCount(dict(written.requests), written.messages)
            written.reset()
            await _send(broker.address, 8)
            return plain, written

    plain, batched = asyncio.run(main())
    # 9 sends each (a warm-up and 8), and nothing else on the streams
    assert plain.requests == {"batched": 0, "plain": 9} and plain.messages == 0
    assert plain.per_message("plain") == 1.0 and plain.per_message("batched") is None
    plain.check("plain", "plain")
    with pytest.raises(RuntimeError, match="meant to run on batched streams"):
        plain.check("batched", "plain")
    assert batched.requests == {"batched": 9, "plain": 0}
    assert 1 <= batched.messages <= 9
    per_message = batched.per_message("batched")
    assert per_message is not None and per_message == 9 / batched.messages
    batched.check("batched", "batched")


def test_the_check_lets_the_other_way_s_idle_clients_through_and_no_more() -> None:
    count = st.WriterCount({"batched": 4000, "plain": 3}, 500)
    count.check("batched", "idle plain clients")
    count.requests["plain"] = 400
    with pytest.raises(RuntimeError, match="meant to run on batched streams"):
        count.check("batched", "a plain client of the batched way")
    with pytest.raises(RuntimeError, match="meant to run on plain streams"):
        st.WriterCount({"batched": 0, "plain": 0}).check("plain", "nothing written")


def test_the_counting_and_the_forcing_end_with_their_blocks(broker: EmbeddedBroker) -> None:
    import sdk._transport.exchange as exchange_module

    init, writable = exchange_module.Exchange.__init__, exchange_module._Stream._writable
    join = exchange_module.join_repeated
    with pytest.raises(RuntimeError, match="outside forcing"), st.plain_exchange():
        pass
    with st.counting(), st.forcing(), st.plain_exchange():
        assert exchange_module.Exchange.__init__ is not init
        assert exchange_module.join_repeated is not join
    assert exchange_module.Exchange.__init__ is init
    assert exchange_module._Stream._writable is writable
    assert exchange_module.join_repeated is join


def _figure(key: str, value: float, client_cpu: float, server_cpu: float) -> Figure:
    figure = Figure(key, key, "msg/s" if "callers" in key else "ms", {})
    figure.runs = [Run(value, 1.0, 100, client_cpu, server_cpu, rate=1000.0)]
    return figure


def test_ratios_set_each_batched_figure_against_its_plain_one() -> None:
    figures = [
        _figure("stream.batched.callers8", 3000, 0.4, 0.5),
        _figure("stream.plain.callers8", 2000, 0.8, 0.5),
        _figure("stream.batched.e2e.aio.rate2000.p99", 2.0, 0.3, 0.3),
        _figure("stream.plain.e2e.aio.rate2000.p99", 4.0, 0.3, 0.6),
        _figure("stream.batched.e2e.push.rate2000.p99", 2.0, 0.3, 0.3),  # plain one missing
        _figure("produce.async.inflight1", 50_000, 0.5, 0.5),
    ]
    ratios = st.ratios(figures)
    assert ratios == {
        "callers8": {"value": 1.5, "client_us_per_msg": 0.5, "broker_us_per_msg": 1.0},
        # latency figures: CPU per message from their rate
        "e2e.aio.rate2000.p99": {"value": 0.5, "client_us_per_msg": 1.0, "broker_us_per_msg": 0.5},
    }
    line = st.comparison(figures, {"callers8": {"batched": 7.5, "plain": 1.0}})
    assert "callers8 3,000 vs 2,000 msg/s (1.50x, client CPU/msg 0.50x" in line
    assert "e2e.aio.rate2000.p99 2.00 vs 4.00 ms (0.50x)" in line
    assert "requests per ExchangeBatched message: callers8 7.50" in line
    assert st.comparison(figures[-1:], {}) == ""
