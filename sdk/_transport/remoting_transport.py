"""The Transport over RocketMQ 4.x remoting: endpoints written "rocketmq://ns1:9876;ns2:9876".

Routes come from the name servers (GET_ROUTEINFO_BY_TOPIC), every one asked and their
answers merged, refreshed every ROUTE_REFRESH_SECONDS, on `refresh` and after a failure;
each broker is then reached at its master's address. Messages are prepared as ordermq
frames, as on gRPC (so the spool and the accumulator work unchanged), and translated to
RocketMQ's message when sent (sdk/_remoting/translate.py): one message as
SEND_MESSAGE_V2, several as SEND_BATCH_MESSAGE. What RocketMQ cannot do raises
UnsupportedByTransportError: cancelling a scheduled message, delivery times other than
its 18 delay levels, receiving with an invisible time (pop), and fencing epochs (a
lock's epoch is always 0 here).

Transactions are RocketMQ's: a half message is SEND_MESSAGE_V2 with the prepared sysFlag,
ended by END_TRANSACTION (as a request); a transaction producer heartbeats as a producer
of its group to every broker and answers CHECK_TRANSACTION_STATE on those connections.

With credentials every request is signed as RocketMQ's AclClientRPCHook signs it
(sdk/_remoting/acl_signature.py), name server requests included, as Java clients do; an
ACL refusal (SYSTEM_ERROR with an AclException) raises AuthenticationError or
PermissionDeniedError.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from sdk._remoting.acl_signature import AclRefusal, acl_refusal, signed_fields
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk._remoting.connection import RemotingConnection
from sdk._remoting.message_ids import decode_offset_msg_id
from sdk._remoting.message_layout import (
    TRANSACTION_PREPARED_TYPE,
    decode_records,
    encode_batch_element,
)
from sdk._remoting.properties import encode_properties, representable
from sdk._remoting.translate import (
    UNIQ_KEY,
    OutgoingMessage,
    compressed,
    from_frame,
    retry_properties,
    to_message_ext,
)
from sdk._transport import ROCKETMQ_SCHEME
from sdk._transport.codec import encode_message
from sdk._transport.port_probe import speaks_http2
from sdk._transport.protocol import (
    Appended,
    GroupInfo,
    HalfSent,
    LockResult,
    MessageAnswer,
    PullResult,
    PullStatus,
    SendPart,
    SentBack,
    Subscription,
    TransactionCheck,
    Unanswered,
    UnlockResult,
    send_each,
)
from sdk._validation import DLQ_PREFIX, RETRY_PREFIX, split_tag_expression
from sdk._wire import DELAY_LEVEL_SECONDS, FRAME_LEN_PREFIX
from sdk.credentials import Credentials
from sdk.errors import (
    AuthenticationError,
    BrokerBusyError,
    BrokerError,
    BrokerUnavailableError,
    ClientStateError,
    CorruptRecordError,
    GroupNotFoundError,
    InvalidMessageError,
    InvalidTagExpressionError,
    NotSupportedError,
    OrderMQError,
    PermissionDeniedError,
    RequestTimeoutError,
    TLSError,
    TopicNotFoundError,
    UnsupportedByTransportError,
    WrongProtocolError,
)
from sdk.message import Message, MessageExt, MessageQueue, Receipt
from sdk.selector import queue_order
from sdk.tls import TLSConfig, speaks_tls, tls_hint, tls_refusal

log = logging.getLogger("ordermq.remoting")

#: How endpoints name this transport.
SCHEME = ROCKETMQ_SCHEME
#: Routes older than this are asked again (RocketMQ's pollNameServerInterval).
ROUTE_REFRESH_SECONDS = 30.0
#: The deadline of a request made without one.
REQUEST_SECONDS = 10.0
#: RocketMQ's maxMessageSize: the most one send carries (a batch's bodies together).
MAX_SEND_BYTES = 4 * 1024 * 1024
#: The producer group sends name (Java's default); ordermq's producers have none.
PRODUCER_GROUP = "DEFAULT_PRODUCER"
#: The topic whose route a producer borrows for a topic that does not exist yet (the broker
#: creates it on the first send, as RocketMQ's autoCreateTopicEnable does).
DEFAULT_TOPIC = "TBW102"
#: RocketMQ's default: a message is retried 16 times before it is dead-lettered.
DEFAULT_MAX_RECONSUME_TIMES = 16
#: PermName: the queue may be read, written.
PERM_READ, PERM_WRITE = 0x4, 0x2
#: PullSysFlag: suspend (long polling), the request carries its subscription.
PULL_SUSPEND, PULL_SUBSCRIPTION = 0x2, 0x4
#: END_TRANSACTION's commitOrRollback (MessageSysFlag's transaction types).
END_COMMIT, END_ROLLBACK = 0x8, 0xC
#: The one "broker" a transaction producer watches: checks come on every broker connection.
ALL_BROKERS = "*"
#: A transaction producer heartbeats again this often (RocketMQ's heartbeatBrokerInterval).
HEARTBEAT_SECONDS = 30.0
#: Half messages whose commit-log position is kept for their END_TRANSACTION.
MAX_REMEMBERED_HALVES = 10_000
#: RocketMQ's properties: transactional, producer group, check-backs so far.
TRAN_MSG, PGROUP, CHECK_TIMES = "TRAN_MSG", "PGROUP", "TRANSACTION_CHECK_TIMES"
_UNQUOTED_KEY = re.compile(r"([{,])\s*(-?\d+)\s*:")

#: RocketMQ's answers -> ordermq's errors (others: BrokerError).
_ERRORS: dict[int, type[OrderMQError]] = {
    ResponseCode.SYSTEM_BUSY: BrokerBusyError,
    ResponseCode.FLOW_CONTROL: BrokerBusyError,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: NotSupportedError,
    ResponseCode.MESSAGE_ILLEGAL: InvalidMessageError,
    ResponseCode.SERVICE_NOT_AVAILABLE: BrokerUnavailableError,
    ResponseCode.TOPIC_NOT_EXIST: TopicNotFoundError,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: InvalidTagExpressionError,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: GroupNotFoundError,
}


def refused(response: RemotingCommand, what: str) -> OrderMQError:
    """The error for a RocketMQ answer other than SUCCESS; the server's remark kept."""
    try:
        name = ResponseCode(response.code).name
    except ValueError:
        name = f"CODE_{response.code}"
    # The ACL's refusals: SYSTEM_ERROR with RocketMQ's AclException in the remark.
    refusal = acl_refusal(response.code, response.remark)
    if refusal is AclRefusal.UNAUTHENTICATED:
        return AuthenticationError(f"{what}: {response.remark}", code=name, reason=refusal.name)
    if refusal is AclRefusal.PERMISSION_DENIED:
        return PermissionDeniedError(f"{what}: {response.remark}", code=name, reason=refusal.name)
    cls = _ERRORS.get(response.code, BrokerError)
    return cls(f"{what}: {name}: {response.remark or 'no remark'}", code=name)


