"""A producer's retry after a lost answer resends the same message id (broker dedup's key).

The broker stored the first attempt but its answer never came (a timeout): the retry,
even on another queue (a keyless send moves), carries the same frames, so a broker with
dedup on answers it with the first copy's place, which the SendResult then reports.
"""

from __future__ import annotations

import asyncio

from sdk import Message, MessageQueue, ProducerConfig, SendResult
from sdk._transport.protocol import Appended
from sdk.errors import RequestTimeoutError
from sdk.producer.core import ProducerCore
from tests.unit.fake_transport import FramesTransport

QUEUES = 4


class LostFirstAnswer:
    """Keeps each request's frames; answers the first with a timeout, as if lost on the way.

    Later requests with the same frames are answered as broker dedup answers them: the
    first request's place, naming its queue.
    """

    def __init__(self) -> None:
        self.requests: list[tuple[int, bytes]] = []

    async def send(
        self, topic: str, queue_id: int, frames: bytes, *, timeout: float | None = None
    ) -> Appended:
        self.requests.append((queue_id, frames))
        if len(self.requests) == 1:
            raise RequestTimeoutError("the answer was lost")
        first_queue, first_frames = self.requests[0]
        assert frames == first_frames
        return Appended(True, 41, 1, queue_id=first_queue if first_queue != queue_id else -1)


async def writable_queues(topic: str) -> list[MessageQueue]:
    return [MessageQueue(topic, "broker-a", q) for q in range(QUEUES)]


def test_a_retry_after_a_lost_answer_resends_the_same_id_and_reports_the_first_place() -> None:
    broker = LostFirstAnswer()

    async def main() -> SendResult:
        config = ProducerConfig(retry_times=2, retry_backoff=0.001, retry_backoff_max=0.002)
        producer = ProducerCore(FramesTransport(broker, writable_queues), config=config)
        await producer.start()
        try:
            return await producer.send(Message("orders", b"x"))  # keyless: the retry may move
        finally:
            await producer.shutdown()

    result = asyncio.run(main())
    (first_queue, first), (again_queue, again) = broker.requests
    assert again_queue != first_queue  # moved, keyless
    assert again == first  # the same frame: the same message id
    assert first[4:20].hex().upper() == result.msg_id
    assert (result.queue.queue_id, result.queue_offset) == (first_queue, 41)
