"""RocketMQ's C++ client's transaction producer against `python -m mockbroker` (issue 41).

Commit, rollback and check-back, driven by tests/interop/cpp_driver.py `transaction` in a
process of its own. PyPI `rocketmq` 0.4.4 (the client the other interop tests run) has
no transaction producer: its Python binding has no TransactionMQProducer and its
librocketmq.so (rocketmq-client-cpp 1.2.3's C API) exports no C function for one. The
driver then says so ("unsupported", with what it found missing) and the test is skipped
with that reason; a binding that has one (rocketmq-client-python 2.x's API) runs it.
The remoting side is covered without it by tests/component/test_transactions_remoting.py
(raw requests) and by the SDK over rocketmq:// (tests/component/test_transactions.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.interop.harness import Driver, GrpcView, RemotingBroker, brokers, drivers
from tests.interop.provision import Client, require
from tests.support import wait_until

pytestmark = [pytest.mark.system, pytest.mark.interop]

TOPIC, GROUP = "cpp-txn-orders", "cpp-txn-producers"


@pytest.fixture(scope="module")
def cpp() -> Client:
    return require("cpp")


@pytest.fixture
def run(cpp: Client, tmp_path: Path) -> Iterator[Callable[..., Driver]]:
    with drivers(cpp, tmp_path / "drivers") as start:
        yield start


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Callable[..., RemotingBroker]]:
    with brokers(tmp_path) as start:
        yield start


def test_the_cpp_transaction_producer_commits_rolls_back_and_answers_a_check_back(
    run: Callable[..., Driver], broker: Callable[..., RemotingBroker]
) -> None:
    b = broker("--transaction-timeout-seconds", "1", "--transaction-check-seconds", "1")
    view = GrpcView(b.address)
    view.create_topic(TOPIC, 4)
    driver = run("transaction", "transaction", "--namesrv", b.namesrv, "--topic", TOPIC,
                 "--group", GROUP, "--deadline", "60")  # fmt: skip
    driver.wait_for(
        lambda evs: any(e.get("event") in ("unsupported", "done") for e in evs),
        60,
        "the transactions to be sent and 'unknown' checked back",
    )
    unsupported = driver.of("unsupported")
    if unsupported:
        pytest.skip(str(unsupported[0]["reason"]))
    assert driver.finish() == 0, driver.describe()
    assert [e["body"] for e in driver.of("sent")] == ["commit", "rollback", "unknown"]
    assert "unknown" in [e["body"] for e in driver.of("checked")]
    wait_until(
        lambda: sorted(m.body for m in view.messages(TOPIC)) == [b"commit", b"unknown"],
        30,
        "the committed messages",
    )
