"""The clients' constructors and their config classes given hostile values.

Every public client constructor (sdk's and sdk.aio's Producer, PushConsumer,
LitePullConsumer, SimpleConsumer and TransactionProducer) gets values a user could pass by
mistake for each parameter: empty, huge and badly spelt group names and endpoints, enums of
the wrong kind, negative, zero, huge and bool counts, values of the wrong type, and config
objects with hostile fields. Every field of every public config dataclass (the tuning
configs, TLSConfig and Credentials) does too, except the float durations, which
tests/unit/test_config_durations.py covers. The fields and parameters are read from the
dataclasses and signatures, so a new one is fuzzed (or fails
test_every_field_and_parameter_has_a_strategy) without being listed here.

The rule: making the config or the client raises an OrderMQError (a bad value: an
InvalidArgumentError, also a ValueError) or a TypeError, or the client works: the blocking
clients made with accepted values start, do their basic operation against an embedded
broker (a send, a transaction, a message handed to a listener, polled or received) and
shut down, all within USE_SECONDS (without TLS: the broker has none). That part runs over
gRPC only: the values checked here
are the client's own, whatever the wire; the asyncio twins share the blocking clients'
config classes and checks, and are only made.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import itertools
import math
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import sdk
import sdk.aio
from sdk import (
    AccumulatorConfig,
    AllocateMessageQueueAveragely,
    ConsumeFromWhere,
    Credentials,
    LitePullConsumer,
    LitePullConsumerConfig,
    Message,
    Producer,
    ProducerConfig,
    PushConsumer,
    PushConsumerConfig,
    SimpleConsumer,
    TLSConfig,
    TransactionProducer,
)
from sdk.errors import InvalidArgumentError, OrderMQError
from tests.component.hostile_calls import TOPIC, bounded, floats, ints, made, texts, wrong
from tests.component.test_fuzz_public_api_aio_push_tx import (
    AsyncCommitting,
    Committing,
    Recording,
)
from tests.component.transports import BrokerOver, broker_over
from tests.fuzzing import fuzz_settings, integers

#: Longest a client made with accepted values may take to start, be used and shut down.
USE_SECONDS = 20.0
#: Few examples (each starts a client), drawn until that many clients are made: most
#: hostile values are refused, which the construction tests check.
_USE_BASE = fuzz_settings(20, 150)
USE_SETTINGS = settings(
    _USE_BASE,
    suppress_health_check=[*_USE_BASE.suppress_health_check, HealthCheck.filter_too_much],
)

CONFIGS: list[type[Any]] = [
    ProducerConfig, AccumulatorConfig, PushConsumerConfig, LitePullConsumerConfig,
    TLSConfig, Credentials,
]  # fmt: skip
CLIENT_NAMES = sorted(n for n in sdk.aio.__all__ if n.endswith(("Producer", "Consumer")))
CLIENTS: dict[str, type[Any]] = {name: getattr(sdk, name) for name in CLIENT_NAMES} | {
    f"aio.{name}": getattr(sdk.aio, name) for name in CLIENT_NAMES
}

# ---------------------------------------------------------------------------- values
#: Counts: small, negative, the protocol's limits and their neighbours, huge, and what
#: looks like a count but is none (a bool, a float, a numeric string).
counts = (
    integers(-(2**70), 2**70)
    | ints
    | st.sampled_from([True, False, 2.5, 1.0, -0.0, math.nan, math.inf, "5", 10**30])
    | wrong
)
#: Every enum member the SDK exports: the right kind and every wrong one.
ENUMS = [getattr(sdk, name) for name in sdk.__all__]
enum_members = st.sampled_from([m for e in ENUMS if isinstance(e, enum.EnumMeta) for m in e])
#: Directories: none, relative, where nothing can be written, not a directory, bad bytes.
PATHS = ["", ".", "spool", "/nonexistent/dir", "/dev/null", "/proc/version", "a\x00b",
         Path("relative/dir"), Path("/")]  # fmt: skip
paths = st.none() | st.sampled_from(PATHS) | wrong
words = st.sampled_from(["push", "pull", "PUSH", " push", "block", "fail", "Block"]) | texts


def literal(*allowed: str) -> st.SearchStrategy[Any]:
    """The allowed values of a Literal field, and near misses."""
    return st.sampled_from(allowed) | words | wrong


#: Hostile values of a config field, by the field's annotation.
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "int": counts,
    "int | None": st.none() | counts,
    "str": words | wrong,
    "str | None": st.none() | words | wrong,
    "Literal['block', 'fail']": literal("block", "fail"),
    "KeyFailurePolicy": enum_members | words | wrong,
    "AccumulatorConfig | None": st.none() | st.deferred(lambda: configs(AccumulatorConfig)) | wrong,
    "Path | None": paths,
    "str | Path | None": paths,
}


def fuzzed_fields(config: type[Any]) -> list[dataclasses.Field[Any]]:
    """The fields of `config` fuzzed here: all but the float durations."""
    return [f for f in dataclasses.fields(config) if f.type != "float"]


def config_fields(config: type[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments of `config`: one or two of its fuzzed fields, given hostile values.

    A field with no default (Credentials has two) is always given one.
    """
    names = [f.name for f in fuzzed_fields(config)]
    types = {f.name: str(f.type) for f in fuzzed_fields(config)}
    required = [f.name for f in dataclasses.fields(config) if f.default is dataclasses.MISSING]
    chosen = st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True)
    return chosen.flatmap(
        lambda picked: st.fixed_dictionaries(
            {name: FIELD_VALUES[types[name]] for name in {*picked, *required}}
        )
    )


