"""The standalone broker's busy polling, as an operator sees it on /metrics."""

from __future__ import annotations

from pathlib import Path

from mockbroker.busy_poll import available_cores
from sdk import Message, Producer
from tests.component.scraping import scrape
from tests.support import BrokerProcess


def test_the_standalone_broker_shows_its_spin_and_how_often_it_paid(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", "--metrics-port", "0")
    address = broker.start()
    try:
        with Producer(address) as producer:
            for n in range(200):  # one after another: each request comes as its answer went
                producer.send(Message("orders", b"%d" % n, sharding_key="k"))
        samples = scrape(int(broker.fronts["metrics"].rsplit(":", 1)[1]))
    finally:
        broker.terminate()
    polling = available_cores() >= 2  # the broker runs where this test does
    assert samples[("ordermq_busy_poll_spin_seconds", ())] == (0.0004 if polling else 0.0)
    hit = samples[("ordermq_busy_poll_spins_total", (("outcome", "hit"),))]
    missed = samples[("ordermq_busy_poll_spins_total", (("outcome", "missed"),))]
    assert (hit + missed > 0) == polling
