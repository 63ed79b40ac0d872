"""TLS on every port: clients connect with the right CA, are refused clearly otherwise.

Certificates are made on the fly (tests/tls_certs.py). Every port of the broker is
covered: ordermq's gRPC and admin (clients, the CLI), RocketMQ remoting and the name
server (`rocketmq://`), RocketMQ 5's gRPC, and the metrics page.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import shutil
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.__main__ import main as broker_main
from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2_grpc as svc_grpc
from mockbroker.tls import TLSCertificateError
from sdk import (
    ConsumeConcurrentlyStatus,
    LitePullConsumer,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TLSConfig,
    aio,
)
from sdk.cli import cli
from sdk.errors import InvalidArgumentError, TLSError
from tests.tls_certs import Issued, issue

TOPIC = "orders"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Issued:
    return issue(tmp_path_factory.mktemp("certs"), "good")


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> Issued:
    """Another CA and its certificates: trusted by nobody here."""
    return issue(tmp_path_factory.mktemp("stranger"), "stranger")


def every_port(data_dir: Path, certs: Issued, **kw: Any) -> BrokerConfig:
    return BrokerConfig(
        data_dir=data_dir, tls_cert=certs.cert, tls_key=certs.key, remoting_port=0,
        namesrv_port=0, v2_port=0, metrics_port=0, **kw,
    )  # fmt: skip


@pytest.fixture
def broker(tmp_path: Path, certs: Issued) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(every_port(tmp_path / "data", certs)) as b:
        yield b


@pytest.fixture
def mutual(tmp_path: Path, certs: Issued) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(every_port(tmp_path / "data", certs, tls_client_ca=certs.ca)) as b:
        yield b


def endpoints(broker: EmbeddedBroker, wire: str) -> str:
    return broker.address if wire == "grpc" else f"rocketmq://{broker.namesrv_address}"


def keyed(n: int) -> list[Message]:
    return [Message(TOPIC, f"m{i}".encode(), sharding_key=f"order-{i % 2}") for i in range(n)]


def stored(broker: EmbeddedBroker) -> int:
    return broker.broker.store.stats.messages_stored


@pytest.mark.parametrize("wire", ["grpc", "rocketmq"])
def test_a_producer_and_a_pull_consumer_work_over_tls(
    broker: EmbeddedBroker, certs: Issued, wire: str
) -> None:
    tls = TLSConfig(ca_file=certs.ca)
    with Producer(endpoints(broker, wire), tls=tls) as producer:
        for message in keyed(4):
            producer.send(message)
    consumer = LitePullConsumer("pullers", endpoints(broker, wire), tls=tls)
    consumer.subscribe(TOPIC)
    with consumer:
        got: list[bytes] = []
        for _ in range(20):
            got += [m.body for m in consumer.poll(timeout=1.0)]
            if len(got) == 4:
                break
    assert sorted(got) == [b"m0", b"m1", b"m2", b"m3"]


class Collect(MessageListenerConcurrently):
    def __init__(self, expected: int) -> None:
        self.bodies: list[bytes] = []
        self.expected = expected
        self.done = threading.Event()

    def consume_message(self, msgs: list[MessageExt], context: Any) -> ConsumeConcurrentlyStatus:
        self.bodies += [m.body for m in msgs]
        if len(self.bodies) >= self.expected:
            self.done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


def test_a_push_consumer_a_simple_consumer_and_an_asyncio_producer_work_over_tls(
    broker: EmbeddedBroker, certs: Issued
) -> None:
    tls = TLSConfig(ca_file=certs.ca)

    async def produce() -> None:
        async with aio.Producer(broker.address, tls=tls) as producer:
            for message in keyed(2):
                await producer.send(message)

    listener = Collect(2)
    push = PushConsumer("pushers", broker.address, tls=tls)
    push.subscribe(TOPIC)
    push.register_message_listener(listener)
    simple = SimpleConsumer("jobs", broker.address, tls=tls)
    simple.subscribe(TOPIC)
    with push, simple:
        asyncio.run(produce())
        received: list[MessageExt] = []
        for _ in range(20):
            received += simple.receive(max_messages=16, invisible_duration=30)
            if len(received) == 2:
                break
        for message in received:
            simple.ack(message)
        assert listener.done.wait(30)
    assert sorted(m.body for m in received) == [b"m0", b"m1"]
    assert sorted(listener.bodies) == [b"m0", b"m1"]


@pytest.mark.parametrize("wire", ["grpc", "rocketmq"])
@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("wrong-ca", "not signed by a CA the client trusts"),
        ("wrong-name", "does not name wrong.example"),
        ("plain-text", "serves"),
    ],
)
def test_a_client_that_cannot_agree_on_tls_gets_a_tls_error_and_stores_nothing(
    broker: EmbeddedBroker, certs: Issued, stranger: Issued, wire: str, case: str, says: str
) -> None:
    tls = {
        "wrong-ca": TLSConfig(ca_file=stranger.ca),
        "wrong-name": TLSConfig(ca_file=certs.ca, server_name="wrong.example"),
        "plain-text": None,
    }[case]
    with (
        pytest.raises(TLSError, match=says) as raised,
        Producer(endpoints(broker, wire), tls=tls) as producer,
    ):
        producer.send(keyed(1)[0])
    if case == "plain-text":
        assert "TLS only" in str(raised.value) and "tls=sdk.TLSConfig" in str(raised.value)
    assert stored(broker) == 0


@pytest.mark.parametrize("wire", ["grpc", "rocketmq"])
def test_mutual_tls_takes_a_client_certificate_of_its_ca_and_refuses_others(
    mutual: EmbeddedBroker, certs: Issued, stranger: Issued, wire: str
) -> None:
    own = TLSConfig(certs.ca, cert_file=certs.client_cert, key_file=certs.client_key)
    with Producer(endpoints(mutual, wire), tls=own) as producer:
        producer.send(keyed(1)[0])
    assert stored(mutual) == 1
    foreign = TLSConfig(certs.ca, cert_file=stranger.client_cert, key_file=stranger.client_key)
    for tls in (TLSConfig(certs.ca), foreign):
        with pytest.raises(TLSError), Producer(endpoints(mutual, wire), tls=tls) as producer:
            producer.send(keyed(1)[0])
    assert stored(mutual) == 1


def v2_route(address: str, credentials: grpc.ChannelCredentials | None) -> Any:
    """QueryRoute on a RocketMQ 5 port, over TLS with `credentials`."""
    request = svc.QueryRouteRequest(topic=v2.Resource(name=TOPIC))
    metadata = (("x-mq-client-id", "v2-client-1"),)

    async def query() -> Any:
        channel = (
            grpc.aio.secure_channel(address, credentials)
            if credentials is not None
            else grpc.aio.insecure_channel(address)
        )
        async with channel:
            stub = svc_grpc.MessagingServiceStub(channel)
            return await stub.QueryRoute(request, metadata=metadata, timeout=5)

    return asyncio.run(query())


def test_mutual_tls_covers_the_rocketmq_5_port_the_metrics_page_and_the_cli(
    mutual: EmbeddedBroker, certs: Issued
) -> None:
    ca = certs.ca.read_bytes()
    own = grpc.ssl_channel_credentials(
        ca, certs.client_key.read_bytes(), certs.client_cert.read_bytes()
    )
    assert v2_route(mutual.v2_address, own).status.code == v2.OK
    with pytest.raises(grpc.aio.AioRpcError):
        v2_route(mutual.v2_address, grpc.ssl_channel_credentials(ca))

    url = f"https://127.0.0.1:{mutual.broker.metrics_port}/healthz"
    context = ssl.create_default_context(cafile=str(certs.ca))
    with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
        urllib.request.urlopen(url, context=context, timeout=5).read()
    context.load_cert_chain(certs.client_cert, certs.client_key)
    with urllib.request.urlopen(url, context=context, timeout=5) as page:
        assert page.status == 200

    runner = CliRunner()
    base = ["--broker", mutual.address, "--tls-ca", str(certs.ca)]
    without = runner.invoke(cli, [*base, "broker", "status"])
    assert without.exit_code == 1 and "requires a client certificate" in without.output
    with_cert = runner.invoke(cli, [*base, "--tls-cert", str(certs.client_cert), "--tls-key",
                                    str(certs.client_key), "broker", "status"])  # fmt: skip
    assert with_cert.exit_code == 0, with_cert.output


def test_the_rocketmq_5_port_serves_tls_only(broker: EmbeddedBroker, certs: Issued) -> None:

    answer = v2_route(broker.v2_address, grpc.ssl_channel_credentials(certs.ca.read_bytes()))
    assert answer.status.code == v2.OK and len(answer.message_queues) == 8
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        v2_route(broker.v2_address, None)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_metrics_page_is_served_over_https_only(broker: EmbeddedBroker, certs: Issued) -> None:
    port = broker.broker.metrics_port
    context = ssl.create_default_context(cafile=str(certs.ca))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context) as page:
        assert page.status == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)


def test_the_cli_connects_over_tls_and_says_why_it_cannot(
    broker: EmbeddedBroker, certs: Issued
) -> None:
    runner = CliRunner()
    ok = runner.invoke(cli, ["--broker", broker.address, "--tls-ca", str(certs.ca), "broker",
                             "status"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    plain = runner.invoke(cli, ["--broker", broker.address, "broker", "status"])
    assert plain.exit_code == 1 and "serves TLS only" in plain.output
    half = runner.invoke(cli, ["--tls-cert", str(certs.client_cert), "broker", "status"])
    assert half.exit_code == 2 and "cert_file and key_file go together" in half.output


def test_a_tls_config_with_a_missing_file_is_refused_when_the_client_is_made(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    missing = TLSConfig(ca_file=tmp_path / "nope.pem")
    for where in (broker.address, f"rocketmq://{broker.namesrv_address}"):
        with pytest.raises(InvalidArgumentError, match=r"nope\.pem"):
            Producer(where, tls=missing)


@pytest.mark.parametrize("problem", ["ca-not-pem", "cert-not-pem", "key-mismatch", "encrypted"])
def test_a_tls_file_the_client_cannot_use_is_named_when_the_client_is_made(
    broker: EmbeddedBroker, certs: Issued, stranger: Issued, tmp_path: Path, problem: str
) -> None:
    # Before, gRPC took these files and failed each connection ("failed to create security
    # handshaker"), and an encrypted key had OpenSSL prompt for its pass phrase.
    junk = tmp_path / "junk.pem"
    junk.write_text("hello\n")
    if problem == "ca-not-pem":
        tls, says = TLSConfig(ca_file=junk), r"ca_file '.*junk\.pem' holds no PEM certificate"
    elif problem == "cert-not-pem":
        tls = TLSConfig(certs.ca, cert_file=junk, key_file=certs.client_key)
        says = r"cert_file '.*junk\.pem' and key_file .* are not a PEM certificate and its \w+ key$"
    elif problem == "key-mismatch":
        tls = TLSConfig(certs.ca, cert_file=certs.client_cert, key_file=stranger.client_key)
        says = r"are not a PEM certificate and its private key \(KEY_VALUES_MISMATCH\)"
    else:
        encrypted = _encrypted(certs.client_key, tmp_path)
        tls = TLSConfig(certs.ca, cert_file=certs.client_cert, key_file=encrypted)
        says = r"key_file '.*encrypted\.key' is encrypted"
    for where in (broker.address, f"rocketmq://{broker.namesrv_address}"):
        with pytest.raises(InvalidArgumentError, match=says):
            Producer(where, tls=tls)


@pytest.mark.parametrize("name", ["", " ", "a b", "host\x00", "host\n", 5])
def test_a_server_name_that_is_no_host_name_is_refused(name: Any) -> None:
    # "\x00" was taken, and the gRPC channel then raised TypeError at the first call.
    with pytest.raises(InvalidArgumentError, match="server_name"):
        TLSConfig(server_name=name)


# ---------------------------------------------------------------------- the broker's files
def _days(n: int) -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=n)


@pytest.mark.parametrize(
    "problem", ["missing", "not-pem", "key-mismatch", "expired", "not-yet-valid", "encrypted"]
)
def test_the_broker_refuses_to_start_with_a_tls_file_it_cannot_serve(
    tmp_path: Path, certs: Issued, stranger: Issued, problem: str, capsys: Any
) -> None:
    cert, key = certs.cert, certs.key
    if problem == "missing":
        cert, says = tmp_path / "gone.pem", "gone.pem: no such file"
    elif problem == "not-pem":
        cert = tmp_path / "junk.pem"
        cert.write_text("hello\n")
        says = "junk.pem: holds no PEM certificate"
    elif problem == "key-mismatch":
        key, says = stranger.key, "does not match the certificate"
    elif problem == "encrypted":
        key, says = _encrypted(certs.key, tmp_path), "is encrypted"
    else:
        window = (
            {"not_before": _days(-10), "not_after": _days(-1)}
            if problem == "expired"
            else {"not_before": _days(1), "not_after": _days(10)}
        )
        dated = issue(tmp_path / "dated", "dated", **window)
        cert, key = dated.cert, dated.key
        says = "expired on" if problem == "expired" else "not valid before"
    config = BrokerConfig(data_dir=tmp_path / "data", tls_cert=cert, tls_key=key)
    with pytest.raises(TLSCertificateError, match=says):
        EmbeddedBroker(config).start()
    assert not (tmp_path / "data" / "commitlog").exists()  # refused before the store opened
    with pytest.raises(SystemExit) as exited:
        broker_main(["--data-dir", str(tmp_path / "cli"), "--port", "0", "--tls-cert",
                     str(cert), "--tls-key", str(key)])  # fmt: skip
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def _encrypted(key: Path, tmp_path: Path) -> Path:
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    out = tmp_path / "encrypted.key"
    out.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    return out


def test_config_wants_cert_and_key_together_and_a_client_ca_only_with_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="go together"):
        BrokerConfig(data_dir=tmp_path, tls_cert=tmp_path / "c.pem")
    with pytest.raises(ValueError, match="needs tls_cert"):
        BrokerConfig(data_dir=tmp_path, tls_client_ca=tmp_path / "ca.pem")
    with pytest.raises(InvalidArgumentError, match="go together"):
        TLSConfig(cert_file="c.pem")


# ---------------------------------------------------------------------- rotation
def test_a_reload_serves_new_connections_the_new_certificate_and_keeps_old_ones(
    tmp_path: Path, certs: Issued, stranger: Issued
) -> None:
    served = tmp_path / "served"
    served.mkdir()
    cert, key = served / "cert.pem", served / "key.pem"
    shutil.copy(certs.cert, cert)
    shutil.copy(certs.key, key)
    config = BrokerConfig(data_dir=tmp_path / "data", tls_cert=cert, tls_key=key,
                          remoting_port=0, namesrv_port=0)  # fmt: skip
    with EmbeddedBroker(config) as broker:
        wires = [broker.address, f"rocketmq://{broker.namesrv_address}"]
        before = [Producer(w, tls=TLSConfig(certs.ca)) for w in wires]
        for producer in before:
            producer.start()
            producer.send(keyed(1)[0])
        shutil.copy(stranger.cert, cert)  # the new certificate, of another CA
        shutil.copy(stranger.key, key)
        broker.broker.reload_tls()
        for producer in before:  # connected before: keep working
            producer.send(keyed(1)[0])
            producer.shutdown()
        for wire in wires:
            with Producer(wire, tls=TLSConfig(stranger.ca)) as producer:
                producer.send(keyed(1)[0])
            with pytest.raises(TLSError), Producer(wire, tls=TLSConfig(certs.ca)) as producer:
                producer.send(keyed(1)[0])
        key.write_text("not a key\n")  # a bad set is refused whole; the served one stays
        with pytest.raises(TLSCertificateError, match="holds no PEM private key"):
            broker.broker.reload_tls()
        with Producer(broker.address, tls=TLSConfig(stranger.ca)) as producer:
            producer.send(keyed(1)[0])
        assert stored(broker) == 7


# ---------------------------------------------------------------------- plain text, loudly
def test_a_broker_open_to_the_network_without_tls_says_so_once(
    tmp_path: Path, certs: Issued, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mockbroker")
    open_config = BrokerConfig(data_dir=tmp_path / "open", host="0.0.0.0", remoting_port=0,
                               metrics_port=0)  # fmt: skip
    with EmbeddedBroker(open_config) as broker:
        port = broker.broker.metrics_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as page:
            assert page.status == 200  # the metrics page stays on loopback
    warnings = [r.getMessage() for r in caplog.records if "plain text" in r.getMessage()]
    assert len(warnings) == 1
    assert "ordermq gRPC and admin" in warnings[0] and "RocketMQ remoting" in warnings[0]
    assert "metrics" not in warnings[0]
    caplog.clear()
    with EmbeddedBroker(every_port(tmp_path / "tls", certs, host="0.0.0.0")):
        pass
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "local")):
        pass
    assert not [r for r in caplog.records if "plain text" in r.getMessage()]
