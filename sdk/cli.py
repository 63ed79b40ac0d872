"""`ordermq`: the admin command for an ordermq broker.

    ordermq [--broker HOST:PORT] [--json] topics list | create | describe | delete
    ordermq groups list | describe GROUP | delete GROUP
    ordermq offsets reset GROUP --topic T (--earliest | --latest | --timestamp T | --offset N)
    ordermq messages get MSG_ID | find TOPIC KEY [--sharding-key] | tail TOPIC
    ordermq dlq list GROUP | resend GROUP
    ordermq broker status

Text output is for people (tables); --json is for scripts. An error is one line on
stderr and exit status 1 (2 for bad usage).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from sdk._accel import hand_out
from sdk._transport import Transport, connect
from sdk._transport.broker_client import BrokerClient
from sdk._transport.grpc_transport import GrpcTransport
from sdk._version import __version__
from sdk._wire import DEFAULT_PORT
from sdk.credentials import Credentials
from sdk.errors import NotSupportedError, OrderMQError
from sdk.message import MessageExt, MessageQueue
from sdk.message_admin import by_sharding_key as find_by_sharding_key
from sdk.message_admin import dead_letters, read_queues, resend_dead_letters
from sdk.producer import Producer
from sdk.tls import TLSConfig

T = TypeVar("T")
DEFAULT_BROKER = f"127.0.0.1:{DEFAULT_PORT}"
#: `messages find --sharding-key` reads at most this many of a queue's newest messages.
SHARDING_KEY_SCAN = 10_000

# Numbers as the protocol carries them: beyond its fields' range a value could not even
# be sent, and would end the command with a traceback instead of a usage error.
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
#: A number of queues, of messages to read or of messages at most: at least one.
_HOW_MANY = click.IntRange(1, _INT32_MAX)
#: A queue of a topic, by its id.
_QUEUE_ID = click.IntRange(0, _INT32_MAX)


class Context:
    """What every command gets: where the broker is and how to print."""

    def __init__(
        self,
        broker: str,
        as_json: bool,
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.broker = broker
        self.tls = tls
        self.credentials = credentials
        self.as_json = as_json
        self.console = Console(highlight=False, soft_wrap=True)

    def call(self, body: Callable[[BrokerClient], Awaitable[T]]) -> T:
        """Run `body` with a client of the broker; OrderMQError ends the command."""

        async def main() -> T:
            transport = connect(self.broker, self.tls, self.credentials)
            try:
                return await body(_admin_client(transport))
            finally:
                await transport.close()

        try:
            return asyncio.run(main())
        except OrderMQError as exc:
            label = exc.reason or exc.code
            message = f"{label}: {exc}" if label else str(exc)
            raise click.ClickException(_one_line(message)) from None

    def emit(self, data: Any, table: Table | str | None = None) -> None:
        """Print `data` as JSON with --json, else the table (or text)."""
        if self.as_json:
            click.echo(json.dumps(data, indent=2, default=str))
        elif table is not None:
            self.console.print(table)


def _admin_client(transport: Transport) -> BrokerClient:
    """The connection to the broker the commands administer (the first endpoint).

    The commands use ordermq's AdminService: they need an ordermq broker, over gRPC.
    """
    if not isinstance(transport, GrpcTransport):
        raise NotSupportedError(
            f"the ordermq command administers ordermq brokers over gRPC, not {transport!r}"
        )
    return transport.client(transport.endpoints[0])


def _one_line(text: str) -> str:
    """`text` with its line breaks and control characters escaped.

    An error is one line, whatever names (typed by the user, or stored by a client) it
    quotes.
    """
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    table = Table(title=title, title_justify="left")
    for c in columns:
        # Long values (client ids, group names) fold onto a second line rather than lose
        # their ends to an ellipsis when the terminal is narrow.
        table.add_column(c, overflow="fold")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    return table


def _ms(value: Any) -> str:
    ms = int(value or 0)
    return datetime.fromtimestamp(ms / 1000).isoformat(timespec="seconds") if ms else "-"


@click.group()
@click.version_option(__version__, prog_name="ordermq", message="%(prog)s %(version)s")
@click.option("--broker", "-b", default=DEFAULT_BROKER, show_default=True, envvar="ORDERMQ_BROKER",
              help="host:port of a broker (or ORDERMQ_BROKER)")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--tls-ca", type=click.Path(dir_okay=False), envvar="ORDERMQ_TLS_CA",
              help="connect over TLS, trusting this PEM CA (or ORDERMQ_TLS_CA)")  # fmt: skip
@click.option("--tls", "use_tls", is_flag=True,
              help="connect over TLS, trusting the system's roots")  # fmt: skip
@click.option("--tls-cert", type=click.Path(dir_okay=False), envvar="ORDERMQ_TLS_CERT",
              help="client certificate, for brokers that require one (with --tls-key)")  # fmt: skip
@click.option("--tls-key", type=click.Path(dir_okay=False), envvar="ORDERMQ_TLS_KEY",
              help="the client certificate's key")  # fmt: skip
@click.option("--tls-server-name", help="the name the broker's certificate must carry")
@click.option("--access-key", envvar="ORDERMQ_ACCESS_KEY",
              help="ACL access key, for a broker with an ACL (or ORDERMQ_ACCESS_KEY)")  # fmt: skip
@click.option("--secret-key", envvar="ORDERMQ_SECRET_KEY",
              help="the account's secret key (better ORDERMQ_SECRET_KEY: not in ps)")  # fmt: skip
@click.pass_context
def cli(
    ctx: click.Context,
    broker: str,
    as_json: bool,
    tls_ca: str | None,
    use_tls: bool,
    tls_cert: str | None,
    tls_key: str | None,
    tls_server_name: str | None,
    access_key: str | None,
    secret_key: str | None,
) -> None:
    """Administer an ordermq broker."""
    tls = None
    if use_tls or any(v is not None for v in (tls_ca, tls_cert, tls_key, tls_server_name)):
        try:
            tls = TLSConfig(tls_ca, tls_cert, tls_key, tls_server_name)
        except OrderMQError as exc:
            raise click.UsageError(str(exc)) from None
    credentials = None
    if (access_key is None) != (secret_key is None):
        raise click.UsageError(
            "--access-key and --secret-key (ORDERMQ_ACCESS_KEY, ORDERMQ_SECRET_KEY) go together"
        )
    if access_key is not None and secret_key is not None:
        try:
            credentials = Credentials(access_key, secret_key)
        except OrderMQError as exc:
            raise click.UsageError(str(exc)) from None
    ctx.obj = Context(broker, as_json, tls, credentials)


# ---------------------------------------------------------------------- topics
@cli.group()
def topics() -> None:
    """Create, list, describe and delete topics."""


@topics.command("list")
@click.option("--system", is_flag=True, help="include the broker's own topics")
@click.pass_obj
def topics_list(c: Context, system: bool) -> None:
    """Every topic and its queue count."""
    data = c.call(lambda b: b.admin("ListTopics", include_system=system))["topics"]
    rows = [
        [t["topic"], t["queue_count"], t["broker_name"], _retention(t["retention"])] for t in data
    ]
    c.emit(data, _table("topics", ["topic", "queues", "broker", "retention"], rows))


_RETENTION_HOURS = click.option(
    "--retention-hours",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="serve its messages this long after they were stored (default: the broker's "
    "--retention-hours)",
)
_RETENTION_BYTES = click.option(
    "--retention-bytes-per-queue",
    type=click.IntRange(1, _INT64_MAX),
    default=None,
    help="each queue serves at most this many bytes, newest first (default: no cap)",
)


@topics.command("create")
@click.argument("topic")
@click.option("--queues", type=_HOW_MANY, default=8, show_default=True, help="how many queues")
@_RETENTION_HOURS
@_RETENTION_BYTES
@click.pass_obj
def topics_create(
    c: Context,
    topic: str,
    queues: int,
    retention_hours: float | None,
    retention_bytes_per_queue: int | None,
) -> None:
    """Create TOPIC with a number of queues (nothing happens if it exists alike).

    By default its messages are kept as long as the broker keeps every topic's; the
    retention options give it its own (see docs/operations.md, "Per-topic retention").
    """
    fields: dict[str, Any] = {"topic": topic, "queue_count": queues}
    if retention_hours is not None or retention_bytes_per_queue is not None:
        fields["retention"] = _retention_settings(retention_hours, retention_bytes_per_queue)
    data = c.call(lambda b: b.admin("CreateTopic", **fields))
    text = f"created {topic} with {queues} queues" if data["created"] else f"{topic} exists"
    c.emit(data, f"{text}; retention: {_retention(data['topic']['retention'])}")


@topics.command("set-retention")
@click.argument("topic")
@_RETENTION_HOURS
@_RETENTION_BYTES
@click.pass_obj
def topics_set_retention(
    c: Context, topic: str, retention_hours: float | None, retention_bytes_per_queue: int | None
) -> None:
    """Give TOPIC its own retention; without options, back to the broker's default.

    It applies within a second: a shorter time or a size cap expires what is past it at
    once (those messages are not served again).
    """
    settings = _retention_settings(retention_hours, retention_bytes_per_queue)
    data = c.call(lambda b: b.admin("SetTopicRetention", topic=topic, retention=settings))
    c.emit(data, f"{topic} retention: {_retention(data['topic']['retention'])}")


def _retention_settings(hours: float | None, bytes_per_queue: int | None) -> dict[str, Any]:
    """RetentionSettings' fields (0: the broker's default)."""
    return {"hours": hours or 0.0, "bytes_per_queue": bytes_per_queue or 0}


def _retention(settings: dict[str, Any]) -> str:
    """A topic's retention as its row shows it ("default", "24 h", "24 h, 1.0 GiB/queue")."""
    hours, size = float(settings.get("hours") or 0), int(settings.get("bytes_per_queue") or 0)
    if not hours and not size:
        return "default"
    parts = [f"{hours:g} h" if hours else "default time"]
    if size:
        parts.append(f"{_bytes(size)}/queue")
    return ", ".join(parts)


