"""Drive Apache rocketmq-client-cpp 1.2.3 (PyPI `rocketmq` 0.4.4) against a name server.

Runs inside the interop virtualenv (tests/interop/provision.py), never in the project's:
it imports nothing of ordermq. Every line it prints on stdout is one JSON object with an
"event" field, so that a test can wait on lines; errors end it with exit code 2 (a client
call failed) or 3 (the --deadline passed), after an {"event": "error"} line.

    cpp_driver.py selfcheck
    cpp_driver.py produce --namesrv 127.0.0.1:9876 --topic T --group G --keys 100 --rounds 100
    cpp_driver.py produce --namesrv "127.0.0.1:9876;127.0.0.1:9877" ... --resend
    cpp_driver.py push    --namesrv 127.0.0.1:9876 --topic T --group G [--orderly]
    cpp_driver.py pull    --namesrv 127.0.0.1:9876 --topic T --group G
    cpp_driver.py transaction --namesrv 127.0.0.1:9876 --topic T --group G

Message bodies are "<key>:<seq>" (optionally padded: "<key>:<seq> xxxx..."); the consumers
parse them back into "key" and "seq" (null for other bodies, whose text is in "body").

Events:
- selfcheck: {"rocketmq", "python", "started": true} once a producer started and stopped;
- every command: "started" once its client started (consumers: after the route check);
- produce: "sent" per message {key, seq, status, msg_id, offset, at} (--report each; at:
  time.monotonic_ns() of the acknowledgement), with --resend "send_failed" {key, seq,
  message} per failed attempt (sent again), then "done" {sent, seconds, rate, cpu_seconds,
  failures};
- push: "message" per listener call {key, seq, topic, queue, offset, msg_id, reconsume,
  tags, keys, body, size, properties (those named by --property-names), start, end}
  (start/end: time.monotonic_ns(), one clock for every
  process of the machine), then on SIGTERM/SIGINT "stopping" and "stopped"
  {shutdown_seconds}, exit 0;
- pull: "queues" {queues}, "message" per message (--report each), "queue_done" per queue
  {queue, next_offset, min_offset, max_offset, messages}, then "done" {messages, seconds,
  rate, cpu_seconds}.
- transaction: "unsupported" {reason} when the binding has no transaction producer (exit
  0); else "sent" per message {body, status, msg_id} (bodies "commit", "rollback",
  "unknown": the local transaction answers so, and the check-back of "unknown" commits),
  "checked" per check-back {body}, then "done" once "unknown" was checked back.

The C++ client's quirks this copes with: it logs to $HOME/logs/rocketmq-cpp/ (set HOME;
SetProducerLogPath has no effect once a client exists). With no name server listening it
starts anyway and fails later (a send: "No route info"; a consumer: silently idle), and
on a loaded machine its first route request can fail at once although the name server
is up; so a producer's first send is tried again for up to --route-timeout while it fails
for want of a route, and the consumers first wait up to --route-timeout for the topic's
route, asked through a PullConsumer of group "<group>_ROUTE_PROBE" (client id
<pid>-<ip>@DEFAULT; a push consumer's instance name is PUSH unless --instance says
otherwise, so the ids differ).
With a name server that accepts connections and never answers, a send takes 60 s to fail,
a push consumer's start 10 s and a route request 5 s: --deadline bounds them all.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import queue
import signal
import sys
import threading
import time
import zlib
from typing import Any

_out = threading.Lock()
#: What the driver is doing, for the --deadline error.
_phase = ["starting"]


def emit(event: str, **fields: Any) -> None:
    """Print one JSON line (whole lines only, from any thread) and flush it."""
    line = json.dumps({"event": event, **fields}, separators=(",", ":"))
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def fail(message: str, code: int = 2, **fields: Any) -> None:
    """Print an error line and end the process at once (no client shutdown)."""
    emit("error", message=message, phase=_phase[0], **fields)
    os._exit(code)


def phase(text: str) -> None:
    _phase[0] = text


def start_deadline(seconds: float) -> None:
    """End the process with an error line if it is still running after `seconds`."""
    if seconds <= 0:
        return

    def expire() -> None:
        fail(f"gave up after the --deadline of {seconds:g} s", code=3)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def body_of(key: str, seq: int, size: int) -> str:
    text = f"{key}:{seq}"
    return text if len(text) >= size else f"{text} " + "x" * (size - len(text) - 1)


def _text(value: Any) -> str | None:
    """A property as the wrapper returns it (bytes, str or None), as text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if value is None else str(value)


