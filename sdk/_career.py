"""The singleton career: one holder per career name, over the broker's queue locks.

A career is seed 000's "ILeaderCareer" (领导人交接: inaugurate, execute, hand over):
of all the processes that run a career with the same name, one at a time holds it;
it is inaugurated, executes its job over and over, and hands over when it stops. This
module is the core, shared by `sdk.Career` (blocking callbacks) and `sdk.aio.Career`
(async callbacks); it reaches brokers through the Transport protocol only.

Design: no new broker protocol. A career named N is the broker's queue lock on

- consumer group ``CAREER_N`` (one group per career, so its lock is its own), and
- the first writable queue of the topic ``ordermq-careers`` (`DEFAULT_TOPIC`, one topic
  for every career; the first route query creates it on a broker that creates topics,
  which is the default; otherwise create it, or pass another existing topic).

The broker's RebalanceLockManager gives that lock to one client at a time, with a lease
(60 s by default) and a fencing epoch that grows with every grant to a new owner and
survives broker restarts. A candidate joins the group by heartbeat, then asks for the
lock every `renew_interval_seconds`. The holder renews it as often, and counts its own
lease from the moment it *sent* the request that was granted: `lease_seconds` (30 s by
default) must be shorter than the broker's lease, so that a holder whose renewals fail
(network, broker, a paused process) stops executing before the broker may give the lock
to another candidate.

The epoch of the grant is handed to every callback. It is the application's fence: a
store that refuses writes whose epoch is lower than the highest it has seen refuses a
deposed holder's late writes (a process paused past its lease that wakes up and goes on
for a moment before it learns it was deposed).

A term ends:

- cleanly, on shutdown: the running `on_execute` is cancelled, `on_hand_over(epoch)`
  runs while the lock is still renewed, then the lock is released, so that another
  candidate is inaugurated at its next attempt (within one `renew_interval_seconds`);
- forcibly, when a renewal is refused (the broker gave the lock away) or the holder's
  own lease view runs out: the running `on_execute` is cancelled at once, then
  `on_hand_over(epoch)` runs. A holder that died (kill -9) or is paused stops renewing:
  the broker gives the lock away once its lease is over.

A blocking callback (sdk.Career runs each in a worker thread) cannot be cancelled: its
end is awaited instead, so a long `on_execute` should check `holds(epoch)`, which turns
False at once in both cases, and return.

Over RocketMQ's remoting protocol (`rocketmq://` endpoints) locks carry no epoch:
every epoch is 0, so there is nothing to fence with. The career is tested over ordermq's
own protocol (the default) only.

A failing `on_execute` is logged and called again after `execute_interval_seconds`; a
failing `on_inaugurate` is logged and ends the term (the lock is released).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sdk._transport.protocol import GroupInfo, Transport
from sdk._validation import NAME_RE, check_clock, check_topic
from sdk.clock import Clock, SystemClock
from sdk.consumer.core import new_client_id
from sdk.errors import ClientStateError, InvalidArgumentError, OrderMQError
from sdk.message import MessageQueue

log = logging.getLogger("ordermq.career")

#: The topic whose first queue carries every career's lock (see the module docstring).
DEFAULT_TOPIC = "ordermq-careers"
#: A career's group is this prefix and its name.
GROUP_PREFIX = "CAREER_"
DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_RENEW_INTERVAL_SECONDS = 5.0
DEFAULT_EXECUTE_INTERVAL_SECONDS = 1.0

Callback = Callable[[int], Awaitable[object]]


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{name} must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidArgumentError(f"{name} must be a finite number >= 0, not {value!r}")
    return float(value)


def check_career_name(name: object) -> str:
    """`name` if it can name a career, else InvalidArgumentError."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(GROUP_PREFIX + name) or not name:
        raise InvalidArgumentError(
            f"career name {name!r} must be 1-{127 - len(GROUP_PREFIX)} letters, digits, _ or -"
        )
    return name


