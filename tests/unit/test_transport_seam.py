"""The cores' one seam: they run over any Transport, and import no gRPC transport module.

The producer and consumer cores run here over an in-memory transport whose messages are
laid out its own way (pickled fields, not ordermq's frames): what they send arrives
whole, in order, whichever way the producer sends it. No sockets.
"""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest

from sdk import (
    AccumulatorConfig,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerOrderly,
    MessageQueue,
    ProducerConfig,
    PushConsumerConfig,
    SendStatus,
    shard_index,
)
from sdk._transport.protocol import Appended
from sdk.consumer.push_core import PushConsumerCore
from sdk.errors import BrokerUnavailableError, MessageNotFoundError
from sdk.producer import retry
from sdk.producer.core import ProducerCore
from sdk.testing import FakeClock
from tests.unit.fake_transport import FakeBroker, FakeTransport

SDK = Path(__file__).resolve().parents[2] / "sdk"
#: What only a transport may import: gRPC, protocol buffers, the gRPC transport's modules,
#: RocketMQ's remoting wire model.
GRPC_ONLY = (
    "sdk._remoting",
    "grpc",
    "google.protobuf",
    "sdk._pb",
    "sdk._transport.grpc_transport",
    "sdk._transport.broker_client",
    "sdk._transport.exchange",
    "sdk._transport.status",
)
#: The public clients, which choose a transport (sdk._transport.connect) for their core.
FACES = {
    "sdk/producer/__init__.py",
    "sdk/consumer/push.py",
    "sdk/consumer/lite_pull.py",
    "sdk/consumer/simple.py",
}
#: ordermq's message layouts are a transport's business; the spool keeps messages in one.
CODEC_USERS = {"sdk/producer/spool.py"}


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, `from a import b` counted as both a and a.b."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            assert node.level == 0, f"{path}: relative import"
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def core_modules() -> list[Path]:
    return sorted([*SDK.glob("producer/*.py"), *SDK.glob("consumer/*.py"), SDK / "_career.py"])


def relative(path: Path) -> str:
    return str(path.relative_to(SDK.parent))


def test_no_core_module_imports_grpc_or_the_grpc_transport() -> None:
    offenders = {
        f"{relative(path)} imports {module}"
        for path in core_modules()
        for module in imported_modules(path)
        if any(module == banned or module.startswith(banned + ".") for banned in GRPC_ONLY)
    }
    assert not offenders


def test_only_the_faces_choose_a_transport_and_only_the_spool_uses_a_wire_layout() -> None:
    modules = {relative(path): imported_modules(path) for path in core_modules()}
    assert len(modules) > 10, "the globs found the core modules"
    choosers = {name for name, found in modules.items() if "sdk._transport.connect" in found}
    assert choosers == FACES
    layouts = {
        name
        for name, found in modules.items()
        if any(m.startswith(("sdk._transport.codec", "sdk._wire")) for m in found)
    }
    assert layouts == CODEC_USERS
    others = {
        m
        for found in modules.values()
        for m in found
        if m.startswith("sdk._transport")
        and m not in ("sdk._transport", "sdk._transport.connect")
        and not m.startswith(("sdk._transport.protocol", "sdk._transport.codec"))
    }
    assert not others, "the cores know the transport by its interface only"


#: The one SDK module that may import the broker: the testing kit's TestBroker gives an
#: application's tests a broker in their process, and imports it only when one is made.
BROKER_IMPORTER = "sdk/testing/broker.py"


def test_no_sdk_module_imports_the_broker() -> None:
    """A client never imports the broker: the broker imports the SDK's wire code instead."""
    modules = sorted(SDK.rglob("*.py"))
    assert any(relative(p).startswith("sdk/_remoting/") for p in modules), "the glob found it"
    offenders = {
        f"{relative(path)} imports {module}"
        for path in modules
        if "_pb" not in path.parts and relative(path) != BROKER_IMPORTER
        for module in imported_modules(path)
        if module == "mockbroker" or module.startswith("mockbroker.")
    }
    assert not offenders


