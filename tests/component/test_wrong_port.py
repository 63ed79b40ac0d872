"""A client pointed at a port of another protocol is told so, at once, by name.

An ordermq gRPC client at the name server's or the broker's RocketMQ remoting port, or at
the RocketMQ 5 gRPC port; a `rocketmq://` client at a gRPC port. Each gets
WrongProtocolError naming what answers there, not "cannot reach the broker within 5s"
(gRPC retrying a handshake that cannot succeed) or "Method not found!".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerOrderly,
    Producer,
    PushConsumer,
)
from sdk.errors import WrongProtocolError


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    data = tmp_path_factory.mktemp("wrong-port") / "data"
    config = BrokerConfig(data_dir=data, remoting_port=0, namesrv_port=0, v2_port=0,
                          exchange_port=0)  # fmt: skip
    with EmbeddedBroker(config) as b:
        yield b


class Never(MessageListenerOrderly):
    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        raise AssertionError("no message can arrive through a port of another protocol")


def refused(attempt: Callable[[], object]) -> WrongProtocolError:
    """The error `attempt` raised: WrongProtocolError, where a client that only timed out
    would raise "cannot reach the broker" (BrokerUnavailableError)."""
    with pytest.raises(WrongProtocolError) as caught:
        attempt()
    return caught.value


def send_with(endpoints: str) -> Callable[[], object]:
    def send() -> object:
        with Producer(endpoints) as producer:
            return producer.send(Message("wrong-port", b"x", sharding_key="k"))

    return send


@pytest.mark.parametrize("port", ["namesrv_address", "remoting_address"])
def test_an_ordermq_client_at_a_remoting_port_is_told_to_use_rocketmq(
    broker: EmbeddedBroker, port: str
) -> None:
    address = getattr(broker, port)
    error = refused(send_with(address))
    assert f"{address} answers RocketMQ remoting" in str(error)
    assert f"rocketmq://{address}" in str(error)


def test_an_ordermq_client_at_the_exchange_port_is_told_to_give_the_grpc_port(
    broker: EmbeddedBroker,
) -> None:
    address = broker.exchange_address
    assert address is not None
    error = refused(send_with(address))
    assert f"{address} is an ordermq broker's Exchange port" in str(error)


def test_an_ordermq_client_at_the_rocketmq5_port_is_told_what_answers_there(
    broker: EmbeddedBroker,
) -> None:
    error = refused(send_with(broker.v2_address))
    assert f"{broker.v2_address} answers RocketMQ 5's gRPC" in str(error)
    consumer = PushConsumer("wrong-port", broker.v2_address)
    consumer.subscribe("wrong-port")
    consumer.register_message_listener(Never())
    error = refused(consumer.start)
    assert "RocketMQ 5's gRPC" in str(error)


@pytest.mark.parametrize("port", ["address", "v2_address"])
def test_a_rocketmq_client_at_a_grpc_port_is_told_to_drop_the_scheme(
    broker: EmbeddedBroker, port: str
) -> None:
    address = getattr(broker, port)
    error = refused(send_with(f"rocketmq://{address}"))
    assert f"{address} answers gRPC (HTTP/2), not RocketMQ remoting" in str(error)


def test_the_right_ports_still_work(broker: EmbeddedBroker) -> None:
    assert send_with(broker.address)() is not None
    assert send_with(f"rocketmq://{broker.namesrv_address}")() is not None


def test_the_broker_logs_a_grpc_client_at_its_remoting_port_as_such(
    broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(WrongProtocolError):
        send_with(broker.remoting_address)()
    closed = [r.getMessage() for r in caplog.records if r.name == "ordermq.broker.remoting"]
    assert any("an HTTP/2 (gRPC) client's preface" in m for m in closed), closed
    assert not any("bytes is over the limit" in m for m in closed), closed  # nor the TLS probe
