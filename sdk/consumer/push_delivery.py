"""Push delivery for the consumer cores: the broker sends a queue's batches within credits.

PushConsumerCore and LitePullConsumerCore take their queues' records this way when their
config's `delivery` is "push" (the default): one subscription per queue, on the
transport's stream, instead of a pull round trip per batch. Without push at the
transport or the broker, they pull (ConsumerCore's pull loop).
"""

from __future__ import annotations

import asyncio
import logging

from sdk._transport.protocol import PullResult, PullStatus, Subscription
from sdk.clock import sleep_for
from sdk.consumer.core import ConsumerCore
from sdk.consumer.process_queue import ProcessQueue
from sdk.errors import (
    InvalidArgumentError,
    LockNotHeldError,
    NotSupportedError,
    OrderMQError,
    StaleEpochError,
)
from sdk.message import MessageQueue

log = logging.getLogger("ordermq.consumer")

#: Push delivery: a queue's credit is looked at again at least this often (seconds), as
#: well as whenever messages leaving its cache free a grant's worth of room.
CREDIT_RECHECK = 1.0


class PushDeliveryCore(ConsumerCore):
    """ConsumerCore whose queues are pushed by the broker while `_push` holds."""

    #: Push delivery was asked for and nothing has said it is not served (the
    #: subclasses set it from their config's `delivery`).
    _push: bool = False

    def _credit_limit(self) -> int:
        """Most messages a queue's subscription may have on their way or cached."""
        return self._queue_threshold()

    def _start_pulling(self, queue: MessageQueue, pq: ProcessQueue) -> None:
        if self._push:
            self._pulls[queue] = asyncio.create_task(self._push_loop(queue, pq))
        else:
            super()._start_pulling(queue, pq)

    async def _push_loop(self, queue: MessageQueue, pq: ProcessQueue) -> None:
        """Push delivery of one queue (delivery "push"): what the pull loop does.

        Subscribes from the next offset with the credit the cache has room for, takes
        the batches as a pull's, and grants more as room frees. A subscription ends when
        the queue is reset or changes lock epoch (subscribe again from the new offset),
        when the broker says the lock is lost (fenced, as a refused commit: nothing
        buffered goes to a listener or poll() until the lock is granted again), or when
        the connection breaks (subscribe again after pull_error_backoff). Without push at the
        transport or the broker (a refusal, UNIMPLEMENTED or INVALID_ARGUMENT, before the
        first batch), this queue and every later one are pulled.
        """
        c = self._tuning
        expression = self._subscriptions.get(queue.topic, "*")
        while not pq.dropped:
            if not self._push:
                await self._pull_loop(queue, pq)
                return
            if not self._may_pull(queue, pq):
                await self._wait_for_room(pq, c.flow_control_backoff)
                continue
            if self.uses_locks and not pq.locked:
                await sleep_for(self._clock, 1.0)
                continue
            generation, epoch = pq.generation, pq.lock_epoch
            messages = self._credit_limit() - pq.count
            size = c.pull_threshold_bytes_for_queue - pq.size
            if messages <= 0 or size <= 0:
                await self._wait_for_room(pq, c.flow_control_backoff)
                continue
            try:
                subscription = await self._transport.subscribe(
                    self.group,
                    queue,
                    pq.next_offset,
                    client_id=self.client_id,
                    lock_epoch=epoch if self.uses_locks else 0,
                    credit_messages=messages,
                    credit_bytes=size,
                    max_messages=c.pull_batch_size,
                    max_bytes=c.pull_max_bytes,
                    tag_expression=expression,
                )
            except NotSupportedError as exc:
                self._no_push(exc)
                continue
            except OrderMQError as exc:
                log.warning("subscribing to %s failed: %s", queue, exc)
                await sleep_for(self._clock, c.pull_error_backoff)
                continue
            except Exception:  # a bug below: this queue's task must not end with it
                log.exception("subscribing to %s failed unexpectedly", queue)
                await sleep_for(self._clock, c.pull_error_backoff)
                continue
            if pq.dropped or pq.generation != generation:
                subscription.close()
                continue
            await self._receive(queue, pq, subscription, generation, epoch)

    async def _receive(
        self,
        queue: MessageQueue,
        pq: ProcessQueue,
        subscription: Subscription,
        generation: int,
        epoch: int,
    ) -> None:
        """Take one subscription's batches until it ends or no longer fits the queue."""
        granter = asyncio.create_task(self._grant_credit(pq, subscription))
        received = False
        locks = self.uses_locks

        def still_ours() -> bool:
            # Not reset (seek, new owner) since it was opened, and (orderly) its lock held
            # at the subscription's epoch.
            return not (
                pq.dropped
                or pq.generation != generation
                or (locks and (not pq.locked or pq.lock_epoch != epoch))
            )

        def take(result: PullResult) -> bool:
            # In the transport's reader, as batches arrive: a batch the loop below would
            # only buffer is buffered here, without waking it (a task hand-off per batch).
            # Anything else goes to next(), where the loop makes its checks again.
            nonlocal received
            received = True
            if result.status is PullStatus.OFFSET_ILLEGAL or not still_ours():
                return False
            self._buffer(queue, pq, result)
            return True

        subscription.on_batch(take)
        try:
            while not pq.dropped:
                result = await subscription.next()
                received = True
                if not still_ours():
                    return  # subscribe again (or not, the lock lost)
                await self._accept(queue, pq, result)
                if result.status is PullStatus.OFFSET_ILLEGAL:
                    return  # its last batch: subscribe again where the broker said
        except (NotSupportedError, InvalidArgumentError) as exc:
            # Refused before any batch: a broker without push (UNIMPLEMENTED; one of before
            # it answers INVALID_ARGUMENT, a body it does not know), or a request it will
            # not serve: pulling does what it did before push existed.
            if not received:
                self._no_push(exc)
            else:
                log.warning("push subscription of %s ended: %s", queue, exc)
                await sleep_for(self._clock, self._tuning.pull_error_backoff)
        except (LockNotHeldError, StaleEpochError) as exc:
            log.info("push subscription of %s ended: %s", queue, exc)
            # A lock granted again since, at a new epoch (which ended this subscription
            # at once), is ours: subscribe again at it. Otherwise the lock is lost.
            if pq.lock_epoch == epoch:
                self._fenced(queue)
        except OrderMQError as exc:
            log.warning("push subscription of %s ended: %s", queue, exc)
            await sleep_for(self._clock, self._tuning.pull_error_backoff)
        except Exception:  # a bug below: this queue's task must not end with it
            log.exception("push subscription of %s ended unexpectedly", queue)
            await sleep_for(self._clock, self._tuning.pull_error_backoff)
        finally:
            subscription.on_batch(None)
            granter.cancel()
            subscription.close()

    async def _grant_credit(self, pq: ProcessQueue, subscription: Subscription) -> None:
        """Grant a subscription more credit whenever the queue's cache has room for it.

        Sleeps until the room is worth a grant (CreditWindow.grantable: a batch's worth
        of messages, or half the bytes), not woken by each message consumed.
        """
        c = self._tuning
        credit, limit_bytes = subscription.credit, c.pull_threshold_bytes_for_queue
        while True:
            limit = self._credit_limit()
            least = min(c.pull_batch_size, limit // 2)
            messages, size = credit.to_grant(limit, limit_bytes, pq.count, pq.size, least)
            if messages or size:
                subscription.grant(messages, size)

            def worth_a_grant(limit: int = limit, least: int = least) -> bool:
                return credit.grantable(limit, limit_bytes, pq.count, pq.size, least)

            await self._wait_for_room(pq, CREDIT_RECHECK, worth_a_grant)

    def _no_push(self, exc: OrderMQError) -> None:
        if self._push:
            log.info("push delivery is not served (%s): pulling instead", exc)
        self._push = False