@topics.command("describe")
@click.argument("topic")
@click.pass_obj
def topics_describe(c: Context, topic: str) -> None:
    """Min and max offset, and the newest message's time, of every queue of TOPIC."""
    data = c.call(lambda b: b.admin("DescribeTopic", topic=topic))["topic"]
    rows = [
        [q["queue_id"], q["min_offset"], q["max_offset"], _ms(q["last_store_timestamp_ms"])]
        for q in data["queues"]
    ]
    title = f"topic {topic} (retention: {_retention(data['retention'])})"
    c.emit(data, _table(title, ["queue", "min", "max", "last stored"], rows))


@topics.command("delete")
@click.argument("topic")
@click.option("--force", is_flag=True, help="even while live consumers subscribe to it")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.pass_obj
def topics_delete(c: Context, topic: str, force: bool, yes: bool) -> None:
    """Delete TOPIC: its messages, and every group's offsets and locks on it.

    Refused while a group with live members subscribes to it, unless --force. A topic
    created later with the same name starts empty, at offset 0.
    """
    if not yes:
        click.confirm(f"Delete topic {topic} and all its messages on {c.broker}?", abort=True)
    data = c.call(lambda b: b.admin("DeleteTopic", topic=topic, force=force))
    groups = ", ".join(data["groups"]) or "none"
    c.emit(data, f"deleted {topic} ({data['queue_count']} queues; offsets of groups: {groups})")


