"""The blocking clients' lifecycle, what runs at the process's end, and waiting for a signal.

The end of a real process (Ctrl+C, SIGTERM, the main thread returning) is in
tests/system/test_consumer_signals.py; here are the pieces, with cores that do nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk.aio
from sdk import wait_for_shutdown_signal
from sdk._blocking import BlockingClient, shutdown_running_clients
from sdk.errors import ClientStateError, InvalidArgumentError
from tests.support import wait_until


class Core:
    """An async core that records its shutdown, and may fail it."""

    def __init__(self, name: str, shut: list[str], fail: bool = False) -> None:
        self.name, self.shut, self.fail = name, shut, fail

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        self.shut.append(self.name)
        if self.fail:
            raise RuntimeError(f"{self.name} failed to shut down")

    async def echo(self, value: int) -> int:
        return value


class Client(BlockingClient):
    """A blocking client around a Core."""

    def __init__(self, core: Core) -> None:
        super().__init__(core, f"test-{core.name}")
        self.core = core

    def echo(self, value: int) -> int:
        return self._run(self.core.echo(value))


@pytest.fixture
def sigterm_default() -> Iterator[None]:
    """SIGTERM at its default for the test, whatever it was before."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_running_clients_are_shut_down_last_started_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shut: list[str] = []
    producer, consumer, other = (
        Client(Core("producer", shut)),
        Client(Core("consumer", shut, fail=True)),
        Client(Core("other", shut)),
    )
    for client in (producer, consumer, other):
        client.start()
    other.shutdown()
    with caplog.at_level(logging.ERROR, "ordermq"):
        shutdown_running_clients()
    # The consumer goes first: its listener may still use the producer. Its failure is
    # logged and does not keep the producer running.
    assert shut == ["other", "consumer", "producer"]
    assert "shutting down Client failed" in caplog.text
    shutdown_running_clients()
    assert shut == ["other", "consumer", "producer"]


def test_a_shut_down_client_stays_shut_down() -> None:
    shut: list[str] = []
    client = Client(Core("c", shut))
    with pytest.raises(ClientStateError, match="not started"):
        client.echo(1)
    with client:
        assert client.echo(7) == 7
    client.shutdown()
    assert shut == ["c"]
    with pytest.raises(ClientStateError, match="is shut down"):
        client.echo(1)
    with pytest.raises(ClientStateError, match="make a new one"):
        client.start()


@pytest.mark.usefixtures("sigterm_default")
def test_a_started_client_takes_sigterm_only_while_nothing_else_does() -> None:
    client = Client(Core("c", []))
    client.start()
    ours = signal.getsignal(signal.SIGTERM)
    assert callable(ours)
    client.shutdown()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    def own(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, own)
    with Client(Core("d", [])):
        assert signal.getsignal(signal.SIGTERM) is own
    assert signal.getsignal(signal.SIGTERM) is own


def send_when_waiting(sig: signal.Signals, before: object) -> threading.Thread:
    """Send `sig` to this process once its handler is no longer `before`."""

    def send() -> None:
        wait_until(lambda: signal.getsignal(sig) is not before, what="the wait's handler")
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=send)
    thread.start()
    return thread


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.usefixtures("sigterm_default")
def test_wait_for_shutdown_signal_returns_the_signal_and_restores_the_handlers(
    sig: signal.Signals,
) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    sender = send_when_waiting(sig, before[sig])
    assert wait_for_shutdown_signal() is sig  # no KeyboardInterrupt, no exit
    sender.join()
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.usefixtures("sigterm_default")
def test_a_signal_sent_the_moment_the_wait_takes_it_ends_the_wait_every_time() -> None:
    # The docs runner sends SIGTERM as soon as the wait's handler is in place. A signal
    # whose Python handler had not run when the old wait went to sleep was only seen when
    # the sleep (an hour) ended: the wait must block on something the signal itself wakes.
    main = threading.main_thread().ident or 0
    before = signal.getsignal(signal.SIGTERM)
    for _ in range(30):

        def send() -> None:
            while signal.getsignal(signal.SIGTERM) is before:
                pass  # no sleep: the signal goes at the first moment the wait takes it
            signal.pthread_kill(main, signal.SIGTERM)

        sender = threading.Thread(target=send)
        sender.start()
        assert wait_for_shutdown_signal() is signal.SIGTERM
        sender.join()
        assert signal.getsignal(signal.SIGTERM) is before
    assert signal.set_wakeup_fd(-1) == -1, "the wait left its wake-up socket in place"


