"""Queue selection: sharding-key hashing and the selectors users pass to send().

The sharding formula is part of the public contract, so that producers in any language
pick the same queue: mmh3's 32-bit unsigned hash of the UTF-8 key, seed 0, modulo the
number of the topic's writable queues sorted by (broker name, queue id).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any

import mmh3

from sdk.errors import InvalidArgumentError
from sdk.message import Message, MessageQueue

#: A selector: (writable queues sorted, message, arg) -> the queue to send to.
MessageQueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]


def queue_order(queue: MessageQueue) -> tuple[str, int]:
    """The order the sharding formula numbers a topic's queues in: (broker name, queue id).

    Transports sort the queues they hand selectors with it.
    """
    return queue.broker_name, queue.queue_id


def shard_index(key: str, queue_count: int) -> int:
    """The queue index for a sharding key among `queue_count` queues."""
    if queue_count <= 0:
        raise InvalidArgumentError("there are no writable queues to choose from")
    if type(key) is str and key.isascii():
        # ASCII is its own UTF-8: mmh3 hashes the str as is (half the cost, once per
        # message). Only text that is surely valid UTF-8 goes in as a str: mmh3 5.x
        # crashes the interpreter on a lone surrogate.
        return mmh3.hash(key, 0, False) % queue_count
    if not isinstance(key, str):
        raise InvalidArgumentError(f"a sharding key is a str, not {type(key).__name__}")
    try:
        data = key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"sharding key {key!r} is not UTF-8 text: it holds a lone surrogate at index "
            f"{exc.start}"
        ) from None
    return mmh3.hash(data, 0, False) % queue_count


class SelectMessageQueueByHash:
    """Pick the queue by the sharding formula applied to `str(arg)`."""

    def __call__(self, queues: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
        """The queue for `arg`."""
        return queues[shard_index(str(arg), len(queues))]


class SelectMessageQueueByRandom:
    """Pick a queue at random."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def __call__(self, queues: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
        """A random queue."""
        return queues[self._rng.randrange(len(queues))]


class RoundRobinSelector:
    """Pick the queues in turn (the default for messages without a sharding key)."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def __call__(self, queues: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
        """The next queue in turn."""
        return queues[next(self._counter) % len(queues)]