# ---------------------------------------------------------------------- groups
@cli.group()
def groups() -> None:
    """Consumer groups: members, locks, lag."""


@groups.command("list")
@click.pass_obj
def groups_list(c: Context) -> None:
    """Every group with members or committed offsets."""
    data = c.call(lambda b: b.admin("ListGroups"))["groups"]
    rows = [
        [g["group"], g["members"], g["consume_type"] or "-", g["message_model"] or "-",
         ", ".join(g["topics"])]
        for g in data
    ]  # fmt: skip
    c.emit(data, _table("groups", ["group", "members", "type", "model", "topics"], rows))


@groups.command("delete")
@click.argument("group")
@click.option("--force", is_flag=True, help="even while it has live members")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.pass_obj
def groups_delete(c: Context, group: str, force: bool, yes: bool) -> None:
    """Delete GROUP: its offsets, locks, and its retry and dead-letter topics.

    Refused while it has live members, unless --force.
    """
    if not yes:
        click.confirm(
            f"Delete group {group}, its offsets and its retry and dead-letter messages "
            f"on {c.broker}?",
            abort=True,
        )
    data = c.call(lambda b: b.admin("DeleteGroup", group=group, force=force))
    topics = ", ".join(data["deleted_topics"]) or "none"
    c.emit(data, f"deleted group {group} (offsets on {len(data['topics'])} topics; "
                 f"topics deleted: {topics})")  # fmt: skip


