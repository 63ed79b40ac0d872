"""RocketMQ's stored-message record and send-batch body, byte for byte.

A *record* is how a RocketMQ broker stores a message and how pull, view and query
answers carry messages (MessageDecoder.decode reads it). Big-endian, in this order:

    total size      int    the whole record, this field included
    magic           int    0xDAA320A7 (v1); RocketMQ 5's 0xDAA320AB (v2) has a 2-byte
                           topic length
    body CRC        int    CRC32 of the body as stored, & 0x7FFFFFFF
    queue id        int
    flag            int    the user's Message.flag
    queue offset    long   the consume-queue (logical) offset
    physical offset long   where the record lies in the commit log
    sysFlag         int    see below
    born timestamp  long   ms, the producer's clock
    born host       4+4 or 16+4 bytes: IP, then the port as an int (16 when sysFlag 0x10)
    store timestamp long   ms, the broker's clock
    store host      4+4 or 16+4 bytes (16 when sysFlag 0x20)
    reconsume times int
    prepared transaction offset  long
    body            int length, then the bytes (compressed when sysFlag 0x1)
    topic           1-byte length (v1; 2 bytes in v2), then UTF-8
    properties      2-byte length, then the properties string (properties.py)

sysFlag (MessageSysFlag): 0x1 compressed body, 0x2 multi tags, 0xC the transaction
type, 0x10 / 0x20 IPv6 born / store host, bits 8-10 the compression codec (1 LZ4,
2 ZSTD, 3 ZLIB; 0 is read as ZLIB, as producers before 4.9.4 send).

A SEND_BATCH_MESSAGE body is the concatenation of *batch elements* (encodeMessage):
total size (int), magic 0, body CRC 0, flag (int), body (int length + bytes), properties
(short length + string).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from sdk._remoting.message_ids import (
    UNKNOWN_HOST,
    SocketAddress,
    create_offset_msg_id,
)
from sdk._remoting.properties import (
    MAX_PROPERTIES_STRING_BYTES,
    decode_properties_bytes,
    encode_properties,
)

#: MessageDecoder.MESSAGE_MAGIC_CODE (-626843481): a record with a 1-byte topic length.
MESSAGE_MAGIC_CODE = 0xDAA320A7
#: RocketMQ 5's MESSAGE_MAGIC_CODE_V2 (-626843477): a record with a 2-byte topic length.
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB

# MessageSysFlag bits.
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_TYPE_MASK = 0xC
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20
COMPRESSION_TYPE_MASK = 0x700
COMPRESSION_LZ4_TYPE = 0x100
COMPRESSION_ZSTD_TYPE = 0x200
COMPRESSION_ZLIB_TYPE = 0x300
_CODECS = {0: "ZLIB", 1: "LZ4", 2: "ZSTD", 3: "ZLIB"}

#: The longest topic a v1 record can name (its length is a signed byte).
MAX_TOPIC_BYTES = 127

_HEAD = struct.Struct(">iIiiiqqiq")  # size .. born timestamp
_LONG = struct.Struct(">q")
_TAIL = struct.Struct(">iqi")  # reconsume times, prepared offset, body length
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")
_BYTE = struct.Struct(">b")
_ELEMENT_HEAD = struct.Struct(">iiiii")  # size, magic, CRC, flag, body length


class MessageLayoutError(ValueError):
    """Bytes that are not a well-formed record or batch element."""


class UnsupportedCompressionError(ValueError):
    """A body compressed with a codec this broker does not have (LZ4, ZSTD)."""


@dataclass(slots=True)
class MessageRecord:
    """One stored message in RocketMQ's layout.

    `body` is as stored: compressed when `sys_flag` has COMPRESSED_FLAG (the decoder
    decompresses it unless told not to, and then clears the flag). `body_crc` None is
    computed when encoding. `store_size` is what a decoded record said its size was.
    """

    topic: str
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    born_host: SocketAddress = UNKNOWN_HOST
    store_timestamp_ms: int = 0
    store_host: SocketAddress = UNKNOWN_HOST
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int | None = None
    store_size: int = 0

    @property
    def offset_msg_id(self) -> str:
        """The broker's id of this record: its store host and physical offset."""
        return create_offset_msg_id(self.store_host, self.physical_offset)


