"""A private event loop in a daemon thread: how the blocking clients run the async core.

Each blocking client owns one; there is no loop shared between clients.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar, TypeVarTuple, cast

T = TypeVar("T")
_Ts = TypeVarTuple("_Ts")
#: How long stop() lets the loop's remaining tasks finish after cancelling them.
DRAIN_SECONDS = 2.0


def _nothing() -> None:
    return None


async def _cancel_the_rest() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=DRAIN_SECONDS)


#: The module of gRPC's asyncio completion callbacks (`_handle_callback_wrapper`).
GRPC_CALLBACKS_MODULE = "grpc._cython.cygrpc"


class _ClientLoop(asyncio.SelectorEventLoop):
    """A blocking client's loop: gRPC's completions that come after it closed are dropped.

    gRPC's asyncio poller (grpcio 1.85) hands each completion of a call to whichever
    bound loop reads its socket first, and that loop passes it on with the call's loop's
    call_soon_threadsafe. A call cancelled at a client's shutdown can complete after the
    client's loop closed: the RuntimeError ("Event loop is closed") then ended the other
    loop's callback, which asyncio logged as an error on a client that did nothing wrong.
    Nothing waits for such a completion any more.
    """

    def call_soon_threadsafe(
        self,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        if self.is_closed() and getattr(callback, "__module__", None) == GRPC_CALLBACKS_MODULE:
            return asyncio.Handle(_nothing, (), self, context)  # never run
        return super().call_soon_threadsafe(callback, *args, context=context)


def _outcome(future: asyncio.Future[T]) -> tuple[bool, Any]:
    """A done future's outcome for a thread: (True, result) or (False, exception).

    Cancelled (the loop stopping under it, or the work cancelled there): the
    CancelledError of concurrent.futures, which the waiting thread's callers catch.
    """
    if future.cancelled():
        return False, concurrent.futures.CancelledError()
    if (exc := future.exception()) is not None:
        return False, exc
    return True, future.result()


class _Answer(Generic[T]):
    """One blocking call's outcome, handed from the loop to the waiting thread.

    A plain lock rather than a Future and its Condition: the cheaper hand-off.
    """

    __slots__ = ("_answered", "_outcome")

    def __init__(self) -> None:
        self._answered = threading.Lock()
        self._answered.acquire()
        self._outcome: tuple[bool, Any] = (False, None)  # (True, result) or (False, exception)

    def give(self, ok: bool, value: Any) -> None:
        self._outcome = (ok, value)
        self._answered.release()

    def give_outcome(self, future: asyncio.Future[T]) -> None:
        self.give(*_outcome(future))

    def wait(self) -> T:
        self._answered.acquire()
        ok, value = self._outcome
        if ok:
            return cast(T, value)
        raise value


class LoopThread:
    """Run coroutines on a dedicated loop from any thread."""

    def __init__(self, name: str) -> None:
        self._loop = _ClientLoop()
        self._incoming: deque[Callable[[], None]] = deque()
        self._wake_pending = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the loop; its result arrives in the returned future."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and wait for its result (or exception)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking ordermq call was made from its own loop thread")
        return self.run_started(lambda: coro)

    def run_or_call(
        self, now: Callable[[], T | None], later: Callable[[], Coroutine[Any, Any, T]]
    ) -> T:
        """`now()` on the loop; when it returns None, run `later()` there instead; wait.

        One hop to the loop and back, as run(), but without a task when `now` answers,
        and the answer comes back through a plain lock rather than a Future and its
        Condition: a cheaper hand-off for calls mostly answered at once (poll()).
        """
        answer: _Answer[T] = _Answer()

        def step() -> None:  # never raises: the steps queued behind it run too
            try:
                result = now()
                if result is None:
                    self._loop.create_task(later()).add_done_callback(answer.give_outcome)
                    return
            except BaseException as exc:
                answer.give(False, exc)
                return
            answer.give(True, result)

        return self._wait(answer, step)

    def run_started(self, start: Callable[[], Awaitable[T]]) -> T:
        """`start()` on the loop; wait for the future or coroutine it returns.

        As run_or_call, for calls that begin at once and finish later: a future that
        `start` returns is waited for without a task (a send admitted to the producer's
        buffer), a coroutine runs as one.
        """
        answer: _Answer[T] = _Answer()

        def step() -> None:  # never raises
            try:
                self._future_of(start()).add_done_callback(answer.give_outcome)
            except BaseException as exc:
                answer.give(False, exc)

        return self._wait(answer, step)

    def begin(self, start: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """`start()` on the loop, in turn with the calls of run_started; its future.

        Once `start` ran the call is under way: cancelling the returned future does not
        stop it (a message handed to the producer's buffer is sent).
        """
        result: concurrent.futures.Future[T] = concurrent.futures.Future()

        def settle(future: asyncio.Future[T]) -> None:
            ok, value = _outcome(future)
            if ok:
                result.set_result(value)
            else:
                result.set_exception(value)

        def step() -> None:  # never raises
            if not result.set_running_or_notify_cancel():
                return  # cancelled before it began
            try:
                self._future_of(start()).add_done_callback(settle)
            except BaseException as exc:
                result.set_exception(exc)

        self._call_soon(step)
        return result

    def _future_of(self, awaitable: Awaitable[T]) -> asyncio.Future[T]:
        if isinstance(awaitable, asyncio.Future):
            return awaitable
        return self._loop.create_task(cast(Coroutine[Any, Any, T], awaitable))

    def _wait(self, answer: _Answer[T], step: Callable[[], None]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking ordermq call was made from its own loop thread")
        self._call_soon(step)
        return answer.wait()

    def _call_soon(self, step: Callable[[], None]) -> None:
        """Run `step` on the loop soon: one wake-up of the loop for the steps queued together.

        Each call_soon_threadsafe writes to the loop's wake-up pipe, which the loop then
        reads: callers of several threads at once share one write (docs/performance.md).
        """
        self._incoming.append(step)
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._take_incoming)
            except BaseException:  # a closed loop: RuntimeError, to this caller and the next
                self._wake_pending = False
                raise

    def _take_incoming(self) -> None:
        # Cleared before the deque is emptied: a step queued after the last pop saw it
        # cleared, and woke the loop again.
        self._wake_pending = False
        incoming = self._incoming
        while incoming:
            incoming.popleft()()

    def hold(self) -> threading.Event:
        """Block the loop until the returned event is set (sdk.testing.paused).

        Returns once the loop is blocked: nothing scheduled on it runs meanwhile, as in a
        process stopped by SIGSTOP.
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("a loop cannot hold itself")
        held, release = threading.Event(), threading.Event()

        def block() -> None:
            held.set()
            release.wait()

        self._loop.call_soon_threadsafe(block)
        held.wait()
        return release

    def stop(self) -> None:
        """Cancel what still runs on the loop (as asyncio.run does), stop it, join it.

        Tasks left pending would be destroyed with the loop, gRPC's own among them
        ("Task was destroyed but it is pending!").
        """
        if self._loop.is_closed():
            return
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self.submit(_cancel_the_rest()).result(DRAIN_SECONDS + 1)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._wake_pending = False  # a call from now on raises (the loop is closed), not waits
