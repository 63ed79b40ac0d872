"""A broker restart while 8 callers' sends ride shared requests (natural batching, issue 35).

Eight callers (asyncio tasks of one producer, or threads of one blocking producer) each
send their own key's messages one after another through the accumulator with `linger=0`,
so that what arrives while a request is in flight rides the next one. The broker, under
sync flush, is stopped (kill -9, or SIGTERM) while they send, and started again on the same
port and data directory. Then:

- every send returned: a SendResult or an OrderMQError, none hangs (every wait is bounded);
- every acknowledged message is in the broker after the restart, at the queue and offset
  its SendResult named, with its body and message id;
- each key's acknowledged messages are stored in the order they were sent, and nothing
  stored of a key (acknowledged or not) comes before an earlier send of that key;
- the callers send again once the broker is back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import sdk.aio
from sdk import AccumulatorConfig, Message, Producer, ProducerConfig, SendResult, shard_index
from sdk.errors import OrderMQError
from tests.component.pulling import read_topic
from tests.support import BrokerProcess, wait_until

pytestmark = [pytest.mark.system]

TOPIC = "inflight"
QUEUES = 8
CALLERS = 8
#: Acknowledgements before the broker is stopped, and per caller after it is back.
ACKS_BEFORE = 200
ACKS_AFTER_PER_CALLER = 20
#: The longest one send may take (its attempts, backoffs and the restart): a send that
#: has no outcome by then hangs, and fails the test instead of blocking it.
SEND_BOUND_SECONDS = 30.0


def config(retry_times: int) -> ProducerConfig:
    """Natural batching; with retries, the sends cut short by the stop usually succeed."""
    return ProducerConfig(
        accumulator=AccumulatorConfig(linger=0),
        send_timeout=5,
        retry_times=retry_times,
        retry_backoff=0.1,
        retry_backoff_max=0.5,
    )


@dataclass
class Send:
    """One send of a caller: its key's `seq`-th message, and what it came to."""

    key: str
    seq: int
    result: SendResult | None = None
    error: BaseException | None = None

    @property
    def body(self) -> bytes:
        """The message body: "<key>:<seq>"."""
        return f"{self.key}:{self.seq}".encode()


@dataclass
class Caller:
    """One caller's sends, in the order it made them; `sending` while one is in flight."""

    key: str
    sends: list[Send] = field(default_factory=list)
    sending: bool = False
    acked: int = 0

    def next_send(self) -> tuple[Send, Message]:
        """Note the caller's next send, and the message it sends."""
        send = Send(self.key, len(self.sends))
        self.sends.append(send)
        self.sending = True
        return send, Message(TOPIC, send.body, sharding_key=self.key)

    def answered(self, send: Send, outcome: SendResult | BaseException) -> None:
        """Note what became of `send`."""
        if isinstance(outcome, SendResult):
            send.result = outcome
            self.acked += 1
        else:
            send.error = outcome
        self.sending = False


def keys() -> list[str]:
    """One key per caller; they hash to 4 of the 8 queues, so several keys share a queue."""
    return [f"caller-{n}" for n in range(CALLERS)]


def from_tasks(
    address: str, config: ProducerConfig, callers: list[Caller], stop: threading.Event
) -> None:
    """The callers as asyncio tasks of one sdk.aio.Producer; returns once all stopped."""

    async def caller(producer: sdk.aio.Producer, c: Caller) -> None:
        while not stop.is_set():
            send, message = c.next_send()
            try:
                async with asyncio.timeout(SEND_BOUND_SECONDS):
                    outcome: SendResult | BaseException = await producer.send(message)
            except Exception as exc:  # TimeoutError: hung; checked by the test
                outcome = exc
            c.answered(send, outcome)

    async def run() -> None:
        async with sdk.aio.Producer(address, config=config) as producer:
            await asyncio.gather(*(caller(producer, c) for c in callers))

    asyncio.run(run())


