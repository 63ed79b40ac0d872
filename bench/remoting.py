"""The remoting group of `make bench`: RocketMQ's C++ client against mockbroker's remoting front.

The client is rocketmq-client-cpp 1.2.3 (PyPI `rocketmq` 0.4.4), installed by
tests/interop/provision.py into ~/.cache/ordermq/interop and run by tests/interop/cpp_driver.py in a
process of its own; the figures are what that driver measures itself, from its first send
(or pull) to its last, so process start-up and route lookups are not in them. They sit
next to the gRPC figures of the same shape ("send: await send(), 1 at a time", "pull, 1
queue at a time"): one client, one message (or one pull) in flight.

The group is skipped, with the reason in the results' facts, when this mockbroker has no
remoting front (no --remoting-port) or the client cannot be installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from procs import ROOT, ServerProcess

# The client's provisioning and the broker checks are shared with the interop tests.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.interop.harness import remoting_support as remoting_support  # used by run.py
from tests.interop.provision import Client, provision
from tests.support import BrokerProcess

#: Messages per pull (the C++ client's default pullBatchSize, and the Java broker's cap for
#: messages served from memory).
PULL_MAX_NUM = 32
#: The topic every remoting figure uses (on a fresh broker each).
TOPIC = "bench-remoting"
#: How long a driver run may take before the bench gives up on it.
DRIVER_TIMEOUT = 900.0


def unavailable() -> str:
    """Why the remoting figures cannot be taken here ("" when they can)."""
    if reason := remoting_support():
        return reason
    client = provision("cpp")
    return "" if client.available else f"the C++ client is unavailable: {client.reason}"


def cpp_client() -> Client:
    """The provisioned C++ client (call unavailable() first)."""
    return provision("cpp")


#: Broker options turning the name server and remoting on, on ports the broker picks.
BROKER_OPTIONS = ("--remoting-port", "0", "--namesrv-port", "0")


def namesrv_of(broker: ServerProcess) -> str:
    """The address of the name server a broker started with BROKER_OPTIONS announced."""
    assert broker.lines is not None, "not started"
    line = broker.lines.find(BrokerProcess.FRONTS["--namesrv-port"][1], 30.0)
    if not line:
        raise RuntimeError(f"the broker announced no name server: {broker.stderr()[-2000:]}")
    return line.split()[-1]


def endpoint(namesrv: str) -> str:
    """The SDK endpoint reaching the broker over RocketMQ remoting through `namesrv`."""
    return f"rocketmq://{namesrv}"


async def drive(client: Client, home: Path, namesrv: str, args: list[str]) -> dict[str, Any]:
    """Run the driver (`args`, then --namesrv) to its end; its "done" event.

    The event has the driver's own seconds, rate, cpu_seconds and counts.
    """
    home.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        *client.command(*args, "--namesrv", namesrv, "--deadline", str(DRIVER_TIMEOUT)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=client.environment({**os.environ, "HOME": str(home)}),
    )
    out, err = await proc.communicate()
    events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    done = [e for e in events if e.get("event") == "done"]
    if proc.returncode != 0 or not done:
        errors = [e for e in events if e.get("event") == "error"]
        raise RuntimeError(
            f"cpp_driver {args[0]} exited with {proc.returncode}: {errors or events[-3:]} "
            f"{err.decode(errors='replace')[-500:]}"
        )
    return done[0]


def produce_args(topic: str, mode: str, keys: int, rounds: int, body: int) -> list[str]:
    """Driver arguments: `rounds` messages for each of `keys` keys, one send at a time.

    A failed send is sent again (--resend; the driver's "done" event counts them): on a
    loaded machine the C++ client's first route request once timed out in `make test`
    ("No route info of this topic") and failed the whole run.
    """
    return ["produce", "--topic", topic, "--group", "bench-producer", "--mode", mode,
            "--keys", str(keys), "--rounds", str(rounds), "--body-bytes", str(body),
            "--report", "summary", "--resend"]  # fmt: skip


def pull_args(topic: str) -> list[str]:
    """Driver arguments: every queue of `topic` read from offset 0 to its end."""
    return ["pull", "--topic", topic, "--group", "bench-remoting-readers",
            "--max-num", str(PULL_MAX_NUM), "--report", "summary"]  # fmt: skip
