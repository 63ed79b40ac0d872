"""A consumer process started with start(), as the README shows, ended every way a process ends.

Each test runs a broker process and consumer processes of tests/system/start_consumer.py
(an orderly listener that logs each message it processes; no signal handler, no
shutdown() call), and judges the end by what the broker says afterwards (admin API).

- Ctrl+C (SIGINT), SIGTERM, or the main thread simply ending: the process exits by itself,
  with no traceback from ordermq; every message it processed is committed (the committed
  offset of each queue is one past the last offset it logged); it holds no lock and is no
  longer a member of the group.
- The same consumer written as PushConsumer's docstrings recommend, waiting with
  `wait_for_shutdown_signal()` (blocking) or `sdk.aio.wait_for_shutdown_signal()`
  (asyncio) inside its `with` block: Ctrl+C or SIGTERM ends the wait, the block shuts
  the consumer down, and the program carries on to exit with status 0, as cleanly.
- kill -9: the broker sees the process's connections close; after its disconnect grace
  (here 3 s) it removes the client and releases its locks, so a successor consumes every
  queue long before the lock lease (60 s) or the client timeout (120 s) would allow.
- SIGSTOP: a paused process keeps its connections, so it keeps its membership and its
  locks (until the lease runs out, as in RocketMQ), however long the disconnect grace has
  passed; resumed, it carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sdk import Message, Producer
from sdk._transport.broker_client import BrokerClient
from tests.support import ROOT, BrokerProcess, wait_until, written_lines
from tests.system.start_consumer import GROUP, TOPIC

pytestmark = [pytest.mark.system, pytest.mark.chaos]

StartBroker = Callable[..., BrokerProcess]

SCRIPT = ROOT / "tests" / "system" / "start_consumer.py"
QUEUES = 8
#: A Python process importing grpc, on a busy two-core machine.
START_TIMEOUT = 60.0
#: Shutting down: listener calls in flight finish (20 ms each), then commit, unlock, leave.
EXIT_TIMEOUT = 60.0
DISCONNECT_GRACE = 3.0
#: Well under the 60 s lock lease: the grace, a sweep, a rebalance, and a busy machine.
TAKEOVER_TIMEOUT = 20.0


@dataclass
class ConsumerProcess:
    """One start_consumer.py process, its output files, and what it logged."""

    proc: subprocess.Popen[bytes]
    log: Path
    out: Path
    err: Path

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def exit_status(self, timeout: float) -> int:
        """Its exit status once it ends; AssertionError with every thread's stack if it
        has not ended within `timeout` (start_consumer.py dumps them on SIGUSR1)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(3)
            raise AssertionError(
                f"not ended {timeout:g} s after the signal; its threads then:\n{self.stderr()}"
            ) from None

    def client_id(self) -> str:
        return next(
            line.split()[1] for line in self.stdout().splitlines() if line.startswith("ready ")
        )

    def queues_consumed(self) -> set[int]:
        """Queues of which it processed at least one message."""
        return {
            int(q)
            for line in self.stdout().splitlines()
            if line.startswith("consumed ")
            for q in line.split()[1:]
        }

    def last_offsets(self) -> dict[int, int]:
        """The highest offset it processed per queue."""
        last: dict[int, int] = {}
        for line in written_lines(self.log):
            queue, offset = map(int, line.split())
            last[queue] = max(last.get(queue, -1), offset)
        return last


@pytest.fixture
def start_consumer(tmp_path: Path) -> Iterator[Callable[..., ConsumerProcess]]:
    """`start_consumer(address, name, *args)`: a consumer process, once it is ready."""
    started: list[ConsumerProcess] = []

    def start(address: str, name: str, *args: str) -> ConsumerProcess:
        c = ConsumerProcess(
            None,  # type: ignore[arg-type]  # set below, once the files exist
            tmp_path / f"{name}.log",
            tmp_path / f"{name}.out",
            tmp_path / f"{name}.err",
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        with c.out.open("wb") as out, c.err.open("wb") as err:
            c.proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), "--broker", address, "--log", str(c.log), *args],
                cwd=ROOT, env=env, stdout=out, stderr=err,
            )  # fmt: skip
        started.append(c)

        def ready() -> bool:
            assert c.proc.poll() is None, f"{name} exited early:\n{c.stderr()}"
            return "ready " in c.stdout()

        wait_until(ready, START_TIMEOUT, f"{name} to start")
        return c

    yield start
    for c in started:
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait()