def body_crc(body: bytes) -> int:
    """The BODYCRC field: CRC32 of the body as stored, as a non-negative int."""
    return zlib.crc32(body) & 0x7FFFFFFF


def compression_type(sys_flag: int) -> str:
    """The codec a compressed body uses ("ZLIB", "LZ4" or "ZSTD"); ValueError otherwise."""
    codec = _CODECS.get((sys_flag & COMPRESSION_TYPE_MASK) >> 8)
    if codec is None:
        raise UnsupportedCompressionError(
            f"sysFlag {sys_flag:#x} names compression type {(sys_flag >> 8) & 7}, "
            "which RocketMQ does not define"
        )
    return codec


def decompress_body(body: bytes, sys_flag: int, *, max_bytes: int) -> bytes:
    """The plain body of a compressed one.

    ValueError when it does not inflate or is longer than `max_bytes` (it is never
    inflated further than that).
    """
    codec = compression_type(sys_flag)
    if codec != "ZLIB":
        raise UnsupportedCompressionError(
            f"the body is compressed with {codec}, which this broker cannot read; "
            "send it uncompressed or with zlib (RocketMQ's default)"
        )
    inflater = zlib.decompressobj()
    try:
        plain = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise ValueError(f"the compressed body does not inflate: {exc}") from None
    if len(plain) > max_bytes:
        raise ValueError(f"the body inflates to more than {max_bytes} bytes")
    if not inflater.eof or inflater.unused_data:
        raise ValueError("the compressed body is truncated or has bytes after its end")
    return plain


def compress_body(body: bytes, level: int = 5) -> bytes:
    """A zlib body as RocketMQ's Java producer compresses it (level 5, zlib wrapper)."""
    return zlib.compress(body, level)


def encode_record(record: MessageRecord, *, version: int = 1) -> bytes:
    """The record's bytes; the host bits of sysFlag follow the hosts' address families.

    ValueError when the topic or the properties string is too long for the layout.
    """
    topic = record.topic.encode()
    if version == 1 and len(topic) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic is {len(topic)} bytes; a v1 record holds {MAX_TOPIC_BYTES}")
    if version not in (1, 2) or len(topic) > 0x7FFF:
        raise ValueError(f"no record layout for version {version} and a {len(topic)}-byte topic")
    properties = encode_properties(record.properties).encode()
    if len(properties) > MAX_PROPERTIES_STRING_BYTES:
        raise ValueError(
            f"properties are {len(properties)} bytes; a record holds {MAX_PROPERTIES_STRING_BYTES}"
        )
    born, store = record.born_host, record.store_host
    sys_flag = record.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
    sys_flag |= (BORNHOST_V6_FLAG if born.is_v6 else 0) | (
        STOREHOSTADDRESS_V6_FLAG if store.is_v6 else 0
    )
    body = record.body
    topic_len = bytes([len(topic)]) if version == 1 else _SHORT.pack(len(topic))
    size = (
        _HEAD.size + len(born.ip) + 4 + _LONG.size + len(store.ip) + 4 + _TAIL.size
        + len(body) + len(topic_len) + len(topic) + _SHORT.size + len(properties)
    )  # fmt: skip
    crc = body_crc(body) if record.body_crc is None else record.body_crc
    return b"".join((
        _HEAD.pack(
            size, MESSAGE_MAGIC_CODE if version == 1 else MESSAGE_MAGIC_CODE_V2, crc,
            record.queue_id, record.flag, record.queue_offset, record.physical_offset,
            sys_flag, record.born_timestamp_ms,
        ),
        born.packed(),
        _LONG.pack(record.store_timestamp_ms),
        store.packed(),
        _TAIL.pack(record.reconsume_times, record.prepared_transaction_offset, len(body)),
        body, topic_len, topic, _SHORT.pack(len(properties)), properties,
    ))  # fmt: skip