def parse_body(body: bytes) -> tuple[str | None, int | None]:
    head = body.split(b" ", 1)[0].decode("utf-8", "replace")
    key, _, seq = head.rpartition(":")
    if key and seq.isdigit():
        return key, int(seq)
    return None, None


def keys_of(a: argparse.Namespace) -> list[tuple[str, int]]:
    """(key, sharding argument) pairs: the C++ selector picks queue `arg % queue count`.

    --key-queues FILE (a JSON object key -> queue index) fixes each key's queue, so that a
    test can place keys as ordermq's shard_index does; otherwise keys are k000, k001, ...
    and the argument is the key's CRC-32.
    """
    if a.key_queues:
        with open(a.key_queues) as f:
            placed = json.load(f)
        return [(str(k), int(v)) for k, v in placed.items()]
    width = len(str(max(a.keys - 1, 0)))
    keys = [f"k{i:0{max(width, 3)}d}" for i in range(a.keys)]
    return [(k, zlib.crc32(k.encode()) & 0x7FFFFFFF) for k in keys]


def quiet_logs(set_level: Any, set_size: Any, handle: Any, level: str) -> None:
    """The C++ client's own log: the level asked for, at most 3 files of 20 MB."""
    from rocketmq.ffi import _CLogLevel

    set_level(handle, _CLogLevel[level])
    set_size(handle, 3, 20 * 1024 * 1024)


#: How often wait_for_stop looks for the stop signal.
STOP_POLL_SECONDS = 0.1


def stop_signal() -> queue.SimpleQueue[int]:
    """A queue SIGTERM and SIGINT put their number in (`wait_for_stop` waits for one).

    Not a threading.Event: a handler's set() that lands while the main thread is inside
    the Event's wait() (holding its lock) blocks for good. SimpleQueue.put is safe there.
    """
    stop: queue.SimpleQueue[int] = queue.SimpleQueue()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.put(signum))
    return stop


def wait_for_stop(stop: queue.SimpleQueue[int]) -> int:
    """The first signal `stop_signal`'s queue got, waiting for it in short steps.

    The kernel hands a process's signal to any of its threads, the client's too; one
    that lands on another thread does not wake the main thread from a blocking get(),
    and Python runs the handler only when the main thread next runs Python code. A
    plain get() then waited for good (a SIGTERM'd driver did not stop in 60 s).
    """
    while True:
        try:
            return stop.get(timeout=STOP_POLL_SECONDS)
        except queue.Empty:
            continue


# ---------------------------------------------------------------------------- commands
def selfcheck(a: argparse.Namespace) -> None:
    """Import the wrapper (loads librocketmq.so), start and stop a producer."""
    from importlib.metadata import version

    from rocketmq.client import Producer

    producer = Producer("ORDERMQ_SELFCHECK")
    producer.set_namesrv_addr("127.0.0.1:1")
    producer.start()
    producer.shutdown()
    emit("selfcheck", rocketmq=version("rocketmq"), python=sys.version.split()[0], started=True)


#: How the C++ client words a send it found no route for (its name server unreachable).
NO_ROUTE = "No route info"


