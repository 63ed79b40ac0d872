"""The common shape of the blocking clients: an async core run on a private loop thread.

Blocking clients that are still running when the process ends are shut down the way
shutdown() does it, the last started first:

- when the main thread ends (it returned, raised, or got Ctrl+C's KeyboardInterrupt):
  before Python stops its thread pools, which would otherwise refuse the clients' work
  ("cannot schedule new futures after shutdown") while their loops still run;
- on SIGTERM, when the process had no SIGTERM handler of its own when a client started:
  the clients are shut down, then SIGTERM ends the process as it would have (exit status
  -15, no atexit callbacks, as without ordermq). The handler itself only wakes a thread
  that does this: it runs in the main thread between any two of its steps, and whatever
  the main thread held there (the registry's lock, a future's condition) would be held
  against a shutdown run inside it, for ever.

A second Ctrl+C or SIGTERM while that shutdown runs ends the process at once.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # its exit hook must be registered before ours
import contextlib
import logging
import os
import queue
import select
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine
from types import FrameType, TracebackType
from typing import Any, Protocol, Self, TypeVar

from sdk._loop import LoopThread
from sdk.errors import ClientStateError, InvalidArgumentError

T = TypeVar("T")

log = logging.getLogger("ordermq")

# The running clients, in start order. Changed only under _registry_lock; the clients'
# start() and shutdown() run outside it.
_registry_lock = threading.Lock()
_running: list[BlockingClient] = []
_exit_hook_registered = False
_terminating = False  # SIGTERM came: end the process once no client runs
# Woken by the SIGTERM handler (SimpleQueue.put is safe in one); started with the handler.
_sigterm_wake: queue.SimpleQueue[None] = queue.SimpleQueue()
_sigterm_thread_pid = 0  # the process whose thread waits on it (a fork's child has none)


class AsyncCore(Protocol):
    """What a blocking client runs: an async core that starts and shuts down."""

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...


class BlockingClient:
    """start(), shutdown() and `with` for a core, on a loop thread of the client's own.

    A client still running when the process ends is shut down then (see the module).
    """

    def __init__(self, core: AsyncCore, thread_name: str) -> None:
        self._async_core = core
        self._thread_name = thread_name
        self._loop: LoopThread | None = None
        self._shut_down = False
        self._lifecycle = threading.Lock()  # start() and shutdown() one at a time
        self._lifecycle_thread: int | None = None  # the thread inside one of them

    def start(self) -> None:
        """Start the client; its background work runs until shutdown()."""
        with self._lifecycle:
            if self._shut_down:
                raise ClientStateError(f"{type(self).__name__} was shut down; make a new one")
            if self._loop is not None:
                raise ClientStateError(f"{type(self).__name__} already started")
            self._lifecycle_thread = threading.get_ident()
            try:
                self._loop = LoopThread(self._thread_name)
                try:
                    self._loop.run(self._async_core.start())
                except BaseException:
                    self._loop.stop()
                    self._loop = None
                    raise
                _started(self)
            finally:
                self._lifecycle_thread = None
        if _terminating:  # SIGTERM came while it started
            self.shutdown()

    def shutdown(self) -> None:
        """Stop the client (see the subclass for what it finishes first)."""
        with self._lifecycle:
            loop = self._loop
            if loop is None or self._shut_down:
                return
            self._shut_down = True
            self._lifecycle_thread = threading.get_ident()
            try:
                loop.run(self._async_core.shutdown())
            finally:
                loop.stop()
                self._lifecycle_thread = None
                _stopped(self)
        _end_if_terminating()

    def _running(self, coro: Coroutine[Any, Any, Any]) -> LoopThread:
        if self._loop is None or self._shut_down:
            coro.close()
        return self._live_loop()

    def _live_loop(self) -> LoopThread:
        if self._shut_down:
            raise ClientStateError(f"{type(self).__name__} is shut down")
        if self._loop is None:
            raise ClientStateError(f"{type(self).__name__} is not started; call start() first")
        return self._loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the client's loop and wait; ClientStateError before start()."""
        return self._running(coro).run(coro)

    def _run_or_call(
        self, now: Callable[[], T | None], later: Callable[[], Coroutine[Any, Any, T]]
    ) -> T:
        """`now()` on the client's loop, or the coroutine `later()` when it returns None."""
        return self._live_loop().run_or_call(now, later)

    def _run_started(self, start: Callable[[], Awaitable[T]]) -> T:
        """`start()` on the client's loop; wait for the future or coroutine it returns."""
        return self._live_loop().run_started(start)

    def _begin(self, start: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """`start()` on the client's loop, in turn with _run_started's calls; its future."""
        return self._live_loop().begin(start)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()


# ---------------------------------------------------------------------- the process's end
def shutdown_running_clients() -> None:
    """Shut down every blocking client still running, the last started first.

    A client whose shutdown() another thread is running is waited for; one whose start()
    or shutdown() this very thread was in (a signal handler interrupted it) is left to it.
    After SIGTERM, the process then ends by SIGTERM: also when the main thread's exit hook
    gets here first, as the SIGTERM thread (a daemon) may not outlive the interpreter.
    """
    me = threading.get_ident()
    while True:
        with _registry_lock:
            waiting = [c for c in _running if c._lifecycle_thread != me]
        if not waiting:
            break
        client = waiting[-1]
        try:
            client.shutdown()
        except Exception:
            log.exception("shutting down %s failed", type(client).__name__)
            _stopped(client)
    _end_if_terminating()


def _started(client: BlockingClient) -> None:
    global _exit_hook_registered
    with _registry_lock:
        _running.append(client)
        register = not _exit_hook_registered
        _exit_hook_registered = True
    if register:
        _register_exit_hook()
    _handle_sigterm()


def _stopped(client: BlockingClient) -> None:
    with _registry_lock:
        if client in _running:
            _running.remove(client)
        idle = not _running
    if idle and not _terminating:
        _release_sigterm()


def _register_exit_hook() -> None:
    # threading's exit hooks run when the main thread ends, before non-daemon threads are
    # joined, newest first: ours, registered after concurrent.futures' own, runs before
    # the thread pools stop taking work. atexit hooks would run only after that.
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(shutdown_running_clients)
    except RuntimeError:  # the interpreter is already exiting, or an unusual Python
        atexit.register(shutdown_running_clients)


def _handle_sigterm() -> None:
    """Take SIGTERM where nothing else handles it (signal handlers: main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGTERM)
    if handler is signal.SIG_DFL or handler is _on_sigterm:  # ours: a fork's child's too
        global _sigterm_thread_pid
        if _sigterm_thread_pid != os.getpid():
            _sigterm_thread_pid = os.getpid()
            threading.Thread(target=_terminate_on_wake, name="ordermq-sigterm", daemon=True).start()
        signal.signal(signal.SIGTERM, _on_sigterm)


def _release_sigterm() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # left in place: with no client running it does what SIG_DFL does
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _terminating
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    _terminating = True
    if _sigterm_thread_pid == os.getpid():
        _sigterm_wake.put(None)
    else:  # a fork's child that started no client in its main thread: nothing to wait for
        os.kill(os.getpid(), signal.SIGTERM)


def _terminate_on_wake() -> None:
    """The SIGTERM thread: once woken, shut the clients down, then end the process."""
    _sigterm_wake.get()
    shutdown_running_clients()


def _end_if_terminating() -> None:
    """After SIGTERM, once no client runs any more: end the process by SIGTERM."""
    with _registry_lock:
        end = _terminating and not _running
    if end:
        os.kill(os.getpid(), signal.SIGTERM)


def _forget_clients_in_child() -> None:
    # A forked child has none of the parent's loop threads: its copies of the running
    # clients cannot be shut down, and must not be waited for at its exit.
    global _terminating
    _running.clear()
    _terminating = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_clients_in_child)


# ---------------------------------------------------------------------- waiting for a signal
def wait_for_shutdown_signal(
    signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM),
) -> signal.Signals:
    """Block until one of `signals` arrives (Ctrl+C or SIGTERM by default); return it.

    While it waits, those signals only end the wait: no KeyboardInterrupt, no exit. Their
    previous handlers are back when it returns, so shut down after it::

        with consumer:
            wait_for_shutdown_signal()
        # consumer.shutdown() has run: listener calls finished, offsets committed,
        # queues unlocked, group left

    Python runs signal handlers in the main thread only: call it from there
    (ClientStateError otherwise).
    """
    wanted = catchable_signals(signals)
    if threading.current_thread() is not threading.main_thread():
        raise ClientStateError(
            "wait_for_shutdown_signal() must be called from the main thread: "
            "Python delivers signals to no other"
        )
    received: list[signal.Signals] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if not received:  # a second signal while the handlers are restored: ignored
            received.append(signal.Signals(signum))

    # The wait is on a socket the signal's C-level handler writes to (set_wakeup_fd), not
    # on a sleep: a signal that arrives after the handlers are in place but before the
    # thread blocks has run no Python handler yet, and would not wake a sleep that starts
    # after it (a SIGTERM lost for the length of the sleep, seen under load).
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    previous: dict[signal.Signals, Any] = {}
    previous_fd = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    try:
        for sig in wanted:
            previous[sig] = signal.signal(sig, handler)
        while not received:  # each pass first runs the handlers of signals that came
            select.select([wake_r], [], [])
            with contextlib.suppress(BlockingIOError):
                wake_r.recv(4096)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        signal.set_wakeup_fd(previous_fd)
        wake_r.close()
        wake_w.close()
    return received[0]


def catchable_signals(signals: tuple[signal.Signals, ...]) -> list[signal.Signals]:
    """`signals` as a list; InvalidArgumentError if one is no signal or cannot be caught."""
    uncatchable = {getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n)}
    try:
        wanted = [signal.Signals(s) for s in signals]
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{signals!r} are not all signals: {exc}") from None
    if not wanted:
        raise InvalidArgumentError("wait_for_shutdown_signal() needs a signal to wait for")
    caught = [s.name for s in wanted if s in uncatchable]
    if caught:
        raise InvalidArgumentError(
            f"{', '.join(caught)} cannot be caught: a process cannot wait for it"
        )
    return wanted
