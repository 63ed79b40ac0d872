"""What the interop tests run: driver processes read line by line, and the brokers.

`Driver` runs a driver program (cpp_driver.py, ons_driver.js, rmq5_driver.*) as a child
process and reads its JSON lines on a thread as they come, so a test waits on lines
(`wait_for`), never on time; a driver that exits while a test waits on it fails the wait
at once, with its output. `RemotingBroker` is `python -m mockbroker` with its RocketMQ
name server and remoting ports, ready once its gRPC ready line came and both ports accept
connections; `V2Broker` the same with its RocketMQ 5 (apache.rocketmq.v2) port.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
from google.protobuf.duration_pb2 import Duration

from sdk import Credentials, MessageQueue, TLSConfig
from sdk._transport.broker_client import BrokerClient, PullStatus
from sdk.message import MessageExt
from tests.interop.provision import Client
from tests.support import ROOT, BrokerProcess

Event = dict[str, Any]
T = TypeVar("T")
#: A driver that is up: its client started (and, for consumers, found the topic's route).
START_TIMEOUT = 60.0
#: A consumer's shutdown: persist offsets, unlock its queues, unregister.
STOP_TIMEOUT = 60.0


class Driver:
    """A driver child process and the JSON events it printed so far."""

    def __init__(self, name: str, client: Client, args: list[str], workdir: Path) -> None:
        self.name = name
        self.events: list[Event] = []
        self._changed = threading.Condition()
        workdir.mkdir(parents=True, exist_ok=True)
        self._stderr_path = workdir / f"{name}.stderr"
        # The C++ client writes its log under $HOME/logs/rocketmq-cpp: one home per driver.
        home = workdir / f"{name}.home"
        home.mkdir(exist_ok=True)
        #: The driver's HOME, where the client library writes its log.
        self.home = home
        env = client.environment({**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"})
        with self._stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                client.command(*args), cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1,
            )  # fmt: skip
        self._reader = threading.Thread(target=self._read, name=f"{name}-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if not isinstance(event, dict):  # something the client library printed itself
                event = {"event": "raw", "line": line.rstrip("\n")}
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ reading
    def of(self, kind: str) -> list[Event]:
        """The events of one kind ("message", "sent", ...) printed so far."""
        with self._changed:
            return [e for e in self.events if e.get("event") == kind]

    def stderr(self) -> str:
        """What the driver (and the client library) wrote to stderr."""
        return self._stderr_path.read_text(errors="replace")

    def describe(self, last: int = 5) -> str:
        """Exit status, last events and stderr tail, for failure messages."""
        code = self.proc.poll()
        state = "running" if code is None else f"exited with {code}"
        with self._changed:
            tail = self.events[-last:]
        return (
            f"{self.name} ({state}); last events: {json.dumps(tail)}; "
            f"stderr: {self.stderr()[-1500:]!r}"
        )

    def wait_for(self, condition: Callable[[list[Event]], bool], timeout: float, what: str) -> None:
        """Wait until `condition(events)` holds; fail if the driver exits first or time's up.

        An "error" event fails the wait at once (the driver exits right after it).
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if condition(self.events):
                    return
                errors = [e for e in self.events if e.get("event") == "error"]
                if errors or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{self.name} ended while waiting for {what}: "
                                         f"{self.describe()}")  # fmt: skip
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"timed out after {timeout:g} s waiting for {what}: {self.describe()}"
                    )
                self._changed.wait(min(left, 0.5))  # also notices an exit without output

    def check(self, what: str) -> None:
        """Fail if the driver reported an error or exited (it should be running)."""
        if self.of("error") or self.proc.poll() is not None:
            raise AssertionError(f"{self.name} ended while waiting for {what}: {self.describe()}")

    def wait_event(self, kind: str, timeout: float = START_TIMEOUT) -> Event:
        """Wait for the first event of `kind` and return it."""
        self.wait_for(lambda evs: any(e.get("event") == kind for e in evs), timeout, kind)
        return self.of(kind)[0]

    # ------------------------------------------------------------------ ending
    def finish(self, timeout: float = STOP_TIMEOUT) -> int:
        """Wait for a driver that ends by itself (produce, pull); its exit code."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self._reader.join(10)
            raise AssertionError(
                f"{self.name} did not end within {timeout:g} s (killed): {self.describe()}"
            ) from None
        self._reader.join(10)
        return code

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, then wait for the exit; its exit code.

        Skips the test when the C++ client aborted in its own shutdown (a known crash of
        rocketmq-client-cpp 1.2, not the broker's doing: see `crashed_in_cpp_shutdown`).
        """
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.finish(timeout)
        if self.crashed_in_cpp_shutdown(code):
            pytest.skip(
                f"{self.name}: rocketmq-client-cpp aborted in its shutdown (uncaught "
                "boost::thread_interrupted, apache/rocketmq-client-cpp#204): the rest of "
                "this run cannot be checked"
            )
        return code

    def crashed_in_cpp_shutdown(self, code: int) -> bool:
        """The C++ client's shutdown, once the driver began it, died on an interrupted
        thread: its threads are interrupted and one ended outside the client's handlers
        (std::terminate, SIGABRT). Seen once in ~200 runs of the suite."""
        return (
            code == -signal.SIGABRT
            and bool(self.of("stopping"))
            and "boost::thread_interrupted" in self.stderr()
        )

    def kill9(self) -> None:
        """SIGKILL and reap (lines it printed before are still read)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.finish(10)

    def close(self) -> None:
        """Whatever still runs is killed: for the end of a test."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def drivers(client: Client, workdir: Path) -> Iterator[Callable[..., Driver]]:
    """`start(name, *args)` starts a driver of `client`; all of them are killed at the end."""
    started: list[Driver] = []

    def start(name: str, *args: str) -> Driver:
        driver = Driver(name, client, list(args), workdir)
        started.append(driver)
        return driver

    try:
        yield start
    finally:
        for driver in started:
            driver.close()


