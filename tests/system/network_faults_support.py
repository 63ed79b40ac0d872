"""The network of the network fault tests: a broker, a paced producer and orderly consumer
processes, each client behind its own fault proxy (tests/faultproxy.py).

A broker process with a short lock lease (4 s) and client timeout (6 s); consumer processes
(tests/system/orderly_worker.py: client lease 3 s, renewal every 1 s) and a producer in the
test's process (rounds of one message per key, 160 keys over 8 queues). Every client
reaches the broker through its own fault proxy (named by gRPC's `grpc_proxy` variable), so
a fault can hit every link or one client only. The tests are split by subject:
test_network_faults_links.py (delay, resets, netem), test_network_faults_partitions.py (a
consumer or the producer cut off) and test_network_faults_jobs.py (SimpleConsumers through
resets).
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sdk import (
    ProducerConfig,
    shard_index,
)
from tests.chaos_report import scaled
from tests.faultproxy import NO_PROXY_VARIABLES, FaultProxy, LinkFaults, proxy_environment
from tests.system.orderly_history import (
    History,
    PacedProducer,
    Report,
    Scene,
    orderly_broker,
)

QUEUES = 8
KEYS = [f"k{i:03d}" for i in range(160)]
ROUND_INTERVAL = 0.5
#: Rounds each test sends at least (one message per key each).
MIN_ROUNDS = scaled(16, 240)
#: Rounds sent while a fault lasts, where its length is counted in rounds.
FAULT_ROUNDS = scaled(16, 240)
DRAIN_TIMEOUT = 60.0
#: How long the producer retries a round that failed.
RETRY_FOR = 60.0

#: (b): a connection reset every 0.2 to 1 s, somewhere, while it carries something: each
#: link delays by 20 ms, so that requests and answers are on their way for a while.
RESET_PACE = (0.2, 1.0)
RESET_LINK = LinkFaults(delay=0.02)


# ---------------------------------------------------------------------------- the network
@dataclass
class Net:
    """One run's broker, producer and workers, each client behind its own fault proxy."""

    scene: Scene
    history: History
    monkeypatch: pytest.MonkeyPatch
    proxies: dict[str, FaultProxy] = field(default_factory=dict)

    def proxy(self, name: str) -> FaultProxy:
        """The proxy of client `name` (made and started on first use)."""
        if name not in self.proxies:
            proxy = self.proxies[name] = FaultProxy(seed=len(self.proxies), name=f"proxy-{name}")
            proxy.start()
        return self.proxies[name]

    def start_producer(
        self, *, backlog: int = 0, config: ProducerConfig | None = None
    ) -> PacedProducer:
        """The paced producer (a thread of this process) behind proxy "producer"."""
        proxy = self.proxy("producer")
        # gRPC reads the variable when a channel is made: the producer's, in its thread.
        self.monkeypatch.setenv("grpc_proxy", proxy.url)
        for name in NO_PROXY_VARIABLES:
            self.monkeypatch.delenv(name, raising=False)
        producer = PacedProducer(
            self.scene.broker.address, KEYS, ROUND_INTERVAL,
            backlog=backlog, retry_for=RETRY_FOR, config=config,
        )  # fmt: skip
        self.scene.producer = producer
        producer.start()
        self.scene.until(lambda: self.scene.sent() >= 1, 30, "the first round (the topic)")
        return producer

    def spawn(self, *names: str) -> None:
        """Start workers `names` together, each behind its own proxy."""
        self.spawn_all(dict.fromkeys(names, ()))

    def spawn_all(self, workers: dict[str, tuple[str, ...]]) -> None:
        """Start workers together (name: its extra arguments), each behind its own proxy."""
        self.scene.spawn_all(workers, lambda name: proxy_environment(self.proxy(name)))

    def finish(self, workers: list[str]) -> int:
        """Halt the producer, wait until everything sent is processed, stop `workers`."""
        scene, history = self.scene, self.history
        assert scene.producer is not None
        scene.producer.hurry(MIN_ROUNDS)  # the scenario is over: the rest need no pace
        scene.until(
            lambda: scene.sent() >= MIN_ROUNDS, MIN_ROUNDS * ROUND_INTERVAL + 60, "all rounds"
        )
        rounds = scene.producer.halt()
        scene.mark(f"producer done: {rounds} rounds, {scene.producer.failed_sends} failed sends")
        total = rounds * len(KEYS)
        scene.until(lambda: len(history.distinct) >= total, DRAIN_TIMEOUT, f"all {total} processed")
        scene.mark("all processed")
        scene.stop_workers(workers)
        scene.mark("workers stopped")
        history.refresh()
        return rounds

    def check_traffic_went_through_the_proxies(self) -> None:
        """Every client's connections went through its proxy, to the broker."""
        for name, proxy in self.proxies.items():
            stats = proxy.stats()
            assert stats.connections >= 1, f"{name} never connected through its proxy"
            assert stats.bytes_down > 0, f"{name}'s proxy carried no answer"
            broker = self.scene.broker
            assert stats.targets == {broker.address, *broker.fronts.values()}, stats.targets

    def timeline(self) -> str:
        return "\n".join(self.scene.timeline())


@contextlib.contextmanager
def network(directory: Path, monkeypatch: pytest.MonkeyPatch, *broker_args: str) -> Iterator[Net]:
    """A broker started; clients are added by the test; everything ends on the way out.

    `broker_args`: more options of the broker (a front its clients use: they reach it
    through their proxies too).
    """
    assert {shard_index(k, QUEUES) for k in KEYS} == set(range(QUEUES)), "keys cover queues"
    broker = orderly_broker(directory / "broker", QUEUES, *broker_args)
    history = History(KEYS)
    net = Net(Scene(directory, broker, history), history, monkeypatch)
    try:
        broker.start()
        yield net
    finally:
        net.scene.clean_up()
        for proxy in net.proxies.values():
            proxy.stop()


def check(report: Report, net: Net, extra: str = "") -> None:
    text = f"{report.summary()}{extra}\n{net.timeline()}"
    print(text)
    assert not report.errors, f"{len(report.errors)} violations:\n" + (
        "\n".join(report.errors[:30]) + "\n" + text
    )


# ---------------------------------------------------------------------------- (b) resets
class Resetter(threading.Thread):
    """Every RESET_PACE seconds, resets a busy connection of a proxy picked at random."""

    def __init__(self, proxies: list[FaultProxy], seed: int) -> None:
        super().__init__(name="resetter", daemon=True)
        self._proxies = proxies
        self._rng = random.Random(seed)
        self._halt = threading.Event()
        self.resets = 0

    def run(self) -> None:
        while not self._halt.wait(self._rng.uniform(*RESET_PACE)):  # the pace of the faults
            proxy = self._rng.choice(self._proxies)
            # The next moment it carries something (a proxy's link is rarely idle for long).
            while not self._halt.is_set() and not proxy.reset(count=1, busy=True):
                self._halt.wait(0.002)
            self.resets += 1

    def halt(self) -> int:
        self._halt.set()
        self.join(10)
        return self.resets