class CareerCore:
    """Campaign for a career, hold it, hand it over; async callbacks (module docstring).

    `transport` makes the transport, called once the arguments were checked.
    """

    def __init__(
        self,
        name: str,
        transport: Callable[[], Transport],
        on_inaugurate: Callback,
        on_execute: Callback,
        on_hand_over: Callback,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        renew_interval_seconds: float = DEFAULT_RENEW_INTERVAL_SECONDS,
        execute_interval_seconds: float = DEFAULT_EXECUTE_INTERVAL_SECONDS,
        topic: str = DEFAULT_TOPIC,
        clock: Clock | None = None,
    ) -> None:
        self.name = check_career_name(name)
        self.lease_seconds = _seconds("lease_seconds", lease_seconds)
        self.renew_interval_seconds = _seconds("renew_interval_seconds", renew_interval_seconds)
        self.execute_interval_seconds = _seconds(
            "execute_interval_seconds", execute_interval_seconds
        )
        if self.renew_interval_seconds <= 0:
            raise InvalidArgumentError("renew_interval_seconds must be > 0")
        if self.lease_seconds <= self.renew_interval_seconds:
            raise InvalidArgumentError(
                f"lease_seconds ({lease_seconds}) must exceed renew_interval_seconds "
                f"({renew_interval_seconds}): the holder renews within its lease"
            )
        for label, cb in (
            ("on_inaugurate", on_inaugurate),
            ("on_execute", on_execute),
            ("on_hand_over", on_hand_over),
        ):
            if not callable(cb):
                raise InvalidArgumentError(f"{label} must be callable, not {cb!r}")
        try:
            self.topic = check_topic(topic)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"career topic: {exc}") from None
        check_clock(clock)
        self.group = GROUP_PREFIX + name
        self.client_id = new_client_id()
        self.clock: Clock = clock or SystemClock()
        self._transport = transport()  # made once the arguments are known to be good
        self._on_inaugurate = on_inaugurate
        self._on_execute = on_execute
        self._on_hand_over = on_hand_over
        self._epoch: int | None = None  # the term held now
        self._lease_until = -math.inf  # monotonic, the holder's own view
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._executing: asyncio.Future[bool] | None = None  # the on_execute call running
        self._started = False
        #: Every epoch this candidate was inaugurated with, in order (for tests and logs).
        self.terms: list[int] = []

    # ------------------------------------------------------------------ state
    @property
    def epoch(self) -> int | None:
        """The epoch of the term held now, or None when this candidate does not hold it."""
        if self._epoch is not None and self.clock.monotonic() < self._lease_until:
            return self._epoch
        return None

    def holds(self, epoch: int) -> bool:
        """True while the term of `epoch` is held, within the holder's own lease view."""
        return self.epoch == epoch and not self._stopping.is_set()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start campaigning; returns at once (the callbacks run in the background)."""
        if self._started:
            raise ClientStateError("the career was started already; make a new one")
        self._started = True
        self._stopping = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.group)

    async def shutdown(self) -> None:
        """Hand over cleanly if holding (on_hand_over, unlock), leave, close connections."""
        self._stopping.set()
        if self._executing is not None:
            self._executing.cancel()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(OrderMQError):
            await self._transport.unregister(self.client_id)
        await self._transport.close()

    # ------------------------------------------------------------------ campaign
    async def _run(self) -> None:
        queue: MessageQueue | None = None
        while not self._stopping.is_set():
            try:
                if queue is None:
                    queue = (await self._transport.writable_queues(self.topic))[0]
                await self._heartbeat()
                sent = self.clock.monotonic()
                answer = await self._transport.lock_batch(self.group, self.client_id, [queue])
            except OrderMQError as exc:
                log.warning("career %s: campaign failed, retrying: %s", self.name, exc)
                await self._pause(self.renew_interval_seconds)
                continue
            epoch = answer.locked.get(queue)
            if epoch is None:
                await self._pause(self.renew_interval_seconds)
                continue
            if self._stopping.is_set():  # granted as shutdown began: give it back at once
                with contextlib.suppress(OrderMQError):
                    await self._transport.unlock_batch(self.group, self.client_id, [queue])
                return
            await self._serve(queue, epoch, sent)
            # The others' turn first: a candidate whose inauguration failed tries again
            # only after them.
            await self._pause(self.renew_interval_seconds)

    async def _heartbeat(self) -> None:
        await self._transport.heartbeat(self.client_id, [GroupInfo(self.group, "CONSUME_ORDERLY")])

    async def _pause(self, seconds: float) -> None:
        """Sleep `seconds` on the clock, or until shutdown."""
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await self._wait_any([stop], seconds)
        finally:
            stop.cancel()

    async def _wait_any(self, tasks: Sequence[asyncio.Future[Any]], seconds: float) -> None:
        """Wait until one of `tasks` is done or `seconds` pass; the temporary ones cancelled."""
        timer = asyncio.ensure_future(self.clock.sleep_until(self.clock.now() + max(0, seconds)))
        try:
            await asyncio.wait([*tasks, timer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()

    # ------------------------------------------------------------------ term
    async def _serve(self, queue: MessageQueue, epoch: int, sent: float) -> None:
        self._epoch = epoch
        self._lease_until = sent + self.lease_seconds
        self.terms.append(epoch)
        log.info("career %s: %s inaugurated with epoch %d", self.name, self.client_id, epoch)
        work = asyncio.ensure_future(self._work(epoch))
        why = await self._keep(queue, epoch, work)
        self._epoch = None
        if why is not None:  # deposed: stop at once
            log.warning("career %s: epoch %d ended: %s", self.name, epoch, why)
            work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        outcome = "lost" if work.cancelled() else work.result()
        if outcome == "lost":
            await self._call("on_hand_over", self._on_hand_over, epoch)
        try:  # releases only this client's lock: harmless if it was given away
            await self._transport.unlock_batch(self.group, self.client_id, [queue])
        except OrderMQError as exc:
            log.warning("career %s: unlock failed (its lease runs out): %s", self.name, exc)
        log.info("career %s: epoch %d over (%s)", self.name, epoch, outcome)

    async def _keep(self, queue: MessageQueue, epoch: int, work: asyncio.Future[str]) -> str | None:
        """Renew while `work` runs; None once it ended, else why the term was lost."""
        next_renewal = self.clock.monotonic() + self.renew_interval_seconds
        while True:
            now = self.clock.monotonic()
            if work.done():
                return None
            if now >= self._lease_until:
                return "the holder's lease ran out before a renewal succeeded"
            wait = min(next_renewal, self._lease_until) - now
            if wait > 0:
                await self._wait_any([work], wait)
                continue
            sent = self.clock.monotonic()
            try:
                answer = await self._transport.lock_batch(self.group, self.client_id, [queue])
            except OrderMQError as exc:
                log.warning("career %s: renewal failed: %s", self.name, exc)
                next_renewal = self.clock.monotonic() + min(1.0, self.renew_interval_seconds)
                continue
            unanswered = [u.error for u in answer.unanswered if queue in u.queues]
            if unanswered:  # the broker was not reached: the lease may still be ours
                log.warning("career %s: renewal failed: %s", self.name, unanswered[0])
                next_renewal = self.clock.monotonic() + min(1.0, self.renew_interval_seconds)
                continue
            got = answer.locked.get(queue)
            if got != epoch:
                return f"the broker refused the renewal (epoch now {got})"
            if self._epoch == epoch:
                self._lease_until = sent + self.lease_seconds
            next_renewal = sent + self.renew_interval_seconds
            # After the renewal: an owner may renew before it heartbeats (after a broker
            # restart, say); the heartbeat keeps it a member, and alive at the broker.
            try:
                await self._heartbeat()
            except OrderMQError as exc:
                log.warning("career %s: heartbeat failed: %s", self.name, exc)

    async def _work(self, epoch: int) -> str:
        """Inaugurate, execute while held; "failed", "handed" (on shutdown) or "lost"."""
        if not await self._call("on_inaugurate", self._on_inaugurate, epoch):
            return "failed"
        while self.holds(epoch):
            call = asyncio.ensure_future(self._call("on_execute", self._on_execute, epoch))
            self._executing = call
            try:
                await asyncio.wait([call])  # shutdown() cancels it
            except asyncio.CancelledError:  # deposed
                call.cancel()
                await asyncio.wait([call])
                raise
            finally:
                self._executing = None
            if self.execute_interval_seconds and self.holds(epoch):
                await self._pause(self.execute_interval_seconds)
        if self._stopping.is_set() and self.epoch == epoch:
            await self._call("on_hand_over", self._on_hand_over, epoch)
            return "handed"
        return "lost"

    async def _call(self, label: str, callback: Callback, epoch: int) -> bool:
        try:
            await callback(epoch)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("career %s: %s(%d) raised", self.name, label, epoch)
            return False
        return True


class CareerView:
    """What both faces of a career tell about it, read from their CareerCore (`_core`)."""

    _core: CareerCore

    @property
    def name(self) -> str:
        """The career's name."""
        return self._core.name

    @property
    def client_id(self) -> str:
        """The candidate's client id (the lock's owner at the broker while it holds it)."""
        return self._core.client_id

    @property
    def epoch(self) -> int | None:
        """The epoch of the term this candidate holds now, or None."""
        return self._core.epoch

    @property
    def terms(self) -> list[int]:
        """The epochs this candidate was inaugurated with, in order."""
        return list(self._core.terms)

    def holds(self, epoch: int) -> bool:
        """True while the term of `epoch` is held (and no shutdown began)."""
        return self._core.holds(epoch)
