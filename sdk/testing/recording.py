"""OrderRecorder: an orderly listener that records what it handles, and the order checks."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sdk.consumer.listener import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageListenerOrderly,
)
from sdk.message import MessageExt, MessageQueue


@dataclass(frozen=True)
class Handled:
    """One message an OrderRecorder handled (its handler returned without raising)."""

    key: str | None
    body: bytes
    queue: MessageQueue
    offset: int
    recorder: str
    started: float  # time.monotonic() when its listener call began


class OrderRecorder(MessageListenerOrderly):
    """An orderly listener that records each message it handles.

    Args:
        handler: Called with each message, in order (None: record only). A handler that
            raises fails the listener call: the batch is retried, as with any listener,
            and only messages whose handler returned are recorded.
        name: Tells recorders of several consumers apart in `Handled.recorder`.

    Give it to a consumer (`consumer.register_message_listener(recorder)`), then
    `wait_for(n)` and `assert_handled_in_order(sent, recorder, ...)`.
    """

    def __init__(
        self, handler: Callable[[MessageExt], object] | None = None, name: str = ""
    ) -> None:
        self.handler = handler
        self.name = name
        self._handled: list[Handled] = []
        self._changed = threading.Condition()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        """Handle each message (the handler's exception fails the call), then record them."""
        started = time.monotonic()
        for m in msgs:
            if self.handler is not None:
                self.handler(m)
        done = [
            Handled(m.sharding_key, m.body, m.queue, m.queue_offset, self.name, started)
            for m in msgs
        ]
        with self._changed:
            self._handled.extend(done)
            self._changed.notify_all()
        return ConsumeOrderlyStatus.SUCCESS

    @property
    def handled(self) -> list[Handled]:
        """What was handled so far, in the order the calls recorded it."""
        with self._changed:
            return list(self._handled)

    def wait_for(self, count: int, timeout: float = 30.0) -> None:
        """Wait until `count` messages were handled; AssertionError after `timeout` s."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._handled) >= count, timeout):
                raise AssertionError(
                    f"{len(self._handled)} of {count} messages handled within {timeout:g} s"
                )


def order_problems(
    sent: Mapping[str | None, Sequence[bytes]],
    *recorders: OrderRecorder,
    max_duplicates: int = 0,
) -> list[str]:
    """What breaks the ordering promise in what `recorders` handled (empty: nothing).

    `sent` maps each sharding key to the bodies sent with it, in send order (bodies are
    unique per key). Checked: every sent message was handled (none lost), nothing else was;
    no message of a key was handled before every earlier one of that key had been (order,
    over all recorders, by when their calls began); and at most `max_duplicates` messages
    were handled again (a re-delivery after a crash or a hand-over repeats a suffix).
    """
    index: dict[tuple[str | None, bytes], int] = {}
    for key, bodies in sent.items():
        for i, body in enumerate(bodies):
            if (key, body) in index:
                raise ValueError(f"key {key!r} has the body {body!r} twice: bodies must differ")
            index[(key, body)] = i
    handled = sorted((h for r in recorders for h in r.handled), key=lambda h: h.started)
    problems: list[str] = []
    top: dict[str | None, int] = defaultdict(lambda: -1)
    duplicates = 0
    for h in handled:
        at = index.get((h.key, h.body))
        if at is None:
            problems.append(f"handled {h.body!r} of key {h.key!r}, which was not sent")
            continue
        if at > top[h.key] + 1:
            problems.append(
                f"key {h.key!r}: {h.body!r} was handled before {sent[h.key][top[h.key] + 1]!r}"
            )
        elif at <= top[h.key]:
            duplicates += 1
        top[h.key] = max(top[h.key], at)
    for key, bodies in sent.items():
        missing = list(bodies[top[key] + 1 :])
        if missing:
            problems.append(f"key {key!r}: {len(missing)} never handled, from {missing[0]!r}")
    if duplicates > max_duplicates:
        problems.append(
            f"{duplicates} re-deliveries handled again, more than max_duplicates={max_duplicates}"
        )
    return problems


def assert_handled_in_order(
    sent: Mapping[str | None, Sequence[bytes]],
    *recorders: OrderRecorder,
    max_duplicates: int = 0,
) -> None:
    """AssertionError listing what `order_problems` finds, if anything."""
    problems = order_problems(sent, *recorders, max_duplicates=max_duplicates)
    if problems:
        raise AssertionError(f"{len(problems)} problems:\n" + "\n".join(problems[:20]))
