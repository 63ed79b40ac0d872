"""What a client is given is checked where the client is made: endpoints, configs, hooks.

Before, an endpoint with no port, a port that is no number or out of range, or spaces in
its host was accepted: the client's first call waited 5 s, then said it "cannot reach the
broker", as if the broker were down; "rocketmq://" with no name server failed with
"invalid literal for int()". A config of the wrong class raised AttributeError; a
`message_model` that is no MessageModel silently meant CLUSTERING; a NaN or text
`consume_timestamp`, an allocate strategy without `allocate` and hooks that cannot be
called were kept, to fail later inside the client's tasks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import sdk.aio
from sdk import (
    AllocateMessageQueueAveragelyByCircle,
    ConsumeFromWhere,
    LitePullConsumer,
    Producer,
    PushConsumer,
    SimpleConsumer,
)
from sdk._transport import connect
from sdk.errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("endpoints", "problem"),
    [
        ("broker", "is not 'host:port'"),
        ("broker:http", "is not 'host:port'"),
        ("broker:", "is not 'host:port'"),
        (":8081", "is not 'host:port'"),
        ("my broker:8081", "is not 'host:port'"),
        ("broker:8081/x", "is not 'host:port'"),
        ("broker:0", "port 0 is outside 1..65535"),
        ("broker:65536", "port 65536 is outside 1..65535"),
        ("h1:8081;h2", "is not 'host:port'"),
        ("rocketmq://", "names no host"),
        ("rocketmq://ns1:9876;ns2", "is not 'host:port'"),
        (["h1:8081", "h2:x"], "is not 'host:port'"),
    ],
)
def test_an_endpoint_that_is_not_host_and_port_is_refused_by_name(
    endpoints: str | list[str], problem: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=f"endpoint .*{problem}.*accepted: 'host:port'"):
        connect(endpoints)


@pytest.mark.parametrize(
    "endpoints",
    [
        "localhost:8081", "127.0.0.1:65535", "[::1]:8081", "[fe80::1:2]:1",
        "broker-a.example.com:8081", "broker_1:8081", " h1:1 ; h2:2 ", ["h1:1", "h2:2"],
        "rocketmq://ns1:9876;ns2:9876", "rocketmq://[::1]:9876",
    ],
)  # fmt: skip
def test_host_and_port_endpoints_are_accepted(endpoints: str | list[str]) -> None:
    connect(endpoints)


def test_every_client_refuses_a_bad_endpoint_where_it_is_made() -> None:
    for make in (
        lambda: Producer("broker"),
        lambda: LitePullConsumer("g", "broker:http"),
        lambda: PushConsumer("g", "broker:0"),
        lambda: SimpleConsumer("g", "my broker:1"),
    ):
        with pytest.raises(InvalidArgumentError, match="endpoint"):
            make()


ENDPOINT = "127.0.0.1:8081"
CONSUMERS: list[Callable[..., Any]] = [
    lambda **kw: LitePullConsumer("g", ENDPOINT, **kw),
    lambda **kw: PushConsumer("g", ENDPOINT, **kw),
    lambda **kw: sdk.aio.LitePullConsumer("g", ENDPOINT, **kw),
    lambda **kw: sdk.aio.PushConsumer("g", ENDPOINT, **kw),
]


@pytest.mark.parametrize(
    ("keywords", "problem"),
    [
        ({"config": 5}, "config must be a .*Config or None, not int"),
        ({"consume_from_where": ConsumeFromWhere.TIMESTAMP, "consume_timestamp": math.nan},
         "consume_timestamp must be a datetime or seconds since the epoch"),
        ({"consume_timestamp": "yesterday"}, "consume_timestamp must be"),
        ({"allocate_strategy": 5}, "allocate_strategy must have an allocate"),
        ({"on_queues_assigned": 5}, "on_queues_assigned must be callable"),
        ({"on_queues_revoked": "log"}, "on_queues_revoked must be callable"),
    ],
    ids=["config", "timestamp-nan", "timestamp-text", "strategy", "assigned", "revoked"],
)  # fmt: skip
@pytest.mark.parametrize("make", CONSUMERS, ids=["lite", "push", "aio-lite", "aio-push"])
def test_a_consumer_refuses_arguments_of_the_wrong_kind_where_it_is_made(
    make: Callable[..., Any], keywords: dict[str, object], problem: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=problem):
        make(**keywords)


def test_a_push_consumers_message_model_and_a_producers_config_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="message_model must be a MessageModel"):
        PushConsumer("g", ENDPOINT, message_model="BROADCASTING")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="config must be a ProducerConfig"):
        Producer(ENDPOINT, config=5)  # type: ignore[arg-type]


def test_the_right_kinds_are_accepted(tmp_path: Path) -> None:
    LitePullConsumer("g", ENDPOINT, consume_from_where=ConsumeFromWhere.TIMESTAMP,
                     consume_timestamp=1.7e9)  # fmt: skip
    PushConsumer(
        "g", ENDPOINT, allocate_strategy=AllocateMessageQueueAveragelyByCircle(),
        on_queues_assigned=print, on_queues_revoked=lambda queues: None,
        message_model=sdk.MessageModel.BROADCASTING, offset_dir=tmp_path,
    )  # fmt: skip


TRANSACTION_PRODUCERS: list[Callable[..., Any]] = [
    lambda **kw: sdk.TransactionProducer(**{"endpoints": ENDPOINT, "group": "g", **kw}),
    lambda **kw: sdk.aio.TransactionProducer(**{"endpoints": ENDPOINT, "group": "g", **kw}),
]


class _Listener:
    def execute_local_transaction(self, msg: object, arg: object) -> None: ...

    def check_local_transaction(self, msg: object) -> None: ...


class _AsyncListener:
    async def execute_local_transaction(self, msg: object, arg: object) -> None: ...

    async def check_local_transaction(self, msg: object) -> None: ...


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: Producer(ENDPOINT, **kw),
        lambda **kw: PushConsumer("g", ENDPOINT, **kw),
        lambda **kw: sdk.aio.SimpleConsumer("g", ENDPOINT, **kw),
        lambda **kw: TRANSACTION_PRODUCERS[0](listener=_Listener(), **kw),
        lambda **kw: TRANSACTION_PRODUCERS[1](listener=_AsyncListener(), **kw),
    ],
    ids=["producer", "push", "aio-simple", "transactions", "aio-transactions"],
)
def test_a_clock_that_is_no_clock_is_refused_where_the_client_is_made(
    make: Callable[..., Any],
) -> None:
    # Before, it was kept and start() failed with "'bytes' object has no attribute 'now'".
    with pytest.raises(InvalidArgumentError, match=r"clock must be a Clock .* not bytes"):
        make(clock=b"x")


@pytest.mark.parametrize("keywords", [{"tls": 5}, {"endpoints": "broker"}], ids=["tls", "endpoint"])
@pytest.mark.parametrize("make", TRANSACTION_PRODUCERS, ids=["blocking", "aio"])
def test_a_transaction_producer_checks_its_connection_where_it_is_made(
    make: Callable[..., Any], keywords: dict[str, object]
) -> None:
    with pytest.raises(InvalidArgumentError):
        make(listener=_Listener(), **keywords)


@pytest.mark.parametrize(
    ("make", "listener"),
    [
        (TRANSACTION_PRODUCERS[0], None),
        (TRANSACTION_PRODUCERS[1], None),
        (TRANSACTION_PRODUCERS[0], _AsyncListener()),
        (TRANSACTION_PRODUCERS[1], _Listener()),
    ],
    ids=["none", "aio-none", "async-for-blocking", "plain-for-aio"],
)
def test_a_transaction_producer_refuses_a_listener_it_could_not_call(
    make: Callable[..., Any], listener: object
) -> None:
    # Before, sdk.aio's raised AttributeError; a blocking producer kept any listener.
    with pytest.raises(InvalidArgumentError, match="listener must be a TransactionListener"):
        make(listener=listener)


def test_a_transaction_producer_takes_a_listener_of_its_kind() -> None:
    TRANSACTION_PRODUCERS[0](listener=_Listener())
    TRANSACTION_PRODUCERS[1](listener=_AsyncListener())


@pytest.mark.parametrize("make", CONSUMERS, ids=["lite", "push", "aio-lite", "aio-push"])
def test_a_consume_timestamp_no_host_can_convert_is_refused_by_name(
    make: Callable[..., Any],
) -> None:
    # Before: ValueError "year 0 is out of range" from datetime.timestamp().
    problem = r"consume_timestamp datetime\.datetime\(1, 1, 1"
    with pytest.raises(InvalidArgumentError, match=problem):
        make(consume_from_where=ConsumeFromWhere.TIMESTAMP, consume_timestamp=datetime(1, 1, 1))


@pytest.mark.parametrize("name", ["ca_file", "cert_file", "key_file"])
def test_a_tls_file_name_with_a_nul_is_refused_where_the_config_is_made(name: str) -> None:
    # Before, it was kept and making any client with it raised ValueError ("embedded null byte").
    files = {"cert_file": "c.pem", "key_file": "k.pem"} if name != "ca_file" else {}
    with pytest.raises(InvalidArgumentError, match=rf"TLSConfig\.{name} 'a\\x00b' holds a NUL"):
        sdk.TLSConfig(**{**files, name: "a\0b"})
