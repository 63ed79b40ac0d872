"""RocketMQ's C++ client (PyPI `rocketmq` 0.4.4) against mockbroker's remoting ACL.

The client signs with `set_session_credentials(access_key, secret_key, channel)`
(RocketMQ's AclClientRPCHook signature, computed by the C++ library itself): with the
account's secret its producer sends and its pull consumer reads; with a wrong secret its
send is refused and nothing is stored. Skipped when the C++ client is not provisioned
(`make interop-setup`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.component.test_acl_grpc import ACL, CONSUMER, GROUP, PRODUCER, TOPIC
from tests.interop.harness import Driver, RemotingBroker, brokers, drivers
from tests.interop.provision import Client, require
from tests.system.test_rocketmq_cpp_client import CONSUME_TIMEOUT, PRODUCE_TIMEOUT

pytestmark = [pytest.mark.system, pytest.mark.interop]

ADMIN_ACL = ACL + "  - accessKey: route-admin\n    secretKey: route-secret\n    admin: true\n"


@pytest.fixture(scope="module")
def cpp() -> Client:
    return require("cpp")


@pytest.fixture
def run(cpp: Client, tmp_path: Path) -> Iterator[Callable[..., Driver]]:
    with drivers(cpp, tmp_path / "drivers") as start:
        yield start


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RemotingBroker]:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ADMIN_ACL)
    with brokers(tmp_path) as start:
        yield start("--acl-file", str(acl))


def produce(b: RemotingBroker, access_key: str, secret_key: str) -> list[str]:
    return ["produce", "--namesrv", b.namesrv, "--topic", TOPIC, "--group", "cpp-producer",
            "--deadline", str(PRODUCE_TIMEOUT), "--mode", "sync", "--keys", "2",
            "--rounds", "3", "--access-key", access_key, "--secret-key", secret_key]  # fmt: skip


def test_the_cpp_client_signs_and_is_served(
    broker: RemotingBroker, run: Callable[..., Driver]
) -> None:
    producer = run("producer", *produce(broker, PRODUCER.access_key, PRODUCER.secret_key))
    assert producer.finish(PRODUCE_TIMEOUT) == 0, producer.describe()
    assert producer.of("done")[0]["sent"] == 6
    assert pull(broker, run) == 6


def pull(broker: RemotingBroker, run: Callable[..., Driver]) -> int:
    """What the C++ pull consumer, signing as the consumer account, reads of the topic."""
    puller = run(
        "puller", "pull", "--namesrv", broker.namesrv, "--topic", TOPIC, "--group", GROUP,
        "--deadline", str(CONSUME_TIMEOUT), "--report", "summary",
        "--access-key", CONSUMER.access_key, "--secret-key", CONSUMER.secret_key,
    )  # fmt: skip
    assert puller.finish(CONSUME_TIMEOUT) == 0, puller.describe()
    return int(puller.of("done")[0]["messages"])


def test_the_cpp_client_with_a_wrong_secret_is_refused(
    broker: RemotingBroker, run: Callable[..., Driver]
) -> None:
    good = run("good", *produce(broker, PRODUCER.access_key, PRODUCER.secret_key))
    assert good.finish(PRODUCE_TIMEOUT) == 0, good.describe()  # the topic exists now
    # --route-timeout 0: refused sends end in "No route info" too; no waiting for a route
    producer = run("producer", *produce(broker, PRODUCER.access_key, "not-the-secret"),
                   "--route-timeout", "0")  # fmt: skip
    assert producer.finish(PRODUCE_TIMEOUT) != 0
    errors = producer.of("error")
    assert errors and not producer.of("sent"), producer.describe()
    # The C++ client reports its last failure ("No route info ..."), not the broker's remark:
    # what it sent is checked by reading the topic back, the 6 messages of `good` only.
    assert pull(broker, run) == 6