def produce(a: argparse.Namespace) -> None:
    from rocketmq.client import Message, Producer, SendStatus
    from rocketmq.ffi import dll

    keys = keys_of(a)
    producer = Producer(a.group, timeout=a.send_timeout_ms)
    quiet_logs(dll.SetProducerLogLevel, dll.SetProducerLogFileNumAndSize, producer._handle,
               a.log_level)  # fmt: skip
    producer.set_namesrv_addr(a.namesrv)
    sign_with(producer, a)
    producer.start()
    emit("started", pid=os.getpid(), keys=len(keys), rounds=a.rounds, mode=a.mode)
    route_until = time.monotonic() + a.route_timeout
    waited = False
    sent = 0
    began, cpu = time.perf_counter(), time.process_time()
    failures = 0
    for n, seq in enumerate(range(a.first_seq, a.first_seq + a.rounds)):
        time.sleep(max(0.0, began + n * a.round_interval - time.perf_counter()))
        for key, arg in keys:
            phase(f"sending {key}:{seq}")
            msg = Message(a.topic)
            msg.set_keys(key)
            if a.tags:
                msg.set_tags(a.tags)
            msg.set_body(body_of(key, seq, a.body_bytes))
            for name, _, value in (p.partition("=") for p in a.property):
                msg.set_property(name, value)
            while True:
                try:
                    if a.mode == "orderly":
                        # With --resend the driver sends again itself, to the queue the
                        # selector picks: the client's own retries may pick another.
                        retries = 0 if a.resend else 3
                        result = producer.send_orderly(msg, arg, retry_times=retries)
                    else:
                        result = producer.send_sync(msg)
                except Exception as exc:  # the wrapper raises its own exception classes
                    why = f"send of {key}:{seq} failed: {type(exc).__name__}: {exc}"
                    if not sent and NO_ROUTE in str(exc) and time.monotonic() < route_until:
                        # The client's first route request can fail at once on a loaded
                        # machine although the name server is up (seen under make test):
                        # as the consumers wait for a route, the first send waits for one.
                        if not waited:
                            emit("route_wait", key=key, seq=seq, message=why[:300])
                            waited = True
                        time.sleep(0.2)
                        continue
                else:
                    if result.status == SendStatus.OK:
                        break
                    why = f"send of {key}:{seq} answered {result.status.name}"
                if not a.resend:
                    fail(why, key=key, seq=seq)
                failures += 1
                emit("send_failed", key=key, seq=seq, message=why[:300])
                time.sleep(a.resend_backoff)  # while the broker is down
            at = time.monotonic_ns()
            sent += 1
            if a.report == "each":
                emit("sent", key=key, seq=seq, status=result.status.name,
                     msg_id=result.msg_id, offset=result.offset, at=at)  # fmt: skip
    seconds = time.perf_counter() - began
    emit("done", sent=sent, seconds=round(seconds, 4), rate=round(sent / max(seconds, 1e-9), 1),
         cpu_seconds=round(time.process_time() - cpu, 4), failures=failures)  # fmt: skip
    phase("shutting down")
    producer.shutdown()
    producer._handle = None  # shut down once: __del__ would shut it down again


def sign_with(client: Any, a: argparse.Namespace) -> None:
    """Give the client the ACL account of --access-key/--secret-key, if any."""
    if a.access_key:
        client.set_session_credentials(a.access_key, a.secret_key, a.channel)


def fetch_queues(handle: Any, topic: str) -> list[Any]:
    """The topic's queues as the client sees them (copies; empty while it has no route)."""
    from rocketmq.ffi import _CMessageQueue, dll

    found = ctypes.POINTER(_CMessageQueue)()
    count = ctypes.c_int()
    status = dll.FetchSubscriptionMessageQueues(
        handle, topic.encode(), ctypes.pointer(found), ctypes.pointer(count)
    )
    if status != 0 or count.value <= 0:
        return []
    queues = [_CMessageQueue.from_buffer_copy(found[i]) for i in range(count.value)]
    dll.ReleaseSubscriptionMessageQueue(found)
    return sorted(queues, key=lambda q: (q.brokerName, q.queueId))


def wait_for_queues(handle: Any, a: argparse.Namespace) -> list[Any]:
    """Ask for the topic's route until it has queues, for up to --route-timeout seconds.

    The client answers "no queues" at once when nothing listens at the name server
    address, and after its own 5 s time-out when something listens and does not answer.
    """
    phase(f"waiting for the route of {a.topic} from {a.namesrv}")
    deadline = time.monotonic() + a.route_timeout
    while True:
        queues = fetch_queues(handle, a.topic)
        if queues:
            return queues
        if time.monotonic() >= deadline:
            fail(
                f"no route for topic {a.topic} from the name server at {a.namesrv} within "
                f"{a.route_timeout:g} s (nothing answers there, or the topic does not exist); "
                f"the client's log is under {os.environ.get('HOME', '~')}/logs/rocketmq-cpp"
            )
        time.sleep(0.2)  # between route requests: the client has no wait of its own


def probe_route(a: argparse.Namespace) -> list[Any]:
    """The topic's queues through a short-lived PullConsumer (the push API cannot tell)."""
    from rocketmq.client import PullConsumer
    from rocketmq.ffi import dll

    probe = PullConsumer(f"{a.group}_ROUTE_PROBE")
    quiet_logs(dll.SetPullConsumerLogLevel, dll.SetPullConsumerLogFileNumAndSize, probe._handle,
               a.log_level)  # fmt: skip
    probe.set_namesrv_addr(a.namesrv)
    probe.start()
    try:
        return wait_for_queues(probe._handle, a)
    finally:
        probe.shutdown()
        probe._handle = None