def wait_across(
    running: list[Driver],
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    *,
    finishing: Sequence[Driver] = (),
) -> None:
    """Wait until `condition()` holds, failing fast if one of `running` ends meanwhile.

    `finishing`: drivers that end by themselves (a producer that sent everything): the
    wait fails fast only if one reports an error or exits with a status other than 0.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        for driver in running:
            driver.check(what)
        for driver in finishing:
            if driver.of("error") or driver.proc.poll() not in (None, 0):
                raise AssertionError(
                    f"{driver.name} failed while waiting for {what}: {driver.describe()}"
                )
        if time.monotonic() > deadline:
            states = "\n".join(d.describe() for d in running)
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}:\n{states}")
        time.sleep(0.05)  # polling a condition with a deadline


# ---------------------------------------------------------------------------- the broker
@functools.cache
def remoting_support() -> str:
    """Empty when `python -m mockbroker` has --remoting-port and --namesrv-port, else why not."""
    proc = subprocess.run(
        [sys.executable, "-m", "mockbroker", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    missing = [f for f in ("--remoting-port", "--namesrv-port") if f not in proc.stdout]
    if proc.returncode != 0 or missing:
        return (
            f"this mockbroker has no {' and '.join(missing) or 'usable --help'}: its RocketMQ "
            "remoting front (issue 23) is not part of this build"
        )
    return ""


@contextlib.contextmanager
def brokers(workdir: Path) -> Iterator[Callable[..., RemotingBroker]]:
    """`start(*args)` starts a RemotingBroker; all are stopped at the end.

    Skips the calling test when this mockbroker has no remoting front.
    """
    import pytest

    if reason := remoting_support():
        pytest.skip(reason)
    started: list[RemotingBroker] = []

    def start(*args: str) -> RemotingBroker:
        broker = RemotingBroker(workdir / f"broker{len(started)}", *args)
        started.append(broker)
        return broker.start()

    try:
        yield start
    finally:
        for broker in started:
            broker.stop()


def accepts(port: int) -> bool:
    """True if something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


