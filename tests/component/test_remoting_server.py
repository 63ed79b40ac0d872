"""mockbroker's RocketMQ remoting port and name server, over real sockets.

The broker runs embedded with both ports on; tests speak remoting through
tests/remoting_client.py and check what the core holds through the gRPC SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.fronts.remoting.channel import ClientChannel, Handler
from mockbroker.fronts.remoting.server import RemotingServer
from mockbroker.limits import ClientLimits
from sdk import LitePullConsumer, Message, MessageQueue, Producer
from sdk._remoting.codec import ROCKETMQ, encode, read_command
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk.clock import SystemClock
from sdk.testing import FakeClock
from tests.component.scraping import scrape
from tests.remoting_client import RemotingClient
from tests.support import wait_until

T = TypeVar("T")


@pytest.fixture
def rocketmq(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(data_dir=tmp_path / "broker", remoting_port=0, namesrv_port=0)
    with EmbeddedBroker(config) as broker:
        yield broker


def run(body: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(body())


def address(broker: EmbeddedBroker, which: str) -> str:
    found = broker.remoting_address if which == "broker" else broker.namesrv_address
    assert found is not None
    return found


async def ask(where: str, code: int, **fields: str) -> RemotingCommand:
    client = await RemotingClient.connect(where)
    try:
        return await client.request(RemotingCommand(code, ext_fields=fields))
    finally:
        await client.close()


def stored_messages(broker: EmbeddedBroker) -> int:
    assert broker.broker.state is not None
    return broker.broker.state.store.stats.messages_stored


def test_both_ports_are_off_unless_asked(broker: EmbeddedBroker) -> None:
    assert (broker.remoting_address, broker.namesrv_address) == (None, None)


@pytest.mark.parametrize("busy_one", ["remoting_port", "namesrv_port"])
def test_a_busy_remoting_port_is_refused_before_anything_serves(
    tmp_path: Path, busy_one: str
) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        grpc_port = free.getsockname()[1]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        ports = {"remoting_port": 0, "namesrv_port": 0, busy_one: busy}
        broker = EmbeddedBroker(BrokerConfig(data_dir=tmp_path, port=grpc_port, **ports))
        with pytest.raises(OSError) as raised:
            broker.start()
    assert str(raised.value) == f"cannot listen on 127.0.0.1:{busy}: Address already in use"
    with socket.socket() as probe:  # the gRPC port was never taken (or was given back)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", grpc_port))


def test_the_name_server_routes_a_topic_to_the_remoting_port(rocketmq: EmbeddedBroker) -> None:
    with Producer(rocketmq.address) as producer:
        producer.send(Message("orders", b"x", sharding_key="k"))
    namesrv = address(rocketmq, "namesrv")
    answer = run(lambda: ask(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, topic="orders"))
    assert answer.code == ResponseCode.SUCCESS and answer.is_response
    route = json.loads(answer.body)
    assert route["brokerDatas"] == [
        {"brokerAddrs": {"0": address(rocketmq, "broker")}, "brokerName": "broker-a",
         "cluster": "DefaultCluster"}
    ]  # fmt: skip
    assert route["queueDatas"] == [
        {"brokerName": "broker-a", "perm": 6, "readQueueNums": 8, "topicSysFlag": 0,
         "writeQueueNums": 8}
    ]  # fmt: skip
    assert route["orderTopicConf"] == "broker-a:8"


def test_unknown_topics_have_no_route_but_the_default_and_retry_topics_do(
    rocketmq: EmbeddedBroker,
) -> None:
    namesrv = address(rocketmq, "namesrv")

    async def main() -> list[RemotingCommand]:
        return [
            await ask(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, topic=topic)
            for topic in ("nowhere", "TBW102", "%RETRY%readers")
        ]

    unknown, default, retry = run(main)
    assert unknown.code == ResponseCode.TOPIC_NOT_EXIST
    assert unknown.remark == "No topic route info in name server for the topic: nowhere"
    assert json.loads(default.body)["queueDatas"][0]["writeQueueNums"] == 8
    assert json.loads(retry.body)["queueDatas"][0]["readQueueNums"] == 1


def test_a_retry_topic_of_a_group_name_that_cannot_exist_has_no_route(
    rocketmq: EmbeddedBroker,
) -> None:
    namesrv = address(rocketmq, "namesrv")
    answer = run(lambda: ask(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, topic="%RETRY%a b"))
    assert answer.code == ResponseCode.TOPIC_NOT_EXIST, "no send-back can ever create it"
    assert answer.remark is not None and "'a b' must match" in answer.remark


def test_cluster_info_names_the_one_broker(rocketmq: EmbeddedBroker) -> None:
    answer = run(lambda: ask(address(rocketmq, "namesrv"), RequestCode.GET_BROKER_CLUSTER_INFO))
    info = json.loads(answer.body)
    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
    assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": address(rocketmq, "broker")}


def test_offset_queries_answer_as_rocketmqs_broker(rocketmq: EmbeddedBroker) -> None:
    with Producer(rocketmq.address) as producer:
        sent = [producer.send(Message("orders", b"x", sharding_key="k")) for _ in range(3)]
    queue = str(sent[0].queue.queue_id)
    where = address(rocketmq, "broker")

    async def main() -> list[RemotingCommand]:
        return [
            await ask(where, RequestCode.GET_MAX_OFFSET, topic="orders", queueId=queue),
            await ask(where, RequestCode.GET_MIN_OFFSET, topic="orders", queueId=queue),
            await ask(where, RequestCode.GET_EARLIEST_MSG_STORETIME, topic="orders",
                      queueId=queue),
            await ask(where, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic="orders",
                      queueId=queue, timestamp="0"),
            await ask(where, RequestCode.GET_MAX_OFFSET, topic="nowhere", queueId="0"),
            await ask(where, RequestCode.GET_EARLIEST_MSG_STORETIME, topic="nowhere",
                      queueId="0"),
        ]  # fmt: skip

    answers = run(main)
    assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 6
    fields = [a.ext_fields for a in answers]
    assert fields[0] == {"offset": "3"} and fields[1] == {"offset": "0"}
    assert fields[2] is not None and int(fields[2]["timestamp"]) > 0
    assert fields[3] == {"offset": "0"}
    assert fields[4] == {"offset": "0"} and fields[5] == {"timestamp": "-1"}


def test_an_unknown_code_is_not_supported_and_a_binary_request_is_answered_in_binary(
    rocketmq: EmbeddedBroker,
) -> None:
    where = address(rocketmq, "broker")

    async def main() -> tuple[RemotingCommand, RemotingCommand]:
        client = await RemotingClient.connect(where)
        try:
            unknown = await client.request(RemotingCommand(9999))
            binary = await client.request(
                RemotingCommand(
                    RequestCode.GET_MAX_OFFSET,
                    ext_fields={"topic": "nowhere", "queueId": "0"},
                    serialize_type=ROCKETMQ,
                )
            )
            return unknown, binary
        finally:
            await client.close()

    unknown, binary = run(main)
    assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert unknown.remark == " request type 9999 not supported"
    assert (binary.serialize_type, binary.ext_fields) == (ROCKETMQ, {"offset": "0"})


def test_a_held_pull_does_not_hold_up_the_requests_behind_it_on_its_connection(
    rocketmq: EmbeddedBroker,
) -> None:
    with Producer(rocketmq.address) as producer:
        producer.send(Message("orders", b"first", sharding_key="k"))
        queue = producer.send(Message("orders", b"second", sharding_key="k")).queue
    where = address(rocketmq, "broker")

    async def main() -> tuple[RemotingCommand, RemotingCommand]:
        client = await RemotingClient.connect(where)
        try:
            pull = asyncio.ensure_future(
                client.request(
                    RemotingCommand(
                        RequestCode.PULL_MESSAGE,
                        ext_fields={
                            "consumerGroup": "readers", "topic": "orders",
                            "queueId": str(queue.queue_id), "queueOffset": "2",
                            "maxMsgNums": "32", "sysFlag": "2", "commitOffset": "0",
                            "suspendTimeoutMillis": "20000", "subVersion": "0",
                        },
                    )
                )
            )  # fmt: skip
            offsets = await client.request(
                RemotingCommand(
                    RequestCode.GET_MAX_OFFSET,
                    ext_fields={"topic": "orders", "queueId": str(queue.queue_id)},
                )
            )
            assert not pull.done(), "the pull is held: nothing is past offset 2"
            await asyncio.to_thread(send_third, rocketmq, queue.queue_id)
            return offsets, await pull
        finally:
            await client.close()

    offsets, pulled = run(main)
    assert offsets.ext_fields == {"offset": "2"}
    assert pulled.code == ResponseCode.SUCCESS
    assert pulled.ext_fields is not None and pulled.ext_fields["nextBeginOffset"] == "3"


def send_third(broker: EmbeddedBroker, queue_id: int) -> None:
    with Producer(broker.address) as producer:
        sent = producer.send(Message("orders", b"third", sharding_key="k"))
    assert sent.queue.queue_id == queue_id


BAD_INPUT = {
    "garbage": b"GET / HTTP/1.1\r\n\r\n",
    "a frame announcing 2 GB": (2**31).to_bytes(4, "big") + b"\x00\x00\x00\x02{}",
    "a header that is not JSON": (12).to_bytes(4, "big") + (8).to_bytes(4, "big") + b"not json",
    "a binary header with bad lengths": (25).to_bytes(4, "big")
    + b"\x01\x00\x00\x15"
    + bytes(13)
    + b"\x7f\xff\xff\xff"
    + bytes(4),
    "a truncated frame, then the end": (100).to_bytes(4, "big") + b'{"code":10',
}


@pytest.mark.parametrize("bad", list(BAD_INPUT), ids=list(BAD_INPUT))
def test_bad_input_closes_that_connection_only_and_stores_nothing(
    rocketmq: EmbeddedBroker, bad: str
) -> None:
    where = address(rocketmq, "broker")
    stored = stored_messages(rocketmq)

    async def main() -> RemotingCommand:
        other = await RemotingClient.connect(where)
        bad_client = await RemotingClient.connect(where)
        try:
            await bad_client.send_raw(BAD_INPUT[bad])
            if bad.endswith("then the end"):
                bad_client._writer.write_eof()
            await asyncio.wait_for(bad_client.closed.wait(), 30)
            return await other.request(
                RemotingCommand(
                    RequestCode.GET_MAX_OFFSET, ext_fields={"topic": "t", "queueId": "0"}
                )
            )
        finally:
            await bad_client.close()
            await other.close()

    answer = run(main)
    assert answer.code == ResponseCode.SUCCESS, "the other connection is still served"
    assert stored_messages(rocketmq) == stored
    assert rocketmq.broker.remoting is not None
    assert rocketmq.broker.remoting.broker is not None
    assert rocketmq.broker.remoting.broker.malformed_frames == 1


def test_a_message_sent_over_remoting_is_read_over_grpc(rocketmq: EmbeddedBroker) -> None:
    where = address(rocketmq, "broker")
    send = RemotingCommand(
        RequestCode.SEND_MESSAGE_V2,
        ext_fields={
            "a": "producers", "b": "orders", "c": "TBW102", "d": "4", "e": "1", "f": "0",
            "g": "1700000000000", "h": "0", "i": "KEYS\x01order-1\x02TAGS\x01paid\x02",
            "j": "0", "k": "false", "m": "false",
        },
        body=b"order 1 paid",
    )  # fmt: skip
    answer = run(lambda: ask_command(where, send))
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert answer.ext_fields is not None and answer.ext_fields["queueOffset"] == "0"
    with LitePullConsumer("readers", rocketmq.address) as consumer:
        consumer.assign([MessageQueue("orders", "broker-a", 1)])
        consumer.seek(MessageQueue("orders", "broker-a", 1), 0)
        got = consumer.poll(timeout=10)
    assert [(m.body, m.tags, m.keys) for m in got] == [(b"order 1 paid", "paid", ("order-1",))]


async def ask_command(where: str, command: RemotingCommand) -> RemotingCommand:
    client = await RemotingClient.connect(where)
    try:
        return await client.request(command)
    finally:
        await client.close()


def test_a_connection_silent_for_two_minutes_is_closed(tmp_path: Path) -> None:
    clock = FakeClock()
    config = BrokerConfig(data_dir=tmp_path / "broker", remoting_port=0)
    with EmbeddedBroker(config, clock=clock) as broker:
        where = address(broker, "broker")

        async def main() -> bool:
            client = await RemotingClient.connect(where)
            try:
                await client.request(RemotingCommand(9999))
                for _ in range(2):  # 119 s of silence, then a request: the count restarts
                    clock.advance(119)
                    await client.request(RemotingCommand(9999))
                clock.advance(120)
                await asyncio.wait_for(client.closed.wait(), 30)
                return client.closed.is_set()
            finally:
                await client.close()

        assert run(main)


def test_a_request_whose_answer_echoes_a_lone_surrogate_is_answered(
    rocketmq: EmbeddedBroker,
) -> None:
    # JSON lets a client escape half a surrogate pair; the route's refusal names the topic.
    host, port = address(rocketmq, "namesrv").rsplit(":", 1)
    header = b'{"code":105,"extFields":{"topic":"a\\ud800"},"flag":0,"opaque":5}'

    async def main() -> RemotingCommand | None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write((4 + len(header)).to_bytes(4, "big") + len(header).to_bytes(4, "big"))
            writer.write(header)
            return await asyncio.wait_for(read_command(reader), 30)
        finally:
            writer.close()

    answer = run(main)
    assert answer is not None and answer.opaque == 5
    assert answer.code == ResponseCode.TOPIC_NOT_EXIST
    assert answer.remark is not None and answer.remark.endswith("the topic: a?")


# ------------------------------------------------------------ the server, on its own table
async def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def serving(
    handlers: dict[int, Handler], limits: ClientLimits | None = None
) -> tuple[RemotingServer, RemotingClient]:
    server = RemotingServer("test", handlers, SystemClock(), limits=limits)
    port = await server.start("127.0.0.1", 0)
    return server, await RemotingClient.connect(f"127.0.0.1:{port}")


def test_an_answer_that_cannot_be_encoded_is_answered_system_error() -> None:
    async def unsendable(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        return request.response(ext_fields={"k" * 40000: "v"})  # over a binary key's 32767

    async def main() -> tuple[RemotingCommand, RemotingCommand]:
        server, client = await serving({1000: unsendable})
        try:
            refused = await client.request(RemotingCommand(1000, serialize_type=ROCKETMQ))
            json_answer = await client.request(RemotingCommand(1000))
            return refused, json_answer
        finally:
            await client.close()
            await server.stop()

    refused, json_answer = run(main)
    assert (refused.code, refused.serialize_type) == (ResponseCode.SYSTEM_ERROR, ROCKETMQ)
    assert refused.remark is not None and "key of 40000 bytes" in refused.remark
    assert json_answer.code == ResponseCode.SUCCESS, "the connection still serves"


def test_stop_cancels_and_waits_for_the_requests_of_connections_already_closed() -> None:
    started = asyncio.Event()
    unwound: list[str] = []

    async def held(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        started.set()
        try:
            await asyncio.get_running_loop().create_future()  # never answered
        finally:
            unwound.append("held")
        raise AssertionError("unreachable")

    async def main() -> list[str]:
        server, client = await serving({1000: held})
        pending = asyncio.ensure_future(client.request(RemotingCommand(1000)))
        await started.wait()
        await client.close()  # the request read before the close goes on (an offset commit)
        with contextlib.suppress(ConnectionError):
            await pending
        await until(lambda: not server.connections, "the server to see the close")
        await server.stop()
        return list(unwound)  # as stop() left it: asyncio.run cancels what is left after

    assert run(main) == ["held"]


def test_a_client_over_its_in_flight_limit_is_not_read_until_an_answer_goes_out() -> None:
    gates = {1: asyncio.Event(), 2: asyncio.Event()}
    released = False
    seen_released: list[bool] = []

    async def held(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        number = int(request.body[:1])
        if number in gates:
            await gates[number].wait()
        else:
            seen_released.append(released)
        return request.response()

    async def main() -> list[bool]:
        nonlocal released
        server, client = await serving({1000: held}, ClientLimits(max_bytes=1000))
        try:
            # Three requests of 600 bytes in one write: two take the client over 1000.
            answers = [
                asyncio.ensure_future(client.request(RemotingCommand(1000, body=b"%d" % n * 600)))
                for n in (1, 2, 3)
            ]
            await until(lambda: len(server.requests) >= 2, "two requests read")
            released = True
            gates[1].set()
            await answers[0]
            await answers[2]
            gates[2].set()
            await answers[1]
            return seen_released
        finally:
            await client.close()
            await server.stop()

    assert run(main) == [True], "the third request was read only once an answer went out"


def test_a_pull_held_when_the_broker_stops_gets_its_answer(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=tmp_path / "broker", remoting_port=0)
    broker = EmbeddedBroker(config)
    broker.start()
    try:
        with Producer(broker.address) as producer:
            queue = producer.send(Message("orders", b"first", sharding_key="k")).queue
        where = address(broker, "broker")
        held = asyncio.Event()

        async def main() -> RemotingCommand:
            client = await RemotingClient.connect(where)
            try:
                pull = asyncio.ensure_future(
                    client.request(
                        RemotingCommand(
                            RequestCode.PULL_MESSAGE,
                            ext_fields={
                                "consumerGroup": "readers", "topic": "orders",
                                "queueId": str(queue.queue_id), "queueOffset": "1",
                                "maxMsgNums": "32", "sysFlag": "2", "commitOffset": "0",
                                "suspendTimeoutMillis": "20000", "subVersion": "0",
                            },
                        )
                    )
                )  # fmt: skip
                state = broker.broker.state
                assert state is not None
                await asyncio.to_thread(wait_until, lambda: state.holder.held == 1, 30, "held")
                held.set()
                await asyncio.to_thread(broker.stop)
                return await asyncio.wait_for(pull, 30)
            finally:
                await client.close()

        answer = run(main)
    finally:
        broker.stop()
    assert held.is_set()
    assert answer.code == ResponseCode.PULL_NOT_FOUND, "answered, not cut off"


# ------------------------------------------------------------ peers that stop reading
async def big_answer(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
    return request.response(body=b"x" * (1 << 20))


async def small_answer(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
    return request.response()


async def stuck_peer(port: int, requests: int = 32) -> asyncio.StreamWriter:
    """A peer that asks for 32 MiB of answers and reads none of them."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1024)
    for opaque in range(1, requests + 1):
        writer.write(encode(RemotingCommand(1000, opaque=opaque)))
    await writer.drain()
    return writer