@st.composite
def configs(draw: st.DrawFn, config: type[Any]) -> Any:
    """A `config` built with hostile fields, or None when they are refused."""
    try:
        return config(**draw(config_fields(config)))
    except (OrderMQError, TypeError):
        return None


#: Hostile values of a client constructor's parameter, by the parameter's name.
ENDPOINTS = ["", "host", "127.0.0.1:0", "127.0.0.1:1", ":1", "rocketmq://", "a" * 300 + ":1",
             ["127.0.0.1:1"], [], ["127.0.0.1:1", 5], ("127.0.0.1:1",), "127.0.0.1:1;"]  # fmt: skip
GROUPS = ["", " ", "g", "a" * 127, "a" * 128, "bad group", "%RETRY%g", "rmq_sys_g", "é", "g\n"]
TLS = [TLSConfig(), TLSConfig(ca_file="/nonexistent.pem"), TLSConfig(server_name="x")]
MOMENTS = [datetime(2020, 1, 1), datetime(1, 1, 1), datetime(9999, 1, 1, tzinfo=UTC)]
PARAMETER_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "endpoints": st.sampled_from(ENDPOINTS) | texts | wrong,
    "group": st.sampled_from(GROUPS) | texts | wrong,
    "config": st.none() | wrong | st.sampled_from(CONFIGS[:4]).flatmap(configs),
    "clock": st.none() | wrong,
    "tls": st.none() | wrong | st.sampled_from(TLS) | configs(TLSConfig),
    "credentials": st.none() | wrong | configs(Credentials),
    "consume_from_where": enum_members | words | wrong,
    "message_model": enum_members | words | wrong,
    "ordering": enum_members | words | wrong,
    "consume_timestamp": st.none() | floats | wrong | st.sampled_from(MOMENTS),
    "allocate_strategy": st.none() | wrong | st.just(AllocateMessageQueueAveragely()),
    "on_queues_assigned": st.none() | wrong | st.just(print),
    "on_queues_revoked": st.none() | wrong | st.just(print),
    "offset_dir": paths,
    "instance_name": st.sampled_from(["DEFAULT", "", "a" * 300, "a/b", "\x00"]) | texts | wrong,
    "auto_commit": st.booleans() | counts,
    "orderly": st.booleans() | counts,
    "fifo": st.booleans() | counts,
    "await_duration": floats | wrong,
    "max_delivery_attempts": st.none() | counts,
    "listener": wrong | st.sampled_from([Committing(), AsyncCommitting()]),
}


