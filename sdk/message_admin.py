"""Reading queues and resending dead letters: what the `ordermq` command and the console share.

The command (sdk/cli.py) and the broker's console (mockbroker/fronts/console) read a
queue by offset, find a sharding key's messages and resend a group's dead letters the same
way, through these functions and a BrokerClient of the broker:

- a group's dead letters are the messages of `%DLQ%<group>` from the committed offset of a
  marker group, `<group>-dlq-resend`, on;
- a resend sends each back to its original topic once, in order, with the ORIGIN_*
  properties stripped, then commits the marker past the last one sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sdk._accel import hand_out
from sdk._transport.broker_client import BrokerClient, GroupInfo, PullStatus
from sdk.errors import TopicNotFoundError
from sdk.message import Message, MessageExt, MessageQueue
from sdk.selector import shard_index

T = TypeVar("T")

#: Properties a dead letter carries about where it came from; a resend leaves them out.
ORIGIN_PROPERTIES = ("ORIGIN_TOPIC", "ORIGIN_QUEUE_ID", "ORIGIN_QUEUE_OFFSET")
#: The group name the command and the console pull with (they commit nothing under it).
READER_GROUP = "ordermq-cli"

#: Runs an async body with a client of the broker and returns what it returns.
Call = Callable[[Callable[[BrokerClient], Awaitable[T]]], T]


async def read_queues(
    client: BrokerClient, queues: list[MessageQueue], starts: dict[MessageQueue, int], limit: int
) -> list[MessageExt]:
    """Up to `limit` messages of `queues`, each read from its offset in `starts`, in order."""
    out: list[MessageExt] = []
    for queue in queues:
        offset = starts[queue]
        while len(out) < limit:
            r = await client.pull(READER_GROUP, queue, offset, max_messages=min(1000, limit))
            if r.status is not PullStatus.FOUND:
                break
            hand_out(r.messages)  # out of the SDK: back in the cycle collector's care
            out += r.messages
            offset = r.next_offset
    return out[:limit]


async def by_sharding_key(
    client: BrokerClient, topic: str, key: str, scan: int, limit: int
) -> tuple[list[MessageExt], MessageQueue, int]:
    """Messages of `topic` with sharding key `key`, newest first; the queue; how many read.

    The queue the sharding formula maps `key` to is read from its newest message back, at
    most `scan` messages.
    """
    queues = sorted((r.queue for r in await client.query_route(topic)), key=lambda q: q.queue_id)
    queue = queues[shard_index(key, len(queues))]
    low, high, _ = await client.queue_offsets(queue)
    start = max(low, high - scan)
    messages = await read_queues(client, [queue], {queue: start}, high - start)
    found = [m for m in reversed(messages) if m.sharding_key == key]
    return found[:limit], queue, len(messages)


def marker_group(group: str) -> str:
    """The group whose committed offset on `%DLQ%<group>` marks what was resent."""
    return f"{group}-dlq-resend"


async def dead_letters(client: BrokerClient, group: str, limit: int) -> list[MessageExt]:
    """`group`'s dead letters not resent yet, oldest first (at most `limit`)."""
    try:
        routes = await client.query_route(f"%DLQ%{group}")
    except TopicNotFoundError:
        return []  # the broker creates the topic with the group's first dead letter
    q = routes[0].queue
    low, _high, _ = await client.queue_offsets(q)
    committed = await client.query_offset(marker_group(group), q)
    return await read_queues(client, [q], {q: max(low, committed or 0)}, limit)


def origin_message(dead: MessageExt) -> Message:
    """The message to send back for dead letter `dead`: to its original topic, as it was."""
    return Message(
        dead.properties.get("ORIGIN_TOPIC", dead.topic), dead.body, tags=dead.tags,
        keys=dead.keys, sharding_key=dead.sharding_key,
        properties={k: v for k, v in dead.properties.items() if k not in ORIGIN_PROPERTIES},
    )  # fmt: skip


async def mark_resent(client: BrokerClient, group: str, last: MessageExt) -> None:
    """Commit the marker group past `last`: it and those before it are not listed again."""
    marker = marker_group(group)
    await client.heartbeat(marker, [GroupInfo(marker, "CONSUME_POLL")])
    try:
        await client.commit_offsets(marker, marker, [(last.queue, last.queue_offset + 1, 0)])
    finally:
        await client.unregister(marker)


def resend_dead_letters(
    call: Call[Any], send: Callable[[Message], object], group: str, limit: int
) -> list[MessageExt]:
    """Send the oldest `limit` of `group`'s dead letters back, in order; those sent.

    `call` runs a body with a client of the broker; `send` sends one message (a
    Producer's send: the resent message goes to the queue its sharding key maps to).
    """
    found: list[MessageExt] = call(lambda b: dead_letters(b, group, limit))
    for m in found:
        send(origin_message(m))
    if found:
        last = found[-1]
        call(lambda b: mark_resent(b, group, last))
    return found