class RemotingBroker:
    """`python -m mockbroker` serving gRPC, the RocketMQ name server and remoting.

    The name server and remoting ports are picked by the broker at its first start, and
    kept at later ones (after a kill).
    """

    def __init__(self, data_dir: Path, *extra_args: str) -> None:
        self.process = BrokerProcess(
            data_dir, "--remoting-port", "0", "--namesrv-port", "0", *extra_args
        )

    @property
    def namesrv(self) -> str:
        """The name server address the RocketMQ clients are given (IPv4, as C++ needs)."""
        return self.process.fronts["namesrv"]

    @property
    def remoting_port(self) -> int:
        """The broker's RocketMQ remoting port."""
        return port_of(self.process.fronts["remoting"])

    @property
    def address(self) -> str:
        """The gRPC address, for the ordermq SDK."""
        return self.process.address

    def start(self, timeout: float = 30.0) -> RemotingBroker:
        """Start it; every port accepts connections once the broker has announced it."""
        self.process.start(timeout)
        return self

    def stop(self) -> None:
        """SIGTERM it (kill -9 if it does not go) and reap it."""
        stop_broker(self.process)


def port_of(address: str) -> int:
    """The port of a "host:port" address."""
    return int(address.rsplit(":", 1)[1])


def stop_broker(process: BrokerProcess) -> None:
    """SIGTERM a broker process (kill -9 if it does not go) and reap it."""
    proc = process.proc
    if proc is None or proc.poll() is not None:
        return
    try:
        process.terminate(30)
    except subprocess.TimeoutExpired:
        process.kill9()


class V2Broker:
    """`python -m mockbroker` serving ordermq's gRPC and RocketMQ 5's (apache.rocketmq.v2)."""

    def __init__(self, data_dir: Path, *extra_args: str) -> None:
        self.process = BrokerProcess(data_dir, "--v2-port", "0", *extra_args)

    @property
    def endpoints(self) -> str:
        """The address RocketMQ 5 clients are given."""
        return self.process.fronts["v2"]

    @property
    def address(self) -> str:
        """The gRPC address, for the ordermq SDK."""
        return self.process.address

    def start(self, timeout: float = 30.0) -> V2Broker:
        """Start it; its RocketMQ 5 port accepts connections once the broker has announced it."""
        self.process.start(timeout)
        return self

    def stop(self) -> None:
        """SIGTERM it (kill -9 if it does not go) and reap it."""
        stop_broker(self.process)


@contextlib.contextmanager
def v2_brokers(workdir: Path) -> Iterator[Callable[..., V2Broker]]:
    """`start(*args)` starts a V2Broker; all are stopped at the end."""
    started: list[V2Broker] = []

    def start(*args: str) -> V2Broker:
        broker = V2Broker(workdir / f"broker{len(started)}", *args)
        started.append(broker)
        return broker.start()

    try:
        yield start
    finally:
        for broker in started:
            broker.stop()


def _channel(endpoints: str, ca: Path | None) -> Any:
    """A gRPC channel to `endpoints`: plain text, or TLS trusting the CA file `ca`."""
    import grpc

    if ca is None:
        return grpc.insecure_channel(endpoints)
    return grpc.secure_channel(endpoints, grpc.ssl_channel_credentials(ca.read_bytes()))


