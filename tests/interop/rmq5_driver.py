"""Drive Apache RocketMQ's Python client 5.x (PyPI `rocketmq-python-client`) against a v2 front.

Runs inside its own virtualenv (tests/interop/provision.py), never in the project's, and
imports nothing of ordermq: the client registers RocketMQ 5's protos under the same names
as mockbroker/_pb_v2, so the two cannot share a process. Every line it prints on stdout is
one JSON object with an "event" field; errors end it with exit code 2 (a client call
failed) or 3 (the --deadline passed), after an {"event": "error"} line. The client writes
its log under $HOME/logs/rocketmq_python/: give each run a HOME of its own.

    rmq5_driver.py selfcheck
    rmq5_driver.py produce --endpoints 127.0.0.1:8090 --topic T [--count N] [--groups G]
                           [--delay-ms D] [--tag TAG] [--keys] [--property K=V] [--recall]
    rmq5_driver.py simple  --endpoints E --topic T --group G --expect N [--invisible S]
                           [--no-ack] [--change-invisible S] [--await S] [--tag TAG]
    rmq5_driver.py push    --endpoints E --topic T --group G
    rmq5_driver.py transaction --endpoints E --topic T

produce, simple and push take --tls (the client's own switch, `tls_enable=True`: a TLS
channel that trusts gRPC's default roots) and --tls-ca FILE (--tls, trusting the CA in
FILE instead). The client has no option for a CA of its own: --tls-ca sets
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, the variable gRPC reads its default roots from, before
gRPC loads.

produce, simple and push take --access-key KEY --secret-key SECRET: the client's
`Credentials(ak, sk)` in its ClientConfiguration, with which it signs every call
(MQv2-HMAC-SHA1 over x-mq-date-time). The client stamps its *local* time with a "Z": the
driver runs it with TZ=UTC so that a broker checking the date's window accepts it.

Message bodies are "<key>:<seq>" (key: the message group, or "k"); consumers parse them
back into "key" and "seq".

Events:
- selfcheck: {"rocketmq_python_client", "python"} once the client imported and built a
  producer (not started: that needs a server);
- every command: "started" {client_id} once its client started;
- produce: "sent" per message {key, seq, message_id, offset, recall_handle}, "recalled"
  {message_id} per recalled message (--recall), then "done" {sent};
- simple: "message" per message received, "acked" / "changed" {message_id} after each
  ack / invisible-duration change, "done" {received} once --expect distinct messages came;
- push: "message" per listener call; on SIGTERM "stopping", then "stopped", exit 0;
- transaction: three half messages, bodies "commit" (committed), "rollback" (rolled
  back) and "unknown" (left to the check-back, which its TransactionChecker commits):
  "sent" {body, message_id, transaction_id} each, "ended" {body, resolution}, "checked"
  {body, message_id} per check-back, then "done" once "unknown" was checked back.
"message" carries {key, seq, topic, message_id, tag, keys, group, attempt, properties,
born_host, delivery_timestamp, corrupted, body}.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import sys
import threading
import time
from typing import Any

_out = threading.Lock()
_phase = ["starting"]
#: How often the push command looks for the stop signal (see push).
STOP_POLL_SECONDS = 0.1


def emit(event: str, **fields: Any) -> None:
    """Print one JSON line (whole lines only, from any thread) and flush it."""
    line = json.dumps({"event": event, **fields}, separators=(",", ":"), default=str)
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def fail(message: str, code: int = 2) -> None:
    """Print an error line and end the process at once (no client shutdown)."""
    emit("error", message=message, phase=_phase[0])
    os._exit(code)


def start_deadline(seconds: float) -> None:
    """End the process with an error line if it still runs after `seconds`."""
    if seconds > 0:
        timer = threading.Timer(seconds, lambda: fail(f"deadline of {seconds:g} s passed", 3))
        timer.daemon = True
        timer.start()


def use_tls(a: argparse.Namespace) -> bool:
    """Whether the client connects over TLS; with --tls-ca, make gRPC trust that CA.

    Called before anything imports grpc: gRPC reads GRPC_DEFAULT_SSL_ROOTS_FILE_PATH when it
    first needs its default roots, and the variable wins over the roots grpcio ships.
    """
    if a.tls_ca:
        os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = os.path.abspath(a.tls_ca)
    return bool(a.tls or a.tls_ca)


def use_credentials(a: argparse.Namespace) -> None:
    """With --access-key, run in UTC: the client formats its local time as if it were UTC."""
    if a.access_key is not None:
        os.environ["TZ"] = "UTC"
        time.tzset()


def config(endpoints: str, a: argparse.Namespace | None = None) -> Any:
    from rocketmq import ClientConfiguration, Credentials

    if a is not None and a.access_key is not None:
        return ClientConfiguration(endpoints, Credentials(a.access_key, a.secret_key))
    return ClientConfiguration(endpoints, Credentials())


def describe(message: Any) -> dict[str, Any]:
    body = bytes(message.body or b"")
    text = body.decode("utf-8", "replace")
    key, _, seq = text.partition(":")
    return {
        "key": key if seq.isdigit() else None,
        "seq": int(seq) if seq.isdigit() else None,
        "topic": message.topic,
        "message_id": message.message_id,
        "tag": message.tag,
        "keys": sorted(message.keys),
        "group": message.message_group,
        "attempt": message.delivery_attempt,
        "properties": dict(message.properties),
        "born_host": message.born_host,
        "delivery_timestamp": message.delivery_timestamp,
        "corrupted": message.corrupted,
        "body": text,
    }


# ---------------------------------------------------------------------------- commands
def selfcheck(_: argparse.Namespace) -> int:
    import importlib.metadata

    from rocketmq import Producer

    Producer(config("127.0.0.1:1"))
    emit(
        "selfcheck",
        rocketmq_python_client=importlib.metadata.version("rocketmq-python-client"),
        python=sys.version.split()[0],
    )
    return 0


def produce(a: argparse.Namespace) -> int:
    from rocketmq import Message, Producer

    _phase[0] = "startup"
    producer = Producer(config(a.endpoints, a), (a.topic,), tls_enable=a.tls)
    producer.startup()
    emit("started", client_id=producer.client_id)
    keys = [f"group-{g}" for g in range(a.groups)] if a.groups else ["k"]
    sent = 0
    _phase[0] = "sending"
    for seq in range(a.count):
        for key in keys:
            message = Message()
            message.topic = a.topic
            message.body = f"{key}:{seq}".encode()
            if a.tag:
                message.tag = a.tag
            if a.keys:
                message.keys = f"{key}-{seq}"
            for pair in a.property:
                name, _, value = pair.partition("=")
                message.add_property(name, value)
            if a.groups:
                message.message_group = key
            if a.delay_ms:
                message.delivery_timestamp = int(time.time() * 1000) + a.delay_ms
            receipt = producer.send(message)
            sent += 1
            emit("sent", key=key, seq=seq, message_id=receipt.message_id, offset=receipt.offset,
                 recall_handle=receipt.recall_handle)  # fmt: skip
            if a.recall:
                emit("recalled", message_id=producer.recall_message(a.topic, receipt.recall_handle))
    _phase[0] = "shutdown"
    producer.shutdown()
    emit("done", sent=sent)
    return 0


def transaction(a: argparse.Namespace) -> int:
    from rocketmq import Message, Producer, TransactionChecker, TransactionResolution

    checked = threading.Event()

    class Checker(TransactionChecker):  # type: ignore[misc]
        def check(self, message: Any) -> Any:
            body = bytes(message.body).decode(errors="replace")
            emit("checked", body=body, message_id=message.message_id)
            if body == "unknown":
                checked.set()
            return TransactionResolution.COMMIT

    _phase[0] = "startup"
    producer = Producer(config(a.endpoints, a), (a.topic,), Checker(), tls_enable=a.tls)
    producer.startup()
    emit("started", client_id=producer.client_id)
    for body in ("commit", "rollback", "unknown"):
        _phase[0] = f"sending {body}"
        message = Message()
        message.topic = a.topic
        message.body = body.encode()
        message.keys = body
        txn = producer.begin_transaction()
        receipt = producer.send(message, txn)
        emit("sent", body=body, message_id=receipt.message_id,
             transaction_id=receipt.transaction_id)  # fmt: skip
        if body == "commit":
            txn.commit()
        elif body == "rollback":
            txn.rollback()
        else:
            continue
        emit("ended", body=body)
    _phase[0] = "waiting for the check-back of 'unknown'"
    checked.wait()
    time.sleep(1)  # the checker's EndTransaction goes out after check() returns
    _phase[0] = "shutdown"
    producer.shutdown()
    emit("done")
    return 0


def simple(a: argparse.Namespace) -> int:
    from rocketmq import FilterExpression, SimpleConsumer

    _phase[0] = "startup"
    consumer = SimpleConsumer(
        config(a.endpoints, a), a.group, {a.topic: FilterExpression(a.tag)}, await_duration=a.wait,
        tls_enable=a.tls,
    )  # fmt: skip
    consumer.startup()
    emit("started", client_id=consumer.client_id)
    seen: set[str] = set()
    _phase[0] = "receiving"
    while len(seen) < a.expect:
        for message in consumer.receive(a.max, a.invisible):
            seen.add(message.message_id)
            emit("message", **describe(message))
            if a.change_invisible is not None:
                consumer.change_invisible_duration(message, a.change_invisible)
                emit("changed", message_id=message.message_id)
            if not a.no_ack:
                consumer.ack(message)
                emit("acked", message_id=message.message_id)
    _phase[0] = "shutdown"
    consumer.shutdown()
    emit("done", received=len(seen))
    return 0


def push(a: argparse.Namespace) -> int:
    from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            emit("message", **describe(message))
            return ConsumeResult.SUCCESS

    # Not a threading.Event: a handler's set() that lands while this thread is inside the
    # Event's wait() (holding its lock) blocks for good. SimpleQueue.put is safe there.
    stop: queue.SimpleQueue[int] = queue.SimpleQueue()
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.put(signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: stop.put(signum))
    _phase[0] = "startup"
    consumer = PushConsumer(
        config(a.endpoints, a), a.group, Listener(), {a.topic: FilterExpression(a.tag)},
        consumption_thread_count=4, tls_enable=a.tls,
    )  # fmt: skip
    consumer.startup()
    emit("started", client_id=consumer.client_id, fifo=consumer.fifo)
    _phase[0] = "consuming"
    # In short steps: a signal the kernel hands to one of the client's threads does not
    # wake a blocking get(), and its handler runs only when this thread runs Python code
    # again (a plain get() once left a SIGTERM'd driver waiting for good).
    while stop.empty():
        time.sleep(STOP_POLL_SECONDS)
    emit("stopping")
    consumer.shutdown()
    emit("stopped")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rmq5_driver.py")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("selfcheck")
    for name in ("produce", "simple", "push", "transaction"):
        c = sub.add_parser(name)
        c.add_argument("--endpoints", required=True)
        c.add_argument("--topic", required=True)
        c.add_argument("--deadline", type=float, default=300.0)
        c.add_argument("--tag", default="*" if name != "produce" else "")
        c.add_argument("--tls", action="store_true", help="connect over TLS (tls_enable=True)")
        c.add_argument("--tls-ca", default=None, metavar="FILE",
                       help="--tls, trusting the PEM CA certificate(s) in FILE")  # fmt: skip
        c.add_argument("--access-key", default=None, help="sign calls with this account")
        c.add_argument("--secret-key", default="", help="the account's secret key")
        if name == "produce":
            c.add_argument("--count", type=int, default=1)
            c.add_argument("--groups", type=int, default=0, help="FIFO: this many message groups")
            c.add_argument("--delay-ms", type=int, default=0)
            c.add_argument("--keys", action="store_true")
            c.add_argument("--property", action="append", default=[])
            c.add_argument("--recall", action="store_true")
        elif name != "transaction":
            c.add_argument("--group", required=True)
        if name == "simple":
            c.add_argument("--expect", type=int, required=True)
            c.add_argument("--max", type=int, default=16)
            c.add_argument("--invisible", type=int, default=30)
            c.add_argument("--wait", type=int, default=5, help="long polling, seconds")
            c.add_argument("--no-ack", action="store_true")
            c.add_argument("--change-invisible", type=int, default=None)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse(argv)
    if a.command == "selfcheck":
        return selfcheck(a)
    start_deadline(a.deadline)
    a.tls = use_tls(a)  # before the client (and grpc) is imported
    use_credentials(a)
    try:
        commands = {"produce": produce, "simple": simple, "push": push, "transaction": transaction}
        return commands[a.command](a)
    except Exception as exc:  # the client's exception, reported as a line
        fail(f"{type(exc).__name__}: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