def constructor_arguments(
    client: type[Any], fixed: dict[str, Any] | None = None, *, with_config: bool = False
) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments of `client`'s constructor, some given hostile values.

    Those in `fixed` (by default valid ones for the required parameters), and one to three
    parameters given hostile values; with `with_config`, always a config of the client's
    own class with hostile fields too (and zero to three others).
    """
    fixed = fixed if fixed is not None else {"endpoints": "127.0.0.1:8081", "group": "g",
                                             "listener": Committing()}  # fmt: skip
    params = parameters(client)
    base = {name: value for name, value in fixed.items() if name in params}
    hostile = [name for name in params if name not in fixed or name in ("group", "listener")]
    own = config_class(client)
    values = dict(PARAMETER_VALUES)
    if own is not None:
        values["config"] = values["config"] | configs(own)
        if with_config:
            base["config"] = configs(own)
    drawn = st.lists(st.sampled_from(hostile), min_size=0 if with_config else 1, max_size=3,
                     unique=True)  # fmt: skip
    return drawn.flatmap(
        lambda picked: st.fixed_dictionaries(
            {n: base[n] for n in base if isinstance(base[n], st.SearchStrategy)}
            | {n: values[n] for n in picked}
        ).map(lambda hostile_values: {**base, **hostile_values})
    )


def config_class(client: type[Any]) -> type[Any] | None:
    """The config class `client`'s constructor takes, if any."""
    annotation = inspect.signature(client.__init__).parameters.get("config")
    if annotation is None:
        return None
    return getattr(sdk, str(annotation.annotation).split(" | ")[0])  # type: ignore[no-any-return]


def parameters(client: type[Any]) -> list[str]:
    """The parameter names of `client`'s constructor."""
    return [n for n in inspect.signature(client.__init__).parameters if n != "self"]


def made_or_refused(what: str, make: Callable[[], Any]) -> Any:
    """make()'s result, or None when it refused its arguments as the rule says.

    A bad value with an InvalidArgumentError (a ValueError), a value of the wrong type with
    a TypeError. Making a config or a client does no I/O, so any other error fails.
    """
    try:
        return made(what, make)
    except InvalidArgumentError:
        return None


# ---------------------------------------------------------------------------- tests
def test_every_field_and_parameter_has_a_strategy() -> None:
    missing = [f"{c.__name__}.{f.name}: {f.type}" for c in CONFIGS for f in fuzzed_fields(c)
               if str(f.type) not in FIELD_VALUES]  # fmt: skip
    missing += [f"{name}({p})" for name, client in CLIENTS.items() for p in parameters(client)
                if p not in PARAMETER_VALUES]  # fmt: skip
    assert missing == []


def test_every_public_config_and_client_is_covered() -> None:
    exported = {getattr(sdk, n) for n in sdk.__all__}
    configs_exported = {c for c in exported if dataclasses.is_dataclass(c)
                        and c.__name__.endswith(("Config", "Credentials"))}  # fmt: skip
    assert configs_exported == set(CONFIGS)
    blocking = [n for n in sdk.__all__ if n.endswith(("Producer", "Consumer"))]
    assert sorted(blocking) == CLIENT_NAMES
    assert len(CLIENTS) == 10


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_a_config_refuses_a_hostile_field_or_keeps_it(config: type[Any]) -> None:
    @fuzz_settings(60, 2000)
    @given(config_fields(config))
    def run(fields: dict[str, Any]) -> None:
        made_config = made_or_refused(f"{config.__name__}(**{fields!r})", lambda: config(**fields))
        if made_config is not None:
            # A copy is checked again: what was accepted once must be accepted again.
            dataclasses.replace(made_config)

    run()


@pytest.mark.parametrize("name", sorted(CLIENTS))
def test_a_client_refuses_hostile_arguments_where_it_is_made(name: str) -> None:
    client = CLIENTS[name]

    @fuzz_settings(60, 2000)
    @given(constructor_arguments(client))
    def run(kwargs: dict[str, Any]) -> None:
        made_or_refused(f"{name}(**{kwargs!r})", lambda: client(**kwargs))

    run()