def push(a: argparse.Namespace) -> None:
    from rocketmq.client import PushConsumer
    from rocketmq.ffi import dll

    if a.route_timeout > 0:
        probe_route(a)
    stop = stop_signal()
    consumer = PushConsumer(a.group, orderly=a.orderly)
    quiet_logs(dll.SetPushConsumerLogLevel, dll.SetPushConsumerLogFileNumAndSize,
               consumer._handle, a.log_level)  # fmt: skip
    consumer.set_namesrv_addr(a.namesrv)
    sign_with(consumer, a)
    # Not the probe's client id (<pid>-<ip>@DEFAULT: a PullConsumer's instance name cannot
    # be set): a broker that sees the probe's connection close late must not take it for
    # this consumer's.
    consumer.set_instance_name(a.instance or "PUSH")
    if a.threads:
        consumer.set_thread_count(a.threads)

    def on_message(msg: Any) -> None:
        start = time.monotonic_ns()
        body = msg.body or b""
        key, seq = parse_body(body)
        emit(
            "message", key=key, seq=seq, topic=msg.topic, queue=msg.queue_id,
            offset=msg.queue_offset, msg_id=msg.id, reconsume=msg.reconsume_times,
            tags=(msg.tags or b"").decode("utf-8", "replace"),
            keys=(msg.keys or b"").decode("utf-8", "replace"),
            body=body[: a.body_chars].decode("utf-8", "replace"), size=len(body),
            properties={n: _text(msg.get_property(n)) for n in a.property_names if n},
            start=start, end=time.monotonic_ns(),
        )  # fmt: skip

    consumer.subscribe(a.topic, on_message, a.expression)
    phase("starting the push consumer")
    consumer.start()
    emit("started", pid=os.getpid(), orderly=a.orderly, group=a.group, topic=a.topic)
    phase("consuming")
    wait_for_stop(stop)
    emit("stopping")
    phase("shutting down (offsets persisted, queues unlocked, client unregistered)")
    began = time.monotonic()
    consumer.shutdown()
    consumer._handle = None
    emit("stopped", shutdown_seconds=round(time.monotonic() - began, 3))


def pull(a: argparse.Namespace) -> None:
    from rocketmq.client import PullConsumer, RecvMessage
    from rocketmq.ffi import _CPullStatus, dll

    consumer = PullConsumer(a.group)
    quiet_logs(dll.SetPullConsumerLogLevel, dll.SetPullConsumerLogFileNumAndSize,
               consumer._handle, a.log_level)  # fmt: skip
    consumer.set_namesrv_addr(a.namesrv)
    sign_with(consumer, a)
    consumer.start()
    queues = wait_for_queues(consumer._handle, a)
    emit("queues", queues=[q.queueId for q in queues], broker=queues[0].brokerName.decode())
    emit("started", pid=os.getpid(), group=a.group, topic=a.topic)
    total = 0
    began, cpu = time.perf_counter(), time.process_time()
    for mq in queues:
        offset, count, attempts = a.from_offset, 0, 0
        low = high = -1
        while True:
            phase(f"pulling queue {mq.queueId} at offset {offset}")
            result = dll.Pull(consumer._handle, ctypes.pointer(mq), a.expression.encode(),
                              offset, a.max_num)  # fmt: skip
            status = result.pullStatus
            try:
                if status == _CPullStatus.FOUND and a.report == "each":
                    for i in range(result.size):
                        m = RecvMessage(result.msgFoundList[i])
                        body = m.body or b""
                        key, seq = parse_body(body)
                        emit("message", key=key, seq=seq, topic=m.topic, queue=m.queue_id,
                             offset=m.queue_offset, msg_id=m.id,
                             body=body[: a.body_chars].decode("utf-8", "replace"))  # fmt: skip
                found = result.size if status == _CPullStatus.FOUND else 0
                following, low, high = result.nextBeginOffset, result.minOffset, result.maxOffset
            finally:
                dll.ReleasePullResult(result)
            if status == _CPullStatus.BROKER_TIMEOUT:
                attempts += 1
                if attempts > a.retries:
                    fail(f"pull of queue {mq.queueId} at {offset} timed out {attempts} times")
                continue
            count += found
            if status == _CPullStatus.OFFSET_ILLEGAL:
                emit("offset_illegal", queue=mq.queueId, offset=offset, next_offset=following)
            elif status == _CPullStatus.NO_NEW_MSG:
                break
            offset = following
        total += count
        emit("queue_done", queue=mq.queueId, next_offset=offset, min_offset=low,
             max_offset=high, messages=count)  # fmt: skip
    seconds = time.perf_counter() - began
    emit("done", messages=total, seconds=round(seconds, 4),
         rate=round(total / max(seconds, 1e-9), 1),
         cpu_seconds=round(time.process_time() - cpu, 4))  # fmt: skip
    phase("shutting down")
    consumer.shutdown()
    consumer._handle = None