def send(address: str, count: int) -> None:
    """`count` messages over the topic's queues."""
    with Producer(address) as producer:
        producer.send_batch(
            [Message(TOPIC, b"%d" % i, sharding_key=f"k{i % 64}") for i in range(count)]
        )


def progress(address: str) -> dict[str, Any]:
    """The group's members, and per queue its committed offset and lock owner."""

    async def ask() -> dict[str, Any]:
        client = BrokerClient(address)
        try:
            return await client.admin("ConsumerProgress", group=GROUP, topic=TOPIC)
        finally:
            await client.close()

    return asyncio.run(ask())


def lock_owners(address: str) -> dict[int, str]:
    return {q["queue"]["queue_id"]: q["lock_owner"] for q in progress(address)["queues"]}


def assert_left_cleanly(address: str, consumer: ConsumerProcess) -> None:
    """Committed exactly what it processed; no lock, no membership left behind."""
    state = progress(address)
    assert state["client_ids"] == [], "the client is still a member of its group"
    assert {q["queue"]["queue_id"]: q["lock_owner"] for q in state["queues"]} == dict.fromkeys(
        range(QUEUES), ""
    ), "locks were left behind"
    last = consumer.last_offsets()
    committed = {q["queue"]["queue_id"]: q["consumer_offset"] for q in state["queues"]}
    assert committed == {q: last.get(q, -1) + 1 for q in range(QUEUES)}


def tracebacks(stderr: str) -> list[str]:
    """Each traceback's last line (its exception)."""
    out, inside = [], False
    for line in stderr.splitlines():
        if line.startswith("Traceback"):
            inside = True
        elif inside and line and not line.startswith(" "):
            out.append(line)
            inside = False
    return out


def complaints(stderr: str) -> list[str]:
    """Lines of stderr other than a traceback of KeyboardInterrupt."""
    return [
        line
        for line in stderr.splitlines()
        if line and not line.startswith((" ", "Traceback")) and line != "KeyboardInterrupt"
    ]


@pytest.mark.parametrize(
    ("sig", "user_traceback"),
    [(signal.SIGINT, ["KeyboardInterrupt"]), (signal.SIGTERM, [])],
)
def test_a_signal_ends_a_started_consumer_cleanly(
    tmp_path: Path,
    start_broker: StartBroker,
    start_consumer: Callable[..., ConsumerProcess],
    sig: signal.Signals,
    user_traceback: list[str],
) -> None:
    address = start_broker(tmp_path / "broker").address
    send(address, 4000)
    consumer = start_consumer(address, "a")
    # Every queue busy: listener calls are in flight when the signal comes.
    wait_until(lambda: len(consumer.queues_consumed()) == QUEUES, START_TIMEOUT, "all queues")
    consumer.proc.send_signal(sig)
    assert consumer.exit_status(EXIT_TIMEOUT) == -sig, consumer.stderr()
    # Python reports Ctrl+C in the main thread; nothing else may complain.
    assert tracebacks(consumer.stderr()) == user_traceback, consumer.stderr()
    assert complaints(consumer.stderr()) == [], consumer.stderr()
    assert_left_cleanly(address, consumer)