@groups.command("describe")
@click.argument("group")
@click.option("--topic", default="", help="only this topic")
@click.pass_obj
def groups_describe(c: Context, group: str, topic: str) -> None:
    """Members, and per queue: offsets, lag, messages retention skipped, lock owner, epoch."""
    data = c.call(lambda b: b.admin("ConsumerProgress", group=group, topic=topic))
    rows = [
        [q["queue"]["topic"], q["queue"]["queue_id"], q["broker_max_offset"],
         *((q["consumer_offset"], q["lag"]) if q["consumer_offset"] >= 0
           else ("never", "-")),
         q["skipped"],
         q["lock_owner"] or "-", q["lock_epoch"] or "-"]
        for q in data["queues"]
    ]  # fmt: skip
    members = ", ".join(data["client_ids"]) or "none"
    columns = ["topic", "queue", "max", "committed", "lag", "skipped", "lock owner", "epoch"]
    table = _table(f"group {group} (members: {members})", columns, rows)
    c.emit(data, table)


# ---------------------------------------------------------------------- offsets
@cli.group()
def offsets() -> None:
    """Move a group's offsets."""


@offsets.command("reset")
@click.argument("group")
@click.option("--topic", required=True, help="the topic whose offsets move")
@click.option("--queue", "queue_id", type=click.IntRange(-1, _INT32_MAX), default=-1,
              help="one queue (default: all)")  # fmt: skip
@click.option("--earliest", is_flag=True, help="to each queue's min offset")
@click.option("--latest", is_flag=True, help="to each queue's max offset (skip everything)")
@click.option("--timestamp", help="to the first message stored at or after this ISO time")
@click.option("--offset", type=click.IntRange(0, _INT64_MAX), help="to this offset")
@click.option("--force", is_flag=True, help="even while the group has live members")
@click.pass_obj
def offsets_reset(
    c: Context,
    group: str,
    topic: str,
    queue_id: int,
    earliest: bool,
    latest: bool,
    timestamp: str | None,
    offset: int | None,
    force: bool,
) -> None:
    """Reset GROUP's offsets of --topic (stop the group first, or --force)."""
    chosen = [earliest, latest, timestamp is not None, offset is not None]
    if sum(chosen) != 1:
        raise click.UsageError("give exactly one of --earliest, --latest, --timestamp, --offset")
    target: dict[str, Any]
    if earliest:
        target = {"earliest": True}
    elif latest:
        target = {"latest": True}
    elif timestamp is not None:
        try:
            when = datetime.fromisoformat(timestamp)
        except ValueError:
            raise click.UsageError(f"--timestamp {timestamp!r} is not an ISO time") from None
        target = {"timestamp_ms": int(when.timestamp() * 1000)}
    else:
        target = {"offset": offset}
    data = c.call(lambda b: b.admin(
        "ResetOffset", group=group, topic=topic, queue_id=queue_id, force=force, **target
    ))  # fmt: skip
    rows = [[o["topic"], o["queue_id"], o["offset"]] for o in data["offsets"]]
    c.emit(data, _table(f"offsets of {group} now", ["topic", "queue", "offset"], rows))


# ---------------------------------------------------------------------- messages
@cli.group()
def messages() -> None:
    """Read messages."""


def _message_row(m: MessageExt) -> dict[str, Any]:
    return {
        "topic": m.topic, "queue": m.queue.queue_id, "offset": m.queue_offset,
        "msg_id": m.msg_id, "tags": m.tags, "keys": list(m.keys),
        "sharding_key": m.sharding_key, "properties": m.properties,
        "reconsume_times": m.reconsume_times, "stored": _ms(m.store_timestamp),
        "body": m.body.decode(errors="replace"),
    }  # fmt: skip