async def writes_stuck(server: RemotingServer) -> None:
    """Until a connection's answers wait on its peer (still so a tenth of a second later)."""

    def stuck() -> bool:
        return any(c.unsent_bytes for c in server.connections)

    while True:
        await until(stuck, "answers waiting on the stuck peer")
        await asyncio.sleep(0.1)
        if stuck():
            return


async def until_advancing(clock: FakeClock, condition: Callable[[], bool], what: str) -> None:
    """Advance `clock` a second at a time until `condition` holds (30 s of real time)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        clock.advance(1)
        await asyncio.sleep(0.01)


async def stop_advancing(server: RemotingServer, clock: FakeClock) -> None:
    stopping = asyncio.ensure_future(server.stop())
    await until_advancing(clock, stopping.done, "stop() to return")
    await stopping


def test_a_peer_that_stops_reading_holds_neither_the_idle_reaper_nor_stop() -> None:
    # Reproduced on a real broker: the reaper and stop() waited for the stuck peer's socket
    # to finish closing, which it never does while its answers cannot be written.
    clock = FakeClock()

    async def main() -> None:
        server = RemotingServer("test", {1000: big_answer, 1001: small_answer}, clock)
        port = await server.start("127.0.0.1", 0)
        stuck = await stuck_peer(port)
        await writes_stuck(server)
        idle = await RemotingClient.connect(f"127.0.0.1:{port}")
        try:
            await idle.request(RemotingCommand(1001))
            clock.advance(121)
            await until_advancing(clock, idle.closed.is_set, "the idle connection reaped")
            await until_advancing(clock, lambda: not server.connections, "both connections gone")
            fresh = await RemotingClient.connect(f"127.0.0.1:{port}")
            answer = await fresh.request(RemotingCommand(1001))
            assert answer.code == ResponseCode.SUCCESS
            await fresh.close()
            await stop_advancing(server, clock)
        finally:
            await idle.close()
            stuck.close()

    run(main)


# ------------------------------------------------------------ connection limits
def test_connections_past_the_per_host_and_total_limits_are_closed_and_counted(
    tmp_path: Path,
) -> None:
    # Reproduced in review: the limits counted per connection, and nothing bounded the
    # connections: one host opening sockets took the descriptors the store needs.
    config = BrokerConfig(
        data_dir=tmp_path / "broker", remoting_port=0, metrics_port=0,
        remoting_max_connections=3, remoting_max_connections_per_host=2,
    )  # fmt: skip
    with EmbeddedBroker(config) as broker:
        where = address(broker, "broker")

        async def answered(client: RemotingClient) -> bool:
            answer = await client.request(RemotingCommand(9999))
            return answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED

        async def connect(local_host: str) -> RemotingClient:
            host, port = where.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(
                host, int(port), local_addr=(local_host, 0)
            )
            return RemotingClient(reader, writer)

        async def main() -> list[bool]:
            first = [await connect("127.0.0.1") for _ in range(2)]
            over_host = await connect("127.0.0.1")
            other = await connect("127.0.0.2")
            over_all = await connect("127.0.0.3")
            try:
                await asyncio.wait_for(over_host.closed.wait(), 30)
                await asyncio.wait_for(over_all.closed.wait(), 30)
                served = [await answered(c) for c in (*first, other)]
                await first[0].close()
                state = broker.broker.remoting
                assert state is not None and state.broker is not None
                server = state.broker
                await until(lambda: len(server.connections) == 2, "the close seen")
                again = await connect("127.0.0.1")
                served.append(await answered(again))
                await again.close()
                return served
            finally:
                for client in (*first, over_host, other, over_all):
                    await client.close()

        assert run(main) == [True] * 4
        port = broker.broker.metrics_port
        assert port
        samples = scrape(port)
        assert samples[("ordermq_remoting_connections_refused_total", (("port", "broker"),))] == 2


def test_connection_limits_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="remoting_max_connections"):
        BrokerConfig(data_dir=tmp_path, remoting_max_connections_per_host=0)
