"""BrokerClient: typed async calls to one broker over gRPC, errors already translated.

The result types come from sdk._transport.protocol; they are importable from here too
(tools, benchmarks and tests that talk to one broker use this client directly).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format

from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._transport.codec import decode_records
from sdk._transport.exchange import (
    EXCHANGE_BATCHED_PATH,
    Exchange,
    ExchangeSubscription,
    ExchangeUnsupportedError,
    OpenBatched,
)
from sdk._transport.exchange_port import PortCall
from sdk._transport.port_probe import speaks_exchange_port, speaks_remoting
from sdk._transport.protocol import (
    Appended,
    CreditWindow,
    GroupInfo,
    MessageAnswer,
    PullResult,
    PullStatus,
    SentBack,
    appended,
)
from sdk._transport.signing import CallSigner, signed_hello
from sdk._transport.status import to_ordermq_error
from sdk._wire import GRPC_CLIENT_CHANNEL_OPTIONS, grpc_keepalive_options
from sdk.clock import Clock, SystemClock
from sdk.credentials import Credentials
from sdk.errors import (
    BrokerError,
    BrokerUnavailableError,
    NotSupportedError,
    OrderMQError,
    RequestTimeoutError,
    TLSError,
    WrongProtocolError,
    error_from_status,
)
from sdk.message import MessageExt, MessageQueue, Receipt
from sdk.tls import TLSConfig, handshake_failure, speaks_tls, tls_hint, tls_refusal

__all__ = [
    "CONNECT_TIMEOUT",
    "Appended",
    "BrokerClient",
    "GroupInfo",
    "PullResult",
    "PullStatus",
    "QueueRoute",
    "SentBack",
]

T = TypeVar("T")

#: How long a route lookup or a heartbeat waits, unless given a deadline: it waits for a
#: broker that is not reachable yet (starting, restarting) this long before it fails.
CONNECT_TIMEOUT = 5.0
#: The deadline of a call that is given none (an ack, an offset commit, a lock): it
#: does not wait for an unreachable broker (it fails at once), but one sent on a
#: connection that then dies without a word (a cut cable, a peer gone without a reset)
#: fails after this long instead of waiting for good.
CALL_DEADLINE = 30.0
#: Each channel keeps its own connections. gRPC otherwise shares them between channels to
#: one address, and a new client would inherit another client's reconnect backoff from a
#: broker that has restarted since, and fail its first calls.
_CHANNEL_OPTIONS = (*GRPC_CLIENT_CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1))
#: A method only RocketMQ 5's gRPC serves: asked when ordermq's methods are not found.
ROCKETMQ5_PROBE = "/apache.rocketmq.v2.MessagingService/QueryRoute"
PROBE_SECONDS = 1.0
_NOT_THERE = (
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
)


@dataclass(frozen=True, slots=True)
class QueueRoute:
    """A queue, the broker that serves it, and its permissions."""

    queue: MessageQueue
    broker_address: str
    readable: bool
    writable: bool
    #: Its broker takes batches over several queues in one Send (SendRequest.parts).
    takes_send_parts: bool = False
    #: Its broker's Exchange port, "host:port" ("": none), and the broker's id, which
    #: the port greets with.
    exchange_address: str = ""
    exchange_broker_id: str = ""


class BrokerClient:
    """One channel to one broker. Create and use it on one event loop.

    Send and Pull travel on the channel's Exchange stream; with a broker that has none,
    as unary calls. Sends, pulls, route lookups and heartbeats wait within their deadline
    for the broker to be reachable, so a client works at once when its broker comes up or
    back within the deadline; the other calls fail at once while the broker cannot be
    reached, and by CALL_DEADLINE when their connection goes silent once they are sent.
    """

    def __init__(
        self,
        address: str,
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.address = address
        self._tls = tls
        self._hello: Callable[[], pb.ExchangeHello] = pb.ExchangeHello
        if credentials is not None:
            self._hello = functools.partial(
                signed_hello, credentials, clock or SystemClock(), EXCHANGE_BATCHED_PATH
            )
        self._exchange_port = ("", "")  # the address and broker id last given
        #: Whether a connection was ever made: TLS failures are looked for until then.
        self._connected_once = False
        #: Whether a call was ever answered: until then "no such method" may mean that
        #: another gRPC service answers here.
        self._answered_once = False
        # With credentials every call is signed (sdk/_transport/signing.py).
        interceptors: Sequence[Any] | None = (
            CallSigner(credentials, clock or SystemClock()).interceptors()
            if credentials is not None
            else None
        )
        options = (*_CHANNEL_OPTIONS, *grpc_keepalive_options())
        self._channel = (
            grpc.aio.secure_channel(
                address,
                tls.grpc_credentials(),
                options=(*options, *tls.grpc_options()),
                interceptors=interceptors,
            )
            if tls is not None
            else grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
        )
        self._messaging = pb_grpc.MessagingServiceStub(self._channel)
        self._admin = pb_grpc.AdminServiceStub(self._channel)
        batched: OpenBatched = self._channel.stream_stream(
            EXCHANGE_BATCHED_PATH,
            request_serializer=None,  # written serialized (sdk._batching.join_repeated)
            response_deserializer=pb.ExchangeResponses.FromString,
        )
        self._exchange = Exchange(
            self._messaging.Exchange, address, self._ready, batched, self._disconnected
        )

    def use_exchange_port(self, address: str, broker_id: str = "") -> None:
        """Carry sends, pulls and subscriptions on the broker's Exchange port at `address`.

        As a route names it, with the id the port must greet with (`broker_id`; "": any);
        the same again changes nothing, and "" (a route without a port: the broker was
        restarted without it) forgets it. With credentials each connection's hello is
        signed, as an ExchangeBatched call's opening.
        """
        if (address, broker_id) == self._exchange_port:
            return
        self._exchange_port = address, broker_id
        if not address:
            self._exchange.use_port(None)
            return
        tls = self._tls
        context = tls.ssl_context() if tls is not None else None
        server_name = tls.server_name if tls is not None else None
        self._exchange.use_port(
            functools.partial(PortCall, address, context, server_name, self._hello, broker_id)
        )

    async def close(self) -> None:
        """Close the channel: calls in flight fail (ClientStateError on the Exchange stream)."""
        await self._exchange.close()
        await self._channel.close(None)

    async def _unary(self, method: Callable[..., Awaitable[T]], request: object) -> T:
        """A call of `method` that has no deadline of its own: CALL_DEADLINE bounds it."""
        try:
            return await self._call(lambda: method(request, timeout=CALL_DEADLINE))
        except RequestTimeoutError:
            raise RequestTimeoutError(
                f"no answer from the broker at {self.address} within {CALL_DEADLINE:g}s"
            ) from None

    async def _call(self, call: Callable[[], Awaitable[T]], waited: float | None = None) -> T:
        """Run a call; `waited`: the deadline it waited for the broker to be reachable."""
        try:
            ready = self._channel.get_state() == grpc.ChannelConnectivity.READY
            if waited is not None and not ready:
                result = await self._unless_tls_fails(call())
            else:
                result = await call()
            self._connected_once = self._answered_once = True
            return result
        except grpc.aio.AioRpcError as exc:
            if (
                waited is not None
                and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                and self._channel.get_state() != grpc.ChannelConnectivity.READY
            ):
                error: OrderMQError = BrokerUnavailableError(
                    f"cannot reach the broker at {self.address} within {waited:g}s"
                )
            else:
                error = to_ordermq_error(exc)
            if isinstance(error, BrokerUnavailableError):
                error = await self._why_unreachable(exc.details() or "") or error
            elif exc.code() == grpc.StatusCode.UNIMPLEMENTED and not self._answered_once:
                error = await self._rocketmq5_instead() or error
            raise error from None

    async def _ready(self) -> None:
        """Return once the channel is connected; fail as soon as TLS or the port is why not.

        A connection that fails its TLS handshake (or meets a server of another protocol)
        is retried by gRPC until the caller's deadline, each time failing the same way: a
        wrong CA, name, certificate or port is told at the first failure instead.
        """
        state = self._channel.get_state(try_to_connect=True)
        while state != grpc.ChannelConnectivity.READY:
            if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE and not self._connected_once:
                failure = await self._why_unreachable("")
                if failure is not None:
                    raise failure
            await self._channel.wait_for_state_change(state)
            state = self._channel.get_state(try_to_connect=True)
        self._connected_once = True

    async def _disconnected(self) -> None:
        """Return once the channel's connection is lost (it is no longer READY)."""
        state = self._channel.get_state()
        while state == grpc.ChannelConnectivity.READY:
            await self._channel.wait_for_state_change(state)
            state = self._channel.get_state()

    async def _unless_tls_fails(self, pending: Awaitable[T]) -> T:
        """Await a call waiting for the connection; fail at once if TLS or the port fails it."""
        call = asyncio.ensure_future(pending)
        watch = asyncio.ensure_future(self._ready())
        try:
            await asyncio.wait((call, watch), return_when=asyncio.FIRST_COMPLETED)
            if (
                not call.done()
                and watch.done()
                and isinstance(watch.exception(), (TLSError, WrongProtocolError))
            ):
                raise watch.exception()  # type: ignore[misc]
            return await call
        finally:
            watch.cancel()
            call.cancel()

    async def _why_unreachable(self, details: str) -> TLSError | WrongProtocolError | None:
        """The TLS failure or wrong port behind an unreachable broker; None otherwise.

        gRPC tells why a connection failed only to calls that do not wait for one, and
        says "Socket closed" of a refused client certificate: the handshake is tried again
        here, on the failure path only, to tell the user what is wrong. Once connected,
        TLS has worked: later failures are the network's or the broker's, and are not
        held up by a diagnosis.
        """
        if self._connected_once:
            return None
        if self._tls is None:
            if await speaks_tls(self.address):
                return TLSError(
                    f"the broker at {self.address} serves TLS only: give the client "
                    "tls=sdk.TLSConfig(ca_file=...)"
                )
            if await speaks_remoting(self.address):
                return WrongProtocolError(
                    f"{self.address} answers RocketMQ remoting, not ordermq's gRPC: use "
                    f"rocketmq://{self.address}, or the broker's ordermq port"
                )
            if await speaks_exchange_port(self.address):
                return WrongProtocolError(
                    f"{self.address} is an ordermq broker's Exchange port (framed TCP), not "
                    "its gRPC port: give the client the broker's gRPC port (--port)"
                )
            return None
        reason = details if handshake_failure(details) else None
        reason = reason or await tls_refusal(self.address, self._tls)
        if reason is None:
            return None
        return TLSError(f"TLS connection to {self.address} failed: {tls_hint(reason, self._tls)}")

    async def _rocketmq5_instead(self) -> WrongProtocolError | None:
        """WrongProtocolError if RocketMQ 5's gRPC services answer here instead of ordermq's."""
        probe = self._channel.unary_unary(ROCKETMQ5_PROBE, None, None)
        try:
            await probe(b"", timeout=PROBE_SECONDS)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _NOT_THERE:
                return None
        return WrongProtocolError(
            f"{self.address} answers RocketMQ 5's gRPC (apache.rocketmq.v2), not ordermq's: "
            "give the broker's ordermq port (mockbroker --port), or rocketmq://<name server> "
            "for RocketMQ's remoting"
        )

    async def _request(
        self, envelope: pb.ExchangeRequest, timeout: float | None
    ) -> pb.ExchangeResponse:
        """A Send or Pull on the Exchange stream, or as its unary call if the broker has none."""
        if self._exchange.supported:
            try:
                return await self._exchange.call(envelope, timeout)
            except ExchangeUnsupportedError:
                pass  # the broker served nothing of it: go unary, now and from now on
            except BrokerUnavailableError as exc:
                raise await self._why_unreachable("") or exc from None
        wait = timeout is not None
        if envelope.HasField("send"):
            sent = await self._call(
                lambda: self._messaging.Send(envelope.send, timeout=timeout, wait_for_ready=wait),
                timeout,
            )
            return pb.ExchangeResponse(send=sent)
        pulled = await self._call(
            lambda: self._messaging.Pull(envelope.pull, timeout=timeout, wait_for_ready=wait),
            timeout,
        )
        return pb.ExchangeResponse(pull=pulled)

    # ------------------------------------------------------------------ messaging
    async def query_route(
        self,
        topic: str,
        *,
        create_if_missing: bool = False,
        timeout: float = CONNECT_TIMEOUT,
        wait: bool = True,
    ) -> list[QueueRoute]:
        """The queues of `topic`, sorted by (broker name, queue id).

        With `wait`, waits up to `timeout` for an unreachable broker; without, fails at once.
        """
        request = pb.QueryRouteRequest(topic=topic, create_if_missing=create_if_missing)
        response = await self._call(
            lambda: self._messaging.QueryRoute(request, timeout=timeout, wait_for_ready=wait),
            timeout if wait else None,
        )
        return [
            QueueRoute(
                MessageQueue(r.queue.topic, r.queue.broker_name, r.queue.queue_id),
                r.broker_address,
                r.readable,
                r.writable,
                response.takes_send_parts,
                r.exchange_address,
                r.exchange_broker_id,
            )
            for r in response.queues
        ]

    async def send(
        self, topic: str, queue_id: int, frames: bytes, *, timeout: float | None = None
    ) -> Appended:
        """Append frames to one queue."""
        # Filled in place: passing a SendRequest to the constructor would copy the frames.
        envelope = pb.ExchangeRequest()
        request = envelope.send
        request.topic = topic
        request.queue_id = queue_id
        request.frames = frames
        r = (await self._request(envelope, timeout)).send
        moved = r.queue_id if r.duplicate and r.queue_id != queue_id else -1
        return Appended(
            r.status == pb.SEND_OK, r.first_queue_offset, r.count, r.scheduled, moved,
            _answers(r.messages),
        )  # fmt: skip

    async def send_parts(
        self, topic: str, parts: Sequence[tuple[int, bytes]], *, timeout: float | None = None
    ) -> list[Appended | OrderMQError]:
        """Append frames to several queues of `topic` in one Send; each part's outcome.

        A part the broker refused is its error; the request failing whole raises.
        """
        envelope = pb.ExchangeRequest()
        request = envelope.send
        request.topic = topic
        for queue_id, frames in parts:
            request.parts.add(queue_id=queue_id, frames=frames)
        response = (await self._request(envelope, timeout)).send
        if len(response.parts) != len(parts):
            raise BrokerError(
                f"the broker answered a Send of {len(parts)} parts with {len(response.parts)} "
                "results (it does not take batches over several queues)",
                code="INTERNAL",
            )
        outcomes: list[Appended | OrderMQError] = []
        ok = pb.SEND_OK
        for (queue_id, _), r in zip(parts, response.parts, strict=True):
            if r.HasField("error"):
                e = r.error
                outcomes.append(error_from_status(e.code, e.reason or None, e.message or e.code))
                continue
            messages = r.messages  # each message's place: only a batch with duplicates has it
            if not (messages or r.duplicate):
                outcomes.append(
                    appended(r.status == ok, r.first_queue_offset, r.count, r.scheduled)
                )
                continue
            moved = r.queue_id if r.duplicate and r.queue_id != queue_id else -1
            outcomes.append(
                Appended(
                    r.status == ok,
                    r.first_queue_offset,
                    r.count,
                    r.scheduled,
                    moved,
                    _answers(messages) if messages else (),
                )
            )
        return outcomes

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
        """Read messages of one queue from `offset`."""
        request = pb.PullRequest(
            group=group,
            topic=queue.topic,
            queue_id=queue.queue_id,
            offset=offset,
            max_messages=max_messages,
            max_bytes=max_bytes,
            tag_expression=tag_expression,
            suspend_timeout_ms=int(suspend_timeout * 1000),
        )
        r = (await self._request(pb.ExchangeRequest(pull=request), timeout)).pull
        return _pull_result(r, r.records, queue.broker_name)

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
    ) -> GrpcSubscription:
        """Push delivery of `queue` on the Exchange stream (Transport.subscribe)."""
        request = pb.Subscribe(
            group=group,
            topic=queue.topic,
            queue_id=queue.queue_id,
            offset=offset,
            tag_expression=tag_expression,
            max_messages=max_messages,
            max_bytes=max_bytes,
            client_id=client_id,
            lock_epoch=lock_epoch,
            credit_messages=credit_messages,
            credit_bytes=credit_bytes,
        )
        try:
            opened = await self._exchange.subscribe(
                pb.ExchangeRequest(subscribe=request), CONNECT_TIMEOUT
            )
        except ExchangeUnsupportedError as exc:
            raise NotSupportedError(str(exc), code="UNIMPLEMENTED") from None
        except BrokerUnavailableError as exc:
            raise await self._why_unreachable("") or exc from None
        window = CreditWindow()
        window.granted(credit_messages, credit_bytes)
        return GrpcSubscription(opened, queue.broker_name, window)

    async def receive(
        self,
        group: str,
        topic: str,
        queue_ids: Sequence[int],
        broker_name: str,
        *,
        max_messages: int,
        invisible_duration: float,
        await_duration: float,
        tag_expression: str = "*",
        fifo: bool = False,
        max_delivery_attempts: int = 0,
    ) -> list[MessageExt]:
        """Take messages of `topic`'s `queue_ids` for `group`, each with its receipt."""
        request = pb.ReceiveRequest(
            group=group,
            topic=topic,
            queue_ids=queue_ids,
            max_messages=max_messages,
            invisible_duration_ms=_ms(invisible_duration),
            wait_ms=_ms(await_duration),
            tag_expression=tag_expression,
            fifo=fifo,
            max_delivery_attempts=max_delivery_attempts,
        )
        timeout = await_duration + CONNECT_TIMEOUT
        r = await self._call(
            lambda: self._messaging.Receive(request, timeout=timeout, wait_for_ready=True),
            timeout,
        )
        messages = decode_records(r.records, broker_name) if r.records else []
        for message, lease in zip(messages, r.leases, strict=True):
            message.delivery_attempt = lease.delivery_attempt
            message.receipt = self._receipt(group, lease, invisible_duration)
        return messages

    async def ack(self, receipt: Receipt) -> None:
        """Settle the message `receipt` holds."""
        request = pb.AckRequest(group=receipt.group, receipt_handle=receipt.handle)
        await self._unary(self._messaging.Ack, request)

    async def change_invisible_duration(self, receipt: Receipt, seconds: float) -> Receipt:
        """Hide the message `receipt` holds for `seconds` from now; its new receipt."""
        request = pb.ChangeInvisibleDurationRequest(
            group=receipt.group,
            receipt_handle=receipt.handle,
            invisible_duration_ms=_ms(seconds),
        )
        r = await self._unary(self._messaging.ChangeInvisibleDuration, request)
        return self._receipt(receipt.group, r.lease, seconds)

    def _receipt(self, group: str, lease: pb.Lease, invisible_duration: float) -> Receipt:
        return Receipt(
            lease.receipt_handle,
            self.address,
            group,
            invisible_duration,
            lease.invisible_until_ms / 1000,
        )

    async def queue_offsets(
        self, queue: MessageQueue, timestamp_ms: int = 0
    ) -> tuple[int, int, int]:
        """(min offset, max offset, first offset stored at or after timestamp_ms)."""
        request = pb.QueryQueueOffsetsRequest(
            topic=queue.topic, queue_id=queue.queue_id, timestamp_ms=timestamp_ms
        )
        r = await self._unary(self._messaging.QueryQueueOffsets, request)
        return r.min_offset, r.max_offset, r.offset_at_time

    async def query_offset(self, group: str, queue: MessageQueue) -> int | None:
        """The group's committed offset for `queue`, or None if it never committed."""
        request = pb.QueryConsumerOffsetRequest(
            group=group, topic=queue.topic, queue_id=queue.queue_id
        )
        r = await self._unary(self._messaging.QueryConsumerOffset, request)
        return r.offset if r.found else None

    async def commit_offsets(
        self, group: str, client_id: str, offsets: Sequence[tuple[MessageQueue, int, int]]
    ) -> None:
        """Commit (queue, offset, lock epoch) triples durably, all or nothing."""
        request = pb.CommitConsumerOffsetsRequest(
            group=group,
            client_id=client_id,
            offsets=[
                pb.OffsetCommit(topic=q.topic, queue_id=q.queue_id, offset=o, lock_epoch=e)
                for q, o, e in offsets
            ],
        )
        await self._unary(self._messaging.CommitConsumerOffsets, request)

    # ------------------------------------------------------------------ coordination
    async def heartbeat(
        self, client_id: str, groups: Sequence[GroupInfo], *, timeout: float = CONNECT_TIMEOUT
    ) -> dict[str, int]:
        """Register as a member of exactly `groups`; their membership versions."""
        request = pb.HeartbeatRequest(
            client_id=client_id,
            consumer_groups=[
                pb.ConsumerGroupState(
                    group=g.group,
                    consume_type=pb.ConsumeType.Value(g.consume_type),
                    message_model=pb.MessageModel.Value(g.message_model),
                    subscriptions=[
                        pb.Subscription(topic=t, expression=e) for t, e in g.subscriptions
                    ],
                )
                for g in groups
            ],
        )
        r = await self._call(
            lambda: self._messaging.Heartbeat(request, timeout=timeout, wait_for_ready=True),
            timeout,
        )
        return {v.group: v.membership_version for v in r.groups}

    async def unregister(self, client_id: str) -> None:
        """Leave every group and release every lock."""
        request = pb.UnregisterClientRequest(client_id=client_id)
        await self._unary(self._messaging.UnregisterClient, request)

    async def consumer_list(self, group: str) -> tuple[list[str], int]:
        """(sorted member ids, membership version) of a group."""
        request = pb.GetConsumerListRequest(group=group)
        r = await self._unary(self._messaging.GetConsumerList, request)
        return list(r.client_ids), r.membership_version

    async def send_half(
        self, topic: str, queue_id: int, frame: bytes, group: str, *, timeout: float | None
    ) -> tuple[str, bool]:
        """Store a half message; (transaction id, durable)."""
        request = pb.SendHalfMessageRequest(
            topic=topic, queue_id=queue_id, frame=frame, producer_group=group
        )
        r = await self._call(lambda: self._messaging.SendHalfMessage(request, timeout=timeout))
        return r.transaction_id, r.status == pb.SEND_OK

    async def end_transaction(
        self, group: str, transaction_id: str, commit: bool, *, from_check: bool
    ) -> None:
        """Commit or roll back a pending transaction."""
        request = pb.EndTransactionRequest(
            group=group,
            transaction_id=transaction_id,
            resolution=pb.TRANSACTION_COMMIT if commit else pb.TRANSACTION_ROLLBACK,
            from_check=from_check,
        )
        await self._unary(self._messaging.EndTransaction, request)

    async def watch_transaction_checks(
        self, group: str, client_id: str
    ) -> AsyncIterator[tuple[str, list[MessageExt], int]]:
        """(transaction id, [its half message], check times) for each check-back."""
        request = pb.WatchTransactionChecksRequest(group=group, client_id=client_id)
        stream = self._messaging.WatchTransactionChecks(request)
        try:
            async for check in stream:
                messages = decode_records(check.record, check.broker_name)
                yield check.transaction_id, messages, check.check_times
        except grpc.aio.AioRpcError as exc:
            raise to_ordermq_error(exc) from None
        finally:
            stream.cancel()

    async def watch_membership(
        self, group: str, known_version: int
    ) -> AsyncIterator[tuple[int, list[str]]]:
        """(version, members) on every membership change of `group`."""
        request = pb.WatchMembershipRequest(group=group, known_version=known_version)
        stream = self._messaging.WatchMembership(request)
        try:
            async for event in stream:
                yield event.membership_version, list(event.client_ids)
        except grpc.aio.AioRpcError as exc:
            raise to_ordermq_error(exc) from None
        finally:
            stream.cancel()

    async def lock_batch(
        self, group: str, client_id: str, queues: Sequence[MessageQueue]
    ) -> dict[MessageQueue, int]:
        """Take or renew locks; the queues now held, with their fencing epochs."""
        request = pb.LockBatchRequest(group=group, client_id=client_id, queues=_queues(queues))
        r = await self._unary(self._messaging.LockBatch, request)
        return {
            MessageQueue(q.queue.topic, q.queue.broker_name, q.queue.queue_id): q.epoch
            for q in r.locked
        }

    async def unlock_batch(
        self, group: str, client_id: str, queues: Sequence[MessageQueue]
    ) -> list[MessageQueue]:
        """Release locks the client holds; the queues another client holds, left locked."""
        request = pb.UnlockBatchRequest(group=group, client_id=client_id, queues=_queues(queues))
        r = await self._unary(self._messaging.UnlockBatch, request)
        return [MessageQueue(q.topic, q.broker_name, q.queue_id) for q in r.not_held]

    async def send_back(
        self,
        group: str,
        queue: MessageQueue,
        queue_offset: int,
        *,
        delay_level: int = 0,
        max_reconsume_times: int = 0,
        reconsume_times: int = 0,
    ) -> SentBack:
        """Return a failed message for a later retry, or to the dead-letter topic."""
        request = pb.SendBackRequest(
            group=group,
            queue=_queues([queue])[0],
            queue_offset=queue_offset,
            delay_level=delay_level,
            max_reconsume_times=max_reconsume_times,
            reconsume_times=reconsume_times,
        )
        r = await self._unary(self._messaging.SendBack, request)
        return SentBack(r.destination == pb.DEAD_LETTER, r.topic, r.reconsume_times)

    async def park_key(
        self,
        group: str,
        client_id: str,
        queue: MessageQueue,
        sharding_key: str,
        from_offset: int,
        *,
        epoch: int,
        reason: str,
    ) -> int:
        """Park a sharding key of a queue the client holds; the offset it is parked through."""
        request = pb.ParkKeyRequest(
            group=group,
            client_id=client_id,
            queue=_queues([queue])[0],
            sharding_key=sharding_key,
            from_offset=from_offset,
            lock_epoch=epoch,
            reason=reason,
        )
        r = await self._unary(self._messaging.ParkKey, request)
        return r.parked.through_offset

    async def cancel_scheduled(self, topic: str, msg_id: str) -> bool:
        """Cancel a scheduled message; False when it had already been delivered."""
        request = pb.CancelScheduledRequest(topic=topic, msg_id=msg_id)
        r = await self._unary(self._messaging.CancelScheduled, request)
        return r.result == pb.CANCELLED

    # ------------------------------------------------------------------ admin
    async def create_topic(self, topic: str, queue_count: int) -> bool:
        """Create a topic; False when it already existed with this queue count."""
        request = pb.CreateTopicRequest(topic=topic, queue_count=queue_count)
        r = await self._call(lambda: self._admin.CreateTopic(request))
        return r.created

    async def delete_topic(self, topic: str, *, force: bool = False) -> pb.DeleteTopicResponse:
        """Delete a topic (GroupHasMembersError while live consumers use it, unless force)."""
        request = pb.DeleteTopicRequest(topic=topic, force=force)
        return await self._call(lambda: self._admin.DeleteTopic(request))

    async def delete_group(self, group: str, *, force: bool = False) -> pb.DeleteGroupResponse:
        """Delete a consumer group (GroupHasMembersError while it has members, unless force)."""
        request = pb.DeleteGroupRequest(group=group, force=force)
        return await self._call(lambda: self._admin.DeleteGroup(request))

    async def broker_status(self) -> pb.BrokerStatusResponse:
        """The broker's status (protobuf; for tools and tests)."""
        return await self._call(lambda: self._admin.BrokerStatus(pb.BrokerStatusRequest()))

    async def query_message_by_id(self, msg_id: str) -> list[MessageExt]:
        """Every stored copy of a message (original, retries, dead letter), newest first."""
        request = pb.QueryMessageByIdRequest(msg_id=msg_id)
        r = await self._call(lambda: self._admin.QueryMessageById(request))
        return decode_records(r.records, "")

    async def query_messages_by_key(
        self, topic: str, key: str, max_messages: int = 32
    ) -> list[MessageExt]:
        """Messages of `topic` carrying `key`, newest first."""
        request = pb.QueryMessagesByKeyRequest(topic=topic, key=key, max_messages=max_messages)
        r = await self._call(lambda: self._admin.QueryMessagesByKey(request))
        return decode_records(r.records, "")

    # Admin answers as plain dicts (field names as in the protocol), for the CLI.
    async def admin(self, method: str, **fields: Any) -> dict[str, Any]:
        """Call an AdminService method by name; the answer as a dict."""
        request_type = getattr(pb, f"{method}Request")
        call = getattr(self._admin, method)
        response = await self._call(lambda: call(request_type(**fields)))
        return json_format.MessageToDict(
            response,
            always_print_fields_with_no_presence=True,
            preserving_proto_field_name=True,
            unquote_int64_if_possible=True,
        )