@messages.command("get")
@click.argument("msg_id")
@click.pass_obj
def messages_get(c: Context, msg_id: str) -> None:
    """Every stored copy of message MSG_ID (original, retries, dead letter), newest first.

    MSG_ID is any id the clients print: ordermq's (SendResult.msg_id), RocketMQ 4.x's
    msgId (UNIQ_KEY) or offsetMsgId, or RocketMQ 5's message id.
    """
    found = c.call(lambda b: b.query_message_by_id(msg_id))
    _print_messages(c, found, f"no stored message has id {msg_id}")


@messages.command("find")
@click.argument("topic")
@click.argument("key")
@click.option(
    "--sharding-key",
    "by_sharding_key",
    is_flag=True,
    help="KEY is a sharding key (Message(sharding_key=...)), not one of keys=",
)
@click.option(
    "--scan",
    type=_HOW_MANY,
    default=SHARDING_KEY_SCAN,
    show_default=True,
    help="with --sharding-key: how many of the queue's newest messages to read",
)
@click.option("--limit", type=_HOW_MANY, default=32, show_default=True,
              help="at most this many messages")  # fmt: skip
@click.pass_obj
def messages_find(
    c: Context, topic: str, key: str, by_sharding_key: bool, scan: int, limit: int
) -> None:
    """Messages of TOPIC whose keys include KEY, newest first.

    Without --sharding-key it searches the messages' keys (Message(keys=...), printed as
    keys=), through the broker's index. With it, KEY is a sharding key: the queue the
    sharding formula maps KEY to is read from its newest message back (at most --scan).
    """
    if not by_sharding_key:
        found = c.call(lambda b: b.query_messages_by_key(topic, key, limit))
        searched = (
            f"no message of {topic} has key {key!r} (searched keys=; "
            "for a sharding key add --sharding-key)"
        )
        _print_messages(c, found, searched)
        return
    found, queue, read = c.call(lambda b: find_by_sharding_key(b, topic, key, scan, limit))
    _print_messages(
        c, found, f"none of the {read} newest messages of {topic} queue {queue.queue_id} "
        f"(where sharding key {key!r} goes) has that sharding key",
    )  # fmt: skip


def _print_messages(c: Context, found: list[MessageExt], none_found: str) -> None:
    if c.as_json:
        click.echo(json.dumps([_message_row(m) for m in found], indent=2))
        return
    if not found:
        click.echo(none_found)
    for m in found:
        _print_message(c, m)


@messages.command("tail")
@click.argument("topic")
@click.option("--count", "-n", type=click.IntRange(0, _INT32_MAX), default=20, show_default=True,
              help="how many of the newest messages per queue")  # fmt: skip
@click.option("--follow", "-f", is_flag=True, help="then keep printing new ones (Ctrl+C stops)")
@click.pass_obj
def messages_tail(c: Context, topic: str, count: int, follow: bool) -> None:
    """The newest messages of TOPIC, oldest first per queue."""

    async def body(b: BrokerClient) -> None:
        queues = [r.queue for r in await b.query_route(topic)]
        starts = {}
        for q in queues:
            low, high, _ = await b.queue_offsets(q)
            starts[q] = max(low, high - count)
        for m in await read_queues(b, queues, starts, count * len(queues)):
            _print_message(c, m)
            starts[m.queue] = m.queue_offset + 1
        if not follow:
            return
        # One long poll per queue, each printing what it gets at once: a message does not
        # wait for the other queues' polls to end. The first failure ends them all.
        polls = [asyncio.create_task(_follow(c, b, q, starts[q])) for q in queues]
        try:
            await asyncio.gather(*polls)
        finally:
            for poll in polls:
                poll.cancel()
            await asyncio.gather(*polls, return_exceptions=True)

    with contextlib.suppress(KeyboardInterrupt):
        c.call(body)


async def _follow(c: Context, b: BrokerClient, queue: MessageQueue, offset: int) -> None:
    """Print `queue`'s messages from `offset` on as they arrive, until cancelled."""
    while True:
        result = await b.pull("ordermq-cli", queue, offset, suspend_timeout=15, timeout=30)
        hand_out(result.messages)
        for m in result.messages:
            _print_message(c, m)
        offset = result.next_offset