def receive_unavailable(endpoints: str, ca: Path | None = None) -> str:
    """Why RocketMQ 5 consumers cannot receive from the broker at `endpoints` ("" if they can).

    Asks for a receive the way a client does (on this process's own copy of the protos):
    a broker without its pop core answers NOT_IMPLEMENTED, with the reason. `ca`: the
    broker serves TLS with a certificate this CA signed.
    """
    from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
    from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
    from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2_grpc as svc_grpc

    request = svc.ReceiveMessageRequest(
        group=v2.Resource(name="probe-group"),
        message_queue=v2.MessageQueue(topic=v2.Resource(name="probe-topic"), id=-1),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=1,
        invisible_duration=Duration(seconds=30),
        long_polling_timeout=Duration(seconds=0),
    )
    with _channel(endpoints, ca) as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        answer = list(stub.ReceiveMessage(request, metadata=(("x-mq-client-id", "probe"),),
                                          timeout=60))  # fmt: skip
    statuses = [r.status for r in answer if r.HasField("status")]
    if statuses and statuses[0].code == v2.NOT_IMPLEMENTED:
        return f"the broker answers ReceiveMessage NOT_IMPLEMENTED: {statuses[0].message}"
    return ""


def group_is_fifo(endpoints: str, group: str) -> bool:
    """What the broker tells a consumer of `group` in its settings: FIFO or not."""
    import grpc

    from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
    from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
    from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2_grpc as svc_grpc

    settings = svc.TelemetryCommand(
        settings=v2.Settings(
            client_type=v2.PUSH_CONSUMER,
            subscription=v2.Subscription(group=v2.Resource(name=group)),
        )
    )
    with grpc.insecure_channel(endpoints) as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        answers = stub.Telemetry(iter([settings]), metadata=(("x-mq-client-id", "probe"),),
                                 timeout=60)  # fmt: skip
        first = next(answers)
        answers.cancel()
    return bool(first.settings.subscription.fifo)


# ---------------------------------------------------------------------------- over gRPC
class GrpcView:
    """The same broker seen through ordermq's gRPC (one truth: topics, offsets, groups).

    `tls`: how to connect to a broker that serves TLS; `credentials`: to one with an ACL.
    """

    def __init__(
        self, address: str, tls: TLSConfig | None = None, credentials: Credentials | None = None
    ) -> None:
        self.address = address
        self.tls = tls
        self.credentials = credentials

    def _call(self, work: Callable[[BrokerClient], Awaitable[T]]) -> T:
        async def run() -> T:
            client = BrokerClient(self.address, self.tls, self.credentials)
            try:
                return await work(client)
            finally:
                await client.close()

        return asyncio.run(run())

    def create_topic(self, topic: str, queues: int) -> None:
        """Create `topic` with `queues` queues (before any client uses it)."""
        self._call(lambda c: c.create_topic(topic, queues))

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's queues, by queue id."""
        routes = self._call(lambda c: c.query_route(topic))
        return sorted((r.queue for r in routes), key=lambda q: q.queue_id)

    def max_offsets(self, topic: str) -> dict[int, int]:
        """Queue id -> the offset the next message will get."""

        async def work(c: BrokerClient) -> dict[int, int]:
            routes = await c.query_route(topic)
            return {r.queue.queue_id: (await c.queue_offsets(r.queue))[1] for r in routes}

        return self._call(work)

    def committed(self, group: str, topic: str) -> dict[int, int | None]:
        """Queue id -> the group's committed offset (None: never committed)."""

        async def work(c: BrokerClient) -> dict[int, int | None]:
            routes = await c.query_route(topic)
            return {r.queue.queue_id: await c.query_offset(group, r.queue) for r in routes}

        return self._call(work)

    def members(self, group: str) -> list[str]:
        """The client ids of the group's members."""
        return self._call(lambda c: c.consumer_list(group))[0]

    def messages(self, topic: str) -> list[MessageExt]:
        """Every message of the topic now, queue by queue, each queue in order."""

        async def work(c: BrokerClient) -> list[MessageExt]:
            out: list[MessageExt] = []
            for route in sorted(await c.query_route(topic), key=lambda r: r.queue.queue_id):
                offset = 0
                while True:
                    got = await c.pull("interop-readers", route.queue, offset, max_messages=500)
                    if got.status is not PullStatus.FOUND:
                        break
                    out += got.messages
                    offset = got.next_offset
            return out

        return self._call(work)