# ---------------------------------------------------------------------------- made and used
@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerOver]:
    work = tmp_path_factory.mktemp("fuzz-ctor")
    cwd = os.getcwd()
    os.chdir(work)  # where an accepted relative spool or offset directory goes
    try:
        with broker_over("grpc", work / "broker") as b:
            yield b
    finally:
        os.chdir(cwd)


_bodies = itertools.count()


def fresh_body() -> bytes:
    """A body no message sent before carries."""
    return b"ctor-%d" % next(_bodies)


def produces(producer: Producer) -> None:
    """Started, a send is stored (or spooled, with a spool_dir), shut down."""
    with producer:
        sent = producer.send(Message(TOPIC, fresh_body(), sharding_key="k"))
        assert sent.queue_offset >= 0 or sent.status is sdk.SendStatus.SPOOLED, sent


def transacts(producer: TransactionProducer) -> None:
    """Started, a transaction commits, shut down."""
    with producer:
        sent = producer.send_message_in_transaction(Message(TOPIC, fresh_body()))
        assert sent.local_transaction_state is sdk.LocalTransactionState.COMMIT_MESSAGE


def send(address: str, body: bytes) -> None:
    """Send one message with `body` to TOPIC."""
    with Producer(address) as producer:
        producer.send(Message(TOPIC, body, sharding_key="k"))


def pushes(consumer: PushConsumer, address: str) -> None:
    """Subscribed and started, a message sent then reaches its listener; shut down."""
    listener = Recording()
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(listener)
    with consumer:
        body = fresh_body()
        send(address, body)
        assert listener.wait_for(body), "the push consumer handed no new message to its listener"


def polls(consumer: LitePullConsumer, address: str) -> None:
    """Subscribed and started, a message sent is then polled; shut down."""
    consumer.subscribe(TOPIC)
    with consumer:
        body = fresh_body()
        send(address, body)
        while True:
            if any(m.body == body for m in consumer.poll(timeout=1.0)):
                return


def receives(consumer: SimpleConsumer, address: str) -> None:
    """Subscribed and started, a message sent is then received and acked; shut down."""
    consumer.subscribe(TOPIC)
    with consumer:
        body = fresh_body()
        send(address, body)
        while True:
            for message in consumer.receive(max_messages=16, invisible_duration=30):
                consumer.ack(message)
                if message.body == body:
                    return


#: Each blocking client: how one made with accepted values is used.
USES: dict[str, Callable[[Any, str], None]] = {
    "Producer": lambda client, address: produces(client),
    "TransactionProducer": lambda client, address: transacts(client),
    "PushConsumer": pushes,
    "LitePullConsumer": polls,
    "SimpleConsumer": receives,
}
_groups = itertools.count()


@pytest.mark.parametrize("name", sorted(USES))
def test_a_client_made_with_accepted_values_works(broker: BrokerOver, name: str) -> None:
    client = CLIENTS[name]

    @USE_SETTINGS
    @given(constructor_arguments(client, usable_arguments(broker), with_config=True))
    def run(kwargs: dict[str, Any]) -> None:
        made_client = made_or_refused(f"{name}(**{kwargs!r})", lambda: client(**kwargs))
        # Refusals are the other tests' part: these examples are spent on clients made.
        assume(made_client is not None)
        try:
            bounded(lambda: USES[name](made_client, broker.address), USE_SECONDS)
        except AssertionError as exc:
            raise AssertionError(f"{name}(**{kwargs!r}) was made but does not work: {exc}") from exc

    run()


def usable_arguments(broker: BrokerOver) -> dict[str, Any]:
    """Arguments that make a working client of any kind, save those drawn."""
    return {
        "endpoints": broker.address,
        "group": f"ctor-{next(_groups)}",
        "listener": Committing(),
        "consume_from_where": ConsumeFromWhere.FIRST_OFFSET,
        "await_duration": 0.05,
        "tls": None,  # the broker has no TLS: a client with any TLSConfig cannot reach it
    }