def unsupported(what: str) -> UnsupportedByTransportError:
    """UnsupportedByTransportError naming this transport."""
    return UnsupportedByTransportError(what, transport=SCHEME)


@dataclass(frozen=True, slots=True)
class _Route:
    """A topic's queues as a name server answered, and when."""

    readable: list[MessageQueue]
    writable: list[MessageQueue]
    fetched_at: float


def _stale(route: _Route) -> bool:
    """Whether `route` is due to be asked for again."""
    return time.monotonic() - route.fetched_at > ROUTE_REFRESH_SECONDS


class RemotingTransport:
    """Name servers, a connection per broker, and cached routes; use on one event loop.

    `name_servers`: "host:port" each, all asked, their routes merged. With
    `credentials` every request is signed for that account of the brokers' plain ACL.
    """

    max_send_bytes = MAX_SEND_BYTES

    def __init__(
        self,
        name_servers: Sequence[str],
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.name_servers = list(name_servers)
        self.tls = tls
        self._credentials = credentials
        #: One context for every connection (name servers and brokers alike, as RocketMQ's
        #: clients do with tls.enable); made now, so that a bad file fails at once.
        self._tls_context = tls.ssl_context() if tls is not None else None
        self._answered: set[str] = set()  # addresses that answered a request
        self._connections: dict[str, RemotingConnection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._routes: dict[str, _Route] = {}
        self._addresses: dict[str, str] = {}  # broker name -> master address
        self._down: set[str] = set()  # brokers kept in routes they left, registered nowhere
        self._groups: set[str] = set()
        self._heartbeat_body: bytes | None = None  # the last HEART_BEAT's, for new connections
        self._versions: dict[str, int] = {}  # group -> membership changes seen
        self._membership_changed: asyncio.Condition | None = None
        self._closed = False
        # A transaction producer's: its group and client id, the connections that
        # heartbeated as it, the check-backs received, half messages' commit-log positions.
        self._producer: tuple[str, str] | None = None
        self._producer_beats: dict[str, RemotingConnection] = {}
        self._checks: asyncio.Queue[TransactionCheck] | None = None
        self._half_positions: dict[str, int] = {}

    # ------------------------------------------------------------------ connections
    async def _connection(self, address: str) -> RemotingConnection:
        if self._closed:
            raise ClientStateError(f"the client is shut down; no connection to {address}")
        connection = self._connections.get(address)
        if connection is not None and not connection.closed:
            return connection
        lock = self._connecting.setdefault(address, asyncio.Lock())
        async with lock:
            connection = self._connections.get(address)
            if connection is None or connection.closed:
                connection = await RemotingConnection.open(
                    address,
                    lambda command: self._on_request(command, address),
                    tls=self.tls,
                    tls_context=self._tls_context,
                )
                if self._closed:
                    await connection.close()
                    raise ClientStateError("the client is shut down")
                self._connections[address] = connection
                self._membership_touched(list(self._versions))  # missed while away
                await self._greet(connection, address)
        return connection

    async def _greet(self, connection: RemotingConnection, address: str) -> None:
        """The last heartbeat again, first on a new connection to a broker.

        A broker knows a client by the connection it heartbeats on: one that restarted
        (or dropped the connection) would refuse the client's locks ("not a member") and
        its offset commits (the queue "locked by" this very client, restored from disk)
        until the next heartbeat, up to an interval later.
        """
        body = self._heartbeat_body
        if body is None or address in self.name_servers:
            return
        fields: dict[str, str] = {}
        credentials = self._credentials
        if credentials is not None:
            fields = signed_fields(fields, body, credentials.access_key, credentials.secret_key)
        command = RemotingCommand(code=int(RequestCode.HEART_BEAT), ext_fields=fields, body=body)
        try:
            response = await connection.request(command, REQUEST_SECONDS)
        except OrderMQError as exc:
            log.info("heartbeat on the new connection to %s failed: %s", address, exc)
            return
        if response.code != ResponseCode.SUCCESS:
            log.info("heartbeat on the new connection to %s refused: %s", address,
                     refused(response, "heartbeat"))  # fmt: skip

    async def _call(
        self,
        address: str,
        code: int,
        fields: dict[str, str],
        *,
        body: bytes = b"",
        timeout: float | None = None,
    ) -> RemotingCommand:
        connection = await self._connection(address)
        credentials = self._credentials
        if credentials is not None:
            fields = signed_fields(fields, body, credentials.access_key, credentials.secret_key)
        command = RemotingCommand(code=int(code), ext_fields=fields, body=body)
        try:
            response = await connection.request(
                command, REQUEST_SECONDS if timeout is None else timeout
            )
        except BrokerError as exc:  # unreachable, or what answered sent no remoting frame
            raise await self._why_unreachable(address) or exc from None
        self._answered.add(address)
        return response

    async def _why_unreachable(self, address: str) -> TLSError | WrongProtocolError | None:
        """The TLS failure or wrong port behind a connection that failed (see BrokerClient)."""
        if address in self._answered:
            return None  # TLS worked with it: this failure is the network's or the broker's
        if self.tls is None:
            if await speaks_tls(address):
                return TLSError(
                    f"{address} serves RocketMQ remoting over TLS only: give the client "
                    "tls=sdk.TLSConfig(ca_file=...)"
                )
            if await speaks_http2(address):
                return WrongProtocolError(
                    f"{address} answers gRPC (HTTP/2), not RocketMQ remoting: for an "
                    f"ordermq broker's port give {address} without rocketmq://; RocketMQ's "
                    "remoting is served on the name server's and brokers' remoting ports"
                )
            return None
        reason = await tls_refusal(address, self.tls, self._tls_context)
        if reason is None:
            return None
        return TLSError(f"TLS connection to {address} failed: {tls_hint(reason, self.tls)}")

    async def _broker_call(
        self, queue: MessageQueue, code: int, fields: dict[str, str], what: str, **kw: Any
    ) -> RemotingCommand:
        """A request to the broker of `queue`; SUCCESS, else its error."""
        response = await self._at_broker(queue, code, fields, **kw)
        if response.code != ResponseCode.SUCCESS:
            raise refused(response, what)
        return response

    async def _at_broker(
        self,
        queue: MessageQueue,
        code: int,
        fields: dict[str, str],
        *,
        body: bytes = b"",
        timeout: float | None = None,
    ) -> RemotingCommand:
        """A request to the broker of `queue`, its answer whatever its code.

        BrokerUnavailableError names the broker (its name and address) when it cannot be
        reached, and says so when it has left the name servers' routes.
        """
        address = self._address(queue)
        try:
            return await self._call(address, code, fields, body=body, timeout=timeout)
        except BrokerUnavailableError as exc:
            gone = (
                " (it left the name servers' routes; its queues are kept for keyed "
                "messages, which fail until it returns)"
                if queue.broker_name in self._down
                else ""
            )
            raise BrokerUnavailableError(
                f"broker {queue.broker_name!r} at {address}{gone}: {exc.message}",
                code=exc.code, reason=exc.reason,
            ) from None  # fmt: skip

    def _address(self, queue: MessageQueue) -> str:
        address = self._addresses.get(queue.broker_name)
        if address is None:
            raise BrokerUnavailableError(
                f"no route names broker {queue.broker_name!r} (of {queue.topic!r})"
            )
        return address

    def _on_request(self, command: RemotingCommand, address: str) -> None:
        if command.code == RequestCode.CHECK_TRANSACTION_STATE:
            self._check_requested(command, address)
        elif command.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            group = (command.ext_fields or {}).get("consumerGroup")
            if group:
                self._membership_touched([group])

    async def close(self) -> None:
        """Close every connection; no new one is opened after this."""
        self._closed = True
        connections, self._connections = self._connections, {}
        await asyncio.gather(*(c.close() for c in connections.values()))
        self._membership_touched(list(self._versions))

    # ------------------------------------------------------------------ routes
    async def _route(self, topic: str, *, refresh: bool = False) -> _Route:
        route = self._routes.get(topic)
        if refresh or route is None or _stale(route):
            try:
                fresh = await self._query_route(topic)
            except (BrokerUnavailableError, RequestTimeoutError) as exc:
                if route is None or refresh:
                    raise
                log.info("route of %s not refreshed (%s); keeping the last one", topic, exc)
            except TopicNotFoundError:
                # Every broker of the topic left the routes: those registered nowhere keep
                # their queues (not the default topic's brokers' queues, for keyed sends).
                kept = None
                if route is not None and (route.readable or route.writable):
                    empty = _Route([], [], time.monotonic())
                    kept = await self._keep_unregistered(topic, route, empty)
                if kept is None or not (kept.readable or kept.writable):
                    raise
                route = self._routes[topic] = kept
            else:
                route = self._routes[topic] = await self._keep_unregistered(topic, route, fresh)
        assert route is not None
        return route

    async def _keep_unregistered(self, topic: str, old: _Route | None, new: _Route) -> _Route:
        """`new`, plus the queues of brokers it lost that are no longer registered.

        A name server drops a broker that stopped or died (at once, or after its silence);
        were its queues dropped too, keyed sends would hash over fewer queues and land on
        other queues than their earlier messages. So a broker missing from the new route
        keeps its queues while no name server knows it (GET_BROKER_CLUSTER_INFO): sends to
        them fail naming it, and it takes them back when it registers again. A broker still
        registered lost the topic (deleted there): its queues go.
        """
        if old is None:
            return new
        present = {q.broker_name for q in [*new.readable, *new.writable]}
        missing = {q.broker_name for q in [*old.readable, *old.writable]} - present - {""}
        for name in present:
            self._down.discard(name)
        if not missing:
            return new
        registered = await self._registered_brokers()
        kept = sorted(missing - registered)
        for name in kept:
            if name not in self._down:
                log.warning(
                    "broker %s left the route of %s and no name server knows it: its queues "
                    "are kept, their sends fail until it returns", name, topic,
                )  # fmt: skip
            self._down.add(name)
        if not kept:
            return new
        return _Route(
            sorted(
                [*new.readable, *(q for q in old.readable if q.broker_name in kept)],
                key=queue_order,
            ),
            sorted(
                [*new.writable, *(q for q in old.writable if q.broker_name in kept)],
                key=queue_order,
            ),
            new.fetched_at,
        )

    async def _registered_brokers(self) -> set[str]:
        """The broker names any name server that answers has registered (none: empty)."""
        return set(await self._registered_masters())

    async def _registered_masters(self) -> dict[str, str]:
        """Broker name -> its master's address ("" for none), from the name servers.

        Those that answer; none: empty.
        """

        async def ask(address: str) -> dict[str, str]:
            response = await self._call(address, RequestCode.GET_BROKER_CLUSTER_INFO, {})
            if response.code != ResponseCode.SUCCESS:
                raise refused(response, f"the brokers registered with {address}")
            text = response.body.decode()
            try:
                data = json.loads(text)
            except json.JSONDecodeError:  # fastjson writes integer map keys unquoted
                data = json.loads(_UNQUOTED_KEY.sub(r'\1"\2":', text))
            table = data["brokerAddrTable"]
            return {
                str(name): str(((entry or {}).get("brokerAddrs") or {}).get("0", ""))
                for name, entry in table.items()
            }

        answers = await asyncio.gather(
            *(ask(address) for address in self.name_servers), return_exceptions=True
        )
        masters: dict[str, str] = {}
        for answer in answers:
            if isinstance(answer, dict):
                for name, address in answer.items():
                    masters[name] = masters.get(name) or address
            elif isinstance(answer, OrderMQError | ValueError | KeyError | TypeError):
                log.info("registered brokers not known: %s", answer)
            else:
                raise answer
        return masters

    async def _query_route(self, topic: str) -> _Route:
        """Ask every name server at once, and merge the routes of those that answered.

        Name servers may know different brokers (one registered with only some of them, or
        one restarted and not yet told again): the topic's queues are those any of them
        routes. TopicNotFoundError only when none routes it.
        """
        answers = await asyncio.gather(
            *(self._ask_route(address, topic) for address in self.name_servers),
            return_exceptions=True,
        )
        routes = [a for a in answers if isinstance(a, _Route)]
        if routes:
            return _Route(
                sorted({q for r in routes for q in r.readable}, key=queue_order),
                sorted({q for r in routes for q in r.writable}, key=queue_order),
                min(r.fetched_at for r in routes),
            )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, OrderMQError):
                raise answer
        errors = [a for a in answers if isinstance(a, OrderMQError)]
        refusals = [
            e for e in errors if not isinstance(e, BrokerUnavailableError | RequestTimeoutError)
        ]
        not_found = [e for e in refusals if isinstance(e, TopicNotFoundError)]
        if not_found or refusals:
            raise (not_found or refusals)[0]
        raise BrokerUnavailableError(
            f"no name server of {', '.join(self.name_servers)} answered: {errors[-1]}"
        )

    async def _ask_route(self, address: str, topic: str) -> _Route:
        """GET_ROUTEINFO_BY_TOPIC at one name server."""
        response = await self._call(address, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if response.code != ResponseCode.SUCCESS:
            raise refused(response, f"the route of topic {topic!r} from {address}")
        return self._parse_route(topic, response.body, address)

    def _parse_route(self, topic: str, body: bytes, source: str) -> _Route:
        try:
            text = body.decode()
            try:
                data = json.loads(text)
            except json.JSONDecodeError:  # fastjson writes integer map keys unquoted
                data = json.loads(_UNQUOTED_KEY.sub(r'\1"\2":', text))
            masters = {
                b["brokerName"]: b["brokerAddrs"]["0"]
                for b in data["brokerDatas"]
                if "0" in (b.get("brokerAddrs") or {})
            }
            readable, writable = [], []
            for q in data["queueDatas"]:
                name, perm = q["brokerName"], int(q["perm"])
                if name not in masters:
                    continue
                if perm & PERM_READ:
                    readable += [MessageQueue(topic, name, i) for i in range(q["readQueueNums"])]
                if perm & PERM_WRITE:
                    writable += [MessageQueue(topic, name, i) for i in range(q["writeQueueNums"])]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BrokerError(
                f"the name server {source} sent a route for {topic!r} that does not parse: "
                f"{type(exc).__name__}: {exc}",
                code="MALFORMED_RESPONSE",
            ) from None
        self._addresses.update(masters)
        return _Route(
            sorted(readable, key=queue_order), sorted(writable, key=queue_order), time.monotonic()
        )

    async def readable_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        """The queues consumers may read, sorted."""
        return (await self._route(topic, refresh=refresh)).readable

    def known_writable_queues(self, topic: str) -> list[MessageQueue] | None:
        """See Transport.known_writable_queues (a route is asked for again once stale)."""
        route = self._routes.get(topic)
        return None if route is None or _stale(route) else route.writable or None

    async def writable_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        """The queues producers may write; a new topic borrows DEFAULT_TOPIC's brokers.

        A borrowed route is kept (already stale, so the topic's own is asked for at the next
        call) for sends that retry while the name servers cannot be reached.
        """
        try:
            queues = (await self._route(topic, refresh=refresh)).writable
        except TopicNotFoundError:
            default = await self._route(DEFAULT_TOPIC, refresh=refresh)
            queues = [MessageQueue(topic, q.broker_name, q.queue_id) for q in default.writable]
            self._routes[topic] = _Route([], queues, fetched_at=-ROUTE_REFRESH_SECONDS)
        if not queues:
            raise BrokerUnavailableError(f"topic {topic!r} has no writable queue")
        return queues

    # ------------------------------------------------------------------ producing
    def prepare(
        self,
        message: Message,
        msg_id: bytes,
        now_s: float,
        extra_properties: dict[str, str] | None = None,
    ) -> bytes:
        """The message's ordermq frame, if RocketMQ can carry it.

        A delay must be one of RocketMQ's delay levels; keys cannot hold a space (RocketMQ
        joins them with spaces), nor properties an empty value or its separators.
        """
        if any(" " in key for key in message.keys):
            raise unsupported(f"message keys with a space, such as {message.keys!r}")
        bad = [n for n, v in message.properties.items() if not representable(n, v)]
        if bad:
            raise unsupported(
                f"the properties {', '.join(map(repr, bad))}: RocketMQ's properties need "
                "non-empty values, and no U+0001 in names or U+0002 anywhere"
            )
        if message.deliver_at is not None:
            raise unsupported(
                "a delivery time (deliver_at); give delay_seconds, one of RocketMQ's delay "
                f"levels {DELAY_LEVEL_SECONDS}"
            )
        level = 0
        if message.delay_seconds is not None:
            if message.delay_seconds not in DELAY_LEVEL_SECONDS:
                raise unsupported(
                    f"a delay of {message.delay_seconds:g} s; RocketMQ delays by its levels "
                    f"only, in seconds {DELAY_LEVEL_SECONDS}"
                )
            level = DELAY_LEVEL_SECONDS.index(message.delay_seconds) + 1
        return encode_message(message, msg_id, now_s, extra_properties, delay_level=level)

    def prepare_many(
        self, messages: Sequence[Message], ids: Sequence[bytes], now_s: float
    ) -> list[bytes]:
        """`prepare` for each message of a send, in order."""
        return [self.prepare(m, i, now_s) for m, i in zip(messages, ids, strict=True)]

    @staticmethod
    def prepare_spooled(record: bytes) -> bytes:
        """The spool keeps frames without their length prefix: put it back."""
        return FRAME_LEN_PREFIX.pack(len(record)) + record

    async def send(
        self, queue: MessageQueue, prepared: Sequence[bytes], *, timeout: float | None = None
    ) -> Appended:
        """One SEND_MESSAGE_V2, or one SEND_BATCH_MESSAGE; delayed messages one by one.

        RocketMQ takes no delay in a batch; the producer never mixes delayed and other
        messages in one send.
        """
        try:
            messages = [from_frame(memoryview(p)[FRAME_LEN_PREFIX.size :]) for p in prepared]
        except ValueError as exc:
            raise InvalidMessageError(f"cannot send over {SCHEME}: {exc}") from None
        if len(messages) == 1 or any(m.delay_level for m in messages):
            sent = [await self._send_one(queue, m, timeout) for m in messages]
            if len(sent) == 1:
                return sent[0]
            return Appended(
                all(s.durable for s in sent), sent[0].first_offset, len(sent), sent[0].scheduled
            )
        body = b"".join(encode_batch_element(m.body, m.properties) for m in messages)
        header = self._send_header(queue, messages[0].born_timestamp_ms, "", 0)
        header["m"] = "true"
        response = await self._at_broker(
            queue, RequestCode.SEND_BATCH_MESSAGE, header, body=body, timeout=timeout
        )
        return self._appended(queue, response, len(messages), scheduled=False)

    async def _send_one(
        self, queue: MessageQueue, message: OutgoingMessage, timeout: float | None
    ) -> Appended:
        message = compressed(message)
        header = self._send_header(
            queue, message.born_timestamp_ms, encode_properties(message.properties),
            message.sys_flag,
        )  # fmt: skip
        response = await self._at_broker(
            queue, RequestCode.SEND_MESSAGE_V2, header, body=message.body, timeout=timeout
        )
        return self._appended(queue, response, 1, scheduled=bool(message.delay_level))

    def _send_header(
        self, queue: MessageQueue, born_ms: int, properties: str, sys_flag: int
    ) -> dict[str, str]:
        """SEND_MESSAGE_V2's one-letter header (SendMessageRequestHeaderV2)."""
        default_queues = len(self._routes[DEFAULT_TOPIC].writable) if (
            DEFAULT_TOPIC in self._routes
        ) else 4  # fmt: skip
        return {
            "a": PRODUCER_GROUP, "b": queue.topic, "c": DEFAULT_TOPIC, "d": str(default_queues),
            "e": str(queue.queue_id), "f": str(sys_flag), "g": str(born_ms), "h": "0",
            "i": properties, "j": "0", "k": "false", "m": "false", "n": queue.broker_name,
        }  # fmt: skip

    @staticmethod
    def _appended(
        queue: MessageQueue, response: RemotingCommand, count: int, *, scheduled: bool
    ) -> Appended:
        durable = response.code == ResponseCode.SUCCESS
        if not durable and response.code not in (
            ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT,
            ResponseCode.SLAVE_NOT_AVAILABLE,
        ):  # fmt: skip
            raise refused(response, f"send to {queue.topic} queue {queue.queue_id}")
        fields = response.ext_fields or {}
        try:
            first = int(fields.get("queueOffset", "-1"))
            queue_id = int(fields.get("queueId", "-1"))
        except ValueError:
            first, queue_id = -1, -1
        moved = queue_id if queue_id not in (-1, queue.queue_id) else -1
        return Appended(durable, first, count, scheduled, moved, _answers(fields, count))

    async def send_parts(
        self, parts: Sequence[SendPart], *, timeout: float | None = None
    ) -> list[Appended | OrderMQError]:
        """One request per part: RocketMQ's SEND_BATCH_MESSAGE carries one queue's messages."""
        return await send_each(self, parts, timeout)

    async def cancel_scheduled(self, msg_id: str) -> bool:
        """RocketMQ cannot take back a scheduled message."""
        raise unsupported(f"cancelling scheduled message {msg_id}")

    async def park_key(
        self, group: str, client_id: str, message: MessageExt, *, epoch: int, reason: str
    ) -> int:
        """RocketMQ has no parked keys (KeyFailurePolicy.PARK needs ordermq's broker)."""
        raise unsupported(f"parking key {message.sharding_key!r} (KeyFailurePolicy.PARK)")

    # ------------------------------------------------------------------ consuming
    async def subscribe(
        self,
        group: str,
        queue: MessageQueue,
        offset: int,
        *,
        client_id: str,
        lock_epoch: int,
        credit_messages: int,
        credit_bytes: int,
        max_messages: int = 1000,
        max_bytes: int = 4 * 1024 * 1024,
        tag_expression: str = "*",
    ) -> Subscription:
        """RocketMQ's remoting has no push delivery: the consumer pulls."""
        raise unsupported("push delivery (delivery='push'); the consumer pulls instead")

    async def pull(
        self,
        group: str,
        queue: MessageQueue,
        offset: int,
        *,
        max_messages: int = 1000,
        max_bytes: int = 4 * 1024 * 1024,
        tag_expression: str = "*",
        suspend_timeout: float = 0.0,
        timeout: float | None = None,
    ) -> PullResult:
        """PULL_MESSAGE with the subscription; tags filtered again here, by name."""
        tags = split_tag_expression(tag_expression)
        flags = PULL_SUBSCRIPTION | (PULL_SUSPEND if suspend_timeout > 0 else 0)
        fields = {
            "consumerGroup": group, "topic": queue.topic, "queueId": str(queue.queue_id),
            "queueOffset": str(offset), "maxMsgNums": str(max_messages), "sysFlag": str(flags),
            "commitOffset": "0", "suspendTimeoutMillis": str(int(suspend_timeout * 1000)),
            "subscription": tag_expression or "*", "subVersion": "0", "expressionType": "TAG",
        }  # fmt: skip
        deadline = timeout if timeout is not None else suspend_timeout + REQUEST_SECONDS
        response = await self._at_broker(queue, RequestCode.PULL_MESSAGE, fields, timeout=deadline)
        status = _PULL_STATUS.get(response.code)
        if status is None:
            raise refused(response, f"pull of {queue.topic} queue {queue.queue_id}")
        ext = response.ext_fields or {}
        try:
            next_offset, low, high = (
                int(ext[k]) for k in ("nextBeginOffset", "minOffset", "maxOffset")
            )
            records = decode_records(response.body) if status is PullStatus.FOUND else []
        except (KeyError, ValueError) as exc:
            raise CorruptRecordError(
                f"pull of {queue.topic} queue {queue.queue_id}: the answer does not decode: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        messages = [to_message_ext(r, queue.broker_name) for r in records]
        if tags is not None:
            messages = [m for m in messages if m.tags in tags]
        return PullResult(status, next_offset, low, high, messages)

    async def queue_offsets(
        self, queue: MessageQueue, timestamp_ms: int = 0
    ) -> tuple[int, int, int]:
        """GET_MIN_OFFSET, GET_MAX_OFFSET and SEARCH_OFFSET_BY_TIMESTAMP."""
        where = {"topic": queue.topic, "queueId": str(queue.queue_id)}
        low = await self._offset(queue, RequestCode.GET_MIN_OFFSET, where)
        high = await self._offset(queue, RequestCode.GET_MAX_OFFSET, where)
        at = low
        if timestamp_ms > 0:
            at = await self._offset(
                queue,
                RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                {**where, "timestamp": str(timestamp_ms)},
            )
        return low, high, at

    async def _offset(self, queue: MessageQueue, code: int, fields: dict[str, str]) -> int:
        response = await self._broker_call(queue, code, fields, f"offset of {queue}")
        return _int_field(response, "offset")

    async def query_offset(self, group: str, queue: MessageQueue) -> int | None:
        """QUERY_CONSUMER_OFFSET; None when the group never committed one."""
        fields = {"consumerGroup": group, "topic": queue.topic, "queueId": str(queue.queue_id)}
        response = await self._at_broker(queue, RequestCode.QUERY_CONSUMER_OFFSET, fields)
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise refused(response, f"offset of group {group!r} for {queue}")
        return _int_field(response, "offset")

    async def commit_offsets(
        self, group: str, client_id: str, offsets: Sequence[tuple[MessageQueue, int, int]]
    ) -> None:
        """UPDATE_CONSUMER_OFFSET per queue, each answered; epochs do not exist here."""
        for queue, offset, _epoch in offsets:
            fields = {
                "consumerGroup": group, "topic": queue.topic, "queueId": str(queue.queue_id),
                "commitOffset": str(offset),
            }  # fmt: skip
            await self._broker_call(
                queue, RequestCode.UPDATE_CONSUMER_OFFSET, fields, f"commit of {queue}"
            )

    async def send_back(
        self,
        group: str,
        message: MessageExt,
        *,
        delay_level: int = 0,
        max_reconsume_times: int = 0,
        reconsume_times: int = 0,
    ) -> SentBack:
        """CONSUMER_SEND_MSG_BACK at the broker storing the message, or a retry-topic copy.

        When the broker refuses it, a copy goes to `%RETRY%<group>` there, as RocketMQ's
        client falls back. The decision is the same either way, and ordermq's as on gRPC:
        dead-lettered once `reconsume_times` reached the limit, else retried with the count
        one higher after `delay_level` (0: 3 + the count).
        """
        times = max(message.reconsume_times, reconsume_times)
        limit = max_reconsume_times or DEFAULT_MAX_RECONSUME_TIMES
        dead = times >= limit
        sent = SentBack(dead, (DLQ_PREFIX if dead else RETRY_PREFIX) + group, times + (not dead))
        if message.commit_log_offset >= 0:
            try:
                await self._send_msg_back(group, message, -1 if dead else delay_level, limit)
                return sent
            except OrderMQError as exc:
                log.info("send-back of %s refused (%s); sending it to %s",
                         message.msg_id, exc, RETRY_PREFIX + group)  # fmt: skip
        await self._send_to_retry_topic(group, message, dead, times, delay_level)
        return sent

    async def _send_msg_back(
        self, group: str, message: MessageExt, delay_level: int, limit: int
    ) -> None:
        """CONSUMER_SEND_MSG_BACK: the broker copies the record at its commit-log offset.

        `delay_level` -1 sends it straight to the dead-letter topic.
        """
        fields = {
            "offset": str(message.commit_log_offset), "group": group,
            "delayLevel": str(delay_level), "originMsgId": message.msg_id,
            "originTopic": message.topic, "unitMode": "false",
            "maxReconsumeTimes": str(limit),
        }  # fmt: skip
        await self._broker_call(
            message.queue, RequestCode.CONSUMER_SEND_MSG_BACK, fields,
            f"send-back of {message.msg_id}",
        )  # fmt: skip

    async def _send_to_retry_topic(
        self, group: str, message: MessageExt, dead: bool, times: int, delay_level: int
    ) -> None:
        """A copy of the message sent to `%RETRY%<group>`.

        The broker files it under the retry topic, or under `%DLQ%<group>` once the count
        it is sent reaches the limit it is sent.
        """
        retry_topic = RETRY_PREFIX + group
        level = 0 if dead else min(delay_level or 3 + times, len(DELAY_LEVEL_SECONDS))
        count, sent_limit = (times, times) if dead else (times + 1, times + 2)
        header = self._send_header(
            MessageQueue(retry_topic, message.queue.broker_name, 0),
            message.born_timestamp, encode_properties(retry_properties(message, level)), 0,
        )  # fmt: skip
        header.update({"j": str(count), "l": str(sent_limit)})
        response = await self._at_broker(
            message.queue, RequestCode.SEND_MESSAGE_V2, header, body=message.body
        )
        if response.code != ResponseCode.SUCCESS:
            raise refused(response, f"send-back of {message.msg_id} to {retry_topic}")

    # ------------------------------------------------------------------ receiving (pop)
    async def receive(
        self,
        group: str,
        topic: str,
        *,
        max_messages: int,
        invisible_duration: float,
        await_duration: float,
        tag_expression: str = "*",
        fifo: bool = False,
        max_delivery_attempts: int = 0,
    ) -> list[MessageExt]:
        """RocketMQ 4.x has no pop."""
        raise unsupported("receiving with an invisible time (SimpleConsumer)")

    async def ack(self, receipt: Receipt) -> None:
        """RocketMQ 4.x has no pop."""
        raise unsupported("acking a received message (SimpleConsumer)")

    async def change_invisible_duration(self, receipt: Receipt, seconds: float) -> Receipt:
        """RocketMQ 4.x has no pop."""
        raise unsupported("changing a received message's invisible duration (SimpleConsumer)")

    # ------------------------------------------------------------------ membership
    async def heartbeat(self, client_id: str, groups: Sequence[GroupInfo]) -> None:
        """HEART_BEAT with the groups and their subscriptions, to every known broker.

        Every broker gets it, at once, whichever others cannot be reached: the first
        failure (naming its broker) is raised after all were tried.
        """
        self._groups.update(g.group for g in groups)
        body = json.dumps({
            "clientID": client_id,
            "consumerDataSet": [_consumer_data(g) for g in groups],
            "producerDataSet": [],
        }).encode()  # fmt: skip
        self._heartbeat_body = body
        names: dict[str, list[str]] = {}
        for name, address in sorted(self._addresses.items()):
            names.setdefault(address, []).append(name)

        async def beat(address: str) -> None:
            brokers = "broker " + ", ".join(repr(n) for n in names[address])
            try:
                response = await self._call(address, RequestCode.HEART_BEAT, {}, body=body)
            except BrokerUnavailableError as exc:
                raise BrokerUnavailableError(
                    f"heartbeat to {brokers} at {address}: {exc.message}", code=exc.code
                ) from None
            if response.code != ResponseCode.SUCCESS:
                raise refused(response, f"heartbeat to {brokers} at {address}")

        outcomes = await asyncio.gather(*(beat(a) for a in sorted(names)), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def unregister(self, client_id: str) -> None:
        """UNREGISTER_CLIENT for each group, at every known broker; the first failure last."""
        first: OrderMQError | None = None
        for address in sorted(set(self._addresses.values())):
            groups: list[str | None] = [*sorted(self._groups)] or [None]
            for group in groups:
                fields = {"clientID": client_id}
                if group is not None:
                    fields["consumerGroup"] = group
                try:
                    response = await self._call(address, RequestCode.UNREGISTER_CLIENT, fields)
                    if response.code != ResponseCode.SUCCESS:
                        raise refused(response, f"unregister at {address}")
                except OrderMQError as exc:
                    first = first or exc
        if first is not None:
            raise first

    async def consumer_list(self, group: str, topic: str) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP at every broker serving `topic`: the union.

        Each broker knows the members that heartbeated to it; one just restarted knows only
        those that did since, and its answer alone would shrink the group and move queues
        of every broker. So each is asked, at once, and a member any of them knows counts.
        Brokers known to be down are asked only when none of the others answers; one that
        cannot be reached is passed over, so a dead broker does not stop the group's
        rebalancing on the others.
        """
        queues = await self.readable_queues(topic)
        if not queues:
            raise BrokerUnavailableError(f"topic {topic!r} has no readable queue")
        first: dict[str, MessageQueue] = {}
        for q in queues:
            first.setdefault(q.broker_name, q)
        up = [q for q in first.values() if q.broker_name not in self._down]
        down = [q for q in first.values() if q.broker_name in self._down]
        error: BrokerUnavailableError | RequestTimeoutError | None = None
        for batch in (up, down):
            if not batch:
                continue
            answers = await asyncio.gather(
                *(self._members_at(q, group) for q in batch), return_exceptions=True
            )
            members: set[str] = set()
            answered = False
            for queue, answer in zip(batch, answers, strict=True):
                if isinstance(answer, BrokerUnavailableError | RequestTimeoutError):
                    log.info("members of %s not known by %s (%s)", group, queue.broker_name,
                             answer)  # fmt: skip
                    error = error or answer
                elif isinstance(answer, BaseException):
                    raise answer
                else:
                    members.update(answer)
                    answered = True
            if answered:
                return sorted(members)
        assert error is not None
        raise error

    async def _members_at(self, queue: MessageQueue, group: str) -> list[str]:
        """The members of `group` that `queue`'s broker knows."""
        response = await self._broker_call(
            queue, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group},
            f"members of group {group!r}",
        )  # fmt: skip
        try:
            members = json.loads(response.body)["consumerIdList"]
            return [str(m) for m in members]
        except (ValueError, KeyError, TypeError) as exc:
            raise BrokerError(
                f"the members of {group!r} do not parse: {exc}", code="MALFORMED_RESPONSE"
            ) from None

    async def watch_membership(self, group: str, known_version: int) -> AsyncIterator[int]:
        """Changes the brokers announce (NOTIFY_CONSUMER_IDS_CHANGED), and reconnections."""
        if self._membership_changed is None:
            self._membership_changed = asyncio.Condition()
        self._versions.setdefault(group, 0)
        seen = known_version
        while True:
            if self._closed:
                raise ClientStateError("the client is shut down")
            current = self._versions[group]
            if current != seen:
                seen = current
                yield current
                continue
            async with self._membership_changed:
                await self._membership_changed.wait()

    def _membership_touched(self, groups: list[str]) -> None:
        for group in groups:
            self._versions[group] = self._versions.get(group, 0) + 1
        condition = self._membership_changed
        if condition is not None and groups:
            asyncio.get_running_loop().create_task(_notify_all(condition))

    # ------------------------------------------------------------------ locks
    # ------------------------------------------------------------------ transactions
    async def send_half(
        self, queue: MessageQueue, prepared: bytes, group: str, *, timeout: float | None = None
    ) -> HalfSent:
        """SEND_MESSAGE_V2 with the prepared sysFlag, TRAN_MSG and PGROUP, as RocketMQ's.

        The connection first heartbeats as a producer of `group`, so that the broker
        checks back this transaction with it. The transaction id is "<UNIQ_KEY>-<half
        queue offset>" (the gRPC front's form); the broker is the queue's address.
        """
        try:
            message = from_frame(memoryview(prepared)[FRAME_LEN_PREFIX.size :])
        except ValueError as exc:
            raise InvalidMessageError(f"cannot send over {SCHEME}: {exc}") from None
        address = self._address(queue)
        await self._as_producer(address, group)
        message = compressed(message)
        properties = {**message.properties, TRAN_MSG: "true", PGROUP: group}
        header = self._send_header(
            queue, message.born_timestamp_ms, encode_properties(properties),
            message.sys_flag | TRANSACTION_PREPARED_TYPE,
        )  # fmt: skip
        header["a"] = group
        response = await self._at_broker(
            queue, RequestCode.SEND_MESSAGE_V2, header, body=message.body, timeout=timeout
        )
        appended = self._appended(queue, response, 1, scheduled=False)
        fields = response.ext_fields or {}
        txn_id = f"{message.properties[UNIQ_KEY]}-{appended.first_offset}"
        try:
            _host, position = decode_offset_msg_id(fields.get("msgId", ""))
        except ValueError:
            position = 0
        self._remember_half(txn_id, position)
        return HalfSent(txn_id, address, appended.durable)

    async def end_transaction(
        self, broker: str, group: str, transaction_id: str, commit: bool, *, from_check: bool
    ) -> None:
        """END_TRANSACTION at `broker`, as a request (RocketMQ's clients send it oneway).

        Answered once the outcome is durable; a refusal raises (the caller logs it).
        """
        uniq, _, offset = transaction_id.rpartition("-")
        if not uniq or not offset.isdigit():
            raise InvalidMessageError(f"{transaction_id!r} is not a transaction id")
        fields = {
            "producerGroup": group, "tranStateTableOffset": offset,
            "commitLogOffset": str(self._half_positions.pop(transaction_id, 0)),
            "commitOrRollback": str(END_COMMIT if commit else END_ROLLBACK),
            "fromTransactionCheck": "true" if from_check else "false",
            "msgId": uniq, "transactionId": uniq,
        }  # fmt: skip
        response = await self._call(broker, RequestCode.END_TRANSACTION, fields)
        if response.code != ResponseCode.SUCCESS:
            raise refused(response, f"ending transaction {transaction_id}")

    def transaction_brokers(self) -> list[str]:
        """One watch for all brokers: each sends its check-backs on its own connection."""
        return [ALL_BROKERS]

    async def watch_transaction_checks(
        self, broker: str, group: str, client_id: str
    ) -> AsyncIterator[TransactionCheck]:
        """CHECK_TRANSACTION_STATE requests from any broker this producer heartbeats to.

        Heartbeats as a producer of `group` (HEART_BEAT's producerDataSet) to every broker
        it sends to, on each new connection and every HEARTBEAT_SECONDS, as RocketMQ's
        clients do: a broker asks the connections that did.
        """
        if self._checks is None:
            self._checks = asyncio.Queue()
        self._producer = (group, client_id)
        self._heartbeat_body = _producer_heartbeat(group, client_id)
        checks = self._checks
        while True:
            if self._closed:
                raise ClientStateError("the client is shut down")
            masters = await self._registered_masters()
            addresses = {*self._addresses.values(), *(a for a in masters.values() if a)}
            for address in sorted(addresses):
                try:
                    await self._as_producer(address, group, again=True)
                except OrderMQError as exc:
                    log.info("producer heartbeat to %s failed: %s", address, exc)
            beat_again = asyncio.get_running_loop().time() + HEARTBEAT_SECONDS
            while True:
                try:
                    async with asyncio.timeout_at(beat_again):
                        check = await checks.get()
                except TimeoutError:
                    break
                yield check

    async def _as_producer(self, address: str, group: str, *, again: bool = False) -> None:
        """Heartbeat as a producer of `group` on the connection to `address` (once each)."""
        if self._producer is None or self._producer[0] != group:
            client_id = self._producer[1] if self._producer else f"producer@{id(self):x}"
            self._producer = (group, client_id)
            self._heartbeat_body = _producer_heartbeat(*self._producer)
        connection = await self._connection(address)
        if not again and self._producer_beats.get(address) is connection:
            return
        response = await self._call(
            address, RequestCode.HEART_BEAT, {}, body=self._heartbeat_body or b""
        )
        if response.code != ResponseCode.SUCCESS:
            raise refused(response, f"producer heartbeat to {address}")
        self._producer_beats[address] = connection

    def _remember_half(self, transaction_id: str, position: int) -> None:
        """Keep a half message's commit-log position for its END_TRANSACTION (bounded)."""
        self._half_positions[transaction_id] = position
        while len(self._half_positions) > MAX_REMEMBERED_HALVES:
            del self._half_positions[next(iter(self._half_positions))]

    def _check_requested(self, command: RemotingCommand, address: str) -> None:
        """CHECK_TRANSACTION_STATE from the broker at `address`: queued for the watch."""
        fields = command.ext_fields or {}
        try:
            [record] = decode_records(command.body)
            uniq = fields.get("msgId") or record.properties.get(UNIQ_KEY) or ""
            offset = int(fields["tranStateTableOffset"])
            position = int(fields.get("commitLogOffset", record.physical_offset))
            times = int(record.properties.get(CHECK_TIMES, "1") or 1)
        except (ValueError, KeyError) as exc:
            log.warning("a check-back from %s does not parse, ignored: %s", address, exc)
            return
        if self._checks is None:
            return  # not a transaction producer: nothing answers checks
        names = [n for n, a in sorted(self._addresses.items()) if a == address]
        message = to_message_ext(record, names[0] if names else "")
        txn_id = f"{uniq}-{offset}"
        self._remember_half(txn_id, position)
        self._checks.put_nowait(TransactionCheck(txn_id, address, message, times))

    async def lock_batch(
        self, group: str, client_id: str, queues: Sequence[MessageQueue]
    ) -> LockResult:
        """LOCK_BATCH_MQ per broker; every lock's epoch is 0 (RocketMQ has no fencing)."""
        locked: dict[MessageQueue, int] = {}
        unanswered: list[Unanswered] = []
        for name, part in _by_broker(queues).items():
            try:
                response = await self._lock_call(RequestCode.LOCK_BATCH_MQ, group, client_id, part)
                granted = json.loads(response.body or b"{}").get("lockOKMQSet") or []
                held = {(q["topic"], q["brokerName"], int(q["queueId"])) for q in granted}
            except OrderMQError as exc:
                unanswered.append(Unanswered(name, part, exc))
                continue
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                error = BrokerError(f"a lock answer does not parse: {exc}", code="MALFORMED")
                unanswered.append(Unanswered(name, part, error))
                continue
            locked.update((q, 0) for q in part if (q.topic, q.broker_name, q.queue_id) in held)
        return LockResult(locked, unanswered)

    async def unlock_batch(
        self, group: str, client_id: str, queues: Sequence[MessageQueue]
    ) -> UnlockResult:
        """UNLOCK_BATCH_MQ per broker (RocketMQ does not say which were held by others)."""
        unanswered: list[Unanswered] = []
        for name, part in _by_broker(queues).items():
            try:
                await self._lock_call(RequestCode.UNLOCK_BATCH_MQ, group, client_id, part)
            except OrderMQError as exc:
                unanswered.append(Unanswered(name, part, exc))
        return UnlockResult([], unanswered)

    async def _lock_call(
        self, code: int, group: str, client_id: str, queues: list[MessageQueue]
    ) -> RemotingCommand:
        body = json.dumps({
            "consumerGroup": group, "clientId": client_id,
            "mqSet": [
                {"topic": q.topic, "brokerName": q.broker_name, "queueId": q.queue_id}
                for q in queues
            ],
        }).encode()  # fmt: skip
        return await self._broker_call(queues[0], code, {}, f"locks of {group!r}", body=body)


_PULL_STATUS: dict[int, PullStatus] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MESSAGE,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MESSAGE,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


def _int_field(response: RemotingCommand, name: str) -> int:
    try:
        return int((response.ext_fields or {})[name])
    except (KeyError, ValueError):
        raise BrokerError(
            f"the answer has no integer {name!r}: {response.ext_fields!r}",
            code="MALFORMED_RESPONSE",
        ) from None


def _producer_heartbeat(group: str, client_id: str) -> bytes:
    """A transaction producer's HEART_BEAT body: its group in producerDataSet."""
    return json.dumps({
        "clientID": client_id, "producerDataSet": [{"groupName": group}], "consumerDataSet": [],
    }).encode()  # fmt: skip


def _consumer_data(group: GroupInfo) -> dict[str, Any]:
    """A ConsumerData of RocketMQ's heartbeat."""
    return {
        "groupName": group.group,
        "consumeType": "CONSUME_ACTIVELY" if group.consume_type == "CONSUME_POLL"
        else "CONSUME_PASSIVELY",
        "messageModel": group.message_model,
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
        "unitMode": False,
        "subscriptionDataSet": [
            {"classFilterMode": False, "topic": topic, "subString": expression or "*",
             "tagsSet": sorted(split_tag_expression(expression) or ()), "codeSet": [],
             "subVersion": int(time.time() * 1000), "expressionType": "TAG"}
            for topic, expression in group.subscriptions
        ],
    }  # fmt: skip


def _by_broker(queues: Sequence[MessageQueue]) -> dict[str, list[MessageQueue]]:
    out: dict[str, list[MessageQueue]] = {}
    for q in queues:
        out.setdefault(q.broker_name, []).append(q)
    return out


async def _notify_all(condition: asyncio.Condition) -> None:
    async with condition:
        condition.notify_all()


def _answers(fields: dict[str, str], count: int) -> tuple[MessageAnswer, ...]:
    """Each message's place in a reply to a batch with duplicates; () when not told.

    From ordermq's fields queueIds, queueOffsets and uniqKeys, one entry per message.
    """
    if "queueOffsets" not in fields:
        return ()
    try:
        queue_ids = [int(q) for q in fields.get("queueIds", "").split(",")]
        offsets = [int(o) for o in fields["queueOffsets"].split(",")]
    except ValueError:
        return ()
    keys = fields.get("uniqKeys", "").split(",")
    if not len(queue_ids) == len(offsets) == len(keys) == count:
        return ()
    return tuple(
        MessageAnswer(q, o, _uniq_key_id(k), bool(k))
        for q, o, k in zip(queue_ids, offsets, keys, strict=True)
    )


def _uniq_key_id(uniq_key: str) -> bytes:
    """The 16-byte id an SDK's UNIQ_KEY stands for; empty for another client's key."""
    if len(uniq_key) != 32:
        return b""
    try:
        return bytes.fromhex(uniq_key)
    except ValueError:
        return b""