def test_wait_for_shutdown_signal_refuses_what_it_cannot_do() -> None:
    with pytest.raises(InvalidArgumentError, match="needs a signal"):
        wait_for_shutdown_signal(())
    with pytest.raises(InvalidArgumentError, match="SIGKILL cannot be caught"):
        wait_for_shutdown_signal((signal.SIGKILL,))
    with pytest.raises(InvalidArgumentError, match="not all signals"):
        wait_for_shutdown_signal((12345,))  # type: ignore[arg-type]
    raised: list[BaseException] = []

    def elsewhere() -> None:
        try:
            wait_for_shutdown_signal()
        except ClientStateError as exc:
            raised.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert "main thread" in str(raised[0])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.usefixtures("sigterm_default")
def test_the_asyncio_wait_returns_the_signal_and_restores_the_handlers(
    sig: signal.Signals,
) -> None:
    async def main() -> tuple[signal.Signals, bool]:
        # asyncio.run has its own Ctrl+C handler: it must be back afterwards.
        before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        sender = send_when_waiting(sig, before[sig])
        got = await sdk.aio.wait_for_shutdown_signal()
        await asyncio.to_thread(sender.join)
        return got, {s: signal.getsignal(s) for s in before} == before

    assert asyncio.run(main()) == (sig, True)


def test_the_asyncio_wait_refuses_what_it_cannot_do() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(InvalidArgumentError, match="SIGKILL cannot be caught"):
        asyncio.run(sdk.aio.wait_for_shutdown_signal((signal.SIGKILL,)))
    raised: list[BaseException] = []

    def elsewhere() -> None:  # an event loop outside the main thread gets no signals
        try:
            asyncio.run(sdk.aio.wait_for_shutdown_signal())
        except ClientStateError as exc:
            raised.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert "main thread" in str(raised[0])
    assert {s: signal.getsignal(s) for s in before} == before


_INTERRUPTED_HOLDING_THE_REGISTRY = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from sdk import _blocking
from tests.unit.test_blocking import Client, Core

class Reporting(Core):
    async def shutdown(self):
        print("shut down", flush=True)

Client(Reporting("c", [])).start()
print("started", flush=True)
with _blocking._registry_lock:  # as inside a client's start() or shutdown()
    os.kill(os.getpid(), signal.SIGTERM)  # handled here, with the lock held
    time.sleep(0.5)
time.sleep(10)
print("not ended", flush=True)
"""


def test_sigterm_handled_while_the_main_thread_holds_the_registry_shuts_down_and_ends(
    tmp_path: Path,
) -> None:
    # The handler runs in the main thread wherever it was: it shut the clients down right
    # there, and waited for ever for the registry's lock its own thread held.
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_HOLDING_THE_REGISTRY, root],
        capture_output=True,
        timeout=20,
        cwd=tmp_path,
    )
    assert proc.stdout.decode().splitlines() == ["started", "shut down"], proc.stderr.decode()
    assert proc.returncode == -signal.SIGTERM


_MAIN_THREAD_ENDS_DURING_THE_SIGTERM_SHUTDOWN = """
import os, signal, sys, threading, time
sys.path.insert(0, sys.argv[1])
from sdk import _blocking
from tests.unit.test_blocking import Client, Core

class Slow(Core):
    async def shutdown(self):
        print("shut down", flush=True)

end = _blocking._end_if_terminating

def late_end():  # the SIGTERM thread, slow to end the process: the main thread ends first
    if threading.current_thread().name == "ordermq-sigterm":
        time.sleep(2)
    end()

_blocking._end_if_terminating = late_end
Client(Slow("c", [])).start()
print("started", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)  # the SIGTERM thread has shut the client down; main returns now
"""


def test_sigterm_ends_the_process_by_sigterm_when_the_main_thread_ends_first(
    tmp_path: Path,
) -> None:
    # The main thread's exit hook found the client shut down by the SIGTERM thread and
    # returned: the interpreter ended (status 0, atexit callbacks run) before that daemon
    # thread re-raised SIGTERM.
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run(
        [sys.executable, "-c", _MAIN_THREAD_ENDS_DURING_THE_SIGTERM_SHUTDOWN, root],
        capture_output=True,
        timeout=20,
        cwd=tmp_path,
    )
    assert proc.stdout.decode().splitlines() == ["started", "shut down"], proc.stderr.decode()
    assert proc.returncode == -signal.SIGTERM
