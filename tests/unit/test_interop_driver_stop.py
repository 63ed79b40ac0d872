"""Driver.terminate's one exception: the C++ client aborting in its own shutdown.

rocketmq-client-cpp 1.2 now and then dies in `shutdown()` on an uncaught
boost::thread_interrupted (std::terminate, SIGABRT) after the driver printed "stopping":
a crash of the client, which the tests skip on rather than blame the broker. Any other
exit, an abort without that signature included, is returned as it was.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tests.interop.harness import Driver

DRIVER = r"""
import json, os, signal, sys, time
ABORT_TEXT = sys.argv[1]
def on_term(*_):
    print(json.dumps({"event": "stopping"}), flush=True)
    sys.stderr.write(ABORT_TEXT + "\n")
    sys.stderr.flush()
    os.abort()
signal.signal(signal.SIGTERM, on_term)
print(json.dumps({"event": "started"}), flush=True)  # only now: SIGTERM is handled
while True:
    time.sleep(0.05)
"""


class ScriptClient:
    """A stand-in for tests/interop/provision.Client that runs DRIVER with one argument."""

    def __init__(self, abort_text: str) -> None:
        self.abort_text = abort_text

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        return env

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-c", DRIVER, self.abort_text]


def started(tmp_path: Path, abort_text: str) -> Driver:
    driver = Driver("c1", ScriptClient(abort_text), [], tmp_path)  # type: ignore[arg-type]
    driver.wait_event("started")
    return driver


def test_the_cpp_clients_known_shutdown_abort_skips_the_test(tmp_path: Path) -> None:
    driver = started(
        tmp_path, "terminate called after throwing an instance of 'boost::thread_interrupted'"
    )
    with pytest.raises(pytest.skip.Exception, match="aborted in its shutdown"):
        driver.terminate()


def test_any_other_abort_is_the_exit_code_as_it_was(tmp_path: Path) -> None:
    driver = started(tmp_path, "Segmentation fault in something else")
    assert driver.terminate() == -signal.SIGABRT
