"""Apache RocketMQ's Python client 5.x (PyPI rocketmq-python-client) against the v2 front.

The client is installed into ~/.cache/ordermq/interop by tests/interop/provision.py and run by
tests/interop/rmq5_driver.py in processes of its own (its generated protos clash with
mockbroker's copy in one process), each with a HOME of its own (it logs under ~/logs).
The broker is `python -m mockbroker --v2-port P`; what the client sends is read back over
ordermq's gRPC (one truth).

What works without the pop core is tested as it is: routes, telemetry settings (a push
consumer does not start without them), heartbeats into the group, normal, FIFO and delay
sends with their fields, recall. The receive/ack tests detect a broker that answers
ReceiveMessage NOT_IMPLEMENTED and skip with its reason: they run once the core is in.

With `--acl-file` the driver signs with `--access-key/--secret-key` (the client's
`Credentials(ak, sk)`): a wrong secret is refused (40100) and stores nothing.

Over TLS (`--tls-cert/--tls-key`, certificates from tests/tls_certs.py) the client's own
switch (`tls_enable=True`) is used; it trusts gRPC's default roots only, so the driver's
--tls-ca points GRPC_DEFAULT_SSL_ROOTS_FILE_PATH at the test CA.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sdk import Credentials, Message, Producer, TLSConfig
from sdk.selector import shard_index
from tests.interop.harness import (
    Driver,
    GrpcView,
    V2Broker,
    drivers,
    group_is_fifo,
    receive_unavailable,
    v2_brokers,
    wait_across,
)
from tests.interop.provision import Client, require
from tests.support import wait_until
from tests.tls_certs import Issued, issue

pytestmark = [pytest.mark.system, pytest.mark.interop]

QUEUES = 8
TIMEOUT = 120.0


@pytest.fixture(scope="module")
def client() -> Client:
    return require("python5")


@pytest.fixture
def run(client: Client, tmp_path: Path) -> Iterator[Callable[..., Driver]]:
    """`run(name, *args)` starts rmq5_driver.py; whatever still runs is killed at the end."""
    with drivers(client, tmp_path / "drivers") as start:
        yield start


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Callable[..., V2Broker]]:
    with v2_brokers(tmp_path) as start:
        yield start


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Issued:
    return issue(tmp_path_factory.mktemp("certs"), "py5")


def consuming(b: V2Broker, ca: Path | None = None) -> None:
    """Skip the calling test while the broker cannot serve receives."""
    if reason := receive_unavailable(b.endpoints, ca):
        pytest.skip(reason)


def client_log(driver: Driver) -> str:
    """What the client logged (it logs the gRPC status of a failed call, not its driver)."""
    log = driver.home / "logs" / "rocketmq_python" / "rocketmq_client.log"
    return log.read_text(errors="replace") if log.exists() else ""


def test_the_driver_refuses_bad_arguments(client: Client) -> None:
    for args in (["produce", "--topic", "t"], ["simple", "--endpoints", "e", "--topic", "t"],
                 ["subscribe"]):  # fmt: skip
        proc = subprocess.run(
            client.command(*args), capture_output=True, text=True, timeout=60,
            env=client.environment(),
        )  # fmt: skip
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "required" in proc.stderr or "invalid choice" in proc.stderr, proc.stderr
        assert proc.stdout == ""


def test_normal_sends_arrive_with_their_fields_readable_over_ordermqs_grpc(
    run: Callable[..., Driver], broker: Callable[..., V2Broker]
) -> None:
    b = broker()
    producer = run(
        "producer", "produce", "--endpoints", b.endpoints, "--topic", "py5-normal",
        "--count", "6", "--tag", "TagA", "--keys", "--property", "color=red",
    )  # fmt: skip
    assert producer.finish(TIMEOUT) == 0, producer.describe()
    sent = {e["message_id"]: e for e in producer.of("sent")}
    assert len(sent) == 6
    read = GrpcView(b.address).messages("py5-normal")
    assert len(read) == 6
    assert len({m.queue.queue_id for m in read}) == 6  # the broker spread them in turn
    for m in read:
        told = sent[m.properties["UNIQ_KEY"]]
        assert m.body == f"k:{told['seq']}".encode()
        assert (m.tags, m.keys, m.properties["color"]) == ("TagA", (f"k-{told['seq']}",), "red")
        assert m.queue_offset == told["offset"]
        assert m.sharding_key is None and m.born_timestamp > 0


def test_a_transaction_producer_commits_rolls_back_and_answers_a_check_back(
    run: Callable[..., Driver], broker: Callable[..., V2Broker]
) -> None:
    b = broker("--transaction-timeout-seconds", "1", "--transaction-check-seconds", "1")
    producer = run("producer", "transaction", "--endpoints", b.endpoints, "--topic", "py5-txn")
    assert producer.finish(TIMEOUT) == 0, producer.describe()
    sent = {e["body"]: e for e in producer.of("sent")}
    assert list(sent) == ["commit", "rollback", "unknown"]
    assert all(e["transaction_id"] for e in sent.values())
    assert "unknown" in [e["body"] for e in producer.of("checked")]
    wait_until(
        lambda: (
            sorted(m.body for m in GrpcView(b.address).messages("py5-txn"))
            == [b"commit", b"unknown"]
        ),
        30,
        "the committed messages",
    )
    read = {m.body: m for m in GrpcView(b.address).messages("py5-txn")}
    assert read[b"commit"].properties["UNIQ_KEY"] == sent["commit"]["message_id"]


def test_fifo_sends_keep_each_message_group_in_one_queue_shared_with_ordermq_keys(
    run: Callable[..., Driver], broker: Callable[..., V2Broker]
) -> None:
    b = broker()
    groups, rounds = 6, 8
    producer = run(
        "producer", "produce", "--endpoints", b.endpoints, "--topic", "py5-fifo",
        "--count", str(rounds), "--groups", str(groups),
    )  # fmt: skip
    assert producer.finish(TIMEOUT) == 0, producer.describe()
    with Producer(b.address) as sdk:  # ordermq's keyed sends of the same keys: same queues
        for g in range(groups):
            sdk.send(Message("py5-fifo", f"group-{g}:{rounds}".encode(), sharding_key=f"group-{g}"))
    read = GrpcView(b.address).messages("py5-fifo")
    assert len(read) == groups * (rounds + 1)
    seqs: dict[str, list[int]] = {}
    for m in read:
        key, _, seq = m.body.decode().partition(":")
        assert m.sharding_key == key
        assert m.queue.queue_id == shard_index(key, QUEUES), m
        seqs.setdefault(key, []).append(int(seq))
    assert all(s == list(range(rounds + 1)) for s in seqs.values()), seqs


def test_a_delay_message_is_delivered_when_due_and_one_can_be_recalled(
    run: Callable[..., Driver], broker: Callable[..., V2Broker]
) -> None:
    b = broker()
    grpc = GrpcView(b.address)
    # rocketmq-python-client 5.1.2 writes the milliseconds into Timestamp.seconds.
    delayed = run(
        "delayed", "produce", "--endpoints", b.endpoints, "--topic", "py5-delay",
        "--delay-ms", "2000",
    )  # fmt: skip
    assert delayed.finish(TIMEOUT) == 0, delayed.describe()
    [sent] = delayed.of("sent")
    assert sent["recall_handle"] == sent["message_id"]
    wait_until(lambda: len(grpc.messages("py5-delay")) == 1, TIMEOUT, "the delayed message")
    [m] = grpc.messages("py5-delay")
    assert m.properties["UNIQ_KEY"] == sent["message_id"]
    # born_timestamp has whole seconds (the client sends int(time.time())): not before due
    assert m.store_timestamp - m.born_timestamp >= 1000, m

    recalled = run(
        "recalled", "produce", "--endpoints", b.endpoints, "--topic", "py5-delay",
        "--delay-ms", "600000", "--recall",
    )  # fmt: skip
    assert recalled.finish(TIMEOUT) == 0, recalled.describe()
    [sent] = recalled.of("sent")
    assert recalled.of("recalled") == [{"event": "recalled", "message_id": sent["message_id"]}]


def test_a_push_consumer_gets_its_settings_and_heartbeats_into_its_group(
    run: Callable[..., Driver], broker: Callable[..., V2Broker]
) -> None:
    b = broker()
    grpc = GrpcView(b.address)
    grpc.create_topic("py5-members", QUEUES)
    consumer = run(
        "push", "push", "--endpoints", b.endpoints, "--topic", "py5-members", "--group", "py5-g"
    )
    # A push consumer fails to start without the server's settings within 10 s.
    started = consumer.wait_event("started")
    assert started["fifo"] is False
    wait_until(lambda: started["client_id"] in grpc.members("py5-g"), TIMEOUT, "its heartbeat")
    assert consumer.terminate() == 0, consumer.describe()
    assert consumer.of("stopped")
    wait_until(lambda: grpc.members("py5-g") == [], TIMEOUT, "it left the group")


# ---------------------------------------------------------------------- needs the pop core
def test_a_simple_consumer_receives_and_acks_and_an_unacked_message_comes_back(
    run: Callable[..., Driver], broker: Callable[..., V2Broker]
) -> None:
    b = broker()
    consuming(b)
    endpoints, topic = b.endpoints, "py5-simple"
    producer = run("producer", "produce", "--endpoints", endpoints, "--topic", topic,
                   "--count", "3", "--tag", "TagA")  # fmt: skip
    assert producer.finish(TIMEOUT) == 0, producer.describe()
    ids = {e["message_id"] for e in producer.of("sent")}

    worker = run("worker", "simple", "--endpoints", endpoints, "--topic", topic, "--group", "sg",
                 "--expect", "3", "--invisible", "30")  # fmt: skip
    assert worker.finish(TIMEOUT) == 0, worker.describe()
    assert {e["message_id"] for e in worker.of("message")} == ids
    assert {e["message_id"] for e in worker.of("acked")} == ids
    assert all(e["attempt"] == 1 and e["tag"] == "TagA" for e in worker.of("message"))

    producer = run("producer2", "produce", "--endpoints", endpoints, "--topic", topic)
    assert producer.finish(TIMEOUT) == 0, producer.describe()
    [late] = producer.of("sent")
    dropped = run("dropper", "simple", "--endpoints", endpoints, "--topic", topic, "--group",
                  "sg", "--expect", "1", "--invisible", "2", "--no-ack")  # fmt: skip
    assert dropped.finish(TIMEOUT) == 0, dropped.describe()
    again = run("again", "simple", "--endpoints", endpoints, "--topic", topic, "--group", "sg",
                "--expect", "1", "--invisible", "30")  # fmt: skip
    assert again.finish(TIMEOUT) == 0, again.describe()
    [first] = dropped.of("message")
    [second] = again.of("message")
    assert first["message_id"] == second["message_id"] == late["message_id"]
    assert (first["attempt"], second["attempt"]) == (1, 2)


def test_a_changed_invisible_duration_gives_a_receipt_handle_the_ack_accepts(
    run: Callable[..., Driver], broker: Callable[..., V2Broker]
) -> None:
    b = broker()
    consuming(b)
    producer = run("producer", "produce", "--endpoints", b.endpoints, "--topic", "py5-ttr",
                   "--count", "2")  # fmt: skip
    assert producer.finish(TIMEOUT) == 0, producer.describe()
    worker = run("worker", "simple", "--endpoints", b.endpoints, "--topic", "py5-ttr",
                 "--group", "ttr", "--expect", "2", "--invisible", "10",
                 "--change-invisible", "60")  # fmt: skip
    assert worker.finish(TIMEOUT) == 0, worker.describe()
    assert len(worker.of("changed")) == len(worker.of("acked")) == 2


def test_a_push_consumer_on_a_fifo_group_consumes_each_message_group_in_order(
    run: Callable[..., Driver], broker: Callable[..., V2Broker]
) -> None:
    group = "py5-fifo-group"
    b = broker("--fifo-group", group)
    consuming(b)
    assert group_is_fifo(b.endpoints, group), "the broker tells the group's clients it is FIFO"
    groups, rounds = 4, 10
    producer = run("producer", "produce", "--endpoints", b.endpoints, "--topic", "py5-ordered",
                   "--count", str(rounds), "--groups", str(groups))  # fmt: skip
    assert producer.finish(TIMEOUT) == 0, producer.describe()
    consumer = run("push", "push", "--endpoints", b.endpoints, "--topic", "py5-ordered",
                   "--group", group)  # fmt: skip
    assert consumer.wait_event("started")["fifo"] is True
    wait_across(
        [consumer],
        lambda: len({(e["key"], e["seq"]) for e in consumer.of("message")}) >= groups * rounds,
        TIMEOUT,
        "every message consumed",
    )
    last: dict[str, int] = {}
    for e in consumer.of("message"):
        assert e["seq"] == last.get(e["key"], -1) + 1, f"{e['key']} out of order: {e}"
        last[e["key"]] = e["seq"]
    assert consumer.terminate() == 0, consumer.describe()


# ---------------------------------------------------------------------------------- TLS
def test_over_tls_the_client_sends_and_a_simple_consumer_receives_and_acks(
    run: Callable[..., Driver], broker: Callable[..., V2Broker], certs: Issued
) -> None:
    b = broker("--tls-cert", str(certs.cert), "--tls-key", str(certs.key))
    consuming(b, certs.ca)
    tls, topic = ("--tls-ca", str(certs.ca)), "py5-tls"
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
    assert all(e["tag"] == "TagA" and e["body"].startswith("k:") for e in worker.of("message"))


def test_over_tls_a_plain_text_client_or_one_not_trusting_the_ca_connects_nowhere(
    run: Callable[..., Driver], broker: Callable[..., V2Broker], certs: Issued
) -> None:
    b = broker("--tls-cert", str(certs.cert), "--tls-key", str(certs.key))
    grpc = GrpcView(b.address, TLSConfig(ca_file=certs.ca))
    grpc.create_topic("py5-refused", QUEUES)  # a route were the client to get through
    cases = {
        "plain": ([], "Socket closed"),  # the broker closes a connection that is not TLS
        "untrusting": (["--tls"], "CERTIFICATE_VERIFY_FAILED"),  # gRPC's roots only
    }
    for name, (args, why) in cases.items():
        producer = run(name, "produce", "--endpoints", b.endpoints, "--topic", "py5-refused",
                       *args)  # fmt: skip
        assert producer.finish(TIMEOUT) == 2, producer.describe()
        assert producer.of("sent") == []
        [error] = producer.of("error")
        assert "failed to fetch topic:py5-refused route" in error["message"], error
        log = client_log(producer)
        assert "StatusCode.UNAVAILABLE" in log and why in log, log[-3000:]
    assert grpc.messages("py5-refused") == []
    assert grpc.max_offsets("py5-refused") == dict.fromkeys(range(QUEUES), 0)


# ---------------------------------------------------------------------------------- ACL
ACL = """\
accounts:
  - accessKey: py5-writer
    secretKey: py5-writer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - py5-acl=PUB
  - accessKey: py5-reader
    secretKey: py5-reader-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - py5-acl=SUB
    groupPerms:
      - acl-g=SUB
  - accessKey: py5-admin
    secretKey: py5-admin-secret
    admin: true
