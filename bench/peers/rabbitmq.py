"""RabbitMQ: 8 durable classic queues with x-single-active-consumer, persistent messages.

produce: one channel in confirm mode publishes a batch's 100 messages (the key as the
message's correlation id) to its queue, then waits until the broker has confirmed all of
them (confirms may come as one `multiple` ack) before the next batch.
consume: one connection, one channel with a prefetch, a consumer on each of the 8 queues;
it acknowledges every ACK_EVERY deliveries with one `multiple` ack.

pika's BlockingChannel waits for each confirm on its own, so the producer drives pika's
event loop (SelectConnection) directly to keep a whole batch in flight.
"""

from __future__ import annotations

import threading
import time

import pika
import workload as wl
from pika.spec import Basic
from workload import QUEUES, Batch

PREFETCH = 1000
ACK_EVERY = 100
QUEUE_ARGS = {"x-single-active-consumer": True}


def queue(q: int) -> str:
    return f"orders-{q}"


def _params(port: int) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", port, heartbeat=0)


def prepare(port: int) -> None:
    conn = pika.BlockingConnection(_params(port))
    try:
        ch = conn.channel()
        for q in range(QUEUES):
            ch.queue_delete(queue(q))
            ch.queue_declare(queue(q), durable=True, arguments=QUEUE_ARGS)
    finally:
        conn.close()


class _Publisher:
    def __init__(self, port: int, batches: list[Batch]) -> None:
        self.batches = batches
        self.next_batch = 0
        self.published = 0  # delivery tags run 1..published
        self.confirmed = 0
        self.error: str | None = None
        self.start = 0.0
        self.end = 0.0
        self.conn = pika.SelectConnection(
            _params(port),
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_fail,
            on_close_callback=self._on_closed,
        )
        self.channel: pika.channel.Channel | None = None

    def run(self) -> float:
        self.conn.ioloop.start()
        if self.error:
            raise RuntimeError(self.error)
        return self.end - self.start

    def _on_fail(self, _conn: object, err: object) -> None:
        self.error = f"connection failed: {err}"
        self.conn.ioloop.stop()

    def _on_closed(self, _conn: object, reason: object) -> None:
        if self.end == 0.0 and not self.error:
            self.error = f"connection closed: {reason}"
        self.conn.ioloop.stop()

    def _on_open(self, conn: pika.SelectConnection) -> None:
        conn.channel(on_open_callback=self._on_channel)

    def _on_channel(self, channel: pika.channel.Channel) -> None:
        self.channel = channel
        channel.confirm_delivery(self._on_confirm, callback=self._on_confirm_mode)

    def _on_confirm_mode(self, _frame: object) -> None:
        self.start = time.perf_counter()
        self._publish_next()

    def _publish_next(self) -> None:
        assert self.channel is not None
        batch = self.batches[self.next_batch]
        self.next_batch += 1
        name = queue(batch.queue)
        publish = self.channel.basic_publish
        for key, body in zip(batch.keys, batch.bodies, strict=True):
            props = pika.BasicProperties(delivery_mode=2, correlation_id=key)
            publish("", name, body, props)
        self.published += len(batch.keys)

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        method = frame.method
        if isinstance(method, Basic.Nack):
            self.error = f"broker nacked delivery {method.delivery_tag}"
            self.conn.close()
            return
        tag = method.delivery_tag
        self.confirmed = max(self.confirmed, tag)
        if self.confirmed < self.published:
            return
        if self.next_batch < len(self.batches):
            self._publish_next()
            return
        self.end = time.perf_counter()
        self.conn.close()


def produce(port: int, batches: list[Batch]) -> float:
    """Seconds to publish every batch with confirms (connection set-up excluded)."""
    return _Publisher(port, batches).run()


def consume(port: int, expected: int) -> float:
    """Seconds to consume the backlog of the 8 queues, acknowledging per ACK_EVERY."""
    conn = pika.BlockingConnection(_params(port))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=PREFETCH)
        got = 0
        unacked = 0

        def on_message(
            channel: pika.adapters.blocking_connection.BlockingChannel,
            method: Basic.Deliver,
            props: pika.BasicProperties,
            _body: bytes,
        ) -> None:
            nonlocal got, unacked
            if props.correlation_id is None:
                raise AssertionError("a message lost its key")
            got += 1
            unacked += 1
            if unacked >= ACK_EVERY or got >= expected:
                channel.basic_ack(method.delivery_tag, multiple=True)
                unacked = 0
            if got >= expected:
                channel.stop_consuming()

        start = time.perf_counter()
        for q in range(QUEUES):
            ch.basic_consume(queue(q), on_message)
        ch.start_consuming()
        seconds = time.perf_counter() - start
        for q in range(QUEUES):
            left = ch.queue_declare(queue(q), passive=True).method.message_count
            if left:
                raise AssertionError(f"{left} messages left in {queue(q)}")
        return seconds
    finally:
        conn.close()


def latency(port: int, rate: float, seconds: float) -> dict[str, float]:
    """End-to-end latency of single confirmed publishes at `rate`/s to a consumer on all 8."""
    schedule = wl.paced(rate, seconds)
    ages: list[float] = []
    errors: list[BaseException] = []
    ready = threading.Event()

    def reader() -> None:
        try:
            conn = pika.BlockingConnection(_params(port))
        except BaseException as exc:
            errors.append(exc)
            ready.set()
            return
        try:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=PREFETCH)
            unacked = 0

            def on_message(
                channel: pika.adapters.blocking_connection.BlockingChannel,
                method: Basic.Deliver,
                _props: pika.BasicProperties,
                body: bytes,
            ) -> None:
                nonlocal unacked
                ages.append(wl.age_ms(body, time.perf_counter()))
                unacked += 1
                if unacked >= ACK_EVERY or len(ages) >= len(schedule):
                    channel.basic_ack(method.delivery_tag, multiple=True)
                    unacked = 0

            for q in range(QUEUES):
                ch.basic_consume(queue(q), on_message)
            ready.set()
            deadline = time.monotonic() + seconds + 30
            while len(ages) < len(schedule) and time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.5)
        except BaseException as exc:
            errors.append(exc)
        finally:
            ready.set()
            conn.close()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    ready.wait(30)
    conn = pika.BlockingConnection(_params(port))
    try:
        ch = conn.channel()
        ch.confirm_delivery()

        def send(key: str, q: int, body: bytes) -> None:
            props = pika.BasicProperties(delivery_mode=2, correlation_id=key)
            ch.basic_publish("", queue(q), body, props)

        wl.pace(schedule, send)
    finally:
        conn.close()
    thread.join(seconds + 30)
    if errors:
        raise errors[0]
    if len(ages) < len(schedule):
        raise AssertionError(f"latency consumer got {len(ages)} of {len(schedule)}")
    return wl.latency_figures(ages)
