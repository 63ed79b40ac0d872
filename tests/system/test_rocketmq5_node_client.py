"""Apache RocketMQ's Node.js client (npm rocketmq-client-nodejs) against the v2 front.

Installed into ~/.cache/ordermq/interop by tests/interop/provision.py (where Node.js and npm are
there) and run by tests/interop/rmq5_driver.js, each run with a HOME of its own (the
client logs under ~/logs/rocketmq). The client differs from the Python one where it
matters to a server: it writes a proper delivery Timestamp, names a queue id in its sends
(which the server ignores, as the proxy does) and a host name as born host, and its
SimpleConsumer receives from queue 0 only (so pops must take from the whole broker).

Over TLS the client's own switch (`sslEnabled: true`) is used; @grpc/grpc-js trusts its
default roots only, so the driver's --tls-ca points GRPC_DEFAULT_SSL_ROOTS_FILE_PATH at
the test CA.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sdk import TLSConfig
from sdk.selector import shard_index
from tests.interop.harness import (
    Driver,
    GrpcView,
    V2Broker,
    drivers,
    receive_unavailable,
    v2_brokers,
)
from tests.interop.provision import Client, require
from tests.support import wait_until
from tests.tls_certs import Issued, issue

pytestmark = [pytest.mark.system, pytest.mark.interop]

QUEUES = 8
TIMEOUT = 120.0


@pytest.fixture(scope="module")
def client() -> Client:
    return require("node5")


@pytest.fixture
def run(client: Client, tmp_path: Path) -> Iterator[Callable[..., Driver]]:
    with drivers(client, tmp_path / "drivers") as start:
        yield start


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Callable[..., V2Broker]]:
    with v2_brokers(tmp_path) as start:
        yield start


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Issued:
    return issue(tmp_path_factory.mktemp("certs"), "node5")


def test_the_driver_refuses_bad_arguments(client: Client) -> None:
    cases = [
        (["produce", "--topic", "t"], "--endpoints is required"),
        (["simple", "--endpoints", "e", "--topic", "t", "--group", "g"], "--expect is required"),
        (["produce", "--endpoints", "e", "--topic", "t", "--count", "many"], "must be a number"),
        (["subscribe"], "unknown command"),
    ]
    for args, expected in cases:
        proc = subprocess.run(
            client.command(*args), capture_output=True, text=True, timeout=60,
            env=client.environment(),
        )  # fmt: skip
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert expected in proc.stderr, (args, proc.stderr)
        assert proc.stdout == ""


def test_normal_fifo_and_delay_sends_are_read_over_ordermqs_grpc(
    run: Callable[..., Driver], broker: Callable[..., V2Broker]
) -> None:
    b = broker()
    grpc = GrpcView(b.address)
    normal = run("normal", "produce", "--endpoints", b.endpoints, "--topic", "node5",
                 "--count", "4", "--tag", "TagN", "--keys")  # fmt: skip
    assert normal.finish(TIMEOUT) == 0, normal.describe()
    fifo = run("fifo", "produce", "--endpoints", b.endpoints, "--topic", "node5-fifo",
               "--count", "5", "--groups", "3")  # fmt: skip
    assert fifo.finish(TIMEOUT) == 0, fifo.describe()
    delayed = run("delayed", "produce", "--endpoints", b.endpoints, "--topic", "node5-delay",
                  "--delay-ms", "1500")  # fmt: skip
    assert delayed.finish(TIMEOUT) == 0, delayed.describe()

    sent = {e["message_id"]: e for e in normal.of("sent")}
    read = grpc.messages("node5")
    assert {m.properties["UNIQ_KEY"] for m in read} == set(sent)
    for m in read:
        seq = sent[m.properties["UNIQ_KEY"]]["seq"]
        assert (m.body, m.tags, m.keys) == (f"k:{seq}".encode(), "TagN", (f"k-{seq}",))
        assert m.properties["__rmq.bornHost"]  # the client's host name, kept as it is

    seqs: dict[str, list[int]] = {}
    for m in grpc.messages("node5-fifo"):
        key, _, seq = m.body.decode().partition(":")
        assert (m.sharding_key, m.queue.queue_id) == (key, shard_index(key, QUEUES))
        seqs.setdefault(key, []).append(int(seq))
    assert seqs == {f"group-{g}": list(range(5)) for g in range(3)}

    [due] = delayed.of("sent")
    wait_until(lambda: len(grpc.messages("node5-delay")) == 1, TIMEOUT, "the delayed message")
    assert grpc.messages("node5-delay")[0].properties["UNIQ_KEY"] == due["message_id"]


def test_a_delay_message_can_be_recalled(
    run: Callable[..., Driver], broker: Callable[..., V2Broker]
) -> None:
    b = broker()
    producer = run("recall", "produce", "--endpoints", b.endpoints, "--topic", "node5-recall",
                   "--delay-ms", "600000", "--recall")  # fmt: skip
    assert producer.finish(TIMEOUT) == 0, producer.describe()
    [sent] = producer.of("sent")
    assert sent["recall_handle"] == sent["message_id"]
    assert producer.of("recalled")[0]["message_id"] == sent["message_id"]


def test_a_simple_consumer_receives_and_acks(
    run: Callable[..., Driver], broker: Callable[..., V2Broker]
) -> None:
    b = broker()
    if reason := receive_unavailable(b.endpoints):
        pytest.skip(reason)
    producer = run("producer", "produce", "--endpoints", b.endpoints, "--topic", "node5-recv",
                   "--count", "5", "--tag", "TagN")  # fmt: skip
    assert producer.finish(TIMEOUT) == 0, producer.describe()
    ids = {e["message_id"] for e in producer.of("sent")}
    consumer = run("consumer", "simple", "--endpoints", b.endpoints, "--topic", "node5-recv",
                   "--group", "node5-g", "--expect", "5", "--invisible-ms", "30000")  # fmt: skip
    assert consumer.finish(TIMEOUT) == 0, consumer.describe()
    assert {e["message_id"] for e in consumer.of("message")} == ids
    assert {e["message_id"] for e in consumer.of("acked")} == ids
    assert not any(e.get("corrupted") for e in consumer.of("message"))  # unset unless corrupt


# ---------------------------------------------------------------------------------- TLS
def test_over_tls_the_client_sends_and_a_simple_consumer_receives_and_acks(
    run: Callable[..., Driver], broker: Callable[..., V2Broker], certs: Issued
) -> None:
    b = broker("--tls-cert", str(certs.cert), "--tls-key", str(certs.key))
    if reason := receive_unavailable(b.endpoints, certs.ca):
        pytest.skip(reason)
    tls, topic = ("--tls-ca", str(certs.ca)), "node5-tls"
    producer = run("producer", "produce", "--endpoints", b.endpoints, "--topic", topic,
                   "--count", "3", "--tag", "TagA", *tls)  # fmt: skip
    assert producer.finish(TIMEOUT) == 0, producer.describe()
    ids = {e["message_id"] for e in producer.of("sent")}
    assert len(ids) == 3
    grpc = GrpcView(b.address, TLSConfig(ca_file=certs.ca))  # ordermq's port is TLS too
    assert {m.properties["UNIQ_KEY"] for m in grpc.messages(topic)} == ids

    worker = run("worker", "simple", "--endpoints", b.endpoints, "--topic", topic,
                 "--group", "tls-g", "--expect", "3", *tls)  # fmt: skip
    assert worker.finish(TIMEOUT) == 0, worker.describe()
    assert {e["message_id"] for e in worker.of("message")} == ids
    assert {e["message_id"] for e in worker.of("acked")} == ids


def test_over_tls_a_plain_text_client_or_one_not_trusting_the_ca_connects_nowhere(
    run: Callable[..., Driver], broker: Callable[..., V2Broker], certs: Issued
) -> None:
    b = broker("--tls-cert", str(certs.cert), "--tls-key", str(certs.key))
    grpc = GrpcView(b.address, TLSConfig(ca_file=certs.ca))
    grpc.create_topic("node5-refused", QUEUES)  # a route were the client to get through
    cases = {
        "plain": ([], "Failed to connect"),
        "untrusting": (["--tls"], "unable to verify the first certificate"),
    }
    for name, (args, why) in cases.items():
        producer = run(name, "produce", "--endpoints", b.endpoints, "--topic", "node5-refused",
                       *args)  # fmt: skip
        assert producer.finish(TIMEOUT) == 2, producer.describe()
        assert producer.of("started") == producer.of("sent") == []
        [error] = producer.of("error")
        assert "Failed to fetch topic routes" in error["message"], error
        log = producer.home / "logs" / "rocketmq" / "rocketmq_client_nodejs.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        assert "14 UNAVAILABLE" in text and why in text, text[-3000:]
    assert grpc.messages("node5-refused") == []
    assert grpc.max_offsets("node5-refused") == dict.fromkeys(range(QUEUES), 0)