def _print_message(c: Context, m: MessageExt) -> None:
    if c.as_json:
        click.echo(json.dumps(_message_row(m)))
    else:
        sharding = f" sharding_key={m.sharding_key}" if m.sharding_key else ""
        keys = f" keys={','.join(m.keys)}" if m.keys else ""
        tags = f" tags={m.tags}" if m.tags else ""
        click.echo(f"{m.topic}/{m.queue.queue_id}@{m.queue_offset} "
                   f"stored={_ms(m.store_timestamp)} id={m.msg_id}{sharding}{keys}{tags} "
                   f"{m.body.decode(errors='replace')}")  # fmt: skip


# ---------------------------------------------------------------------- dlq
@cli.group()
def dlq() -> None:
    """A group's dead-letter queue."""


@dlq.command("list")
@click.argument("group")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="at most this many dead letters")  # fmt: skip
@click.pass_obj
def dlq_list(c: Context, group: str, limit: int) -> None:
    """Dead letters of GROUP not resent yet."""
    found = c.call(lambda b: dead_letters(b, group, limit))
    rows = [_message_row(m) for m in found]
    columns = ["offset", "origin", "sharding key", "keys", "tries", "body"]
    table = _table(f"dead letters of {group}", columns, [
        [r["offset"], r["properties"].get("ORIGIN_TOPIC", "?"), r["sharding_key"] or "-",
         ",".join(r["keys"]) or "-", r["reconsume_times"], r["body"][:60]] for r in rows
    ])  # fmt: skip
    c.emit(rows, table)


@dlq.command("resend")
@click.argument("group")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True,
              help="resend at most this many dead letters")  # fmt: skip
@click.pass_obj
def dlq_resend(c: Context, group: str, limit: int) -> None:
    """Send GROUP's dead letters back to their original topics (each once)."""
    with Producer(c.broker, tls=c.tls, credentials=c.credentials) as producer:
        found = resend_dead_letters(c.call, producer.send, group, limit)
    c.emit({"resent": len(found)}, f"resent {len(found)} message(s) of {group}")


@cli.group()
def parked() -> None:
    """Keys that key-mode consumers parked (KeyFailurePolicy.PARK), and their release."""


@parked.command("list")
@click.argument("group", required=False, default="")
@click.pass_obj
def parked_list(c: Context, group: str) -> None:
    """The keys parked for GROUP (or every group), and those released not yet passed."""
    data = c.call(lambda b: b.admin("ListParkedKeys", group=group))["keys"]
    rows = [
        [k["group"], k["queue"]["topic"], k["queue"]["queue_id"], k["sharding_key"] or "(none)",
         k["parked_messages"], "released" if k["released_at_ms"] else "parked",
         _ms(k["parked_at_ms"]), k["reason"]]
        for k in data
    ]  # fmt: skip
    columns = ["group", "topic", "queue", "key", "messages", "state", "parked at", "reason"]
    c.emit(data, _table("parked keys", columns, rows))


@parked.command("release")
@click.argument("group")
@click.argument("topic")
@click.argument("key")
@click.option("--queue", type=_QUEUE_ID, default=None,
              help="the key's queue (default: the one `parked list` names)")  # fmt: skip
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.pass_obj
def parked_release(
    c: Context, group: str, topic: str, key: str, queue: int | None, yes: bool
) -> None:
    """Send KEY's parked messages back to the end of their TOPIC queue, in order, for GROUP.

    Fix what made them fail first: GROUP's consumers then handle them again, in the order
    they were sent, after the queue's newer messages of other keys.
    """
    if queue is None:
        listed = c.call(lambda b: b.admin("ListParkedKeys", group=group))["keys"]
        queues = sorted(
            k["queue"]["queue_id"]
            for k in listed
            if k["queue"]["topic"] == topic and k["sharding_key"] == key
            and not k["released_at_ms"]
        )  # fmt: skip
        if len(queues) != 1:
            raise click.ClickException(
                f"key {key!r} of {topic!r} is parked for {group!r} in "
                + (f"queues {queues}: name one with --queue" if queues else "no queue")
            )
        queue = queues[0]
    if not yes:
        click.confirm(f"Release key {key!r} of {topic} queue {queue} for {group} on {c.broker}?",
                      abort=True)  # fmt: skip
    where = {"topic": topic, "queue_id": queue}
    data = c.call(
        lambda b: b.admin("ReleaseParkedKey", group=group, queue=where, sharding_key=key)
    )["released"]
    back = data["parked_messages"]
    c.emit(data, f"released key {key!r} of {topic} queue {queue} for {group}: "
                 f"{back} parked message(s) back at the queue's end")  # fmt: skip