def iter_records(
    data: bytes | memoryview, *, decompress: bool = True, max_body_bytes: int = 1 << 30
) -> Iterator[MessageRecord]:
    """Decode concatenated records (a pull, view or query answer), in order.

    Compressed bodies are inflated (and COMPRESSED_FLAG cleared) unless `decompress` is
    false. MessageLayoutError names the first record that does not parse.
    """
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        record, end = _decode_one(view, pos)
        if decompress and record.sys_flag & COMPRESSED_FLAG:
            try:
                record.body = decompress_body(
                    record.body, record.sys_flag, max_bytes=max_body_bytes
                )
            except ValueError as exc:
                raise MessageLayoutError(f"record at byte {pos}: {exc}") from None
            record.sys_flag &= ~(COMPRESSED_FLAG | COMPRESSION_TYPE_MASK)
        yield record
        pos = end


def decode_records(data: bytes | memoryview, *, decompress: bool = True) -> list[MessageRecord]:
    """Every record in `data` (see iter_records)."""
    return list(iter_records(data, decompress=decompress))


class _Reader:
    """Reads big-endian fields from a buffer; MessageLayoutError past its end."""

    def __init__(self, view: memoryview, pos: int, start: int) -> None:
        self.view, self.pos, self.start = view, pos, start

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.view):
            raise MessageLayoutError(f"record at byte {self.start}: truncated in its {what}")
        part = self.view[self.pos : self.pos + n]
        self.pos += n
        return part

    def unpack(self, fmt: struct.Struct, what: str) -> tuple[int, ...]:
        return fmt.unpack(self.take(fmt.size, what))

    def host(self, v6: bool, what: str) -> SocketAddress:
        ip = bytes(self.take(16 if v6 else 4, what))
        (port,) = self.unpack(_INT, what)
        return SocketAddress(ip, port & 0xFFFF_FFFF)


def _decode_one(view: memoryview, pos: int) -> tuple[MessageRecord, int]:
    r = _Reader(view, pos, pos)
    size, magic, crc, queue_id, flag, queue_offset, physical, sys_flag, born_ts = r.unpack(
        _HEAD, "header"
    )
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        raise MessageLayoutError(f"record at byte {pos}: magic {magic:#x} is not a message's")
    born = r.host(bool(sys_flag & BORNHOST_V6_FLAG), "born host")
    (store_ts,) = r.unpack(_LONG, "store timestamp")
    store = r.host(bool(sys_flag & STOREHOSTADDRESS_V6_FLAG), "store host")
    reconsume, prepared, body_len = r.unpack(_TAIL, "header")
    body = bytes(r.take(body_len, "body"))
    topic_fmt = _SHORT if magic == MESSAGE_MAGIC_CODE_V2 else _BYTE
    (topic_len,) = r.unpack(topic_fmt, "topic length")
    raw_topic = bytes(r.take(topic_len, "topic"))
    (props_len,) = r.unpack(_SHORT, "properties length")
    raw_props = r.take(props_len, "properties")
    if r.pos - pos != size:
        raise MessageLayoutError(
            f"record at byte {pos} says it is {size} bytes but its fields take {r.pos - pos}"
        )
    try:
        topic = raw_topic.decode()
    except UnicodeDecodeError:
        raise MessageLayoutError(f"record at byte {pos}: its topic is not UTF-8") from None
    record = MessageRecord(
        topic, body, decode_properties_bytes(raw_props), queue_id, flag, queue_offset,
        physical, sys_flag, born_ts, born, store_ts, store, reconsume, prepared, crc, size,
    )  # fmt: skip
    return record, r.pos