@pytest.mark.parametrize("face", ["blocking", "asyncio"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_waiting_for_a_shutdown_signal_shuts_down_cleanly_and_carries_on(
    tmp_path: Path,
    start_broker: StartBroker,
    start_consumer: Callable[..., ConsumerProcess],
    face: str,
    sig: signal.Signals,
) -> None:
    address = start_broker(tmp_path / "broker").address
    send(address, 4000)
    consumer = start_consumer(address, "a", "--wait-for-signal", face)
    wait_until(lambda: len(consumer.queues_consumed()) == QUEUES, START_TIMEOUT, "all queues")
    consumer.proc.send_signal(sig)
    assert consumer.exit_status(EXIT_TIMEOUT) == 0, consumer.stderr()
    assert consumer.stdout().splitlines()[-2:] == [f"signal {sig.name}", "stopped"]
    assert consumer.stderr() == ""
    assert_left_cleanly(address, consumer)


def test_a_main_thread_that_ends_shuts_the_consumer_down(
    tmp_path: Path, start_broker: StartBroker, start_consumer: Callable[..., ConsumerProcess]
) -> None:
    address = start_broker(tmp_path / "broker").address
    send(address, 4000)
    consumer = start_consumer(address, "a", "--exit-after", "200")
    assert consumer.exit_status(EXIT_TIMEOUT) == 0, consumer.stderr()
    assert "main thread ends" in consumer.stdout()
    assert consumer.stderr() == ""
    assert_left_cleanly(address, consumer)


def test_the_queues_of_a_killed_consumer_move_on_after_the_disconnect_grace(
    tmp_path: Path, start_broker: StartBroker, start_consumer: Callable[..., ConsumerProcess]
) -> None:
    broker = start_broker(tmp_path / "broker", "--disconnect-grace-seconds", str(DISCONNECT_GRACE))
    send(broker.address, 4000)
    a = start_consumer(broker.address, "a")
    wait_until(lambda: len(a.queues_consumed()) == QUEUES, START_TIMEOUT, "a on every queue")
    dead = a.client_id()
    a.proc.kill()
    a.proc.wait()
    assert set(lock_owners(broker.address).values()) == {dead}  # nobody unlocked them

    b = start_consumer(broker.address, "b")
    send(broker.address, 800)  # work left on every queue, whatever a got through
    wait_until(
        lambda: len(b.queues_consumed()) == QUEUES, TAKEOVER_TIMEOUT, "b to take every queue"
    )
    assert progress(broker.address)["client_ids"] == [b.client_id()]
    assert "disconnected" in broker.stderr()  # the broker says why a was expired


def test_a_paused_consumer_keeps_its_queues_past_the_disconnect_grace(
    tmp_path: Path, start_broker: StartBroker, start_consumer: Callable[..., ConsumerProcess]
) -> None:
    broker = start_broker(tmp_path / "broker", "--disconnect-grace-seconds", str(DISCONNECT_GRACE))
    address = broker.address
    send(address, 4000)
    paused = start_consumer(address, "paused")
    killed = start_consumer(address, "killed")
    ids = {paused.client_id(), killed.client_id()}
    wait_until(lambda: set(lock_owners(address).values()) == ids, TAKEOVER_TIMEOUT, "a split")
    held = {q for q, owner in lock_owners(address).items() if owner == paused.client_id()}

    paused.proc.send_signal(signal.SIGSTOP)
    try:
        killed.proc.kill()
        killed.proc.wait()
        # Once the killed one is expired, the paused one has been paused for longer
        # than the grace too: it is still there, and so are its locks.
        wait_until(
            lambda: progress(address)["client_ids"] == [paused.client_id()],
            TAKEOVER_TIMEOUT,
            "the killed consumer to be expired",
        )
        owners = lock_owners(address)
        assert {q for q, owner in owners.items() if owner == paused.client_id()} == held
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    # Resumed, it carries on, with the killed one's queues too.
    wait_until(
        lambda: len(paused.queues_consumed()) == QUEUES, TAKEOVER_TIMEOUT, "paused on all queues"
    )
    paused.proc.send_signal(signal.SIGTERM)
    assert paused.exit_status(EXIT_TIMEOUT) == -signal.SIGTERM, paused.stderr()
    assert_left_cleanly(address, paused)