# ---------------------------------------------------------------------- broker
@cli.group()
def broker() -> None:
    """The broker itself."""


@broker.command("status")
@click.pass_obj
def broker_status(c: Context) -> None:
    """Uptime, disk use, retention, counters and what recovery found."""
    data = c.call(lambda b: b.admin("BrokerStatus"))
    table = Table(title=f"broker {data['broker_name']} at {c.broker}", title_justify="left",
                  show_header=False)  # fmt: skip
    for label, value in _status_rows(data):
        table.add_row(label, value)
    c.emit(data, table)


# ---- broker backup ----
@broker.command("backup")
@click.argument("directory")
@click.pass_obj
def broker_backup(c: Context, directory: str) -> None:
    """Write a consistent copy of the broker's data into DIRECTORY, while it serves.

    DIRECTORY is on the broker's machine: an absolute path, new or empty, outside the data
    directory. Restore by starting a broker on it (python -m mockbroker --data-dir DIRECTORY).
    """
    data = c.call(lambda b: b.admin("Backup", directory=directory))
    c.emit(
        data,
        f"backup written to {data['directory']} on the broker's machine: "
        f"{_bytes(data['bytes'])} in {data['files']} files, {data['messages']} messages, "
        f"the commit log up to position {data['commit_log_end']}, "
        f"in {int(data['duration_ms']) / 1000:.1f}s",
    )


# ---- end broker backup ----


def _status_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    """BrokerStatus in words and units; fields this version does not know, as they are."""
    shown: dict[str, tuple[str, Callable[[Any], str]]] = {
        "version": ("version", str),
        "uptime_ms": ("uptime", lambda v: _duration(int(v) / 1000)),
        "flush_mode": ("flush mode", str),
        "topic_count": ("topics", str),
        "messages_in_per_second": ("messages in", lambda v: f"{_rate(v)}/s (last minute)"),
        "messages_out_per_second": ("messages out", lambda v: f"{_rate(v)}/s (last minute)"),
        "messages_stored": ("messages stored since start", str),
        "messages_served": ("messages served since start", str),
        "held_pulls": ("pulls waiting for messages", str),
        "commit_log_bytes": ("commit log", _bytes),
        "disk_bytes": ("data directory", _bytes),
        "recovered_from_crash": ("recovered from a crash", lambda v: "yes" if v else "no"),
        "truncated_bytes_at_recovery": ("cut off at recovery", _bytes),
        "corrupt_records_detected": ("corrupt records found", str),
        "disk_total_bytes": ("disk size", _bytes),
        "disk_free_bytes": ("disk free", _bytes),
        "disk_used_ratio": ("disk used", lambda v: f"{float(v):.0%}"),
        "sends_refused": ("sends refused (disk full)", lambda v: "yes" if v else "no"),
        "retention_hours": ("retention", lambda v: f"{float(v):g} h"),
        "oldest_stored_timestamp_ms": ("oldest stored", _ms),
        "retention_deleted_messages": ("deleted by retention since start", str),
        "retention_expired_messages": ("expired by topics' own retention since start", str),
    }
    rows = [(label, show(data[name])) for name, (label, show) in shown.items() if name in data]
    rows += [
        (name.replace("_", " "), str(value))
        for name, value in data.items()
        if name not in shown and name not in ("broker_name", "retention")
    ]
    rows += [
        (f"oldest offsets {t['topic']}", ", ".join(map(str, t["min_offsets"])))
        for t in data.get("retention", [])
    ]
    return rows


def _duration(seconds: float) -> str:
    """The largest unit and the next: 5s, 3m 38s, 2h 0m, 4d 1h."""
    left = int(seconds)
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    for (unit, size), (small, small_size) in itertools.pairwise(units):
        if left >= size:
            return f"{left // size}{unit} {left % size // small_size}{small}"
    return f"{left}s"


def _rate(per_second: Any) -> str:
    value = float(per_second)
    return f"{value:.0f}" if value >= 10 or value == 0 else f"{value:.1f}"


def _bytes(count: Any) -> str:
    value, unit = float(count), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="ordermq")


if __name__ == "__main__":
    main()