@dataclass(frozen=True, slots=True)
class BatchElement:
    """One message of a SEND_BATCH_MESSAGE body."""

    body: bytes
    properties: dict[str, str]
    flag: int = 0


def encode_batch_element(
    body: bytes, properties: Mapping[str, str] | None = None, flag: int = 0
) -> bytes:
    """One message as MessageDecoder.encodeMessage lays it out in a batch."""
    props = encode_properties(properties or {}).encode()
    if len(props) > MAX_PROPERTIES_STRING_BYTES:
        raise ValueError(f"properties are {len(props)} bytes; at most 32767 fit")
    size = _ELEMENT_HEAD.size + len(body) + _SHORT.size + len(props)
    return b"".join(
        (_ELEMENT_HEAD.pack(size, 0, 0, flag, len(body)), body, _SHORT.pack(len(props)), props)
    )


def encode_batch(elements: list[BatchElement]) -> bytes:
    """A SEND_BATCH_MESSAGE body."""
    return b"".join(encode_batch_element(e.body, e.properties, e.flag) for e in elements)


def decode_batch(body: bytes | memoryview) -> list[BatchElement]:
    """The messages of a SEND_BATCH_MESSAGE body; MessageLayoutError when one is malformed.

    Unlike the Java broker, which trusts them, each element's size must match its fields.
    """
    view = memoryview(body)
    out: list[BatchElement] = []
    pos = 0
    while pos < len(view):
        index = len(out)
        r = _Reader(view, pos, pos)
        try:
            size, _magic, _crc, flag, body_len = r.unpack(_ELEMENT_HEAD, "header")
            element_body = bytes(r.take(body_len, "body"))
            (props_len,) = r.unpack(_SHORT, "properties length")
            props = decode_properties_bytes(r.take(props_len, "properties"))
        except MessageLayoutError as exc:
            raise MessageLayoutError(f"batch element {index}: {exc}") from None
        if r.pos - pos != size:
            raise MessageLayoutError(
                f"batch element {index} says it is {size} bytes but its fields take {r.pos - pos}"
            )
        out.append(BatchElement(element_body, props, flag))
        pos = r.pos
    return out


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: over UTF-16 code units, h = 31*h + c in a signed int."""
    h = 0
    for (unit,) in struct.iter_unpack(">H", text.encode("utf-16-be", "surrogatepass")):
        h = (31 * h + unit) & 0xFFFF_FFFF
    return h - (1 << 32) if h & 0x8000_0000 else h


def tags_code(tags: str | None) -> int:
    """The tag hash a RocketMQ consume queue keeps (tagsString2tagsCode): 0 for no tag."""
    return java_string_hash(tags) if tags else 0


__all__ = [
    "BORNHOST_V6_FLAG",
    "COMPRESSED_FLAG",
    "COMPRESSION_LZ4_TYPE",
    "COMPRESSION_TYPE_MASK",
    "COMPRESSION_ZLIB_TYPE",
    "COMPRESSION_ZSTD_TYPE",
    "MAX_TOPIC_BYTES",
    "MESSAGE_MAGIC_CODE",
    "MESSAGE_MAGIC_CODE_V2",
    "MULTI_TAGS_FLAG",
    "STOREHOSTADDRESS_V6_FLAG",
    "TRANSACTION_COMMIT_TYPE",
    "TRANSACTION_PREPARED_TYPE",
    "TRANSACTION_ROLLBACK_TYPE",
    "TRANSACTION_TYPE_MASK",
    "BatchElement",
    "MessageLayoutError",
    "MessageRecord",
    "UnsupportedCompressionError",
    "body_crc",
    "compress_body",
    "compression_type",
    "decode_batch",
    "decode_records",
    "decompress_body",
    "encode_batch",
    "encode_batch_element",
    "encode_record",
    "iter_records",
    "java_string_hash",
    "tags_code",
]