"""


def test_with_an_acl_signed_clients_send_and_receive_and_a_wrong_secret_stores_nothing(
    run: Callable[..., Driver], broker: Callable[..., V2Broker], tmp_path: Path
) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    b = broker("--acl-file", str(acl))
    consuming(b)
    topic = "py5-acl"
    grpc = GrpcView(b.address, credentials=Credentials("py5-admin", "py5-admin-secret"))
    grpc.create_topic(topic, QUEUES)

    wrong = run("wrong", "produce", "--endpoints", b.endpoints, "--topic", topic,
                "--access-key", "py5-writer", "--secret-key", "not-the-secret")  # fmt: skip
    assert wrong.finish(TIMEOUT) == 2, wrong.describe()
    assert wrong.of("sent") == []
    [error] = wrong.of("error")
    assert "failed to fetch topic:py5-acl route" in error["message"], error
    log = client_log(wrong)  # the client logs the status code and message of the refusal
    assert "40100, accessKey 'py5-writer': the signature does not match" in log, log[-3000:]
    assert grpc.messages(topic) == []

    producer = run("producer", "produce", "--endpoints", b.endpoints, "--topic", topic,
                   "--count", "3", "--access-key", "py5-writer",
                   "--secret-key", "py5-writer-secret")  # fmt: skip
    assert producer.finish(TIMEOUT) == 0, producer.describe()
    ids = {e["message_id"] for e in producer.of("sent")}
    assert len(ids) == 3
    assert {m.properties["UNIQ_KEY"] for m in grpc.messages(topic)} == ids

    worker = run("worker", "simple", "--endpoints", b.endpoints, "--topic", topic,
                 "--group", "acl-g", "--expect", "3", "--access-key", "py5-reader",
                 "--secret-key", "py5-reader-secret")  # fmt: skip
    assert worker.finish(TIMEOUT) == 0, worker.describe()
    assert {e["message_id"] for e in worker.of("message")} == ids
    assert {e["message_id"] for e in worker.of("acked")} == ids