def from_threads(
    address: str, config: ProducerConfig, callers: list[Caller], stop: threading.Event
) -> None:
    """The callers as threads sharing one blocking Producer; returns once all stopped.

    Each waits for its send_async future with a bound, as send() would wait unbounded.
    """
    with Producer(address, config=config) as producer:

        def caller(c: Caller) -> None:
            while not stop.is_set():
                send, message = c.next_send()
                future = producer.send_async(message)
                try:
                    outcome: SendResult | BaseException = future.result(SEND_BOUND_SECONDS)
                except Exception as exc:  # TimeoutError: hung; checked by the test
                    outcome = exc
                c.answered(send, outcome)

        threads = [threading.Thread(target=caller, args=(c,), daemon=True) for c in callers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(SEND_BOUND_SECONDS + 10)
        assert not any(t.is_alive() for t in threads), "a caller thread did not stop"


Face = Callable[[str, ProducerConfig, list[Caller], threading.Event], None]


def stop_broker(broker: BrokerProcess, how: str) -> None:
    """Stop the broker process: kill -9, or SIGTERM (it then exits on its own)."""
    if how == "kill -9":
        broker.kill9()
    else:
        broker.terminate(timeout=30)


@pytest.mark.parametrize(
    ("face", "how", "retry_times"),
    [
        (from_tasks, "kill -9", 3),
        (from_tasks, "kill -9", 0),
        (from_threads, "kill -9", 0),
        (from_tasks, "SIGTERM", 0),
    ],
    ids=["tasks-kill9-retried", "tasks-kill9", "threads-kill9", "tasks-sigterm"],
)
def test_every_in_flight_send_gets_an_outcome_and_acknowledged_ones_survive_in_key_order(
    tmp_path: Path,
    start_broker: Callable[..., BrokerProcess],
    face: Face,
    how: str,
    retry_times: int,
) -> None:
    broker = start_broker(
        tmp_path / "broker", "--flush-mode", "sync", "--default-queues", str(QUEUES)
    )
    callers = [Caller(key) for key in keys()]
    stop = threading.Event()
    crash: list[BaseException] = []

    def produce() -> None:
        try:
            face(broker.address, config(retry_times), callers, stop)
        except BaseException as exc:
            crash.append(exc)

    thread = threading.Thread(target=produce, name="callers", daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: sum(c.acked for c in callers) >= ACKS_BEFORE and all(c.acked for c in callers),
            timeout=30,
            what="acknowledgements before the restart",
        )
        in_flight = sum(c.sending for c in callers)
        acked_before = [c.acked for c in callers]
        stop_broker(broker, how)
        broker.restart()
        wait_until(
            lambda: all(
                c.acked - before >= ACKS_AFTER_PER_CALLER
                for c, before in zip(callers, acked_before, strict=True)
            ),
            timeout=30,
            what="every caller's acknowledgements after the restart",
        )
    finally:
        stop.set()
        thread.join(SEND_BOUND_SECONDS + 15)
    assert not thread.is_alive(), "the callers did not stop"
    assert not crash, f"the producer crashed: {crash[0]!r}"
    assert in_flight, "no send was in flight when the broker stopped"

    sends = [s for c in callers for s in c.sends]
    hung = [s for s in sends if isinstance(s.error, TimeoutError)]
    assert not hung, f"{len(hung)} sends had no outcome within {SEND_BOUND_SECONDS}s: {hung[:3]}"
    for s in sends:
        assert (s.result is None) != (s.error is None), f"{s.body!r}: no single outcome"
        if s.error is not None:
            assert isinstance(s.error, OrderMQError), f"{s.body!r} raised {s.error!r}"

    stored = read_topic(broker.address, TOPIC, queue_count=QUEUES)
    where: dict[tuple[int, int], tuple[bytes, str]] = {
        (m.queue.queue_id, m.queue_offset): (m.body, m.msg_id) for m in stored
    }
    acked = [s for s in sends if s.result is not None]
    for s in acked:
        assert s.result is not None
        at = (s.result.queue.queue_id, s.result.queue_offset)
        assert at[0] == shard_index(s.key, QUEUES), f"{s.body!r}: not its key's queue"
        assert where.get(at) == (s.body, s.result.msg_id), f"acknowledged {s.body!r} lost at {at}"

    by_key: dict[str, list[int]] = {c.key: [] for c in callers}
    for m in stored:  # read back queue by queue, each in offset order
        key, seq = m.body.decode().split(":")
        by_key[key].append(int(seq))
    for c in callers:
        seqs = by_key[c.key]
        # A send that failed may be stored (maybe twice, by a retry), but never after a
        # later one of its key: each caller waits for its send before the next.
        assert seqs == sorted(seqs), f"{c.key}: stored out of send order"
        assert set(seqs) <= set(range(len(c.sends))), f"{c.key}: stored what was never sent"
        acked_offsets = [s.result.queue_offset for s in c.sends if s.result is not None]
        assert acked_offsets == sorted(set(acked_offsets)), f"{c.key}: acknowledged out of order"
    assert broker.terminate() == 0, broker.stderr()
