"""Binary layouts shared by the SDK and the broker (see docs/wire-format.md).

A *message frame* is what a producer sends; the broker checks it and stores it, unchanged
after its length prefix, inside a *stored record*, which is also what a pull returns. So a
message costs the broker one header parse, one CRC and one index entry, and no re-encoding.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from sdk._crc import crc32 as crc32_of
from sdk.errors import CorruptRecordError

#: Where `python -m mockbroker` listens and the `ordermq` command looks by default.
DEFAULT_PORT = 8081
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_PROPERTIES_BYTES = 16 * 1024
MAX_SEND_BYTES = 32 * 1024 * 1024
MAX_PULL_BYTES = 32 * 1024 * 1024
MAX_PULL_MESSAGES = 10_000
#: RocketMQ's delay levels (1-based), in seconds.
DELAY_LEVEL_SECONDS = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600,
                       1200, 1800, 3600, 7200)  # fmt: skip
#: gRPC message size limit on both sides: a full send or pull plus protobuf overhead.
GRPC_MAX_MESSAGE_BYTES = MAX_SEND_BYTES + 1024 * 1024
#: What a client of a broker's Exchange port (framed TCP) sends first: the protocol's
#: magic and its version, 1 (docs/wire-format.md).
EXCHANGE_PORT_PREAMBLE = b"OMQX\x00\x00\x00\x01"
GRPC_CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
)


#: The least time a client's connection attempt gets, TCP connect and HTTP/2 handshake
#: (the broker's SETTINGS frame) together, in ms. gRPC core takes it from
#: grpc.min_reconnect_backoff_ms, despite the name: MIN_CONNECT_TIMEOUT of gRPC's
#: doc/connection-backoff.md (default 20 s), not a floor of the backoff between attempts.
#: Set to 100 ms, a busy machine's handshake outlasted it and calls without a deadline
#: failed with "connection attempt timed out before receiving SETTINGS frame".
#: A few seconds: a broker that does not answer at all still fails such calls soon.
GRPC_MIN_CONNECT_TIMEOUT_MS = 5000
#: Clients reconnect to a restarted broker within seconds (gRPC's default backoff grows
#: to 120 s): the attempts start 100 ms apart, then up to 2 s apart.
GRPC_CLIENT_CHANNEL_OPTIONS = (
    *GRPC_CHANNEL_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", GRPC_MIN_CONNECT_TIMEOUT_MS),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
#: Options of a gRPC channel or server: (name, value) pairs.
GrpcOptions = tuple[tuple[str, int], ...]
#: A client pings a connection that carries calls once it has read nothing on it for this
#: long (ms), and closes it when a ping is not answered within as long: its calls fail
#: with BrokerUnavailableError (retriable) and the next ones connect again. Without it a
#: connection gone silent (a cable cut, a NAT or a firewall that forgot it, a host gone
#: without a reset) kept its calls until TCP gave up, after many minutes, and every
#: request on its Exchange stream failed by its deadline meanwhile. gRPC's ping timeout
#: is set too: a ping of its own (BDP) in flight when the connection went silent is the
#: one a keepalive waits for, with that timeout (60 s by default).
GRPC_KEEPALIVE_MS = 10_000
#: A broker takes a client's pings this often (ms) even when it sends no data: with
#: gRPC's default (5 min), a client whose keepalive pinged a connection the broker sent
#: nothing on (an idle stream, long polls held) got GOAWAY too_many_pings after three,
#: and its calls failed. (gRPC's C name, GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_
#: DATA_MS, is not its string: an option by the C name is ignored.)
GRPC_SERVER_MIN_PING_INTERVAL_MS = 5_000
#: A broker listener's options but its keepalive: one port per broker (without
#: so_reuseport=0 a second broker could bind the same port and share it).
GRPC_SERVER_OPTIONS = (*GRPC_CHANNEL_OPTIONS, ("grpc.so_reuseport", 0))


def grpc_server_options(keepalive_seconds: float) -> GrpcOptions:
    """A broker listener's options: GRPC_SERVER_OPTIONS, and its keepalive.

    It pings a connection it has read nothing on for `keepalive_seconds`, with calls or
    without, and closes it when a ping is not answered within as long; it takes the
    clients' pings every GRPC_SERVER_MIN_PING_INTERVAL_MS (read at each call).
    """
    ms = max(1, round(keepalive_seconds * 1000))
    return (
        *GRPC_SERVER_OPTIONS,
        ("grpc.http2.min_ping_interval_without_data_ms", GRPC_SERVER_MIN_PING_INTERVAL_MS),
        *_keepalive(ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),  # an idle connection can die too
    )


#: Most bytes a stream connection reads from its socket in one call. asyncio reads up to
#: 256 KiB, a buffer over glibc's threshold for mapping memory (128 KiB until the process
#: frees a larger block, which many never do): every read then maps and unmaps 256 KiB
#: and faults its pages in. A small read cost 16 us that way on the bench machine, 2 us
#: from the heap at 64 KiB: 15-20 us of a producer's CPU per request.
STREAM_READ_BYTES = 64 * 1024


def read_in_chunks(writer: asyncio.StreamWriter) -> None:
    """Have `writer`'s connection read at most STREAM_READ_BYTES a call (see there).

    A TLS connection reads into a buffer of its own, made once: it is left as it is.
    """
    transport = writer.transport
    if isinstance(getattr(transport, "max_size", None), int):  # a plain socket's
        transport.max_size = STREAM_READ_BYTES  # type: ignore[attr-defined]


def set_tcp_keepalive(sock: socket.socket | None, idle_seconds: float) -> None:
    """Have the kernel probe `sock` after `idle_seconds` without traffic.

    It closes the connection when three probes, a third of that apart, go unanswered: a
    framed-TCP connection's keepalive, as gRPC's pings are a channel's. None: nothing.
    """
    if sock is None:
        return
    idle = max(1, int(idle_seconds))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; elsewhere the system's defaults
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, idle // 3))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


async def until_silent(ping: Callable[[], None], last_read: Callable[[], float],
                       interval: float) -> None:  # fmt: skip
    """Return once a framed-TCP peer stays silent: a keepalive, as gRPC's pings.

    After `interval` seconds without a frame read (`last_read()`: when one last was, on
    the loop's time) it calls `ping()`, and returns if nothing is read within `interval`
    more. Real time, as gRPC's pings: a test's fake clock jumping ahead drops nobody.
    """
    loop = asyncio.get_running_loop()
    while True:
        quiet = loop.time() - last_read()
        if quiet < interval:
            await asyncio.sleep(interval - quiet)
            continue
        pinged = loop.time()
        ping()
        await asyncio.sleep(interval)
        if last_read() < pinged:
            return


def grpc_keepalive_options() -> GrpcOptions:
    """A client channel's keepalive options (GRPC_KEEPALIVE_MS, read at each call)."""
    return _keepalive(GRPC_KEEPALIVE_MS)


def _keepalive(ms: int) -> GrpcOptions:
    """Ping after `ms` without a read; close when a ping (any: BDP too) waits `ms`."""
    return (
        ("grpc.keepalive_time_ms", ms),
        ("grpc.keepalive_timeout_ms", ms),
        ("grpc.http2.ping_timeout_ms", ms),
    )


# Frame: u32 length of what follows, then the fields below, then the variable parts in
# this order: tags, sharding key, keys (joined by NUL), properties, body.
FRAME_LEN_PREFIX = struct.Struct("<I")
FRAME_FIELDS = struct.Struct("<16sqqBHHHII")
_FRAME_HEADER = struct.Struct("<I" + FRAME_FIELDS.format[1:])  # the prefix, then FRAME_FIELDS
# Record: u32 total size, u32 CRC32 of bytes [8:size], u32 magic, queue id, queue offset,
# store time, reconsume times, u16 topic length; then the topic, then the frame minus its
# length prefix.
RECORD = struct.Struct("<IIIiqqiH")
RECORD_HEAD = struct.Struct("<II")  # size, CRC
RECORD_TAIL = struct.Struct("<IiqqiH")  # the rest of RECORD: what the CRC starts with
RECORD_MAGIC = 0x4F4D5131  # "OMQ1"
KEY_SEPARATOR = b"\x00"
_PROP_KEY = struct.Struct("<H")
_PROP_VALUE = struct.Struct("<H")


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """Encode user properties as (u16 length, key, u16 length, value) pairs."""
    parts: list[bytes] = []
    for key, value in properties.items():
        k = key.encode()
        v = value.encode()
        parts += (_PROP_KEY.pack(len(k)), k, _PROP_VALUE.pack(len(v)), v)
    return b"".join(parts)


def decode_properties(data: bytes | memoryview) -> dict[str, str]:
    """Decode what encode_properties wrote; ValueError when it does not parse."""
    out: dict[str, str] = {}
    pos, end = 0, len(data)
    while pos < end:
        if pos + 2 > end:
            raise ValueError("properties truncated in a key length")
        (klen,) = _PROP_KEY.unpack_from(data, pos)
        pos += 2
        if pos + klen + 2 > end:
            raise ValueError("properties truncated in a key")
        key = bytes(data[pos : pos + klen]).decode()
        pos += klen
        (vlen,) = _PROP_VALUE.unpack_from(data, pos)
        pos += 2
        if pos + vlen > end:
            raise ValueError("properties truncated in a value")
        out[key] = bytes(data[pos : pos + vlen]).decode()
        pos += vlen
    return out


def encode_frame(
    *,
    msg_id: bytes,
    born_timestamp_ms: int,
    body: bytes,
    tags: bytes = b"",
    sharding_key: bytes = b"",
    keys: Sequence[bytes] = (),
    properties: bytes = b"",
    deliver_at_ms: int = 0,
    delay_level: int = 0,
) -> bytes:
    """Lay out one message frame; the caller has validated every field."""
    return pack_frame(
        msg_id, born_timestamp_ms, deliver_at_ms, delay_level, tags, sharding_key,
        KEY_SEPARATOR.join(keys), properties, body,
    )  # fmt: skip


def pack_frame(
    msg_id: bytes,
    born_timestamp_ms: int,
    deliver_at_ms: int,
    delay_level: int,
    tags: bytes,
    sharding_key: bytes,
    joined_keys: bytes,
    properties: bytes,
    body: bytes,
) -> bytes:
    """encode_frame with positional arguments and the keys already joined (the send path)."""
    return b"".join((
        _FRAME_HEADER.pack(
            FRAME_FIELDS.size
            + len(tags) + len(sharding_key) + len(joined_keys) + len(properties) + len(body),
            msg_id, born_timestamp_ms, deliver_at_ms, delay_level,
            len(tags), len(sharding_key), len(joined_keys), len(properties), len(body),
        ),
        tags, sharding_key, joined_keys, properties, body,
    ))  # fmt: skip


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One stored record, decoded; fields are raw bytes where the wire has bytes."""

    topic: str
    queue_id: int
    queue_offset: int
    store_timestamp_ms: int
    reconsume_times: int
    msg_id: bytes
    born_timestamp_ms: int
    deliver_at_ms: int
    delay_level: int
    tags: bytes
    sharding_key: bytes
    keys: bytes
    properties: bytes
    body: bytes


class RecordFormatError(CorruptRecordError, ValueError):
    """A stored record that does not parse or fails its CRC."""


def iter_records(data: bytes, *, verify_crc: bool = True) -> Iterator[StoredRecord]:
    """Decode concatenated stored records, as a pull or message query returns them."""
    view = memoryview(data)
    pos, end = 0, len(data)
    rec_size, frame_size = RECORD.size, FRAME_FIELDS.size
    while pos < end:
        if pos + rec_size > end:
            raise RecordFormatError(f"record header truncated at byte {pos}")
        size, crc, magic, queue_id, queue_offset, store_ts, reconsume, topic_len = (
            RECORD.unpack_from(data, pos)
        )
        if magic != RECORD_MAGIC or size < rec_size + topic_len + frame_size or pos + size > end:
            raise RecordFormatError(f"malformed record at byte {pos}")
        if verify_crc and crc32_of(view[pos + 8 : pos + size]) != crc:
            raise RecordFormatError(f"record at byte {pos} fails its CRC check")
        p = pos + rec_size
        try:
            topic = bytes(view[p : p + topic_len]).decode()
        except UnicodeDecodeError:
            raise RecordFormatError(f"record at byte {pos}: its topic is not UTF-8") from None
        p += topic_len
        (msg_id, born, deliver_at, level, tl, sl, kl, pl, bl) = FRAME_FIELDS.unpack_from(data, p)
        p += frame_size
        if p + tl + sl + kl + pl + bl != pos + size:
            raise RecordFormatError(f"record at byte {pos} has inconsistent lengths")
        tags = data[p : p + tl]
        p += tl
        sharding = data[p : p + sl]
        p += sl
        keys = data[p : p + kl]
        p += kl
        props = data[p : p + pl]
        p += pl
        body = data[p : p + bl]
        yield StoredRecord(
            topic, queue_id, queue_offset, store_ts, reconsume, msg_id, born, deliver_at,
            level, tags, sharding, keys, props, body,
        )  # fmt: skip
        pos += size
