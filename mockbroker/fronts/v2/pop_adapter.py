"""The broker's pop core (mockbroker/pop) as the v2 front's PopCore.

Which groups are FIFO is the broker's setting (`BrokerConfig.fifo_groups`), as RocketMQ 5
keeps it in the subscription group's configuration: the front tells the clients in their
settings, and receives of such a group take a message group's messages one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

from mockbroker.fronts.v2.pop import GroupPolicy, Popped
from mockbroker.pop import PopService
from sdk._wire import iter_records
from sdk.clock import Clock


class PopCoreAdapter:
    """PopCore over PopService; the group's FIFO mode from the broker's configuration."""

    def __init__(self, pop: PopService, clock: Clock, fifo_groups: frozenset[str]) -> None:
        self._pop = pop
        self._clock = clock
        self._fifo = fifo_groups

    def group_policy(self, group: str) -> GroupPolicy:
        """FIFO as configured; delivery attempts as the core counts them for the group."""
        return GroupPolicy(group in self._fifo, self._pop.policy(group).max_attempts)

    async def receive(
        self,
        *,
        group: str,
        topic: str,
        tags: frozenset[bytes] | None,
        max_messages: int,
        invisible_seconds: float,
        wait_seconds: float,
        attempt_id: str,
        client: str | None = None,
    ) -> Sequence[Popped]:
        """Receive from every queue of the topic (`attempt_id` is not used)."""
        got = await self._pop.receive(
            group,
            topic,
            max_messages=max_messages,
            invisible_ms=round(invisible_seconds * 1000),
            tags=tags,
            fifo=group in self._fifo,
            wait_ms=round(wait_seconds * 1000),
            client=client,
        )
        now_ms = self._clock.now() * 1000
        return [
            Popped(
                next(iter_records(r.record)),
                r.receipt,
                r.attempt,
                max(r.invisible_until_ms - now_ms, 0) / 1000,
            )
            for r in got
        ]

    async def ack(self, *, group: str, topic: str, receipt_handle: str) -> None:
        """Settle the message."""
        await self._pop.ack(group, receipt_handle)

    async def change_invisible(
        self, *, group: str, topic: str, receipt_handle: str, invisible_seconds: float
    ) -> str:
        """A new deadline and a new receipt."""
        renewed = await self._pop.change_invisible_duration(
            group, receipt_handle, round(invisible_seconds * 1000)
        )
        return renewed.receipt

    async def forward_to_dead_letter(self, *, group: str, topic: str, receipt_handle: str) -> None:
        """Dead-letter the message now."""
        await self._pop.forward_to_dead_letter(group, receipt_handle)
