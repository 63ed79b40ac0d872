"""tests/interop/harness.py's Driver: lines read as they come, waits that fail fast.

A stand-in driver (a few lines of Python) plays the parts the real drivers play: events,
a line the client library printed itself, an error line, a silent exit, a hang.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.interop.harness import Driver, drivers, wait_across
from tests.interop.provision import Client

pytestmark = [pytest.mark.system, pytest.mark.interop]

STAND_IN = """
import json, os, queue, signal, sys
def emit(event, **f):
    print(json.dumps({"event": event, **f}), flush=True)
part = sys.argv[1]
stop = queue.SimpleQueue()  # not an Event: its set() in a handler can deadlock its wait()
signal.signal(signal.SIGTERM, lambda *_: stop.put(None))
emit("started", home=os.environ["HOME"], extra=os.environ.get("EXTRA"))
if part == "serve":
    print("a line of the client library", flush=True)
    emit("message", n=1)
    stop.get()
    emit("stopped")
elif part == "error":
    emit("error", message="the send failed")
    sys.exit(2)
elif part == "exit":
    sys.exit(5)
elif part == "done":
    emit("done")
elif part == "hang":
    stop.get()
"""


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., Driver]]:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    client = Client("stand-in", True, "", sys.executable, str(script), (("EXTRA", "yes"),))
    with drivers(client, tmp_path / "drivers") as start:
        yield start


def test_events_and_foreign_lines_are_read_as_they_come(
    run: Callable[..., Driver], tmp_path: Path
) -> None:
    d = run("one", "serve")
    started = d.wait_event("started", 60)
    assert started["home"] == str(tmp_path / "drivers" / "one.home")  # the C++ client's logs
    assert started["extra"] == "yes"  # the client's environment (NODE_PATH for ali-ons)
    d.wait_event("message", 60)
    assert d.of("raw") == [{"event": "raw", "line": "a line of the client library"}]
    assert d.terminate() == 0
    assert d.of("stopped")


def test_a_wait_ends_at_once_when_the_driver_reports_an_error(run: Callable[..., Driver]) -> None:
    d = run("failing", "error")
    with pytest.raises(AssertionError, match="failing ended while waiting for message") as e:
        d.wait_event("message", 600)
    assert "the send failed" in str(e.value)


def test_a_wait_ends_at_once_when_the_driver_exits(run: Callable[..., Driver]) -> None:
    d = run("quitter", "exit")
    with pytest.raises(AssertionError, match=r"quitter ended .* \(exited with 5\)"):
        d.wait_event("message", 600)


def test_a_wait_times_out_with_the_drivers_state(run: Callable[..., Driver]) -> None:
    d = run("hanging", "hang")
    d.wait_event("started", 60)
    with pytest.raises(AssertionError, match=r"timed out after 0\.3 s waiting for message"):
        d.wait_event("message", 0.3)
    d.kill9()
    assert d.proc.returncode == -9


def test_a_wait_across_drivers_fails_when_one_of_them_ends(run: Callable[..., Driver]) -> None:
    alive, failing = run("alive", "hang"), run("failing", "error")
    alive.wait_event("started", 60)
    with pytest.raises(AssertionError, match="failing ended while waiting for everything"):
        wait_across([alive, failing], lambda: False, 600, "everything")
    with pytest.raises(AssertionError, match=r"timed out after 0\.3 s waiting for nothing"):
        wait_across([alive], lambda: False, 0.3, "nothing")


def test_a_wait_across_drivers_lets_a_finishing_one_end_well_but_not_fail(
    run: Callable[..., Driver],
) -> None:
    done, failing = run("producer", "done"), run("failing", "error")
    assert done.finish(60) == 0
    with pytest.raises(AssertionError, match=r"timed out after 0\.3 s waiting for half"):
        wait_across([], lambda: False, 0.3, "half", finishing=[done])
    with pytest.raises(AssertionError, match="failing failed while waiting for half"):
        wait_across([], lambda: False, 600, "half", finishing=[done, failing])
    with pytest.raises(AssertionError, match="producer ended while waiting for half"):
        wait_across([done], lambda: False, 600, "half")