# ---------------------------------------------------------------------------- transactions
def transaction(a: argparse.Namespace) -> None:
    import rocketmq.client as client
    from rocketmq.ffi import dll

    missing = [
        what
        for what, there in (
            ("rocketmq.client has no TransactionMQProducer",
             hasattr(client, "TransactionMQProducer")),
            ("its librocketmq.so exports no CreateTransactionProducer nor SendMessageTransaction "
             "(its C API is rocketmq-client-cpp 1.2.3's; the C++ class "
             "rocketmq::TransactionMQProducer inside it is reachable from C++ only)",
             _exports(dll, "CreateTransactionProducer")),
        )
        if not there
    ]  # fmt: skip
    if missing:
        reason = f"PyPI rocketmq {_version()} has no transaction producer: " + "; ".join(missing)
        emit("unsupported", reason=reason)
        return
    # rocketmq-client-python 2.x's API (PyPI rocketmq-client-python): never run here yet.
    states = client.TransactionStatus  # type: ignore[attr-defined]
    answers = {"commit": states.COMMIT, "rollback": states.ROLLBACK, "unknown": states.UNKNOWN}
    checked = threading.Event()

    def check(msg: Any) -> Any:
        body = msg.body.decode(errors="replace")
        emit("checked", body=body)
        if body == "unknown":
            checked.set()
        return states.COMMIT

    def local(msg: Any, user_args: Any) -> Any:
        return answers[msg.body.decode(errors="replace")]

    producer = client.TransactionMQProducer(a.group, check)  # type: ignore[attr-defined]
    producer.set_name_server_address(a.namesrv)
    producer.start()
    emit("started", pid=os.getpid())
    for body in ("commit", "rollback", "unknown"):
        phase(f"sending {body}")
        msg = client.Message(a.topic)
        msg.set_keys(body)
        msg.set_body(body)
        result = producer.send_message_in_transaction(msg, local, None)
        emit("sent", body=body, status=str(result.status), msg_id=result.msg_id)
    phase("waiting for the check-back of 'unknown'")
    checked.wait()
    emit("done")
    producer.shutdown()