def _ms(seconds: float) -> int:
    """Seconds as whole milliseconds, rounded (0.0015 s is 2 ms, not 1)."""
    return round(seconds * 1000)


def _queues(queues: Sequence[MessageQueue]) -> list[pb.MessageQueue]:
    return [
        pb.MessageQueue(topic=q.topic, broker_name=q.broker_name, queue_id=q.queue_id)
        for q in queues
    ]


def _answers(results: Iterable[pb.SendPartResult]) -> tuple[MessageAnswer, ...]:
    """SendResponse.messages (a batch with duplicates) as MessageAnswers."""
    return tuple(
        MessageAnswer(r.queue_id, r.first_queue_offset, r.msg_id, r.duplicate) for r in results
    )


class GrpcSubscription:
    """A push subscription on a broker's Exchange stream, batches decoded (Subscription)."""

    def __init__(self, opened: ExchangeSubscription, broker_name: str, credit: CreditWindow):
        self._opened = opened
        self._broker_name = broker_name
        self._credit = credit

    @property
    def credit(self) -> CreditWindow:
        """Credit granted and not yet used, as seen here."""
        return self._credit

    async def next(self) -> PullResult:
        """The next batch (Subscription.next)."""
        try:
            r = await self._opened.next()
        except ExchangeUnsupportedError as exc:
            raise NotSupportedError(str(exc), code="UNIMPLEMENTED") from None
        return self._result(r)

    def on_batch(self, handler: Callable[[PullResult], bool] | None) -> None:
        """Hand batches to `handler` as they arrive (Subscription.on_batch)."""
        if handler is None:
            self._opened.on_batch(None)
            return

        def take(r: pb.PullResponse) -> bool:
            records = r.records
            if not handler(_pull_result(r, records, self._broker_name)):
                return False  # next() returns it (decoded again: once per subscription)
            self._credit.received(r.record_count, len(records))
            return True

        self._opened.on_batch(take)

    def _result(self, r: pb.PullResponse) -> PullResult:
        records = r.records
        self._credit.received(r.record_count, len(records))
        return _pull_result(r, records, self._broker_name)

    def grant(self, messages: int, size: int) -> None:
        """Let the broker send `messages` more records and `size` more bytes."""
        self._credit.granted(messages, size)
        self._opened.grant(messages, size)

    def close(self) -> None:
        """End the subscription; batches not yet read are dropped."""
        self._opened.close()


#: PullResponse.status -> PullStatus.
_PULL_STATUS = {
    value: PullStatus(name)
    for name, value in pb.PullStatus.items()
    if name in PullStatus.__members__
}


def _pull_result(r: pb.PullResponse, records: bytes, broker_name: str) -> PullResult:
    """A pull's or a pushed batch's answer; `records` is `r.records`, read once.

    Each read of a bytes field copies it.
    """
    status = _PULL_STATUS.get(r.status)
    if status is None:  # a status of a later protocol version
        raise BrokerError(
            f"the broker answered a pull with status {r.status}, which this client does "
            "not know (a broker newer than the client?)",
            code="UNIMPLEMENTED",
        )
    return PullResult(
        status,
        r.next_offset,
        r.min_offset,
        r.max_offset,
        decode_records(records, broker_name, buffered=True) if records else [],
    )