def test_the_testing_kit_loads_the_broker_only_when_a_test_broker_is_made() -> None:
    probe = (
        "import sys, sdk, sdk.testing\n"
        "assert 'mockbroker' not in sys.modules, 'imported with sdk.testing'\n"
        "sdk.testing.TestBroker().close()\n"
        "assert 'mockbroker' in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_the_check_sees_an_import_of_the_grpc_transport(tmp_path: Path) -> None:
    module = tmp_path / "core.py"
    module.write_text(
        "from sdk._transport import grpc_transport\nimport grpc.aio\n"
        "from sdk._transport.broker_client import PullStatus\n"
    )
    found = imported_modules(module)
    assert {"sdk._transport.grpc_transport", "grpc.aio", "sdk._transport.broker_client"} <= found


# ---------------------------------------------------------------------- through a fake


class Collector(MessageListenerOrderly):
    """Keeps what it is given, in order (an async listener: it runs on the loop)."""

    def __init__(self) -> None:
        self.seen: list[MessageExt] = []

    async def consume_message(  # type: ignore[override]
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        self.seen += msgs
        return ConsumeOrderlyStatus.SUCCESS


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.002)


async def consume(broker: FakeBroker, count: int) -> list[MessageExt]:
    """What an orderly consumer core over a FakeTransport reads, until `count` messages."""
    listener = Collector()
    core = PushConsumerCore(
        "g",
        FakeTransport(broker),
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        config=PushConsumerConfig(),
        clock=broker.clock,
    )
    core.subscribe(broker.topic)
    core.register_message_listener(listener)
    await core.start()
    try:
        await until(lambda: len(listener.seen) >= count, f"{count} messages")
    finally:
        await core.shutdown()
    return listener.seen


def run(test: Callable[[FakeBroker], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        await test(FakeBroker(FakeClock(), queues=4))

    asyncio.run(main())


def order_message(key: str, n: int) -> Message:
    return Message(
        "orders", f"{key}:{n}".encode(), tags="paid", keys=[f"order-{n}"],
        properties={"n": str(n)}, sharding_key=key,
    )  # fmt: skip


def check_per_key_order(seen: list[MessageExt], keys: Sequence[str], count: int) -> None:
    for key in keys:
        mine = [m for m in seen if m.sharding_key == key]
        assert [m.body for m in mine] == [f"{key}:{n}".encode() for n in range(count)]
        assert {m.queue.queue_id for m in mine} == {shard_index(key, 4)}
        assert [(m.tags, m.keys, m.properties) for m in mine] == [
            ("paid", (f"order-{n}",), {"n": str(n)}) for n in range(count)
        ]


@pytest.mark.parametrize("way", ["send", "send_batch", "accumulator", "spool"])
def test_a_producer_and_a_consumer_over_another_transport_keep_each_keys_order(
    way: str, tmp_path: Path
) -> None:
    keys, count = ["a", "b", "c"], 10
    messages = [order_message(k, n) for n in range(count) for k in keys]
    config = {
        "accumulator": ProducerConfig(accumulator=AccumulatorConfig(linger=0.001)),
        "spool": ProducerConfig(spool_dir=tmp_path),
    }.get(way, ProducerConfig())

    async def test(broker: FakeBroker) -> None:
        producer = ProducerCore(FakeTransport(broker), config=config)
        await producer.start()
        if way == "send_batch":
            results = await producer.send_batch(messages)
        else:
            results = [await producer.send(m) for m in messages]
        await producer.flush(10)
        await producer.shutdown()
        stored = {m.msg_id for q in broker.messages.values() for m in q}
        assert {r.msg_id for r in results} == stored and len(stored) == len(messages)
        if way != "spool":
            assert all(r.status is SendStatus.SEND_OK for r in results)
            assert all(
                broker.messages[r.queue.queue_id][r.queue_offset].msg_id == r.msg_id
                for r in results
            )
        check_per_key_order(await consume(broker, len(messages)), keys, count)

    run(test)


def test_a_delayed_message_is_scheduled_and_cancelled_through_the_transport() -> None:
    async def test(broker: FakeBroker) -> None:
        producer = ProducerCore(FakeTransport(broker))
        await producer.start()
        result = await producer.send(Message("orders", b"later", delay_seconds=60))
        assert result.queue_offset == -1 and set(broker.scheduled) == {result.msg_id}
        assert await producer.cancel(result.msg_id) is True
        with pytest.raises(MessageNotFoundError):
            await producer.cancel(result.msg_id)
        await producer.shutdown()

    run(test)


class FirstSendsFail(FakeTransport):
    """Refuses the first `failures` sends as an unreachable broker would."""

    def __init__(self, broker: FakeBroker, failures: int) -> None:
        super().__init__(broker)
        self.failures = failures
        self.attempts: list[int] = []  # queue id of each send

    async def send(
        self, queue: MessageQueue, prepared: Sequence[bytes], *, timeout: float | None = None
    ) -> Appended:
        self.attempts.append(queue.queue_id)
        if self.failures:
            self.failures -= 1
            raise BrokerUnavailableError("the broker of this queue cannot be reached")
        return await super().send(queue, prepared, timeout=timeout)


@pytest.mark.parametrize("accumulator", [None, AccumulatorConfig(linger=0)], ids=["own", "acc"])
@pytest.mark.parametrize("keyed", [True, False])
def test_a_failed_send_is_retried_on_its_queue_when_keyed_and_on_the_next_when_not(
    keyed: bool, accumulator: AccumulatorConfig | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_wait(seconds: float) -> None:
        pass

    monkeypatch.setattr(retry, "_sleep", no_wait)

    async def test(broker: FakeBroker) -> None:
        transport = FirstSendsFail(broker, failures=1)
        config = ProducerConfig(retry_times=2, accumulator=accumulator)
        producer = ProducerCore(transport, config=config)
        await producer.start()
        message = Message("orders", b"x", sharding_key="k" if keyed else None)
        result = await producer.send(message)
        await producer.shutdown()
        first, second = transport.attempts
        assert second == (first if keyed else (first + 1) % 4)
        assert result.queue.queue_id == second
        assert [m.body for m in broker.messages[second]] == [b"x"]

    run(test)
