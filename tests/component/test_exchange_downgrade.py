"""A connected client whose broker is restarted as an older version, then upgraded again.

The older broker is the embedded broker without ExchangeBatched (or without Exchange
too): gRPC answers its clients UNIMPLEMENTED for those methods, as a broker of before
them does. The client falls back once for the connection that met the older broker,
and goes back to ExchangeBatched on the connection to the upgraded one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

import mockbroker.server
from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerOrderly,
    ProducerConfig,
    PushConsumer,
    PushConsumerConfig,
)
from sdk import Producer as BlockingProducer
from sdk._transport.broker_client import BrokerClient
from sdk.aio import Producer
from sdk.message import MessageQueue
from tests.component.pulling import read_queue
from tests.support import pinned, wait_until

T = TypeVar("T")
WAIT = 10.0  # seconds any awaited condition may take before the test fails
SERVICE = "ordermq.v1.MessagingService"
OLDER = {
    "without ExchangeBatched": ("ExchangeBatched",),
    "without ExchangeBatched and Exchange": ("ExchangeBatched", "Exchange"),
}


class _Without:
    """A grpc.aio server as add_service sees it: it leaves out `refused` of MessagingService.

    A call of a left-out method is recorded in `refused_calls` and answered UNIMPLEMENTED.
    """

    def __init__(self, server: grpc.aio.Server, refused: Sequence[str], calls: list[str]):
        self._server = server
        self._refused = frozenset(refused)
        self._calls = calls

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_Refusing(h, self._refused, self._calls) for h in handlers)
        )

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        handlers = {k: v for k, v in handlers.items() if k not in self._refused}
        self._server.add_registered_method_handlers(service, handlers)  # type: ignore[attr-defined]


class _Refusing(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, handler: Any, refused: frozenset[str], calls: list[str]) -> None:
        self._handler = handler
        self._refused = {f"/{SERVICE}/{name}" for name in refused}
        self._calls = calls

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        if details.method in self._refused:
            self._calls.append(details.method.rsplit("/", 1)[1])
            return None
        return self._handler.service(details)


class Versions:
    """One broker address and data directory, served by the current or an older broker."""

    def __init__(self, data_dir: Path) -> None:
        # Without the Exchange port: these are gRPC's methods (older brokers have no port).
        self.config = BrokerConfig(data_dir=data_dir, port=0, default_queues=4, exchange_port=None)
        self.broker: EmbeddedBroker | None = None
        #: Calls of a method the running older broker left out, in order.
        self.refused_calls: list[str] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.config.port}"

    def start(self, refused: Sequence[str] = ()) -> None:
        """Start the current broker, or with `refused` an older one without those methods."""
        self.refused_calls = calls = []
        original = mockbroker.server.add_service

        def add_service(server: grpc.aio.Server, service: Any, *args: Any) -> None:
            if service.full_name == SERVICE:
                server = _Without(server, refused, calls)  # type: ignore[assignment]
            original(server, service, *args)

        self.broker = EmbeddedBroker(self.config)
        mockbroker.server.add_service = add_service  # type: ignore[assignment]
        try:
            self.broker.start()
        finally:
            mockbroker.server.add_service = original  # type: ignore[assignment]
        self.config = pinned(self.config, self.broker)

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()
            self.broker = None

    def restart(self, refused: Sequence[str] = ()) -> None:
        self.stop()
        self.start(refused)


@pytest.fixture
def versions(tmp_path: Path) -> Iterator[Versions]:
    v = Versions(tmp_path / "broker")
    v.start()
    try:
        yield v
    finally:
        v.stop()


def run(main: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(6 * WAIT):
            return await main()

    return asyncio.run(bounded())


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    await asyncio.to_thread(wait_until, condition, WAIT, what)


def rpc(client: BrokerClient) -> str | None:
    """The method the client's Send and Pull travel on now (None: no stream open)."""
    exchange = client._exchange
    if not exchange.supported:
        return "unary"
    stream = exchange._stream
    if stream is None:
        return None
    return "ExchangeBatched" if stream._batched else "Exchange"


KEYS = [f"order-{k}" for k in range(4)]


async def send_round(producer: Producer, round_: int, per_key: int) -> list[str]:
    """`per_key` messages for each key, the keys at once, each key's in order; their bodies."""

    async def one_key(key: str) -> list[str]:
        bodies = []
        for i in range(per_key):
            body = f"{round_}:{key}:{i}"
            await producer.send(Message("orders", body.encode(), sharding_key=key))
            bodies.append(body)
        return bodies

    return [b for bodies in await asyncio.gather(*map(one_key, KEYS)) for b in bodies]


def stored(address: str) -> dict[str, list[str]]:
    """Each key's stored bodies, in queue order."""
    by_key: dict[str, list[str]] = {}
    for queue_id in range(4):
        for m in read_queue(address, MessageQueue("orders", "broker-a", queue_id)):
            assert m.sharding_key is not None
            by_key.setdefault(m.sharding_key, []).append(m.body.decode())
    return by_key


