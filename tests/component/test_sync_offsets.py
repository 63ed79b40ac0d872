"""Sync flush: no offset a client can start from or commit lies past what is synced.

A message appended but not yet synced is not served (MessageStore.get), and a power cut
may still lose it, after which another message takes its offset. A consumer that started
there (at the "last offset"), or a group whose offset was committed or reset past it, would
skip that other message.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from mockbroker import EmbeddedBroker
from sdk import Message, MessageQueue, Producer
from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk.errors import InvalidOffsetError


def test_offsets_offered_and_accepted_stop_at_the_synced_end(
    sync_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Producer(sync_broker.address) as producer:
        queue = producer.send(Message("t", b"synced", sharding_key="k")).queue
        started, release = threading.Event(), threading.Event()
        real = os.fdatasync

        def held(fd: int) -> None:
            started.set()
            release.wait(30)
            real(fd)

        monkeypatch.setattr(os, "fdatasync", held)
        pending = threading.Thread(
            target=producer.send, args=(Message("t", b"not synced yet", sharding_key="k"),)
        )
        pending.start()
        try:
            assert started.wait(10), "the second send's fsync never started"
            high, reset = asyncio.run(probe(sync_broker.address, queue))
        finally:
            release.set()
            pending.join(30)
    assert (high, reset) == (1, 1)


async def probe(address: str, queue: MessageQueue) -> tuple[int, int]:
    """(the max offset offered, the offset a reset to the latest sets); a commit of 2 fails."""
    client = BrokerClient(address)
    try:
        _, high, _ = await client.queue_offsets(queue)
        await client.heartbeat("c1", [GroupInfo("g", "CONSUME_POLL")])
        with pytest.raises(InvalidOffsetError):
            await client.commit_offsets("g", "c1", [(queue, 2, 0)])
        reset = await client.admin(
            "ResetOffset", group="g", topic="t", queue_id=queue.queue_id, latest=True, force=True
        )
        return high, int(reset["offsets"][0]["offset"])
    finally:
        await client.close()