def _exports(dll: Any, name: str) -> bool:
    try:
        getattr(dll, name)
    except AttributeError:
        return False
    return True


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rocketmq")
    except PackageNotFoundError:
        return "?"


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("selfcheck", help="import the client, start and stop a producer")

    def common(name: str, text: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=text)
        c.add_argument(
            "--namesrv",
            required=True,
            help="name server addresses, IPv4 HOST:PORT[;HOST:PORT...]",
        )
        c.add_argument("--topic", required=True)
        c.add_argument("--group", required=True, help="producer or consumer group")
        c.add_argument(
            "--deadline",
            type=float,
            default=0.0,
            help="end with exit code 3 after this many seconds (default: never)",
        )
        c.add_argument(
            "--log-level",
            default="WARN",
            choices=["FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"],
            help="the C++ client's own log ($HOME/logs/rocketmq-cpp)",
        )
        c.add_argument(
            "--body-chars",
            type=int,
            default=200,
            help="consumers: at most this much of each body in the output",
        )
        c.add_argument("--access-key", default="", help="ACL account (with --secret-key)")
        c.add_argument("--secret-key", default="")
        c.add_argument("--channel", default="", help="the session credentials' channel")
        return c

    common("transaction", "commit, roll back and leave unknown one transactional message each")
    c = common("produce", "send keyed messages, round after round (seq = round)")
    c.add_argument(
        "--mode",
        choices=["orderly", "sync"],
        default="orderly",
        help="send_orderly with the key's sharding argument, or send_sync",
    )
    c.add_argument("--keys", type=int, default=10, help="keys k000, k001, ... (default 10)")
    c.add_argument("--key-queues", help="JSON file: key -> queue index (instead of --keys)")
    c.add_argument("--rounds", type=int, default=1, help="messages per key (default 1)")
    c.add_argument("--first-seq", type=int, default=0)
    c.add_argument("--tags", default="")
    c.add_argument("--body-bytes", type=int, default=0, help="pad bodies to this size")
    c.add_argument("--property", action="append", default=[], help="NAME=VALUE on every message")
    c.add_argument("--send-timeout-ms", type=int, default=3000)
    c.add_argument("--report", choices=["each", "summary"], default="each")
    c.add_argument(
        "--resend",
        action="store_true",
        help="a failed send is sent again (after --resend-backoff) until acknowledged or "
        "the --deadline, before the next message; each failure prints send_failed",
    )
    c.add_argument("--resend-backoff", type=float, default=0.1, help="seconds (default 0.1)")
    c.add_argument(
        "--route-timeout",
        type=float,
        default=30.0,
        help='a first send that fails for want of a route (the client\'s "No route info") '
        "is sent again for this long (0: it fails at once, as the client fails it)",
    )
    c.add_argument(
        "--round-interval",
        type=float,
        default=0.0,
        help="round n starts n times this many seconds after the first (late ones at once)",
    )

    c = common("push", "a PushConsumer printing every message it is given")
    c.add_argument("--orderly", action="store_true", help="orderly listener (queue locks)")
    c.add_argument(
        "--property-names",
        type=lambda s: s.split(","),
        default=[],
        help="comma-separated property names each message event reports",
    )
    c.add_argument("--expression", default="*", help="tag expression (default *)")
    c.add_argument(
        "--instance",
        default="",
        help="client instance name (default PUSH: its client id "
        "is <pid>-<ip>@PUSH, not the route probe's <pid>-<ip>@DEFAULT)",
    )
    c.add_argument("--threads", type=int, default=0, help="consume threads (default: client's)")
    c.add_argument(
        "--route-timeout",
        type=float,
        default=30.0,
        help="wait this long for the topic's route before starting (0: do not)",
    )

    c = common("pull", "a PullConsumer reading every queue of the topic to its end")
    c.add_argument("--expression", default="*")
    c.add_argument("--from-offset", type=int, default=0)
    c.add_argument("--max-num", type=int, default=32, help="messages per pull (default 32)")
    c.add_argument("--retries", type=int, default=3, help="pull time-outs tolerated per queue")
    c.add_argument("--route-timeout", type=float, default=30.0)
    c.add_argument("--report", choices=["each", "summary"], default="each")
    a = p.parse_args(argv)
    errors = check(a)
    if errors:
        p.error("; ".join(errors))
    return a


def check(a: argparse.Namespace) -> list[str]:
    """What is wrong with the arguments beyond what argparse checks."""
    errors = []
    if a.command == "selfcheck":
        return errors
    for address in a.namesrv.split(";"):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            errors.append(f"--namesrv must be HOST:PORT[;HOST:PORT...], got {a.namesrv!r}")
            break
    for name in ("rounds", "keys", "max_num", "threads", "body_bytes"):
        value = getattr(a, name, None)
        if value is not None and value < 0:
            errors.append(f"--{name.replace('_', '-')} must not be negative")
    if a.command == "produce" and a.key_queues and not os.path.exists(a.key_queues):
        errors.append(f"--key-queues: no file {a.key_queues}")
    if a.command == "produce" and not a.key_queues and a.keys < 1:
        errors.append("--keys must be at least 1")
    return errors


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    start_deadline(getattr(a, "deadline", 0.0))
    try:
        commands = {"selfcheck": selfcheck, "produce": produce, "push": push, "pull": pull,
                    "transaction": transaction}  # fmt: skip
        commands[a.command](a)
    except Exception as exc:  # the client's errors, as one clear line
        fail(f"{type(exc).__name__}: {exc}")
    sys.stdout.flush()
    os._exit(0)  # skip the wrapper's __del__ and the C++ library's static destructors


if __name__ == "__main__":
    main()