@pytest.mark.parametrize("older", list(OLDER))
def test_a_producer_sends_through_a_downgrade_and_back_on_exchange_batched_after(
    versions: Versions, older: str
) -> None:
    refused = OLDER[older]
    fallback = "Exchange" if refused == ("ExchangeBatched",) else "unary"
    config = ProducerConfig(retry_times=0)  # every send succeeds at its first attempt

    async def main() -> list[str]:
        sent: list[str] = []
        address = versions.address
        async with Producer(address, config=config) as producer:
            client = producer._core._transport.client(address)  # type: ignore[attr-defined]
            sent += await send_round(producer, 0, 5)
            assert rpc(client) == "ExchangeBatched"

            await asyncio.to_thread(versions.restart, refused)
            await wait_for(lambda: client._exchange._stream is None, "the stream to end")
            sent += await send_round(producer, 1, 5)
            assert rpc(client) == fallback
            # The fallback was taken once, by the first requests after the restart.
            assert versions.refused_calls == list(refused)
            sent += await send_round(producer, 2, 5)
            assert rpc(client) == fallback
            assert versions.refused_calls == list(refused)

            await asyncio.to_thread(versions.restart)
            if fallback == "Exchange":
                await wait_for(lambda: client._exchange._stream is None, "the stream to end")
            sent += await send_round(producer, 3, 5)
            assert rpc(client) == "ExchangeBatched"
        return sent

    sent = run(main)
    by_key = stored(versions.address)
    for key in KEYS:
        assert by_key[key] == [b for b in sent if b.split(":")[1] == key], key
    assert sum(map(len, by_key.values())) == len(sent) == 4 * 5 * 4


class Recorder(MessageListenerOrderly):
    """Records the bodies it consumes, in order."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        with self.lock:
            self.seen.extend(m.body.decode() for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS

    def distinct(self) -> list[str]:
        """Each body once, at its first delivery (a restart may deliver some again)."""
        with self.lock:
            return list(dict.fromkeys(self.seen))


def subscriptions(broker: EmbeddedBroker | None) -> int:
    assert broker is not None and broker.broker._messaging is not None
    return len(broker.broker._messaging.exchanges.subscriptions)


@pytest.mark.parametrize("older", list(OLDER))
def test_an_orderly_push_consumer_consumes_through_a_downgrade_and_back(
    versions: Versions, older: str
) -> None:
    refused = OLDER[older]
    address = versions.address
    config = PushConsumerConfig(
        suspend_current_queue_time=0.01, persist_interval=0.2, pull_error_backoff=0.2,
        delivery="push",
    )  # fmt: skip
    listener = Recorder()
    consumer = PushConsumer(
        "g", address, config=config, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
    )
    consumer.subscribe("orders", "*")
    consumer.register_message_listener(listener)
    sent: list[str] = []

    def send(round_: int) -> None:
        for i in range(5):
            for key in KEYS:
                body = f"{round_}:{key}:{i}"
                producer.send(Message("orders", body.encode(), sharding_key=key))
                sent.append(body)

    def consumed_all() -> bool:
        return len(listener.distinct()) == len(sent)

    def transport() -> BrokerClient:
        return consumer._core._transport.client(address)  # type: ignore[attr-defined,no-any-return]

    with BlockingProducer(address, config=ProducerConfig(retry_times=0)) as producer:
        consumer.start()
        try:
            send(0)
            wait_until(consumed_all, WAIT, "the first round")
            assert rpc(transport()) == "ExchangeBatched"
            assert subscriptions(versions.broker) == 4

            versions.restart(refused)
            send(1)
            wait_until(consumed_all, WAIT, "the round sent to the older broker")
            if refused == ("ExchangeBatched",):
                assert subscriptions(versions.broker) == 4  # on Exchange
                assert rpc(transport()) == "Exchange"
            else:
                assert not consumer._core._push  # pulls, unary
                assert rpc(transport()) == "unary"
            # The producer's and the consumer's connection each fell back once.
            assert versions.refused_calls.count("ExchangeBatched") == 2
            assert versions.refused_calls.count("Exchange") == 2 * ("Exchange" in refused)

            versions.restart()
            send(2)
            wait_until(consumed_all, WAIT, "the round sent to the upgraded broker")
            wait_until(lambda: rpc(transport()) == "ExchangeBatched", WAIT, "ExchangeBatched")
            if refused == ("ExchangeBatched",):
                assert subscriptions(versions.broker) == 4
            else:
                # Push delivery found not served stays off for the consumer's life: its
                # pulls travel on ExchangeBatched again.
                assert not consumer._core._push and subscriptions(versions.broker) == 0
        finally:
            consumer.shutdown()
    seen = listener.distinct()
    assert sorted(seen) == sorted(sent)
    for key in KEYS:
        assert [b for b in seen if b.split(":")[1] == key] == [
            b for b in sent if b.split(":")[1] == key
        ], key
