"""The rule of taking, renewing and releasing queue locks, written once for every front.

A lock request (gRPC LockBatch, remoting LOCK_BATCH_MQ) is served when, in this order:

1. the client id is 1-255 characters (INVALID_ARGUMENT);
2. the group's name is valid and the group exists: it has members, offsets, locks or
   received messages (GROUP_NOT_FOUND);
3. every queue exists (TOPIC_NOT_FOUND, INVALID_QUEUE);
4. the client is a member of the group now (it joined by heartbeat and has not left or
   expired). A client that is not may only renew the locks it still holds there: after a
   broker restart the lock table is back before the clients' first heartbeats, and an
   owner renews at its epoch at once. Any other request is refused (NOT_A_MEMBER);
5. the client would hold no more than `client_max_locks` lock entries, over every group
   (RESOURCE_EXHAUSTED / TOO_MANY_LOCKS), so that one client cannot grow the lock table,
   and the file it is saved to, without bound.

An unlock (gRPC UnlockBatch, remoting UNLOCK_BATCH_MQ) checks 1 to 3; it releases only
the caller's locks (and expired ones), so it needs no membership.

Every request counts as a sign of life of its client (ConsumerGroups.alive): a client
whose connection was reset and that came back on a new one keeps its membership, and its
locks, without waiting for its next heartbeat (RocketMQ clients send one every 30 s, the
default disconnect grace).

The fronts only translate requests and the refusals (BrokerError) into their wire.
"""

from __future__ import annotations

from collections.abc import Iterable

from grpc import StatusCode

from mockbroker.errors import BrokerError
from mockbroker.lock_manager import QueueKey
from mockbroker.push import lock_wakeup
from mockbroker.state import BrokerState, check_client_id


def not_a_member(group: str, client_id: str) -> BrokerError:
    """FAILED_PRECONDITION / NOT_A_MEMBER."""
    return BrokerError(
        StatusCode.FAILED_PRECONDITION,
        "NOT_A_MEMBER",
        f"client {client_id!r} is not a member of consumer group {group!r}: it must join "
        "it by heartbeat before it locks queues",
    )


class QueueLocks:
    """Lock and unlock requests of every front, by the rule of the module docstring."""

    def __init__(self, state: BrokerState) -> None:
        self._s = state

    def take(
        self, group: str, client_id: str, queues: Iterable[QueueKey], peer: str = ""
    ) -> dict[QueueKey, int]:
        """Take or renew locks for `client_id`; the queues it now holds, with their epochs.

        The caller saves the table (`locks.save()`) before it answers.
        """
        state = self._s
        queues = self._check(group, client_id, queues)
        member = state.groups.is_member(client_id, group)
        if not member and not state.locks.holds_any(group, client_id):
            raise not_a_member(group, client_id)
        state.groups.alive(client_id, peer)
        held = state.locks.lock_batch(
            group,
            client_id,
            queues,
            renew_only=not member,
            max_held=state.config.client_max_locks,
        )
        self._changed(group, queues)
        return held

    def release(
        self, group: str, client_id: str, queues: Iterable[QueueKey], peer: str = ""
    ) -> dict[QueueKey, str]:
        """Release the caller's locks among `queues`; another client's live ones stay.

        The answer maps each queue another client holds to its owner.
        """
        state = self._s
        queues = self._check(group, client_id, queues)
        state.groups.alive(client_id, peer)
        refused = state.locks.unlock_batch(group, client_id, queues)
        self._changed(group, queues)
        return refused

    def _changed(self, group: str, queues: Iterable[QueueKey]) -> None:
        """Wake the push subscriptions of `queues`: they check their lock again."""
        for queue in queues:
            self._s.holder.notify(*lock_wakeup(group, queue))

    def _check(self, group: str, client_id: str, queues: Iterable[QueueKey]) -> list[QueueKey]:
        check_client_id(client_id)
        self._s.known_group(group)
        keys = list(queues)
        for topic, queue_id in keys:
            self._s.topic_queue(topic, queue_id)
        return keys
